//! Several databases (issue 33 part 2): pipelines run in every database where the extension is
//! installed, each database's own; a database's first pipeline starts its launcher without a
//! restart (and its last pipeline's drop stops it: no pipelines, no launcher), a plain
//! `DROP DATABASE` of one succeeds while the other keeps streaming, and a kill -9 of a worker
//! (a crash restart of the server) loses and doubles nothing in either.
//!
//! Needs pg_tide installed (`scripts/install.sh`). Each test runs on its own scratch cluster.

use pg_test::*;
use postgres::Client;
use std::time::Duration;

const LAUNCHER: &str = "pg_tide launcher";
const SUPERVISOR: &str = "pg_tide supervisor";

/// How many `backend_type` processes are connected to database `db`.
fn count_in(c: &Cluster, backend_type: &str, db: &str) -> TestResult<i64> {
    let row = c.try_client()?.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = $1 AND datname = $2",
        &[&backend_type, &db],
    )?;
    Ok(row.get(0))
}

fn wait_for_count(c: &Cluster, backend_type: &str, db: &str, n: i64) {
    c.wait_until(
        &format!("{n} '{backend_type}' connected to database {db}"),
        Duration::from_secs(60),
        Duration::from_millis(100),
        || Ok(count_in(c, backend_type, db)? == n),
    );
}

/// The pid of the worker of pipeline `name` of database `db` (waits for it).
fn worker_pid(c: &Cluster, db: &str, name: &str) -> i32 {
    let mut pid = 0;
    c.wait_until(
        &format!("the worker of pipeline {name} in database {db}"),
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let row = c.connect_db(db).query_one(
                "SELECT coalesce((SELECT worker_pid FROM tide.pipelines WHERE name = $1), 0)",
                &[&name],
            )?;
            pid = row.get(0);
            Ok(pid > 0)
        },
    );
    pid
}

/// In database `db`: the extension, a table `src`, and a pipeline `name` writing it to the
/// table `rep.src` of the same database.
fn app(c: &Cluster, db: &str, name: &str) -> Client {
    c.execute(&format!("CREATE DATABASE {db}"));
    let mut cl = c.connect_db(db);
    // One statement per transaction (a query string of several is one transaction, and
    // create_pipeline must come before any write of its transaction).
    for stmt in [
        "CREATE EXTENSION pg_tide".to_string(),
        "CREATE TABLE public.src (id int PRIMARY KEY, v text, n bigint)".to_string(),
        "INSERT INTO public.src SELECT g, 'seed ' || g, g FROM generate_series(1, 200) g"
            .to_string(),
        format!(r#"SELECT tide.create_pipeline('{name}', 'table', '{{"schema": "rep"}}')"#),
        format!("SELECT tide.add_table('{name}', 'public.src')"),
    ] {
        cl.batch_execute(&stmt).unwrap_or_else(|e| {
            panic!(
                "setting up {db}: {stmt}: {}\n{}",
                describe_error(&e),
                c.log_tail(30)
            )
        });
    }
    cl
}

/// A round of writes: inserts, updates and deletes, some in one transaction.
fn writes(cl: &mut Client, round: i32) {
    let base = 1000 * round;
    cl.batch_execute(&format!(
        "INSERT INTO public.src SELECT g, 'round {round} ' || g, g FROM generate_series({base} + 1, {base} + 300) g;
         UPDATE public.src SET n = n + {round}, v = v || '+' WHERE id % 7 = {round} % 7;
         DELETE FROM public.src WHERE id % 11 = {round} % 11;
         BEGIN;
         UPDATE public.src SET n = -n WHERE id BETWEEN {base} + 1 AND {base} + 50;
         DELETE FROM public.src WHERE id BETWEEN {base} + 51 AND {base} + 60;
         COMMIT;"
    ))
    .expect("writes");
}

/// Wait until pipeline `name` has applied everything (its backfill too), then its target equals
/// its source.
fn assert_target_equals_source(c: &Cluster, db: &str, name: &str) {
    let mut cl = c.connect_db(db);
    let done: bool = cl
        .query_one("SELECT tide.wait_for_pipeline($1, '90 seconds')", &[&name])
        .map(|r| r.get(0))
        .unwrap_or_else(|e| panic!("wait_for_pipeline {db}.{name}: {}", describe_error(&e)));
    assert!(
        done,
        "pipeline {name} of {db} did not catch up\n{}",
        c.log_tail(40)
    );
    // The seed rows come through the table's backfill.
    let done: bool = cl
        .query_one(
            "SELECT tide.wait_for_backfill('public.src', $1, '90 seconds')",
            &[&name],
        )
        .map(|r| r.get(0))
        .unwrap_or_else(|e| panic!("wait_for_backfill {db}.{name}: {}", describe_error(&e)));
    assert!(
        done,
        "the backfill of {db}.{name} did not finish\n{}",
        c.log_tail(40)
    );
    let diff: i64 = cl
        .query_one(
            "SELECT count(*) FROM ((TABLE public.src EXCEPT ALL TABLE rep.src)
                                  UNION ALL (TABLE rep.src EXCEPT ALL TABLE public.src)) d",
            &[],
        )
        .unwrap()
        .get(0);
    let n: i64 = cl
        .query_one("SELECT count(*) FROM rep.src", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        diff, 0,
        "{db}: rep.src ({n} rows) differs from src in {diff} rows"
    );
    assert!(n > 100, "{db}: the target has only {n} rows");
    eprintln!("  {db}: rep.src = src, {n} rows");
}

#[test]
fn two_databases_stream_through_kill9_and_drop_database() {
    let c = start_cluster(Cluster::builder("multidb"));
    let mut a = app(&c, "app_a", "orders_a");
    let mut b = app(&c, "app_b", "orders_b");

    // One supervisor (no database), one launcher per database with pipelines, none in
    // postgres (no extension there).
    c.wait_until(
        "the supervisor",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<i64>(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = '{SUPERVISOR}' AND datname IS NULL"
            ))? == 1)
        },
    );
    wait_for_count(&c, LAUNCHER, "app_a", 1);
    wait_for_count(&c, LAUNCHER, "app_b", 1);
    assert_eq!(count_in(&c, LAUNCHER, "postgres").unwrap(), 0);

    // Each database's pipelines are its own: the view of one does not show the other's.
    let names: Vec<String> = a
        .query("SELECT name FROM tide.pipelines", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(names, ["orders_a"]);
    // A slot name is the server's, so it carries the database's OID: the same pipeline name in
    // the other database has a slot (and an origin) of its own.
    b.batch_execute("SELECT tide.create_pipeline('orders_a', 'outbox')")
        .expect("orders_a in app_b too");
    let slots: Vec<String> = c
        .client()
        .query(
            "SELECT s.slot_name::text || ' in ' || s.database FROM pg_replication_slots s
              WHERE s.slot_name::text = pg_catalog.format('tide_%s_orders_a', (SELECT oid FROM pg_database d WHERE d.datname = s.database))
              ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(slots.len(), 2, "the slots of both orders_a: {slots:?}");
    b.batch_execute("SELECT tide.drop_pipeline('orders_a')")
        .expect("drop orders_a of app_b");
    assert!(
        a.query_one(
            "SELECT count(*) FROM pg_replication_slots s JOIN tide.pipeline p ON p.slot_name = s.slot_name",
            &[]
        )
        .unwrap()
        .get::<_, i64>(0)
            == 1,
        "the drop in app_b took app_a's slot"
    );

    writes(&mut a, 1);
    writes(&mut b, 1);
    assert_target_equals_source(&c, "app_a", "orders_a");
    assert_target_equals_source(&c, "app_b", "orders_b");

    // kill -9 of a worker: the postmaster restarts the whole server; both resume.
    let victim = worker_pid(&c, "app_a", "orders_a");
    drop(a);
    drop(b);
    kill9_and_wait_restart(&c, victim, Duration::from_secs(60));
    let mut a = c.connect_db("app_a");
    let mut b = c.connect_db("app_b");
    writes(&mut a, 2);
    writes(&mut b, 2);
    let worker_a = worker_pid(&c, "app_a", "orders_a");
    assert_ne!(worker_a, victim);
    worker_pid(&c, "app_b", "orders_b");
    assert_target_equals_source(&c, "app_a", "orders_a");
    assert_target_equals_source(&c, "app_b", "orders_b");

    // DROP DATABASE of app_b while its pipeline streams. PostgreSQL refuses it at once while a
    // slot of the database is active (the worker's), WITH (FORCE) too: the error says so.
    writes(&mut b, 3);
    drop(b);
    assert_eq!(count_in(&c, "pg_tide worker", "app_b").unwrap(), 1);
    let err = c
        .try_execute("DROP DATABASE app_b")
        .expect_err("DROP DATABASE with an active slot");
    assert_db_error(&err, "55006", None);
    // The documented way: close the database to connections; pg_tide's processes there leave
    // (their slots become inactive), and a plain DROP DATABASE then succeeds and drops the
    // slots with the database. app_a is not disturbed.
    writes(&mut a, 3);
    c.execute("ALTER DATABASE app_b ALLOW_CONNECTIONS false");
    c.wait_until(
        "no active slot of app_b and no pg_tide process in it",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT (SELECT count(*) FROM pg_replication_slots WHERE database = 'app_b' AND active)
                      + (SELECT count(*) FROM pg_stat_activity WHERE datname = 'app_b')",
            )? == 0)
        },
    );
    c.try_execute("DROP DATABASE app_b").unwrap_or_else(|e| {
        panic!(
            "DROP DATABASE after ALLOW_CONNECTIONS false: {}\n{}",
            describe_error(&e),
            c.log_tail(40)
        )
    });
    let slots: i64 = c.query_scalar(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name::text LIKE 'tide\\_%\\_orders\\_b'",
    );
    assert_eq!(slots, 0, "the slot of the dropped database's pipeline");
    writes(&mut a, 4);
    assert_target_equals_source(&c, "app_a", "orders_a");
    assert_eq!(
        worker_pid(&c, "app_a", "orders_a"),
        worker_a,
        "the worker of app_a was restarted by the DROP DATABASE of app_b"
    );
    assert_eq!(count_in(&c, LAUNCHER, "app_a").unwrap(), 1);
}

/// A database has a launcher only while it has pipelines (issue 44): none after `CREATE
/// EXTENSION` (tide.check() says so), one within seconds of the first `create_pipeline`'s
/// commit, none again once the last pipeline is dropped.
#[test]
fn the_first_pipeline_starts_a_launcher_and_the_last_drop_stops_it() {
    let c = start_cluster(Cluster::builder("multidb_ext"));
    c.execute("CREATE DATABASE app_c");
    let mut cl = c.connect_db("app_c");
    // No extension: no launcher stays in app_c (nor in postgres).
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(count_in(&c, LAUNCHER, "app_c").unwrap(), 0);
    assert_eq!(count_in(&c, LAUNCHER, "postgres").unwrap(), 0);

    // CREATE EXTENSION: still no launcher (no pipelines), and tide.check() says so.
    cl.batch_execute("CREATE EXTENSION pg_tide").unwrap();
    let check: String = cl.query_one("SELECT tide.check()", &[]).unwrap().get(0);
    assert!(
        check.contains("database \"app_c\", no launcher: no pipelines yet"),
        "{check}"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        count_in(&c, LAUNCHER, "app_c").unwrap(),
        0,
        "a launcher without pipelines"
    );

    cl.batch_execute("CREATE TABLE public.src (id int PRIMARY KEY, v text, n bigint)")
        .unwrap();
    cl.batch_execute(r#"SELECT tide.create_pipeline('orders_c', 'table', '{"schema": "rep"}')"#)
        .unwrap();
    cl.batch_execute("SELECT tide.add_table('orders_c', 'public.src')")
        .unwrap();
    wait_for_count(&c, LAUNCHER, "app_c", 1);
    let check: String = cl.query_one("SELECT tide.check()", &[]).unwrap().get(0);
    assert!(
        check.contains("database \"app_c\", launcher running"),
        "{check}"
    );
    writes(&mut cl, 1);
    assert_target_equals_source(&c, "app_c", "orders_c");

    // tide.database restricts: a list without app_c stops its launcher and worker, and
    // tide.check() there says why.
    c.execute("ALTER SYSTEM SET tide.database = 'postgres, \"other db\"'");
    c.execute("SELECT pg_reload_conf()");
    wait_for_count(&c, LAUNCHER, "app_c", 0);
    wait_for_count(&c, "pg_tide worker", "app_c", 0);
    let err = cl
        .query_one("SELECT tide.check()", &[])
        .expect_err("check in an unlisted database");
    assert_db_error(&err, "55000", Some("tide.database"));
    c.execute("ALTER SYSTEM RESET tide.database");
    c.execute("SELECT pg_reload_conf()");
    wait_for_count(&c, LAUNCHER, "app_c", 1);
    writes(&mut cl, 2);
    assert_target_equals_source(&c, "app_c", "orders_c");

    // The last pipeline dropped: the launcher leaves.
    cl.batch_execute("SELECT tide.drop_pipeline('orders_c')")
        .unwrap();
    wait_for_count(&c, LAUNCHER, "app_c", 0);
    let check: String = cl.query_one("SELECT tide.check()", &[]).unwrap().get(0);
    assert!(check.contains("no launcher: no pipelines yet"), "{check}");
    // DROP and CREATE EXTENSION again: still none.
    cl.batch_execute("DROP EXTENSION pg_tide CASCADE; CREATE EXTENSION pg_tide")
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(count_in(&c, LAUNCHER, "app_c").unwrap(), 0);
    // A pipeline brings it back.
    cl.batch_execute("SELECT tide.create_pipeline('again')")
        .unwrap();
    wait_for_count(&c, LAUNCHER, "app_c", 1);
}
