//! Golden-file tests of the SQL surface, in the manner of `pg_regress`: each
//! `pg_test/regress/sql/NAME.sql` runs through `psql -X -a -q` (input echoed, errors with their
//! SQLSTATE: `VERBOSITY verbose`) against a fresh cluster with pg_tide, and its output must
//! equal `pg_test/regress/expected/NAME.out` verbatim, apart from `LOCATION:` lines (they name
//! lines of pg_tide's source). On a difference the test fails with the diff and leaves the
//! output in `target/regress/NAME.out`; to accept a change, copy it over the expected file
//! (and read the diff first: it is the API's behaviour).
//!
//! One `#[test]` per file (`cargo test -p pg_test --test regress -- NAME` runs one), and
//! `every_sql_file_is_tested` fails when a file of `sql/` has no test here or a file of
//! `expected/` has no `sql/` file. A missing expected file is a failure too.
//!
//! Before each file, `pg_test/regress/setup.sql` runs in the same database (its output is not
//! compared): the helpers the transcripts share, such as `regress_wait(condition)`.
//!
//! Every file runs against a cluster made by `setup()` (pg_tide created, its supervisor
//! running; a database's launcher starts with its first pipeline), except `upgrade`: its cluster runs the build under test from a private copy that also holds
//! the oldest release's install script, without the extension, and psql gets the variable
//! `catalog_snapshot` (`pg_test::CATALOG_SNAPSHOT`, the upgrade test's catalog listing).
//!
//! The transcripts must not depend on timing or on the machine: they select stable columns or
//! mask the rest (`x IS NOT NULL AS has_x`), and wait for the worker inside SQL
//! (`tide.wait_for_pipeline`, `tide.wait_for_backfill`, which return false on timeout: the
//! transcript then shows `f`).

use pg_test::*;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

fn regress_dir() -> PathBuf {
    repo_root().join("pg_test").join("regress")
}

/// The output of `sql` through psql against `c`, `LOCATION:` lines left out.
fn run_psql(c: &Cluster, sql: &str, vars: &[(&str, &str)]) -> String {
    // As pg_regress does: stdout and stderr into one file, so that each error follows the
    // statement it belongs to (psql flushes its output before writing an error).
    let psql = pg_bin().join("psql");
    let mut child = command_as_postgres("sh")
        .current_dir("/")
        .args(["-c", "exec \"$0\" \"$@\" 2>&1"])
        .arg(&psql)
        .args([
            "-X",
            "-a",
            "-q",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
        ])
        .arg("-p")
        .arg(c.port().to_string())
        .args(vars.iter().map(|(k, v)| format!("--set={k}={v}")))
        .env("PGAPPNAME", "pg_regress")
        .env("PGTZ", "UTC")
        .env("PGDATESTYLE", "ISO, YMD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run psql");
    child
        .stdin
        .take()
        .expect("psql stdin")
        .write_all(sql.as_bytes())
        .expect("write to psql");
    let out = child.wait_with_output().expect("wait for psql");
    assert!(out.status.success(), "psql failed: {}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    stdout
        .lines()
        .filter(|l| !l.starts_with("LOCATION:"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The names of the files of `dir` with extension `ext`, sorted.
fn names(dir: &str, ext: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(regress_dir().join(dir))
        .unwrap_or_else(|e| panic!("read pg_test/regress/{dir}: {e}"))
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            if p.extension()? != ext {
                return None;
            }
            Some(p.file_stem()?.to_string_lossy().to_string())
        })
        .collect();
    v.sort();
    v
}

/// Run `sql/NAME.sql` against `c` and compare with `expected/NAME.out`.
fn check_on(name: &str, c: &Cluster, vars: &[(&str, &str)]) {
    let sql = std::fs::read_to_string(regress_dir().join("sql").join(format!("{name}.sql")))
        .expect("read the sql file");
    // A transcript that differs on a PostgreSQL version (its ACLs, what it lists as an extension's
    // members) has a variant for it, `NAME.pgNN.out`, as pg_regress has `NAME_1.out`.
    let major = pg_major();
    let variant = regress_dir()
        .join("expected")
        .join(format!("{name}.pg{major}.out"));
    let expected_path = if variant.is_file() {
        variant
    } else {
        regress_dir().join("expected").join(format!("{name}.out"))
    };
    let setup_sql =
        std::fs::read_to_string(regress_dir().join("setup.sql")).expect("read regress/setup.sql");
    let setup_out = run_psql(c, &setup_sql, &[]);
    assert!(
        !setup_out.lines().any(|l| l.starts_with("ERROR:")),
        "pg_test/regress/setup.sql failed:\n{setup_out}"
    );
    let got = run_psql(c, &sql, vars);
    let mut results = repo_root().join("target").join("regress");
    if major != 15 {
        results = results.join(format!("pg{major}"));
    }
    std::fs::create_dir_all(&results).expect("create target/regress");
    let got_path = results.join(format!("{name}.out"));
    std::fs::write(&got_path, &got).expect("write the output");
    let Ok(expected) = std::fs::read_to_string(&expected_path) else {
        panic!(
            "{name}: no expected output {} (the output is in {}: read it line by line, then copy it there, or to {name}.pg{major}.out if it differs on PostgreSQL {major} only)",
            expected_path.display(),
            got_path.display()
        );
    };
    if got != expected {
        let diff = std::process::Command::new("diff")
            .arg("-u")
            .arg(&expected_path)
            .arg(&got_path)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        panic!(
            "{name}: the output differs from {}:\n{diff}\n(the output is in {})",
            expected_path.display(),
            got_path.display()
        );
    }
}

/// Run `sql/NAME.sql` against a fresh cluster with pg_tide (`setup`).
fn check_file(name: &str) {
    let c = setup(&format!("regress_{name}"));
    check_on(name, &c, &[]);
}

/// The files checked by `check_file`, each its own test.
macro_rules! golden {
    ($($name:ident),* $(,)?) => {
        const CHECKED: &[&str] = &[$(stringify!($name)),*];
        $(
            #[test]
            fn $name() {
                check_file(stringify!($name));
            }
        )*
    };
}

golden!(
    api_errors,
    backfill,
    check,
    consumers,
    functions,
    outbox,
    pipelines,
    security,
    settings,
    table_target,
    tables,
    verify_repair,
    views,
);

/// The files checked by their own test (not by `golden!`).
const CHECKED_ELSEWHERE: &[&str] = &["upgrade"];

/// The update from the oldest release's catalog: the cluster runs the build under test, from a
/// private copy that also holds the oldest release's install script; the extension is not
/// created (the file creates the old version, updates it and compares with a fresh install).
#[test]
fn upgrade() {
    let bin = private_pg_with_oldest_script(&format!("pg{}-regress-upgrade", pg_major()));
    let c = start_cluster(Cluster::builder("regress_upgrade").pg_bin(&bin));
    check_on(
        "upgrade",
        &c,
        &[("catalog_snapshot", CATALOG_SNAPSHOT.trim())],
    );
}

#[test]
fn every_sql_file_is_tested() {
    let sql = names("sql", "sql");
    let expected = names("expected", "out");
    let tested: Vec<&str> = CHECKED.iter().chain(CHECKED_ELSEWHERE).copied().collect();
    let untested: Vec<&String> = sql
        .iter()
        .filter(|n| !tested.contains(&n.as_str()))
        .collect();
    assert!(
        untested.is_empty(),
        "pg_test/regress/sql files without a test in pg_test/tests/regress.rs (add them to golden!): {untested:?}"
    );
    let no_sql: Vec<&str> = tested
        .iter()
        .filter(|n| !sql.contains(&n.to_string()))
        .copied()
        .collect();
    assert!(
        no_sql.is_empty(),
        "tests without a pg_test/regress/sql file: {no_sql:?}"
    );
    // A version's variant (NAME.pgNN) belongs to NAME.
    let orphans: Vec<&String> = expected
        .iter()
        .filter(|n| {
            let base = match n.rsplit_once(".pg") {
                Some((b, v)) if v.parse::<u32>().is_ok() => b,
                _ => n.as_str(),
            };
            !sql.iter().any(|s| s == base)
        })
        .collect();
    assert!(
        orphans.is_empty(),
        "pg_test/regress/expected files without a sql file: {orphans:?}"
    );
}
