//! Upgrading pg_tide in place, as a DBA would, with pipelines of every target kind running.
//!
//! The newest release of `sql/releases.txt` before the build under test (built from its commit by
//! `scripts/release.sh`, once per machine) is installed into a private PostgreSQL copy of its own; a cluster runs from it
//! with an outbox, a local table and a remote table pipeline, each with a throttled backfill in
//! progress and writers running. Then the build under test (the pg_tide files of `TIDE_PG_BIN`'s
//! installation, which `scripts/test.sh` installs) is installed over it by rename while the server
//! runs, the server is restarted, and `ALTER EXTENSION pg_tide UPDATE` runs, writers still going.
//!
//! What must hold:
//! - between the restart and the update, the new library runs no worker and its functions refuse
//!   to act (SQLSTATE 55000, the hint names `ALTER EXTENSION pg_tide UPDATE`); writes meanwhile
//!   are not lost;
//! - after the update the workers resume by themselves, with the slots and replication origins
//!   the release made (no resync), the backfills finish, the outbox replays to the source with
//!   no event written twice, both table targets equal their source both ways, and `tide.verify`
//!   reports no difference;
//! - the catalog of the upgraded database equals that of a fresh `CREATE EXTENSION` of the new
//!   version (functions, views, tables, columns, indexes, constraints, policies, privileges and
//!   comments: `CATALOG_SNAPSHOT`), and that comparison does catch a difference: the database
//!   before its update differs from the fresh one, and so does a fresh one with one comment or
//!   one grant changed.

use pg_test::*;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const ROWS: i64 = 30_000;
const CHUNK: i64 = 500;
/// Per backfill: about 15 s for `ROWS`, so each is still running after the upgrade.
const RATE: i64 = 2_000;
/// (pipeline, source table, target kind)
const PIPELINES: &[(&str, &str)] = &[("ob", "o_src"), ("lt", "l_src"), ("rt", "r_src")];

/// Writers on the three source tables until `stop`: updates, inserts (in and past the key
/// range) and deletes, one row each. A failed round (the server restarting) reconnects.
fn spawn_writer(c: &Cluster, stop: Arc<AtomicBool>) -> JoinHandle<(u64, u64)> {
    let cfg = c.config("postgres");
    std::thread::spawn(move || {
        let connect = || cfg.connect(NoTls);
        let mut cl = connect().ok();
        let (mut ok, mut failed) = (0u64, 0u64);
        while !stop.load(Ordering::SeqCst) {
            let Some(client) = cl.as_mut() else {
                std::thread::sleep(Duration::from_millis(200));
                cl = connect().ok();
                continue;
            };
            let mut round_failed = false;
            for (_, t) in PIPELINES {
                let sql = churn_sql(t, ROWS);
                if client.batch_execute(&sql).is_err() {
                    round_failed = true;
                    break;
                }
            }
            if round_failed {
                failed += 1;
                cl = None;
            } else {
                ok += 1;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (ok, failed)
    })
}

fn snapshot(c: &Cluster, db: &str) -> BTreeSet<String> {
    let mut cl = c.connect_db(db);
    cl.query(CATALOG_SNAPSHOT, &[])
        .unwrap_or_else(|e| panic!("catalog snapshot of {db}: {}", describe_error(&e)))
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect()
}

/// The lines only in `a` and only in `b`, for a failure message ("" when equal).
fn catalog_diff(a: &BTreeSet<String>, b: &BTreeSet<String>, an: &str, bn: &str) -> String {
    let mut s = String::new();
    for l in a.difference(b) {
        s.push_str(&format!("only in {an}: {l}\n"));
    }
    for l in b.difference(a) {
        s.push_str(&format!("only in {bn}: {l}\n"));
    }
    s
}

fn pg_tide_workers(c: &Cluster) -> i64 {
    c.query_scalar("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide worker'")
}

/// Count and an order-independent digest of a table's rows, on any cluster.
fn digest(c: &Cluster, table: &str) -> (i64, String) {
    let r = c.query_one(&format!(
        "SELECT count(*), coalesce(md5(string_agg(t::text, ',' ORDER BY t.id)), '') FROM {table} t"
    ));
    (r.get(0), r.get(1))
}

#[test]
fn upgrade_in_place_with_pipelines_running() {
    let from = previous_release();
    let to = current_version();
    assert_ne!(
        from, to,
        "sql/releases.txt names no release before the version under test: nothing to upgrade from"
    );
    assert!(
        repo_root()
            .join(format!("sql/pg_tide--{from}--{to}.sql"))
            .is_file(),
        "no upgrade script sql/pg_tide--{from}--{to}.sql"
    );
    let old_tree = run_repo_script(&["scripts/release.sh", &from]);
    let bin = PathBuf::from(run_repo_script(&[
        "scripts/private-pg.sh",
        &repo_root()
            .join(format!("target/pg{}-upgrade", pg_major()))
            .to_string_lossy(),
    ]));
    remove_pg_tide_files(&bin);
    run_repo_script(&["scripts/install-tree.sh", &bin.to_string_lossy(), &old_tree]);

    // --- the old release, with work in progress ------------------------------------------
    let c = start_cluster(Cluster::builder("upgrade").pg_bin(&bin));
    let tgt = target_cluster("upgrade_tgt");
    c.execute("CREATE EXTENSION pg_tide");
    let v: String = c.query_scalar(
        "SELECT extversion || ' ' || tide.version() FROM pg_extension WHERE extname = 'pg_tide'",
    );
    assert_eq!(
        v,
        format!("{from} {from}"),
        "the old release is not what runs"
    );
    for (_, t) in PIPELINES {
        // Not analyzed: reltuples stays -1, the case where progress had no estimate.
        c.execute(&format!(
            "CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL, pad text);
             INSERT INTO {t} SELECT g, g % 1000, repeat('x', 40) FROM generate_series(1, {ROWS}) g;"
        ));
    }
    create_server(&c, "tgt", &tgt);
    // (each in a transaction of its own: a slot cannot be created after a write)
    c.execute("SELECT tide.create_pipeline('ob')");
    c.execute(r#"SELECT tide.create_pipeline('lt', 'table', '{"schema": "replica"}')"#);
    c.execute(r#"SELECT tide.create_pipeline('rt', 'postgres', '{"server": "tgt"}')"#);
    for (p, t) in PIPELINES {
        c.execute(&format!(
            "SELECT tide.add_table('{p}', '{t}', backfill => false)"
        ));
    }
    for (p, _) in PIPELINES {
        wait_for_pipeline(&c, p, 60, || diag(&c));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(&c, stop.clone());
    for (p, t) in PIPELINES {
        c.execute(&format!(
            "SELECT tide.start_backfill('{t}', '{p}', chunk_size => {CHUNK});
             SELECT tide.alter_backfill('{t}', '{p}', rows_per_second => {RATE});"
        ));
    }
    c.wait_until(
        "two chunks of every backfill",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.backfills WHERE state = 'running' AND chunks_done >= 2",
            )? == 3)
        },
    );

    // --- install the new build over it, by rename, while it runs; restart ----------------
    let (new_lib, new_ext) = install_dirs(&pg_bin());
    run_repo_script(&[
        "scripts/install-tree.sh",
        &bin.to_string_lossy(),
        &new_lib.to_string_lossy(),
        &new_ext.to_string_lossy(),
    ]);
    assert!(
        c.is_running(),
        "installing by rename disturbed the running server"
    );
    c.restart();

    // New library, old SQL objects: nothing runs, the API says what to do.
    let v: String = c.query_scalar(
        "SELECT extversion || ' ' || tide.version() FROM pg_extension WHERE extname = 'pg_tide'",
    );
    assert_eq!(v, format!("{from} {to}"), "after the restart");
    let err = c
        .try_execute("SELECT tide.check()")
        .expect_err("tide.check() must fail between the restart and ALTER EXTENSION UPDATE");
    assert_db_error(&err, "55000", Some("ALTER EXTENSION pg_tide UPDATE"));
    let err = c
        .try_execute("SELECT tide.start_backfill('o_src', 'ob')")
        .expect_err("the API must refuse to act on an old catalog");
    assert_db_error(&err, "55000", Some("ALTER EXTENSION pg_tide UPDATE"));
    c.wait_until(
        "the launcher's word on the versions",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || Ok(c.log_count("pipelines wait") > 0),
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        pg_tide_workers(&c),
        0,
        "a worker runs against the old catalog\n{}",
        diag(&c)
    );

    // The snapshot tells the old catalog from the new one.
    c.execute("CREATE DATABASE fresh");
    c.execute_in("fresh", "CREATE EXTENSION pg_tide");
    let fresh = snapshot(&c, "fresh");
    let before = snapshot(&c, "postgres");
    assert!(
        !catalog_diff(&before, &fresh, "", "").is_empty(),
        "the catalog snapshot of {from} equals that of {to}: it cannot tell an upgrade happened"
    );

    // --- the update: the pipelines resume by themselves --------------------------------------
    c.execute("ALTER EXTENSION pg_tide UPDATE");
    let v: String = c.query_scalar(
        "SELECT extversion || ' ' || tide.version() FROM pg_extension WHERE extname = 'pg_tide'",
    );
    assert_eq!(v, format!("{to} {to}"), "after ALTER EXTENSION UPDATE");
    c.execute("SELECT tide.check()");
    // Schema events describe each change against the recorded shape: the update records it
    // for the tables captured already.
    let unrecorded: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.pipeline_table WHERE shape IS DISTINCT FROM tide._shape(relid)",
    );
    assert_eq!(unrecorded, 0, "tables without their shape after the update");
    c.wait_until(
        "the three workers after the update",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || Ok(pg_tide_workers(&c) == 3),
    );
    // Progress of the backfills the old release started, on a table never analyzed.
    c.wait_until(
        "progress estimates of the running backfills",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.backfills
                  WHERE state = 'running' AND fraction_done > 0 AND fraction_done < 1
                    AND estimated_time_left IS NOT NULL",
            )? == 3)
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    let (rounds, failed) = writer.join().expect("writer");
    assert!(rounds > 50, "the writers barely ran ({rounds} rounds)");
    assert!(
        failed > 0,
        "no write round failed: the server was not restarted under the writers"
    );

    for (p, _) in PIPELINES {
        wait_for_pipeline(&c, p, 120, || diag(&c));
    }
    for (p, t) in PIPELINES {
        wait_for_backfill(&c, t, Some(p), 180, || diag(&c));
    }
    for (p, _) in PIPELINES {
        wait_for_pipeline(&c, p, 120, || diag(&c));
    }

    // --- nothing lost, nothing twice -----------------------------------------------------------
    let not_done: i64 = c.query_scalar("SELECT count(*) FROM tide.backfills WHERE state <> 'done'");
    assert_eq!(not_done, 0, "{}", diag(&c));
    let twice: i64 = c.query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM tide.outbox GROUP BY pipeline, commit_lsn, position
                                HAVING count(*) > 1) d",
    );
    assert_eq!(twice, 0, "outbox events written twice\n{}", diag(&c));
    // The pipelines keep the slots and origins the release made (tide_<db oid>_<name>,
    // pg_tide_<db oid>_<name>, as 0.3.0 names them): nothing was read again, and the launchers'
    // release of what dropped databases left does not take them.
    let oid: String =
        c.query_scalar("SELECT oid::text FROM pg_database WHERE datname = 'postgres'");
    let kept: Vec<String> = c
        .query(
            "SELECT p.name || ' ' || p.slot_name || ' ' || coalesce(p.resync, '-') || ' '
                    || (p.slot_lost_at IS NULL)::text || ' '
                    || (SELECT count(*) FROM pg_replication_slots s WHERE s.slot_name = p.slot_name)
               FROM tide.pipeline p ORDER BY p.name",
        )
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        kept,
        [
            format!("lt tide_{oid}_lt - true 1"),
            format!("ob tide_{oid}_ob - true 1"),
            format!("rt tide_{oid}_rt - true 1")
        ],
        "the pipelines' slots after the update\n{}",
        diag(&c)
    );
    let origins: Vec<String> = c
        .query("SELECT roname FROM pg_replication_origin ORDER BY roname")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        origins,
        [
            format!("pg_tide_{oid}_lt"),
            format!("pg_tide_{oid}_ob"),
            format!("pg_tide_{oid}_rt")
        ],
        "the pipelines' origins after the update"
    );
    outbox_copy(&c, "o_src", "public.o_src", "o_copy");
    let events: i64 = c.query_scalar("SELECT o_copy_replay('ob')");
    assert!(events >= ROWS, "only {events} outbox events");
    assert_eq!(
        digest(&c, "o_src"),
        digest(&c, "o_copy"),
        "outbox replay differs from the source\n{}",
        diag(&c)
    );
    assert_eq!(
        digest(&c, "l_src"),
        digest(&c, "replica.l_src"),
        "local table target differs from the source\n{}",
        diag(&c)
    );
    assert_eq!(
        digest(&c, "r_src"),
        digest(&tgt, "public.r_src"),
        "remote table target differs from the source\n{}",
        diag(&c)
    );
    for (p, t) in [("lt", "l_src"), ("rt", "r_src")] {
        let r = c.query_one(&format!(
            "SELECT count(*) FILTER (WHERE kind NOT LIKE 'summary%'),
                    coalesce(json_agg(v) FILTER (WHERE kind NOT LIKE 'summary%'), '[]')::text
               FROM tide.verify('{t}', '{p}') v"
        ));
        let (n, rows): (i64, String) = (r.get(0), r.get(1));
        assert_eq!(n, 0, "tide.verify('{t}', '{p}') after the upgrade: {rows}");
    }

    // --- the upgraded catalog is the fresh one -------------------------------------------------
    let after = snapshot(&c, "postgres");
    let d = catalog_diff(&after, &fresh, "upgraded", "fresh");
    assert!(
        d.is_empty(),
        "the catalog after ALTER EXTENSION pg_tide UPDATE differs from a fresh install of {to}:\n{d}"
    );
    // ... and the comparison sees a changed comment or a changed privilege.
    let mut fc = c.connect_db("fresh");
    for change in [
        "COMMENT ON VIEW tide.backfills IS 'changed'",
        "GRANT SELECT ON tide.pipeline TO PUBLIC",
        "REVOKE EXECUTE ON FUNCTION tide._estimate_rows(oid) FROM tide_admin",
    ] {
        let mut tx = fc.transaction().expect("begin");
        tx.batch_execute(change).expect(change);
        let changed: BTreeSet<String> = tx
            .query(CATALOG_SNAPSHOT, &[])
            .expect("snapshot")
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        tx.rollback().expect("rollback");
        assert!(
            !catalog_diff(&changed, &fresh, "", "").is_empty(),
            "the catalog snapshot did not see: {change}"
        );
    }

    // --- a slot lost after the update is made anew, under the same name --------------------
    // lt's slot is dropped while it is paused: at its resume the worker makes a new slot of the
    // same name, reads its table again, and keeps marking its writes with its origin.
    c.execute("SELECT tide.pause_pipeline('lt')");
    let lt_slot = format!("tide_{oid}_lt");
    c.wait_until(
        "lt's slot to be free",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<bool>(&format!(
                "SELECT NOT active FROM pg_replication_slots WHERE slot_name = '{lt_slot}'"
            ))?)
        },
    );
    c.execute(&format!("SELECT pg_drop_replication_slot('{lt_slot}')"));
    c.execute("SELECT tide.resume_pipeline('lt')");
    c.wait_until(
        "lt to resync under its slot's name",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<bool>(&format!(
                "SELECT coalesce((SELECT resync IS NULL AND slot_lost_at IS NOT NULL
                                         AND slot_name = '{lt_slot}'
                                    FROM tide.pipelines WHERE name = 'lt'), false)"
            ))?)
        },
    );
    for (_, t) in PIPELINES {
        c.execute(&churn_sql(t, ROWS));
    }
    for (p, _) in PIPELINES {
        wait_for_pipeline(&c, p, 120, || diag(&c));
    }
    assert_eq!(
        digest(&c, "l_src"),
        digest(&c, "replica.l_src"),
        "local table target differs from the source after its resync\n{}",
        diag(&c)
    );
    let origins_after: String =
        c.query_scalar("SELECT string_agg(roname, ' ' ORDER BY roname) FROM pg_replication_origin");
    assert_eq!(
        origins_after,
        format!("pg_tide_{oid}_lt pg_tide_{oid}_ob pg_tide_{oid}_rt"),
        "the origins after lt's resync"
    );
}
