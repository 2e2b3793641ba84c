//! `tide.add_tables_in_schema(pipeline, schema, backfill)` (issue 32 item 9), as a DBA runs it:
//! every call here is made by `alice`, a member of `tide_admin` with no other attribute, on her
//! own pipeline.
//!
//! - every ordinary and partitioned table of the schema is added, in name order, each as
//!   `tide.add_table` adds it (with its backfill), and each target ends equal to its source;
//! - a partition is captured through its partitioned table, not on its own;
//! - a table that cannot be captured (no key, unlogged) is skipped with a NOTICE naming it;
//! - calling it again adds 0; a table created later is added by the next call; the tables of
//!   the pipeline's target schema are skipped (they are its targets);
//! - an unknown schema is 3F000, pg_tide's own schema 42809, and a failing add undoes the whole
//!   call (all or nothing).
//!
//! Other roles (42501) are in `security/operations.rs`.

use pg_test::*;
use std::sync::{Arc, Mutex};

fn diag(c: &Cluster) -> String {
    diag_of(
        c,
        &[
            (
                "pipelines",
                "SELECT name, state, enabled, last_error FROM tide.pipelines",
                10,
            ),
            (
                "tables",
                "SELECT pipeline, relation, target_name FROM tide.pipeline_table ORDER BY relation",
                20,
            ),
            (
                "backfills",
                "SELECT id, relation, state, rows_read, error FROM tide.backfill ORDER BY id",
                20,
            ),
        ],
        30,
    )
}

/// A connection as `alice` whose NOTICEs are collected in the returned list.
fn connect_alice(c: &Cluster) -> (Client, Arc<Mutex<Vec<String>>>) {
    let notices = Arc::new(Mutex::new(Vec::new()));
    let sink = notices.clone();
    let mut cfg = c.config("postgres");
    cfg.user("alice");
    cfg.notice_callback(move |n| sink.lock().expect("notices").push(n.message().to_string()));
    let client = cfg
        .connect(NoTls)
        .unwrap_or_else(|e| panic!("connect as alice: {}", describe_error(&e)));
    (client, notices)
}

#[track_caller]
fn ok(cl: &mut Client, c: &Cluster, sql: &str) {
    if let Err(e) = cl.batch_execute(sql) {
        panic!(
            "as alice: {sql}\nfailed: {}\n{}",
            describe_error(&e),
            diag(c)
        );
    }
}

#[track_caller]
fn added(cl: &mut Client, c: &Cluster, sql: &str) -> i32 {
    match cl.query_one(sql, &[]) {
        Ok(r) => r.get(0),
        Err(e) => panic!(
            "as alice: {sql}\nfailed: {}\n{}",
            describe_error(&e),
            diag(c)
        ),
    }
}

fn captured(c: &Cluster) -> String {
    c.query_scalar::<Option<String>>(
        "SELECT string_agg(relation, ',' ORDER BY relation) FROM tide.pipeline_table WHERE pipeline = 'p'",
    )
    .unwrap_or_default()
}

#[test]
fn add_every_table_of_a_schema() {
    let c = setup("schema_add");
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA app AUTHORIZATION alice;
         CREATE SCHEMA copy AUTHORIZATION alice;",
    );
    let (mut alice, notices) = connect_alice(&c);
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.orders (id int PRIMARY KEY, v text);
         INSERT INTO app.orders SELECT g, 'o' || g FROM generate_series(1, 2000) g;
         CREATE TABLE app.customers (id int PRIMARY KEY, name text);
         CREATE TABLE app.items (id bigint PRIMARY KEY, qty int);
         CREATE TABLE app.events (id int PRIMARY KEY, at date) PARTITION BY RANGE (id);
         CREATE TABLE app.events_1 PARTITION OF app.events FOR VALUES FROM (0) TO (100);
         CREATE TABLE app.events_2 PARTITION OF app.events FOR VALUES FROM (100) TO (200);
         INSERT INTO app.events SELECT g, date '2026-01-01' + g FROM generate_series(0, 199) g;
         CREATE TABLE app.log (line text);
         INSERT INTO app.log VALUES ('no key');
         CREATE UNLOGGED TABLE app.scratch (id int PRIMARY KEY);
         CREATE VIEW app.big_orders AS SELECT * FROM app.orders WHERE id > 1000;",
    );
    ok(
        &mut alice,
        &c,
        r#"SELECT tide.create_pipeline('p', 'table', '{"schema": "copy"}')"#,
    );
    // Unknown schema; pg_tide's own.
    expect_fail_with(
        "an unknown schema",
        alice.batch_execute("SELECT tide.add_tables_in_schema('p', 'no_such')"),
        "3F000",
        Some("pg_namespace"),
    );
    expect_fail_with(
        "pg_tide's schema",
        alice.batch_execute("SELECT tide.add_tables_in_schema('p', 'tide')"),
        "42809",
        Some("schema of your own"),
    );
    assert_eq!(captured(&c), "", "a refused call added tables");

    notices.lock().expect("notices").clear();
    let n = added(
        &mut alice,
        &c,
        "SELECT tide.add_tables_in_schema('p', 'app')",
    );
    assert_eq!(n, 4, "customers, events, items, orders\n{}", diag(&c));
    assert_eq!(
        captured(&c),
        "app.customers,app.events,app.items,app.orders",
        "the partitions, the keyless, unlogged table and the view are not captured"
    );
    // In name order: the add markers (and so the backfills) are queued in that order.
    assert_eq!(
        c.query_scalar::<String>("SELECT string_agg(relation, ',' ORDER BY id) FROM tide.backfill"),
        "app.customers,app.events,app.items,app.orders"
    );
    let seen = notices.lock().expect("notices").clone();
    for (table, why) in [
        ("app.log", "has no primary key"),
        ("app.scratch", "unlogged"),
    ] {
        assert!(
            seen.iter()
                .any(|n| n.starts_with(&format!("skipping {table}:")) && n.contains(why)),
            "no NOTICE for {table} ({why}): {seen:?}"
        );
    }
    // Changes after the add are captured too.
    ok(
        &mut alice,
        &c,
        "INSERT INTO app.customers SELECT g, 'c' || g FROM generate_series(1, 50) g;
         INSERT INTO app.items SELECT g, g FROM generate_series(1, 30) g;
         UPDATE app.orders SET v = 'changed' WHERE id % 7 = 0;
         DELETE FROM app.events WHERE id % 5 = 0;",
    );
    for t in ["app.customers", "app.events", "app.items", "app.orders"] {
        wait_for_backfill(&c, t, Some("p"), 120, || diag(&c));
    }
    wait_for_pipeline(&c, "p", 60, || diag(&c));
    for (t, cols) in [
        ("customers", "id, name"),
        ("events", "id, at"),
        ("items", "id, qty"),
        ("orders", "id, v"),
    ] {
        assert_same_rows(t, &c, &format!("app.{t}"), &c, &format!("copy.{t}"), cols);
    }

    // Again: nothing new to add.
    let n = added(
        &mut alice,
        &c,
        "SELECT tide.add_tables_in_schema('p', 'app', backfill => false)",
    );
    assert_eq!(n, 0, "a second call added tables\n{}", diag(&c));
    // The pipeline's own target schema: every table there is a target, skipped with a NOTICE.
    notices.lock().expect("notices").clear();
    let n = added(
        &mut alice,
        &c,
        "SELECT tide.add_tables_in_schema('p', 'copy')",
    );
    assert_eq!(n, 0, "a target was captured\n{}", diag(&c));
    let seen = notices.lock().expect("notices").clone();
    assert_eq!(
        seen.iter()
            .filter(|n| n.starts_with("skipping copy.")
                && n.contains("is a table target of pipeline \"p\""))
            .count(),
        4,
        "one NOTICE per target: {seen:?}"
    );

    // A table created later is added by the next call, with its rows (backfill).
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.later (id int PRIMARY KEY, v int);
         INSERT INTO app.later SELECT g, g FROM generate_series(1, 300) g;",
    );
    let n = added(
        &mut alice,
        &c,
        "SELECT tide.add_tables_in_schema('p', 'app')",
    );
    assert_eq!(n, 1, "app.later\n{}", diag(&c));
    wait_for_backfill(&c, "app.later", Some("p"), 60, || diag(&c));
    wait_for_pipeline(&c, "p", 60, || diag(&c));
    assert_same_rows("later", &c, "app.later", &c, "copy.later", "id, v");

    // All or nothing: a failing add (its target exists with another shape) undoes the adds
    // before it in the same call.
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.a1 (id int PRIMARY KEY);
         CREATE TABLE app.z9 (id int PRIMARY KEY, v int);
         CREATE TABLE copy.z9 (other text PRIMARY KEY);",
    );
    let e = expect_db_error(alice.query_one("SELECT tide.add_tables_in_schema('p', 'app')", &[]));
    eprintln!("  the failing add: {} {}", e.code().code(), e.message());
    assert!(
        e.message().contains("z9"),
        "the error names the table whose add failed: {}",
        e.message()
    );
    assert!(
        !captured(&c).contains("app.a1"),
        "app.a1 stayed captured after the call failed: {}",
        captured(&c)
    );
}
