//! A captured table changing: DDL while streaming; add_table / remove_table boundaries.

use crate::common::*;

/// `inside` in a transaction of another session that commits right after `between` ran: a
/// transaction that wrote before `between` and commits after it.
fn straddle(c: &Cluster, inside: &str, between: &str) {
    let mut straddler = c.client();
    straddler
        .batch_execute(&format!("BEGIN; {inside}"))
        .unwrap();
    c.execute(between);
    straddler.batch_execute("COMMIT").unwrap();
}

#[test]
fn ddl_does_not_stop_the_stream() {
    let c = setup("ddl");
    c.execute("CREATE TABLE orders (id int PRIMARY KEY, total integer)");
    capture_table(&c, "ddl", "orders");
    c.execute("INSERT INTO orders VALUES (1, 10), (2, 20)");
    wait_pipeline(&c, "ddl", 60);

    c.execute("ALTER TABLE orders ADD COLUMN extra text DEFAULT 'x'");
    c.execute("INSERT INTO orders (id, total) VALUES (3, 30)");
    c.execute("UPDATE orders SET total = total + 1, extra = 'y' WHERE id = 1");
    // Change the type while the worker runs, in the same transaction as writes around it.
    c.execute(
        "BEGIN;
         INSERT INTO orders (id, total) VALUES (4, 40);
         ALTER TABLE orders ALTER COLUMN total TYPE numeric(12,2);
         INSERT INTO orders (id, total) VALUES (5, 5);
         COMMIT;",
    );
    c.execute("UPDATE orders SET total = total + 0.5 WHERE id = 2");
    c.execute("ALTER TABLE orders DROP COLUMN extra");
    c.execute("INSERT INTO orders VALUES (6, 6.25)");
    wait_pipeline(&c, "ddl", 60);

    // Row events, and the schema events (what they change) exactly where each ALTER TABLE
    // took effect, in the middle of a transaction too.
    let rows: Vec<(String, String)> = c
        .query(
            "SELECT op, CASE WHEN op = 'schema'
                             THEN jsonb_build_object('added', \"row\"->'added', 'dropped', \"row\"->'dropped',
                                                     'changed', \"row\"->'changed', 'rewrite', \"row\"->'rewrite')
                             ELSE \"row\" END::text
               FROM tide.outbox WHERE pipeline = 'ddl' ORDER BY id",
        )
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let expected = [
        ("insert", r#"{"id": 1, "total": 10}"#),
        ("insert", r#"{"id": 2, "total": 20}"#),
        (
            "schema",
            r#"{"added": [{"name": "extra", "type": "text", "value": "x"}], "changed": [], "dropped": [], "rewrite": false}"#,
        ),
        ("insert", r#"{"id": 3, "extra": "x", "total": 30}"#),
        ("update", r#"{"id": 1, "extra": "y", "total": 11}"#),
        ("insert", r#"{"id": 4, "extra": "x", "total": 40}"#),
        (
            "schema",
            r#"{"added": [], "changed": [{"to": "numeric(12,2)", "from": "integer", "name": "total"}], "dropped": [], "rewrite": true}"#,
        ),
        ("insert", r#"{"id": 5, "extra": "x", "total": 5.00}"#),
        ("update", r#"{"id": 2, "extra": "x", "total": 20.50}"#),
        (
            "schema",
            r#"{"added": [], "changed": [], "dropped": ["extra"], "rewrite": false}"#,
        ),
        ("insert", r#"{"id": 6, "total": 6.25}"#),
    ];
    let got: Vec<(&str, &str)> = rows.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert_eq!(got, expected, "{}", diag(&c));
    let total5: String = c.query_scalar(
        "SELECT (\"row\"->'total')::text FROM tide.outbox WHERE pipeline = 'ddl' AND \"row\"->>'id' = '5'",
    );
    assert_eq!(total5, "5.00", "numeric(12,2) must keep its scale");

    let r = c.query_one(
        "SELECT state, last_error, (SELECT bool_and(state = 'capturing') FROM tide.tables WHERE pipeline = 'ddl')
           FROM tide.pipelines WHERE name = 'ddl'",
    );
    let (state, err, capturing): (String, Option<String>, Option<bool>) =
        (r.get(0), r.get(1), r.get(2));
    assert_eq!(state, "streaming", "{}", diag(&c));
    assert_eq!(err, None);
    assert_eq!(capturing, Some(true));
    assert_stream_invariants(&c, "ddl");
}

#[test]
fn add_and_remove_table_boundaries() {
    let c = setup("membership");
    c.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE other (id int PRIMARY KEY)",
    );
    capture_table(&c, "m", "other");
    c.execute("INSERT INTO t SELECT g, 'before' FROM generate_series(1, 5) g");

    // A transaction that wrote before add_table but commits after it: its changes are delivered.
    straddle(
        &c,
        "INSERT INTO t VALUES (100, 'straddles add')",
        "SELECT tide.add_table('m', 't', backfill => false)",
    );
    c.execute("INSERT INTO t SELECT g, 'after add' FROM generate_series(6, 10) g");
    c.execute("UPDATE t SET v = 'updated' WHERE id = 1");
    c.execute("INSERT INTO other VALUES (1)");
    wait_pipeline(&c, "m", 60);

    let mut want = inserts([100]);
    want.extend(inserts(6..=10));
    want.push("update:1".into());
    assert_eq!(events(&c, "m", "public.t"), want, "{}", diag(&c));
    assert_eq!(events(&c, "m", "public.other"), inserts([1]));
    let r = c.query_one("SELECT state = 'capturing', added_lsn IS NOT NULL FROM tide.tables WHERE pipeline = 'm' AND relation = 'public.t'");
    assert!(
        r.get::<_, bool>(0) && r.get::<_, bool>(1),
        "tide.tables does not show t as capturing"
    );

    // remove_table: a change committed before it is delivered, one that commits after it is not.
    c.execute("INSERT INTO t VALUES (11, 'before remove')");
    straddle(
        &c,
        "INSERT INTO t VALUES (200, 'straddles remove')",
        "SELECT tide.remove_table('m', 't')",
    );
    c.execute("INSERT INTO t SELECT g, 'after remove' FROM generate_series(12, 15) g");
    c.execute("DELETE FROM t WHERE id = 2");
    c.execute("INSERT INTO other VALUES (2)");
    wait_pipeline(&c, "m", 60);
    want.extend(inserts([11]));
    assert_eq!(events(&c, "m", "public.t"), want, "{}", diag(&c));
    assert_eq!(events(&c, "m", "public.other"), inserts([1, 2]));
    let n: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.tables WHERE pipeline = 'm' AND relation = 'public.t'",
    );
    assert_eq!(n, 0, "t is still listed in tide.tables after remove_table");

    // Re-add: delivered again from the new add on.
    c.execute("SELECT tide.add_table('m', 't', backfill => false)");
    c.execute("INSERT INTO t SELECT g, 're-added' FROM generate_series(16, 18) g");
    c.execute("DELETE FROM t WHERE id = 3");
    wait_pipeline(&c, "m", 60);
    want.extend(inserts(16..=18));
    want.push("delete:3".into());
    assert_eq!(events(&c, "m", "public.t"), want, "{}", diag(&c));
    assert_stream_invariants(&c, "m");
}
