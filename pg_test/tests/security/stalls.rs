//! No role can stall or starve another's pipeline (issue 29, class 8), and the minor items of
//! class 9. Each test keeps a second owner's pipeline applying while the attack runs.

use super::*;

/// A connection that gives up on a statement after `secs` (so an attack that blocks pg_tide
/// shows as a failed statement, not a hung test).
fn bounded(c: &Cluster, role: &str, secs: u32) -> postgres::Client {
    let mut cl = connect_as(c, role);
    cl.batch_execute(&format!("SET statement_timeout = '{secs}s'"))
        .expect("set statement_timeout");
    cl
}

/// `nobody` (no pg_tide rights) holds the advisory locks pg_tide used to serialise a pipeline
/// (`hashtext('pg_tide pipeline <name>')`, names are public in pg_replication_slots), its
/// retention and slot creation: alice's pipeline keeps applying, mallory can still create and
/// drop pipelines and consumers.
#[test]
fn advisory_locks_of_others_stall_nothing() {
    let c = secured("sec_advisory");
    alice_pipeline(&c);
    // (Table OIDs are public in pg_class; nobody just cannot resolve alice's schema by name.)
    let relid: i64 = c.query_scalar("SELECT 'alice.t'::regclass::oid::int8");
    let mut holder = connect_as(&c, "nobody");
    holder
        .batch_execute(&format!(
            "SELECT pg_advisory_lock(hashtext('pg_tide pipeline p')),
                    pg_advisory_lock(hashtext('pg_tide retention p')),
                    pg_advisory_lock(hashtext('pg_tide slot tide_m')),
                    pg_advisory_lock(hashtext('pg_tide pipeline m')),
                    pg_advisory_lock(hashtext('pg_tide backfill p {relid}'))"
        ))
        .expect("nobody may take advisory locks");
    c.execute("INSERT INTO alice.t VALUES (1001, 1)");
    let mut a = bounded(&c, "alice", 20);
    let applied: bool = a
        .query_one("SELECT tide.wait_for_pipeline('p', '15 seconds')", &[])
        .map(|r| r.get(0))
        .unwrap_or_else(|e| panic!("wait_for_pipeline: {}", describe_error(&e)));
    assert!(
        applied,
        "another role's advisory lock stalled alice's pipeline\n{}",
        diag(&c)
    );
    a.batch_execute(
        "SELECT tide.create_consumer('p', 'c1'); SELECT tide.start_backfill('alice.t', 'p')",
    )
    .unwrap_or_else(|e| panic!("alice's API under nobody's locks: {}", describe_error(&e)));
    let mut m = bounded(&c, "mallory", 20);
    m.batch_execute("SELECT tide.create_pipeline('m')")
        .unwrap_or_else(|e| {
            panic!(
                "create_pipeline under nobody's locks: {}",
                describe_error(&e)
            )
        });
    m.batch_execute("SELECT tide.drop_pipeline('m')")
        .unwrap_or_else(|e| panic!("drop_pipeline under nobody's locks: {}", describe_error(&e)));
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));
    drop(holder);
}

/// Logical messages are not pg_tide's: `nobody` emitting 500 of them with pg_tide's prefix
/// writes no log line (it used to write one per message and pipeline).
#[test]
fn logical_messages_are_ignored_quietly() {
    let c = secured("sec_messages");
    alice_pipeline(&c);
    ok_as(&c, "mallory", "CREATE TABLE mallory.t (id int PRIMARY KEY)");
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('m')");
    ok_as(
        &c,
        "mallory",
        "SELECT tide.add_table('m', 'mallory.t', backfill => false)",
    );
    wait_for_pipeline(&c, "m", 30, || diag(&c));
    let before = c.log().lines().count();
    ok_as(
        &c,
        "nobody",
        "SELECT count(pg_logical_emit_message(true, 'pg_tide', 'add\tp\t1')) FROM generate_series(1, 500);
         SELECT count(pg_logical_emit_message(false, 'pg_tide', 'x')) FROM generate_series(1, 100);",
    );
    c.execute("INSERT INTO alice.t VALUES (1001, 1); INSERT INTO mallory.t VALUES (1)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    wait_for_pipeline(&c, "m", 30, || diag(&c));
    let log = c.log();
    let new_lines: Vec<&str> = log.lines().skip(before).collect();
    let about: Vec<&&str> = new_lines
        .iter()
        .filter(|l| l.contains("logical message"))
        .collect();
    assert!(
        about.is_empty(),
        "{} log lines about logical messages, e.g. {:?}",
        about.len(),
        about.first()
    );
    assert!(
        new_lines.len() < 100,
        "{} new log lines after 600 logical messages",
        new_lines.len()
    );
}

/// A member has no DELETE (so no LOCK) right on tide.outbox: `LOCK TABLE tide.outbox IN ACCESS
/// EXCLUSIVE MODE` is refused, and so is a DELETE; trimming goes through tide.trim_outbox, for
/// the caller's own pipelines only.
#[test]
fn outbox_cannot_be_locked_or_deleted_by_members() {
    let c = secured("sec_outbox_lock");
    alice_pipeline(&c);
    ok_as(&c, "alice", "SELECT tide.start_backfill('alice.t', 'p')");
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));
    for role in ["mallory", "alice", "nobody"] {
        let mut cl = bounded(&c, role, 10);
        let e = cl
            .batch_execute("BEGIN; LOCK TABLE tide.outbox IN ACCESS EXCLUSIVE MODE")
            .expect_err("LOCK TABLE tide.outbox must be refused");
        assert_db_error(&e, "42501", None);
        let _ = cl.batch_execute("ROLLBACK");
        let e = cl
            .batch_execute("DELETE FROM tide.outbox")
            .expect_err("DELETE FROM tide.outbox must be refused");
        assert_db_error(&e, "42501", None);
    }
    // While mallory tried, alice's pipeline kept applying.
    c.execute("INSERT INTO alice.t VALUES (1001, 1)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    // Trimming: alice trims her events; mallory may not trim alice's.
    let mut m = connect_as(&c, "mallory");
    let e = m
        .batch_execute("SELECT tide.trim_outbox('p', 1000000)")
        .expect_err("mallory trims alice's outbox");
    assert_db_error(&e, "42501", None);
    let upto: i64 = scalar_as(&c, "alice", "SELECT min(id) + 9 FROM tide.outbox");
    let trimmed: i64 = scalar_as(
        &c,
        "alice",
        &format!("SELECT tide.trim_outbox('p', {upto})"),
    );
    assert_eq!(trimmed, 10);
    let left: i64 = c.query_scalar("SELECT count(*) FROM tide.outbox WHERE pipeline = 'p'");
    assert_eq!(left, 101 - 10);
}

/// One role cannot take every slot: tide.max_pipelines_per_role (here 2) refuses the third
/// pipeline of a role with 53400; another role and a superuser still create theirs.
#[test]
fn one_role_cannot_take_every_slot() {
    // A quarter of 8 slots: 2 pipelines per role by default.
    let c = secured_with("sec_slot_quota", &["max_replication_slots = 8"]);
    // The default is a quarter of max_replication_slots.
    let (slots, per_role): (String, String) = {
        let r = c.query_one(
            "SELECT current_setting('max_replication_slots'), current_setting('tide.max_pipelines_per_role')",
        );
        (r.get(0), r.get(1))
    };
    assert_eq!(per_role, "-1", "default (max_replication_slots = {slots})");
    assert_eq!(slots, "8");
    for i in 0..2 {
        ok_as(
            &c,
            "mallory",
            &format!("SELECT tide.create_pipeline('m{i}')"),
        );
    }
    let mut m = connect_as(&c, "mallory");
    let e = m
        .batch_execute("SELECT tide.create_pipeline('mx')")
        .expect_err("a pipeline beyond mallory's share");
    assert_db_error(&e, "53400", Some("tide.max_pipelines_per_role"));
    // Another role, and a superuser beyond the share, still have slots.
    ok_as(&c, "alice", "SELECT tide.create_pipeline('a1')");
    ok_as(&c, "alice", "SELECT tide.create_pipeline('a2')");
    c.execute("SELECT tide.create_pipeline('s1')");
    c.execute("SELECT tide.create_pipeline('s2')");
    c.execute("SELECT tide.create_pipeline('s3')");
    // The setting, by reload: 3 for mallory now.
    c.execute("ALTER SYSTEM SET tide.max_pipelines_per_role = 3");
    c.execute("SELECT pg_reload_conf()");
    c.wait_until(
        "the reload",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<String>(
                "SELECT current_setting('tide.max_pipelines_per_role')",
            )? == "3")
        },
    );
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('m2')");
}

/// A paused pipeline's retained WAL is bounded by tide.max_paused_wal_size: past it the slot is
/// dropped and the pipeline says so with the remedy, while another owner's pipeline keeps
/// applying. (With tide.on_slot_lost = 'error'; the default resyncs instead: see the slot_lost
/// suite.)
#[test]
fn paused_pipeline_wal_is_bounded() {
    let c = secured("sec_paused_wal");
    c.execute("ALTER SYSTEM SET tide.on_slot_lost = 'error'");
    c.execute("ALTER SYSTEM SET tide.max_paused_wal_size = '2MB'");
    c.execute("SELECT pg_reload_conf()");
    alice_pipeline(&c);
    ok_as(
        &c,
        "mallory",
        "CREATE TABLE mallory.t (id int PRIMARY KEY, v text)",
    );
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('m')");
    ok_as(
        &c,
        "mallory",
        "SELECT tide.add_table('m', 'mallory.t', backfill => false)",
    );
    wait_for_pipeline(&c, "m", 30, || diag(&c));
    ok_as(&c, "alice", "SELECT tide.pause_pipeline('p')");
    // About 8 MB of WAL, written while alice's pipeline is paused; mallory's applies it.
    c.execute(
        "INSERT INTO mallory.t SELECT g, repeat(md5(g::text), 30) FROM generate_series(1, 8000) g",
    );
    wait_for_pipeline(&c, "m", 60, || diag(&c));
    c.wait_until(
        "alice's paused slot to be dropped",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'tide_5_p'",
            )? == 0)
        },
    );
    let (state, error, remedy): (String, String, String) = {
        let r = c.query_one(
            "SELECT state, coalesce(last_error, ''), coalesce(remedy, '') FROM tide.pipelines WHERE name = 'p'",
        );
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(state, "paused");
    assert!(error.contains("tide.max_paused_wal_size"), "{error}");
    assert!(
        remedy.contains("tide.create_pipeline('p', 'outbox', '{}'::jsonb)"),
        "{remedy}"
    );
    // mallory's pipeline is not disturbed.
    c.execute("INSERT INTO mallory.t VALUES (100000, 'after')");
    wait_for_pipeline(&c, "m", 30, || diag(&c));
    // Resuming says the slot is gone, with the same remedy.
    ok_as(&c, "alice", "SELECT tide.resume_pipeline('p')");
    c.wait_until(
        "the resumed pipeline to report its missing slot",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.pipelines WHERE name = 'p' AND last_error LIKE '%does not exist%' AND remedy LIKE '%tide.create_pipeline(''p'', ''outbox''%'",
            )? == 1)
        },
    );
}

/// Class 9: a non-owner of a superuser's pipeline is not told to GRANT the superuser role to
/// itself.
#[test]
fn no_hint_to_grant_superuser_membership() {
    let c = secured("sec_hint");
    c.execute("SELECT tide.create_pipeline('admin_p')");
    let mut m = connect_as(&c, "mallory");
    let e = m
        .batch_execute("SELECT tide.pause_pipeline('admin_p')")
        .expect_err("mallory pauses the superuser's pipeline");
    assert_db_error(&e, "42501", None);
    let hint = e
        .as_db_error()
        .and_then(|d| d.hint())
        .unwrap_or_default()
        .to_string();
    assert!(!hint.contains("GRANT"), "{hint}");
}

/// Class 9: JSON that jsonb holds but pg_tide's parser cannot (a number beyond a double) is a
/// clean 22023 naming the argument, not an XX000 with pgrx's internals.
#[test]
fn unreadable_json_is_a_clean_error() {
    let c = secured("sec_json");
    let mut m = connect_as(&c, "mallory");
    for options in [r#"{"x": 1e400}"#, r#"{"schema": "s", "n": -1e999}"#] {
        let e = m
            .batch_execute(&format!(
                "SELECT tide.create_pipeline('j', 'table', '{options}')"
            ))
            .expect_err("options pg_tide cannot read");
        assert_db_error(&e, "22023", Some("double precision"));
        let msg = e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default();
        assert!(msg.contains("\"options\""), "{msg}");
    }
}

/// A member's transaction left open while it holds its own pipeline's retention lock
/// (`tide.trim_outbox`, `create_consumer`, `seek_consumer` take it) does not stall the launcher,
/// which starts (and restarts) every role's workers: alice's worker, stopped meanwhile, is
/// started again and applies. (Her pipeline exists before: creating a logical slot waits for
/// every transaction that has written to end, mallory's open one too — PostgreSQL's rule for
/// any slot, not a lock of pg_tide's.)
#[test]
fn an_open_transaction_does_not_stall_the_launcher() {
    let c = secured("sec_launcher_stall");
    alice_pipeline(&c);
    ok_as(&c, "mallory", "CREATE TABLE mallory.t (id int PRIMARY KEY)");
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('m')");
    ok_as(
        &c,
        "mallory",
        "SELECT tide.add_table('m', 'mallory.t', backfill => false)",
    );
    ok_as(&c, "mallory", "SELECT tide.create_consumer('m', 'c1')");
    ok_as(
        &c,
        "mallory",
        "INSERT INTO mallory.t SELECT generate_series(1, 10)",
    );
    wait_for_pipeline(&c, "m", 30, || diag(&c));
    let mut m = connect_as(&c, "mallory");
    // (create_consumer takes the lock as trim_outbox and seek_consumer do, and exists in older
    // builds too, which this test fails on.)
    m.batch_execute("BEGIN; SELECT tide.create_consumer('m', 'c2')")
        .unwrap_or_else(|e| panic!("create_consumer: {}", describe_error(&e)));
    // The launcher's retention visits m's outbox every tick (it has a consumer).
    std::thread::sleep(Duration::from_secs(3));
    let before = worker_pid(&c, "p").unwrap_or_else(|| panic!("no worker for p\n{}", diag(&c)));
    c.execute(&format!("SELECT pg_terminate_backend({before})"));
    c.wait_until(
        "the launcher to start alice's worker again",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || Ok(worker_pid(&c, "p").is_some_and(|p| p != before)),
    );
    c.execute("INSERT INTO alice.t VALUES (5000, 1)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    m.batch_execute("ROLLBACK").expect("rollback");
}
