//! Security, third round (issue 44): with pipelines in every database, no role learns of or
//! starves another's pipelines.

use super::*;

/// 1. Error texts name only what the caller may see. alice owns pipeline `alicesecret`
/// capturing `alice.priv`, in a schema mallory (a `tide_admin` member) has no USAGE on; mallory
/// names the table by OID and gets an error that names neither the pipeline nor its owner, the
/// same as for a table nobody captures; naming the pipeline gets an error without its owner.
/// On main: `must be the owner of pipeline "alicesecret" (or a member of role "alice")`.
#[test]
fn errors_do_not_name_other_owners_pipelines() {
    let c = secured("sec_names");
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.priv (id int PRIMARY KEY);
         CREATE TABLE alice.other (id int PRIMARY KEY);",
    );
    ok_as(&c, "alice", "SELECT tide.create_pipeline('alicesecret')");
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_table('alicesecret', 'alice.priv', backfill => false)",
    );
    let oid = |t: &str| -> u32 {
        c.query_scalar::<postgres::types::Oid>(&format!("SELECT '{t}'::regclass::oid"))
    };
    let (captured, uncaptured) = (oid("alice.priv"), oid("alice.other"));
    for role in ["mallory", "nobody"] {
        let mut texts = Vec::new();
        for sql in [
            format!("SELECT tide.start_backfill('{captured}'::oid::regclass)"),
            format!("SELECT tide.start_backfill('{uncaptured}'::oid::regclass)"),
            format!("SELECT tide.start_backfill('{captured}'::oid::regclass, 'alicesecret')"),
            "SELECT tide.pause_pipeline('alicesecret')".to_string(),
        ] {
            let e = exec_as(&c, role, &sql).expect_err(&sql);
            let text = describe_error(&e);
            assert!(
                !text.contains("\"alice\"") && !text.contains("GRANT alice"),
                "as {role}: {sql}: names the owner: {text}"
            );
            texts.push(text);
        }
        // Without naming it, the captured table reads exactly as one nobody captures.
        let strip = |t: &str, oid: &str| t.replace(oid, "");
        assert_eq!(
            strip(&texts[0], "priv"),
            strip(&texts[1], "other"),
            "as {role}: the errors tell a captured table from an uncaptured one"
        );
        assert!(
            !texts[0].contains("alicesecret"),
            "as {role}: names the pipeline: {}",
            texts[0]
        );
    }
}

/// The pid of the pg_tide worker of database `db`, read from database postgres: while a
/// `DROP DATABASE` of `db` waits for its lock, no new session can connect to `db`.
fn worker_in(c: &Cluster, db: &str) -> Option<i32> {
    c.client()
        .query_one(
            "SELECT (SELECT pid FROM pg_stat_activity
                      WHERE backend_type = 'pg_tide worker' AND datname = $1)",
            &[&db],
        )
        .ok()
        .and_then(|r| r.get(0))
}

/// 3. A role with no rights cannot stop a database's pipelines with a `DROP DATABASE` it may not
/// run. `DROP DATABASE` locks the database before it checks ownership, and the launcher yielded
/// to any such lock. Here nobody's `DROP DATABASE app` is made to wait for the lock (a
/// superuser's open `COMMENT ON DATABASE app` holds a lock it conflicts with), so it stays
/// queued: alice's pipeline in `app` keeps its worker all along (on main it lost it within a
/// second), and once the comment commits nobody's drop fails with 42501. A superuser's drop
/// queued the same way still makes the launcher yield (its worker stops, and the database is
/// dropped).
#[test]
fn a_drop_database_that_cannot_succeed_does_not_stop_pipelines() {
    let c = secured("sec_dropdb");
    c.execute("CREATE DATABASE app OWNER alice");
    c.execute_in("app", "CREATE EXTENSION pg_tide; GRANT tide_admin TO alice");
    let mut a = c.connect_db("app");
    a.batch_execute("SET ROLE alice; SELECT tide.create_pipeline('ap')")
        .expect("create_pipeline");
    drop(a);
    c.wait_until(
        "alice's pipeline in app to stream",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || Ok(worker_in(&c, "app").is_some()),
    );
    let pid = worker_in(&c, "app");
    let queue_drop = |role: &str| {
        let mut holder = c.client();
        holder
            .batch_execute("BEGIN; COMMENT ON DATABASE app IS 'held'")
            .expect("hold");
        let mut dropper = connect_as(&c, role);
        let dropping = std::thread::spawn(move || dropper.batch_execute("DROP DATABASE app"));
        c.wait_until(
            "the DROP DATABASE to queue for its lock",
            Duration::from_secs(20),
            Duration::from_millis(20),
            || {
                Ok(c.try_query_scalar::<i64>(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'object' AND NOT granted
                        AND mode = 'AccessExclusiveLock'
                        AND objid = (SELECT oid FROM pg_database WHERE datname = 'app')",
                )? == 1)
            },
        );
        (holder, dropping)
    };
    let (mut holder, dropping) = queue_drop("nobody");
    // Several launcher ticks (1 s each) with nobody's drop queued.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let now = worker_in(&c, "app");
        assert_eq!(
            now,
            pid,
            "alice's worker stopped while nobody's DROP DATABASE waited\n{}",
            c.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    holder.batch_execute("COMMIT").expect("commit");
    let e = dropping
        .join()
        .expect("thread")
        .expect_err("nobody dropped app");
    assert_db_error(&e, "42501", None);
    assert_eq!(worker_in(&c, "app"), pid, "alice's worker stopped");
    // A superuser's drop, queued the same way, is yielded to: it succeeds.
    let (mut holder, dropping) = queue_drop("postgres");
    c.wait_until(
        "the launcher of app to yield to the superuser's DROP DATABASE",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || Ok(worker_in(&c, "app").is_none()),
    );
    holder.batch_execute("COMMIT").expect("commit");
    dropping.join().expect("thread").unwrap_or_else(|e| {
        panic!(
            "the superuser's DROP DATABASE failed: {}",
            describe_error(&e)
        )
    });
}

/// 2. Following a schema stalls no other role's DDL. The superuser's schema `victim2` is
/// followed by alice (USAGE granted to her); alice keeps a `tide.stop_following_schema` open in
/// a transaction; the schema owner's `CREATE TABLE victim2.n2` (a table alice may not read: a
/// skip is recorded) completes at once. On main it waited for alice's transaction (the skip
/// record's foreign key to her followed-schema row), here cut by a 5 s `lock_timeout`. Once
/// alice commits, the skip is not shown (the schema is no longer followed); following it again
/// starts with no stale skip.
#[test]
fn following_a_schema_stalls_no_ones_ddl() {
    let c = secured("sec_follow_stall");
    c.execute("CREATE SCHEMA victim2; GRANT USAGE ON SCHEMA victim2 TO alice");
    ok_as(&c, "alice", "SELECT tide.create_pipeline('pf')");
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_tables_in_schema('pf', 'victim2', follow => true)",
    );
    let mut alice = connect_as(&c, "alice");
    alice
        .batch_execute("BEGIN; SELECT tide.stop_following_schema('pf', 'victim2')")
        .expect("stop_following_schema");
    let t = Instant::now();
    c.execute("SET lock_timeout = '5s'; CREATE TABLE victim2.n2 (id int PRIMARY KEY)");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "the CREATE TABLE waited {:?} for alice's transaction",
        t.elapsed()
    );
    alice.batch_execute("COMMIT").expect("commit");
    let shown: i64 = scalar_as(
        &c,
        "alice",
        "SELECT count(*) FROM tide.skipped_tables WHERE pipeline = 'pf'",
    );
    assert_eq!(shown, 0, "a skip shown for a schema no longer followed");
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_tables_in_schema('pf', 'victim2', follow => true)",
    );
    // The skip the racing CREATE TABLE recorded (by the superuser) is gone; the follow's own
    // attempt recorded one of its own (by alice).
    let by: Vec<String> = c
        .query(
            "SELECT by_role::text FROM tide.follow_skip
              WHERE pipeline = 'pf' AND relid = 'victim2.n2'::regclass",
        )
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        by,
        ["alice"],
        "the skip records of victim2.n2 after following again"
    );
}
