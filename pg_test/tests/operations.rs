//! Production operations (issue 32): what an operator meets after the first day.
//!
//! - A captured table that is dropped leaves its pipelines by itself, at the DROP's position in
//!   the stream, with a `schema` event saying so and a LOG line; one dropped where the event
//!   trigger could not see it is removed by name or OID ([`dropped_table_leaves_its_pipeline`]).
//! - `apply_lag_seconds` and `lag_bytes` are not 0 while a backlog waits, whatever the state:
//!   paused, error ([`lag_is_true_in_every_state`]).
//! - `tide.drop_pipeline` refuses a transaction block (its slot drop cannot be rolled back), and
//!   the remedy printed after a lost slot re-creates the pipeline exactly: owner, target,
//!   options, tables with their target tables ([`drop_pipeline_and_the_recreate_remedy`]).
//! - A backfill into a target that already holds rows is not `ready` until the rows the source
//!   does not have are gone (tide.repair), or the target is emptied first with
//!   `truncate_target` ([`readd_into_a_nonempty_target`]).
//! - A worker that leaves during its wait leaves no wake-up behind that could signal another
//!   process that reused its pid ([`stale_wakeup_signals_no_reused_pid`]).
//! - `tide.pipelines` shows the owner the options, says why a pipeline has no worker, counts
//!   the time since a lost slot in the lag while the resync is not done, warns in a remedy when
//!   the slot is about to be lost, and answers on a hot standby ([`pipelines_view_says_why`]).
//! - An idle server with pipelines writes nothing: no pg_tide process takes a transaction id
//!   while nothing changes, so every slot stays at the end of the WAL, as `pg_upgrade` needs
//!   ([`idle_pipelines_write_nothing`]).
//!
//! Everything a user does runs as `alice`, a member of `tide_admin` (the documented grant).

use pg_test::*;
use postgres::Client;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A cluster with pg_tide and alice (member of tide_admin, owner of schema alice).
fn cluster(name: &str) -> Cluster {
    let c = setup(name);
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA alice AUTHORIZATION alice;",
    );
    c
}

#[track_caller]
fn ok_as(c: &Cluster, role: &str, sql: &str) {
    if let Err(e) = connect_as(c, role).batch_execute(sql) {
        panic!(
            "as {role}: {sql}\nfailed: {}\n{}",
            describe_error(&e),
            diag(c)
        );
    }
}

fn alice(c: &Cluster) -> Client {
    connect_as(c, "alice")
}

/// Item 1: DROP TABLE of a captured table: it leaves the pipeline at the DROP's position (the events
/// of the same transaction before and after it are on either side of its schema event), with a
/// LOG line; tide.tables no longer lists it; re-created and added again it is one row. A table
/// dropped while event triggers are off (session_replication_role = replica) is removed with
/// tide.remove_table by its name or its OID.
#[test]
fn dropped_table_leaves_its_pipeline() {
    let c = cluster("ops_drop");
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.a (id int PRIMARY KEY, v int);
         CREATE TABLE alice.b (id int PRIMARY KEY, v int);
         CREATE TABLE alice.c (id int PRIMARY KEY, v int);
         CREATE TABLE alice.d (id int PRIMARY KEY, v int);
         INSERT INTO alice.a VALUES (1, 1);",
    );
    ok_as(&c, "alice", "SELECT tide.create_pipeline('p')");
    for t in ["a", "b", "c", "d"] {
        ok_as(
            &c,
            "alice",
            &format!("SELECT tide.add_table('p', 'alice.{t}', backfill => false)"),
        );
    }
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    ok_as(
        &c,
        "alice",
        "BEGIN;
         INSERT INTO alice.b VALUES (1, 1);
         DROP TABLE alice.a;
         INSERT INTO alice.b VALUES (2, 2);
         COMMIT;",
    );
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    let events: Vec<String> = alice(&c)
        .query(
            "SELECT relation || ' ' || op || ' ' || coalesce(key::text, row::text)
               FROM tide.outbox WHERE pipeline = 'p'
                AND commit_lsn = (SELECT max(commit_lsn) FROM tide.outbox WHERE pipeline = 'p')
              ORDER BY position",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(events.len(), 3, "{events:?}\n{}", diag(&c));
    assert_eq!(events[0], r#"alice.b insert {"id": 1}"#, "{events:?}");
    assert!(
        events[1].starts_with("alice.a schema ") && events[1].contains(r#""table_dropped": true"#),
        "the drop's event between the two inserts: {events:?}"
    );
    assert_eq!(events[2], r#"alice.b insert {"id": 2}"#, "{events:?}");
    assert!(
        c.log_count("captured table alice.a was dropped") >= 1,
        "no LOG line for the drop\n{}",
        c.log_tail(40)
    );
    let listed: Vec<String> = alice(&c)
        .query(
            "SELECT relation FROM tide.tables WHERE pipeline = 'p' ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(listed, ["alice.b", "alice.c", "alice.d"]);
    // Re-created and added again: one row, capturing.
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.a (id int PRIMARY KEY, v int);
         SELECT tide.add_table('p', 'alice.a', backfill => false);",
    );
    ok_as(&c, "alice", "INSERT INTO alice.a VALUES (7, 7)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    let rows: i64 = alice(&c)
        .query_one(
            "SELECT count(*) FROM tide.tables WHERE pipeline = 'p' AND relation = 'alice.a' AND state = 'capturing'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);

    // Dropped where the event trigger does not fire: listed until removed by name, or by OID.
    let d_oid: i64 = c.query_scalar("SELECT 'alice.d'::regclass::oid::int8");
    c.execute("SET session_replication_role = replica; DROP TABLE alice.c; DROP TABLE alice.d;");
    let still: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.tables WHERE pipeline = 'p' AND relation IN ('alice.c', 'alice.d')",
    );
    assert_eq!(still, 2, "the scenario needs tables dropped unseen");
    ok_as(&c, "alice", "SELECT tide.remove_table('p', 'alice.c')");
    ok_as(
        &c,
        "alice",
        &format!("SELECT tide.remove_table('p', {d_oid}::oid::regclass)"),
    );
    let err =
        expect_db_error(alice(&c).batch_execute("SELECT tide.remove_table('p', 'alice.nosuch')"));
    assert_eq!(err.code().code(), "42P01", "{err:?}");
    ok_as(&c, "alice", "INSERT INTO alice.b VALUES (3, 3)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    c.wait_until(
        "the removed tables to leave tide.tables",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.tables WHERE pipeline = 'p' AND relation IN ('alice.c', 'alice.d')",
            )? == 0)
        },
    );
}

/// `(apply_lag_seconds, lag_bytes)` of pipeline `p`, as alice sees them.
fn lag(c: &Cluster) -> (f64, i64) {
    let r = alice(c)
        .query_one(
            "SELECT apply_lag_seconds, coalesce(lag_bytes, -1) FROM tide.pipelines WHERE name = 'p'",
            &[],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

/// Lag is measured twice, a second apart: it must be above zero and grow with the time.
#[track_caller]
fn assert_lag_grows(c: &Cluster, state: &str) {
    let (first, bytes) = lag(c);
    c.execute("SELECT pg_sleep(1.1)");
    let (second, _) = lag(c);
    assert!(
        first > 0.0 && second >= first + 1.0,
        "{state}: apply_lag_seconds {first} then {second} a second later, with a backlog\n{}",
        diag(c)
    );
    assert!(bytes > 0, "{state}: lag_bytes {bytes}\n{}", diag(c));
}

/// Item 2: apply_lag_seconds and lag_bytes while paused with a backlog and while a CHECK constraint at
/// the target blocks the pipeline (state error): not 0, growing; small again once caught up.
#[test]
fn lag_is_true_in_every_state() {
    let c = cluster("ops_lag");
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.t (id int PRIMARY KEY, v int);
         INSERT INTO alice.t SELECT g, g FROM generate_series(1, 100) g;",
    );
    ok_as(
        &c,
        "alice",
        r#"SELECT tide.create_pipeline('p', 'table', '{"schema": "alice"}')"#,
    );
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_table('p', 'alice.t', target_table => 't_copy')",
    );
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    let (caught_up, _) = lag(&c);
    assert!(caught_up < 5.0, "caught up: {caught_up}\n{}", diag(&c));

    ok_as(&c, "alice", "SELECT tide.pause_pipeline('p')");
    c.wait_until(
        "the pipeline to be paused",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(
                c.try_query_scalar::<String>("SELECT state FROM tide.pipelines WHERE name = 'p'")?
                    == "paused",
            )
        },
    );
    ok_as(
        &c,
        "alice",
        "INSERT INTO alice.t SELECT g, g FROM generate_series(101, 2000) g",
    );
    assert_lag_grows(&c, "paused");

    // A CHECK constraint at the target refuses the next row: state error.
    ok_as(
        &c,
        "alice",
        "ALTER TABLE alice.t_copy ADD CONSTRAINT small CHECK (v < 1000000)",
    );
    ok_as(&c, "alice", "SELECT tide.resume_pipeline('p')");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    ok_as(&c, "alice", "INSERT INTO alice.t VALUES (5000, 2000000)");
    c.wait_until(
        "the pipeline to fail on the CHECK constraint",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(
                c.try_query_scalar::<String>("SELECT state FROM tide.pipelines WHERE name = 'p'")?
                    == "error",
            )
        },
    );
    assert_lag_grows(&c, "error");

    ok_as(
        &c,
        "alice",
        "ALTER TABLE alice.t_copy DROP CONSTRAINT small",
    );
    wait_for_pipeline(&c, "p", 60, || diag(&c));
    let (after, _) = lag(&c);
    assert!(after < 5.0, "caught up again: {after}\n{}", diag(&c));
}

/// Item 3: drop_pipeline in a transaction block (explicit, or a multi-statement string) is refused
/// with 25001 and leaves the pipeline and its slot alone. After its slot was dropped (a paused
/// pipeline past tide.max_paused_wal_size), the remedy's statements, run one by one as alice,
/// re-create the pipeline as it was: target, options, tables with their target tables.
#[test]
fn drop_pipeline_and_the_recreate_remedy() {
    let c = cluster("ops_droppipe");
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.t (id int PRIMARY KEY, v int);
         CREATE TABLE alice.filler (id int PRIMARY KEY, pad text);
         INSERT INTO alice.t SELECT g, g FROM generate_series(1, 100) g;",
    );
    ok_as(
        &c,
        "alice",
        r#"SELECT tide.create_pipeline('p', 'table', '{"schema": "alice", "schema_changes": "pause"}')"#,
    );
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_table('p', 'alice.t', target_table => 'alice.t_copy')",
    );
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));
    let options_before: String =
        c.query_scalar("SELECT options::text FROM tide.pipeline WHERE name = 'p'");

    let mut a = alice(&c);
    a.batch_execute("BEGIN").unwrap();
    let err = expect_db_error(a.batch_execute("SELECT tide.drop_pipeline('p')"));
    assert_eq!(err.code().code(), "25001", "{err:?}");
    assert!(
        err.hint().unwrap_or("").contains("outside BEGIN"),
        "{err:?}"
    );
    a.batch_execute("ROLLBACK").unwrap();
    let err = expect_db_error(a.batch_execute("SELECT 1; SELECT tide.drop_pipeline('p')"));
    assert_eq!(err.code().code(), "25001", "{err:?}");
    let slots: i64 =
        c.query_scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'tide_5_p'");
    assert_eq!(slots, 1, "the refused drop_pipeline dropped the slot");
    ok_as(&c, "alice", "INSERT INTO alice.t VALUES (1000, 1000)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));

    // Lose the slot: paused past tide.max_paused_wal_size. With tide.on_slot_lost = 'error' the
    // pipeline stops there and prints the remedy (with 'resync', the default, it would recover
    // by itself: pg_test/tests/slot_lost.rs).
    c.execute("ALTER SYSTEM SET tide.on_slot_lost = 'error'");
    c.execute("ALTER SYSTEM SET tide.max_paused_wal_size = '2MB'");
    c.execute("SELECT pg_reload_conf()");
    ok_as(&c, "alice", "SELECT tide.pause_pipeline('p')");
    ok_as(
        &c,
        "alice",
        "INSERT INTO alice.filler SELECT g, repeat(md5(g::text), 30) FROM generate_series(1, 8000) g",
    );
    c.wait_until(
        "the paused slot to be dropped",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'tide_5_p'",
            )? == 0)
        },
    );
    c.wait_until(
        "the remedy in tide.pipelines",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<Option<String>>(
                "SELECT remedy FROM tide.pipelines WHERE name = 'p'",
            )?
            .is_some_and(|r| r.contains("create_pipeline")))
        },
    );
    let remedy: String = c.query_scalar("SELECT remedy FROM tide.pipelines WHERE name = 'p'");
    c.execute("ALTER SYSTEM RESET tide.max_paused_wal_size");
    c.execute("SELECT pg_reload_conf()");
    let stmts = statements_of(&remedy);
    assert!(
        stmts.iter().any(|s| s.contains("tide.create_pipeline(")),
        "no create_pipeline in the remedy: {remedy}"
    );
    let mut a = alice(&c);
    for s in &stmts {
        a.batch_execute(s).unwrap_or_else(|e| {
            panic!(
                "remedy statement {s}: {}\nremedy: {remedy}",
                describe_error(&e)
            )
        });
    }
    let (target, options): (String, String) = {
        let r = c.query_one("SELECT target, options::text FROM tide.pipeline WHERE name = 'p'");
        (r.get(0), r.get(1))
    };
    assert_eq!(target, "table");
    assert_eq!(options, options_before, "remedy: {remedy}");
    assert!(options.contains("\"pause\""), "{options}");
    let tables: Vec<String> = c
        .query("SELECT relation || ' -> ' || target_schema || '.' || target_name || ' ' || owner FROM tide.pipeline_table t JOIN tide.pipeline p ON p.name = t.pipeline WHERE t.pipeline = 'p'")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        tables,
        ["alice.t -> alice.t_copy alice"],
        "remedy: {remedy}"
    );
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));
    ok_as(&c, "alice", "INSERT INTO alice.t VALUES (1001, 1001)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    assert_no_rows(
        &c,
        "source and re-created target differ",
        "(SELECT * FROM alice.t EXCEPT SELECT * FROM alice.t_copy) UNION ALL (SELECT * FROM alice.t_copy EXCEPT SELECT * FROM alice.t)",
    );
}

/// The statements of a remedy: `SET ROLE ...`, `SELECT tide.f(...)` (quotes respected),
/// `RESET ROLE`.
fn statements_of(remedy: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = remedy.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let rest = &remedy[i..];
        if rest.starts_with("SET ROLE ") || rest.starts_with("RESET ROLE") {
            let end = rest.find([';', '.']).unwrap_or(rest.len());
            // (a role name is an identifier: no ';' or '.' unless quoted; alice is not)
            out.push(rest[..end].to_string());
            i += end;
        } else if rest.starts_with("SELECT tide.") {
            // up to the ')' that closes the call, outside quotes
            let mut depth = 0;
            let mut quoted = false;
            let mut end = rest.len();
            for (k, ch) in rest.char_indices() {
                match ch {
                    '\'' => quoted = !quoted,
                    '(' if !quoted => depth += 1,
                    ')' if !quoted => {
                        depth -= 1;
                        if depth == 0 {
                            end = k + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let stmt = &rest[..end];
            // Only what re-creates; not a name in the prose (tide.max_paused_wal_size).
            out.push(stmt.to_string());
            i += end;
        } else {
            i += rest.chars().next().map_or(1, |ch| ch.len_utf8());
        }
    }
    out
}

/// Item 4: A table removed, rows deleted at its source meanwhile, added again into the same target:
/// the backfill writes into a target that holds 2,001 rows the source no longer has. Readiness
/// is not 'ready' until tide.repair removed them; with truncate_target => true the target is
/// emptied first and readiness becomes 'ready' with the target equal to the source.
#[test]
fn readd_into_a_nonempty_target() {
    let c = cluster("ops_readd");
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.t (id int PRIMARY KEY, v int);
         INSERT INTO alice.t SELECT g, g FROM generate_series(1, 3000) g;",
    );
    ok_as(
        &c,
        "alice",
        r#"SELECT tide.create_pipeline('p', 'table', '{"schema": "alice"}')"#,
    );
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_table('p', 'alice.t', target_table => 't_copy')",
    );
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));
    let readiness = |c: &Cluster| -> String {
        alice(c)
            .query_one(
                "SELECT readiness FROM tide.readiness WHERE pipeline = 'p' AND relation = 'alice.t'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    let remove_and_wait = |c: &Cluster| {
        ok_as(c, "alice", "SELECT tide.remove_table('p', 'alice.t')");
        ok_as(c, "alice", "INSERT INTO alice.filler VALUES (1)");
        c.wait_until(
            "the table to leave tide.tables",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                Ok(c.try_query_scalar::<i64>(
                    "SELECT count(*) FROM tide.tables WHERE pipeline = 'p'",
                )? == 0)
            },
        );
    };
    ok_as(&c, "alice", "CREATE TABLE alice.filler (id int)");
    remove_and_wait(&c);
    ok_as(&c, "alice", "DELETE FROM alice.t WHERE id <= 2001");
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_table('p', 'alice.t', target_table => 't_copy')",
    );
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    let extra: i64 = c.query_scalar("SELECT count(*) FROM alice.t_copy c WHERE NOT EXISTS (SELECT 1 FROM alice.t s WHERE s.id = c.id)");
    assert_eq!(extra, 2001, "the scenario: stale rows at the target");
    c.wait_until(
        "the backfill to be applied",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || Ok(readiness(&c) != "catching up"),
    );
    assert_eq!(
        readiness(&c),
        "target not verified",
        "2001 rows at the target do not exist at the source\n{}",
        diag(&c)
    );
    // tide.repair deletes them; then ready.
    ok_as(&c, "alice", "SELECT * FROM tide.repair('alice.t', 'p')");
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));
    c.wait_until(
        "readiness 'ready' after the repair",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || Ok(readiness(&c) == "ready"),
    );
    let extra: i64 = c.query_scalar("SELECT count(*) FROM alice.t_copy c WHERE NOT EXISTS (SELECT 1 FROM alice.t s WHERE s.id = c.id)");
    assert_eq!(extra, 0);

    // truncate_target: emptied first, then ready with no stale row.
    remove_and_wait(&c);
    ok_as(&c, "alice", "DELETE FROM alice.t WHERE id <= 2500");
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_table('p', 'alice.t', target_table => 't_copy', truncate_target => true)",
    );
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));
    c.wait_until(
        "readiness 'ready' after a backfill into the emptied target",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || Ok(readiness(&c) == "ready"),
    );
    assert_no_rows(
        &c,
        "source and target differ",
        "(SELECT * FROM alice.t EXCEPT SELECT * FROM alice.t_copy) UNION ALL (SELECT * FROM alice.t_copy EXCEPT SELECT * FROM alice.t)",
    );
    // Refused where it cannot apply.
    ok_as(&c, "alice", "CREATE TABLE alice.o (id int PRIMARY KEY)");
    ok_as(&c, "alice", "SELECT tide.create_pipeline('ob')");
    let err = expect_db_error(
        alice(&c).batch_execute("SELECT tide.add_table('ob', 'alice.o', truncate_target => true)"),
    );
    assert_eq!(err.code().code(), "22023", "{err:?}");
}

/// The OS uid and gid of the postgres user (the cluster's processes).
fn postgres_ids() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    (id("-u"), id("-g"))
}

/// A process of the postgres OS user (so a backend may signal it) that is not PostgreSQL, with
/// pid `pid`: the kernel's next pid is set through /proc/sys/kernel/ns_last_pid (root), retried
/// while other processes take it first.
fn process_with_pid(pid: i32) -> Child {
    let (uid, gid) = postgres_ids();
    for _ in 0..2000 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", pid - 1))
            .expect("writing /proc/sys/kernel/ns_last_pid (the test runs as root)");
        let mut child = Command::new("sleep")
            .arg("120")
            .uid(uid)
            .gid(gid)
            .spawn()
            .unwrap();
        if child.id() as i32 == pid {
            return child;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("could not start a process with pid {pid}");
}

/// Item 11: A worker terminated while it waits for WAL (its wake-up bit set) leaves nothing behind:
/// the next commit does not signal its pid, even once another process (not PostgreSQL) has it.
/// The launcher is kept from starting the next worker (which would take over the slot) by a lock
/// on tide.pipeline held in a transaction that is rolled back (it commits nothing, so it wakes
/// nobody).
#[test]
fn stale_wakeup_signals_no_reused_pid() {
    let c = cluster("ops_wakeup");
    // A long poll: the worker waits for commits, not for its timer.
    c.execute("ALTER SYSTEM SET tide.poll_interval = '60s'");
    c.execute("SELECT pg_reload_conf()");
    c.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE other (id int)");
    c.execute("SELECT tide.create_pipeline('p')");
    c.execute("SELECT tide.add_table('p', 't', backfill => false)");
    c.execute("INSERT INTO t VALUES (1)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    let pid = worker_pid(&c, "p").expect("a worker");
    // It waits on its latch (after a commit that woke it, until the next one).
    c.execute("INSERT INTO t VALUES (2)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    c.wait_until(
        "the worker to wait on its latch",
        Duration::from_secs(30),
        Duration::from_millis(20),
        || {
            Ok(c.try_query_scalar::<i64>(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = {pid} AND wait_event_type = 'Extension'"
            ))? == 1)
        },
    );
    let mut lock = c.client();
    lock.batch_execute("BEGIN; LOCK TABLE tide.pipeline IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    c.execute(&format!("SELECT pg_terminate_backend({pid})"));
    let t = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "worker {pid} did not exit"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut other = process_with_pid(pid);
    // A commit that wrote WAL: it wakes the workers that wait.
    c.execute("INSERT INTO other VALUES (1)");
    let t = Instant::now();
    let mut died = None;
    while t.elapsed() < Duration::from_secs(2) {
        if let Some(status) = other.try_wait().unwrap() {
            died = Some(status);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = other.kill();
    let _ = other.wait();
    lock.batch_execute("ROLLBACK").unwrap();
    c.execute("ALTER SYSTEM RESET tide.poll_interval");
    c.execute("SELECT pg_reload_conf()");
    assert!(
        died.is_none(),
        "a commit signalled pid {pid}, which the terminated worker had and another process now has: {died:?}"
    );
    // The pipeline goes on with its next worker.
    c.execute("INSERT INTO t VALUES (3)");
    wait_for_pipeline(&c, "p", 60, || diag(&c));
}

/// A physical standby of `primary`: a cluster initialized, its data directory replaced by a
/// `pg_basebackup -R` of the primary (with its own port), started in recovery.
fn standby_of(primary: &Cluster, name: &str) -> Cluster {
    let s = Cluster::builder(name).init();
    let base = std::env::var("TIDE_CLUSTERS").unwrap_or_else(|_| "/tmp/pg_tide_clusters".into());
    let data = format!("{base}/{}/data", s.name());
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(
        command_as_postgres("rm").args(["-rf", &data]),
        "remove the standby's data directory",
    );
    run(
        command_as_postgres(pg_bin().join("pg_basebackup"))
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-X",
                "stream",
                "-R",
                "-D",
                &data,
            ])
            .arg("-p")
            .arg(primary.port().to_string()),
        "pg_basebackup",
    );
    run(
        command_as_postgres("sh").args([
            "-c",
            &format!("echo 'port = {}' >> {data}/postgresql.auto.conf", s.port()),
        ]),
        "give the standby its port",
    );
    s.start();
    s
}

/// Issue 43, item 8: `tide.pipelines` shows the owner the pipeline's options; says why a pipeline
/// has no worker; counts the time since a lost slot in `apply_lag_seconds` while the resync is not
/// done (the target lacks what changed meanwhile); adds the slot's warning to a remedy while the
/// slot is about to be lost; and answers on a hot standby, where every pipeline is `stopped`,
/// saying why.
#[test]
fn pipelines_view_says_why() {
    // max_slot_wal_keep_size well under tide.slot_warning_size: the slot always has a warning.
    let c = start_cluster(Cluster::builder("ops_why").conf("max_slot_wal_keep_size = '256MB'"));
    init_extension(&c);
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA alice AUTHORIZATION alice;
         CREATE SCHEMA alice_rep AUTHORIZATION alice;",
    );
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.t (id int PRIMARY KEY, v int NOT NULL);
         INSERT INTO alice.t SELECT g, g FROM generate_series(1, 2000) g;
         CREATE TABLE alice_rep.t (id int PRIMARY KEY, v int NOT NULL CHECK (v >= 0));",
    );
    ok_as(
        &c,
        "alice",
        r#"SELECT tide.create_pipeline('w', 'table', '{"schema": "alice_rep"}')"#,
    );
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_table('w', 'alice.t', backfill => false)",
    );
    wait_for_pipeline(&c, "w", 60, || diag(&c));
    // The owner sees the options.
    let schema: String = connect_as(&c, "alice")
        .query_one(
            "SELECT options->>'schema' FROM tide.pipelines WHERE name = 'w'",
            &[],
        )
        .unwrap_or_else(|e| panic!("alice reads her options: {}", describe_error(&e)))
        .get(0);
    assert_eq!(schema, "alice_rep");

    // A remedy while the slot is about to be lost says so.
    ok_as(&c, "alice", "INSERT INTO alice.t VALUES (5000, -1)");
    c.wait_until(
        "the CHECK failure",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<Option<String>>(
                "SELECT last_error_sqlstate FROM tide.pipelines WHERE name = 'w'",
            )?
            .as_deref()
                == Some("23514"))
        },
    );
    let remedy: String = c.query_scalar("SELECT remedy FROM tide.pipelines WHERE name = 'w'");
    assert!(
        remedy.contains("But the slot may not keep it: the slot is")
            && remedy.contains("max_slot_wal_keep_size"),
        "remedy: {remedy}"
    );
    ok_as(&c, "alice", "DELETE FROM alice.t WHERE id = 5000");
    c.execute("ALTER TABLE alice_rep.t DROP CONSTRAINT t_v_check");
    wait_for_pipeline(&c, "w", 60, || diag(&c));

    // No worker: why, and what to check.
    c.execute("ALTER SYSTEM SET tide.database = 'nowhere'");
    c.execute("SELECT pg_reload_conf()");
    c.wait_until(
        "the worker to stop",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            Ok(
                c.try_query_scalar::<String>("SELECT state FROM tide.pipelines WHERE name = 'w'")?
                    == "stopped",
            )
        },
    );
    let r = c.query_one("SELECT last_error, remedy FROM tide.pipelines WHERE name = 'w'");
    let (why, what): (Option<String>, Option<String>) = (r.get(0), r.get(1));
    assert_eq!(why.as_deref(), Some("no worker runs for this pipeline"));
    assert!(
        what.as_deref()
            .is_some_and(|w| w.contains("SELECT tide.check()")),
        "{what:?}"
    );
    c.execute("ALTER SYSTEM RESET tide.database");
    c.execute("SELECT pg_reload_conf()");
    wait_streaming(&c, "w", Duration::from_secs(60));

    // A lost slot: until its tables are read again, the lag counts from the loss. The resync
    // is held by a lock on the table (its backfill cannot read it).
    ok_as(&c, "alice", "SELECT tide.pause_pipeline('w')");
    c.wait_until(
        "paused",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(
                c.try_query_scalar::<String>("SELECT state FROM tide.pipelines WHERE name = 'w'")?
                    == "paused",
            )
        },
    );
    c.execute("SELECT pg_drop_replication_slot('tide_5_w')");
    let mut lock = c.client();
    lock.batch_execute("BEGIN; LOCK TABLE alice.t IN ACCESS EXCLUSIVE MODE")
        .expect("lock alice.t");
    ok_as(&c, "alice", "SELECT tide.resume_pipeline('w')");
    c.wait_until("the slot's loss to be seen", Duration::from_secs(60), Duration::from_millis(100), || {
        Ok(c.try_query_scalar::<bool>("SELECT resync IS NOT NULL AND slot_lost_at IS NOT NULL FROM tide.pipelines WHERE name = 'w'")?)
    });
    std::thread::sleep(Duration::from_secs(3));
    let r = c.query_one(
        "SELECT apply_lag_seconds, extract(epoch FROM now() - slot_lost_at)::float8, resync FROM tide.pipelines WHERE name = 'w'",
    );
    let (lag, since, resync): (f64, f64, Option<String>) = (r.get(0), r.get(1), r.get(2));
    assert!(resync.is_some(), "still recovering");
    assert!(
        lag >= 3.0 && lag >= since - 0.5,
        "apply_lag_seconds {lag} while the resync is not done ({since:.1} s since the loss)"
    );
    lock.batch_execute("ROLLBACK").expect("unlock");
    c.wait_until(
        "the resync to finish",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT resync IS NULL FROM tide.pipelines WHERE name = 'w'",
            )?)
        },
    );
    wait_for_pipeline(&c, "w", 60, || diag(&c));
    let lag: f64 = c.query_scalar("SELECT apply_lag_seconds FROM tide.pipelines WHERE name = 'w'");
    assert!(lag < 3.0, "apply_lag_seconds {lag} once the resync is done");

    // A hot standby answers, every pipeline stopped there, saying why.
    let s = standby_of(&c, "ops_why_standby");
    assert!(s.query_scalar::<bool>("SELECT pg_is_in_recovery()"));
    let r = s.query_one(
        "SELECT state, last_error, remedy, current_lsn IS NOT NULL FROM tide.pipelines WHERE name = 'w'",
    );
    assert_eq!(r.get::<_, String>(0), "stopped");
    assert!(
        r.get::<_, String>(1).contains("standby"),
        "{}",
        r.get::<_, String>(1)
    );
    assert!(
        r.get::<_, String>(2).contains("promoted"),
        "{}",
        r.get::<_, String>(2)
    );
    assert!(r.get::<_, bool>(3), "current_lsn is the replay position");
    s.query("SELECT * FROM tide.pipelines");
}

/// Nothing changes, so pg_tide writes nothing. Before this was kept, every iteration of a worker
/// committed an empty transaction (an UPDATE that matched no row still takes an xid), which woke
/// every worker of the database again, forever, and the launcher did the same every 5 s: an
/// idle server wrote WAL without end, and `pg_upgrade` refused the slots ("has not consumed the
/// WAL yet"). Autovacuum is off in this cluster: an ANALYZE takes a transaction id too.
#[test]
fn idle_pipelines_write_nothing() {
    let c = start_cluster(Cluster::builder("idle").conf("autovacuum = off"));
    init_extension(&c);
    c.execute(
        "CREATE TABLE i_out (id int PRIMARY KEY, v int);
         CREATE TABLE i_tab (id int PRIMARY KEY, v int);
         INSERT INTO i_out SELECT g, g FROM generate_series(1, 500) g;
         INSERT INTO i_tab SELECT g, g FROM generate_series(1, 500) g;",
    );
    c.execute("SELECT tide.create_pipeline('io')");
    c.execute(r#"SELECT tide.create_pipeline('it', 'table', '{"schema": "replica"}')"#);
    c.execute("SELECT tide.add_table('io', 'i_out')");
    c.execute("SELECT tide.add_table('it', 'i_tab')");
    wait_for_backfill(&c, "i_out", Some("io"), 120, || diag(&c));
    wait_for_backfill(&c, "i_tab", Some("it"), 120, || diag(&c));
    c.execute(
        "UPDATE i_out SET v = v + 1 WHERE id <= 10; UPDATE i_tab SET v = v + 1 WHERE id <= 10;",
    );
    wait_for_pipeline(&c, "io", 60, || diag(&c));
    wait_for_pipeline(&c, "it", 60, || diag(&c));
    // The launcher saves the new definitions for pg_dump within about 5 s (a write, rightly).
    c.wait_until(
        "the launcher to save the pipelines' definitions",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT count(*) = 2 AND bool_and(d.definition = tide._definition(d.name))
                   FROM tide.pipeline_definition d",
            )?)
        },
    );
    // Settled: every slot at the end of the WAL (the workers confirm their own last
    // transactions on their next iterations).
    c.wait_until(
        "every pg_tide slot to confirm the end of the WAL",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT count(*) = 2 AND bool_and(confirmed_flush_lsn >= pg_current_wal_lsn())
                   FROM pg_replication_slots WHERE plugin = 'pg_tide'",
            )?)
        },
    );
    let next_xid = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8";
    let before: i64 = c.query_scalar(next_xid);
    let lsn_before: String = c.query_scalar("SELECT pg_current_wal_lsn()::text");
    // Several of the launcher's 5-second rounds and many worker polls (0.2 s): long enough for
    // either to have written, whatever the machine's load.
    std::thread::sleep(Duration::from_secs(12));
    let after: i64 = c.query_scalar(next_xid);
    let slots: String = c.query_scalar(
        "SELECT string_agg(slot_name || ' ' || confirmed_flush_lsn, ', ') || ' at ' || pg_current_wal_lsn()
           FROM pg_replication_slots",
    );
    assert_eq!(
        after - before,
        0,
        "transaction ids taken in 12 s by an idle server with two caught-up pipelines (slots: {slots})\n{}\nthe WAL written meanwhile:\n{}",
        diag(&c),
        waldump_from(&pg_bin(), &c, &lsn_before)
    );
    let caught_up: bool = c.query_scalar(
        "SELECT bool_and(confirmed_flush_lsn >= pg_current_wal_lsn()) FROM pg_replication_slots WHERE plugin = 'pg_tide'",
    );
    assert!(caught_up, "every slot still at the end of the WAL: {slots}");
}
