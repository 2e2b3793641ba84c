//! Security, third round (issue 44), items 5 to 7: a role's share of the server is bounded
//! server-wide. Its pipelines count in every database, its readers count against it and against
//! the server's free background workers, and a role with `CREATEDB` (and no pg_tide rights)
//! cannot fill the background workers with launchers.

use super::*;
use postgres::Client;

/// A session of `role` in database `db`.
fn connect_in(c: &Cluster, db: &str, role: &str) -> Client {
    let mut cfg = c.config(db);
    cfg.user(role);
    cfg.connect(postgres::NoTls)
        .unwrap_or_else(|e| panic!("connect to {db} as {role}: {}", describe_error(&e)))
}

/// Item 5: `tide.max_pipelines_per_role` counts a role's pipelines in every database. mallory (a
/// `tide_admin` member, limit 3) has two pipelines in postgres; her `create_pipeline` in app1,
/// left open, makes her concurrent one in app2 wait (the role's lock is server-wide), which
/// then fails with 53400 once the first commits; a later one in app2 fails too. Dropping one in
/// postgres makes room in app2 at once. On main: the limit was per database, the second create
/// did not wait (and she made 10 pipelines across four databases).
#[test]
fn pipelines_per_role_count_in_every_database() {
    let c = secured_with(
        "sec_role_share",
        &[
            "max_replication_slots = 12",
            "tide.max_pipelines_per_role = 3",
        ],
    );
    for db in ["app1", "app2"] {
        c.execute(&format!("CREATE DATABASE {db}"));
        c.execute_in(db, "CREATE EXTENSION pg_tide");
    }
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('m1')");
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('m2')");
    let mut first = connect_in(&c, "app1", "mallory");
    first
        .batch_execute("BEGIN; SELECT tide.create_pipeline('m3')")
        .expect("create_pipeline m3 in app1");
    let mut second = connect_in(&c, "app2", "mallory");
    let second_pid: i32 = second
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let racing =
        std::thread::spawn(move || second.batch_execute("SELECT tide.create_pipeline('m4')"));
    c.wait_until(
        "mallory's create_pipeline in app2 to wait for her create in app1",
        Duration::from_secs(20),
        Duration::from_millis(20),
        || {
            Ok(c.try_query_scalar::<i64>(&format!(
                "SELECT count(*) FROM pg_locks
                  WHERE pid = {second_pid} AND NOT granted AND locktype = 'advisory'
                    AND database = 0"
            ))? == 1)
        },
    );
    first.batch_execute("COMMIT").expect("commit m3");
    let e = racing
        .join()
        .expect("thread")
        .expect_err("mallory's fourth pipeline (in app2) was created");
    assert_db_error(&e, "53400", Some("tide.max_pipelines_per_role"));
    assert!(
        describe_error(&e).contains("owns 3 pipelines in all databases"),
        "{}",
        describe_error(&e)
    );
    let e = connect_in(&c, "app2", "mallory")
        .batch_execute("SELECT tide.create_pipeline('m5')")
        .expect_err("mallory's fourth pipeline (in app2, later)");
    assert_db_error(&e, "53400", Some("tide.max_pipelines_per_role"));
    let slots: i64 = c.query_scalar("SELECT count(*) FROM pg_replication_slots");
    assert_eq!(slots, 3, "replication slots taken by mallory's pipelines");
    // Her share is hers to move: a pipeline dropped in postgres makes room in app2.
    ok_as(&c, "mallory", "SELECT tide.drop_pipeline('m1')");
    connect_in(&c, "app2", "mallory")
        .batch_execute("SELECT tide.create_pipeline('m6')")
        .unwrap_or_else(|e| panic!("m6 after dropping m1: {}", describe_error(&e)));
}

/// The `pg_tide launcher` processes connected to a database whose name starts with `prefix`.
fn launchers_in(c: &Cluster, prefix: &str) -> i64 {
    c.query_scalar(&format!(
        "SELECT count(*) FROM pg_stat_activity
          WHERE backend_type = 'pg_tide launcher' AND datname LIKE '{prefix}%'"
    ))
}

/// Item 6: A role with `CREATEDB` and no pg_tide rights cannot fill the background workers. template1
/// has pg_tide; `creator` makes seven databases from it (with `max_worker_processes = 8`): none
/// gets a launcher (a database has one only while it has pipelines), creator cannot make a
/// pipeline in hers, and alice's new pipeline streams. On main each database got a launcher,
/// every worker slot was taken, and alice's `create_pipeline` failed (or her pipeline never got
/// a worker).
#[test]
fn createdb_does_not_fill_the_background_workers() {
    let c = secured_with("sec_createdb", &["max_worker_processes = 8"]);
    c.execute_in("template1", "CREATE EXTENSION pg_tide");
    c.execute("CREATE ROLE creator LOGIN CREATEDB");
    for i in 1..=7 {
        ok_as(&c, "creator", &format!("CREATE DATABASE cdb{i}"));
    }
    let e = connect_in(&c, "cdb1", "creator")
        .batch_execute("SELECT tide.create_pipeline('mine')")
        .expect_err("creator made a pipeline");
    assert_db_error(&e, "42501", None);
    // alice's pipeline: its launcher is asked for at the commit, by a supervisor that scanned
    // pg_database (and so saw the seven databases) since they were made.
    alice_pipeline(&c);
    assert_eq!(
        launchers_in(&c, "cdb"),
        0,
        "launchers in creator's databases\n{}",
        diag(&c)
    );
    let workers: i64 =
        c.query_scalar("SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'pg_tide%'");
    assert_eq!(
        workers, 3,
        "pg_tide's processes: the supervisor, postgres's launcher and alice's worker"
    );
}

/// The most `pg_tide reader` processes seen over `for_`, sampled every 20 ms.
fn most_readers(c: &Cluster, for_: Duration) -> i64 {
    let until = Instant::now() + for_;
    let mut most = 0;
    while Instant::now() < until {
        most = most.max(c.query_scalar::<i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide reader'",
        ));
        std::thread::sleep(Duration::from_millis(20));
    }
    most
}

/// Item 7: Readers count against their owner and against the free background workers. With
/// `tide.max_backfill_readers = 4` and `tide.max_workers_per_role = 3` (a DBA's), mallory's
/// slow backfill runs two readers at most (her worker and two readers: three processes), her
/// second `create_pipeline` is refused while they run (53400, tide.max_workers_per_role); alice
/// creates a pipeline and it streams, taking the last of `max_worker_processes = 7`, and her
/// next `create_pipeline` is refused (53400: no background worker slot is free), the readers
/// counted. On main mallory's worker ran three readers (every free slot), her second pipeline
/// was created, and so was alice's second, which could never get a worker.
#[test]
fn readers_count_against_their_owner_and_the_free_workers() {
    let c = secured_with(
        "sec_readers",
        &[
            "max_worker_processes = 7",
            "tide.max_backfill_readers = 4",
            "tide.max_workers_per_role = 3",
        ],
    );
    // The limit is the DBA's: no member (nor a role without rights) changes it.
    settings_refused(
        &c,
        &[
            "SET tide.max_workers_per_role = 100",
            "ALTER SYSTEM SET tide.max_workers_per_role = 100",
        ],
    );
    ok_as(
        &c,
        "mallory",
        "CREATE TABLE mallory.big (id int PRIMARY KEY, v int);
         INSERT INTO mallory.big SELECT g, g FROM generate_series(1, 4000) g;
         CREATE FUNCTION mallory.slow(int) RETURNS bool LANGUAGE sql
           AS $$ SELECT true FROM pg_sleep(0.02) $$;",
    );
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('mp')");
    ok_as(
        &c,
        "mallory",
        "SELECT tide.add_table('mp', 'mallory.big', backfill => false)",
    );
    wait_for_pipeline(&c, "mp", 30, || diag(&c));
    // 400 chunks of 10 rows, 0.2 s each: minutes of reading, several chunks planned ahead.
    ok_as(
        &c,
        "mallory",
        "SELECT tide.start_backfill('mallory.big', 'mp', 10, 'mallory.slow(id)')",
    );
    c.wait_until(
        "mallory's backfill to run readers",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide reader'",
            )? >= 1)
        },
    );
    let most = most_readers(&c, Duration::from_secs(4));
    assert!(
        (1..=2).contains(&most),
        "mallory's worker ran {most} readers; tide.max_workers_per_role = 3 allows 2\n{}",
        diag(&c)
    );
    let e = exec_as(&c, "mallory", "SELECT tide.create_pipeline('mp2')")
        .expect_err("mallory's second pipeline while her readers run");
    assert_db_error(&e, "53400", Some("tide.max_workers_per_role"));
    // alice is not starved: her pipeline gets the last free worker slot.
    alice_pipeline(&c);
    let readers = most_readers(&c, Duration::from_millis(200));
    assert!(
        readers >= 1,
        "mallory's readers left: the slot count below proves nothing"
    );
    let e = exec_as(&c, "alice", "SELECT tide.create_pipeline('p2')")
        .expect_err("alice's second pipeline with every worker slot taken");
    assert_db_error(&e, "53400", Some("max_worker_processes"));
    assert!(
        describe_error(&e).contains("7 of max_worker_processes = 7 in use"),
        "{}",
        describe_error(&e)
    );
}
