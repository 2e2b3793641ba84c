//! Self-tests of the e2e harness (scripts/cluster.sh + pg_test). These need
//! PostgreSQL 15 but not pg_tide: every cluster here is `--no-preload`.

use pg_test::*;
use std::time::Duration;

#[test]
fn cluster_lifecycle_and_settings() {
    let c = Cluster::builder("harness_lifecycle")
        .no_preload()
        .conf("work_mem='7MB'")
        .start();
    assert!(c.is_running());
    let wal: String = c.query_scalar("SHOW wal_level");
    assert_eq!(wal, "logical");
    let wm: String = c.query_scalar("SHOW work_mem");
    assert_eq!(wm, "7MB");
    let preload: String = c.query_scalar("SHOW shared_preload_libraries");
    assert_eq!(preload, "");
    let port: i32 = c.query_scalar("SELECT inet_server_port()");
    assert_eq!(port, i32::from(c.port()));

    c.execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2)");
    c.restart();
    let n: i64 = c.query_scalar("SELECT count(*) FROM t");
    assert_eq!(n, 2);

    c.stop(StopMode::Immediate);
    assert!(!c.is_running());
    assert!(c.try_client().is_err());
    c.start();
    wait_until(Duration::from_secs(10), Duration::from_millis(100), || {
        Ok(c.try_query_scalar::<i64>("SELECT count(*) FROM t")? == 2)
    });
    assert!(c
        .log()
        .contains("database system is ready to accept connections"));
    assert!(!c.log_tail(3).is_empty());

    c.execute("CREATE DATABASE other");
    c.execute_in("other", "CREATE TABLE u (y int)");
    let mut other = c.connect_db("other");
    let db: String = other
        .query_one("SELECT current_database()::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(db, "other");
}

#[test]
fn wal_level_and_error_helpers() {
    let c = Cluster::builder("harness_errors")
        .no_preload()
        .wal_level("replica")
        .start();
    let wal: String = c.query_scalar("SHOW wal_level");
    assert_eq!(wal, "replica");

    assert_sql_fails(c.try_query_scalar::<i32>("SELECT 1/0"), "22012", None);
    // A server error that carries a hint (undefined function).
    let err = c.try_execute("SELECT no_such_fn(1)").unwrap_err();
    assert_db_error(&err, "42883", Some("explicit type casts"));
    let db = expect_db_error(c.try_execute("SELECT * FROM no_such_table"));
    assert_eq!(db.code(), &SqlState::UNDEFINED_TABLE);
}

/// Runs `f`, expecting it to panic with a message containing `expected`.
fn assert_panics<F: FnOnce()>(expected: &str, f: F) {
    let err =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).expect_err("expected a panic");
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        msg.contains(expected),
        "panic message {msg:?} lacks {expected:?}"
    );
}

#[test]
fn hint_mismatch_panics() {
    let c = Cluster::builder("harness_hint").no_preload().start();
    let err = c.try_execute("SELECT no_such_fn(1)").unwrap_err();
    drop(c);
    assert_panics("expected a HINT containing", || {
        assert_db_error(&err, "42883", Some("shared_preload_libraries"))
    });
    assert_panics("expected SQLSTATE 55000", || {
        assert_db_error(&err, "55000", None)
    });
}

#[test]
fn pgbench_runs_a_custom_script() {
    let c = Cluster::builder("harness_pgbench").no_preload().start();
    c.execute("CREATE TABLE hits (id bigserial PRIMARY KEY, v int)");
    let out = c
        .pgbench("\\set v random(1, 1000)\nINSERT INTO hits (v) VALUES (:v);\n")
        .clients(2)
        .duration(Duration::from_secs(2))
        .rate(200.0)
        .run();
    let tps = pgbench_tps(&out).unwrap_or_else(|| panic!("no tps in pgbench output:\n{out}"));
    assert!(tps > 50.0, "tps {tps} too low for -R 200:\n{out}");
    let n: i64 = c.query_scalar("SELECT count(*) FROM hits");
    assert!(n > 100, "only {n} rows inserted");
}

#[test]
fn pgbench_failure_reports_stderr() {
    let c = Cluster::builder("harness_pgbench_fail")
        .no_preload()
        .start();
    assert_panics("no_such_table", || {
        c.pgbench("SELECT * FROM no_such_table;")
            .duration(Duration::from_secs(1))
            .run();
    });
}
