//! Scenarios of PostgreSQL's subscription TAP tests (`src/test/subscription/t/*.pl`) that
//! pg_tide failed when ported (issue 45), at a local table target and a remote one.

use crate::common::*;

/// 001_rep_changes, `tab_include`: a primary key with INCLUDE columns is a key of its key
/// columns only. pg_tide took every column of the index as the key: the local target was
/// created with `UNIQUE (a, b)` and `b NOT NULL` (the insert of rows without `b` failed with
/// 23502), and a remote target made as the source is (`PRIMARY KEY (a) INCLUDE (b)`) refused
/// `ON CONFLICT (a, b)` with 42P10. Now both converge to PostgreSQL's expected `20|-20|-1`, and
/// the local target's key is `a` alone with `b` nullable.
#[test]
fn primary_key_with_include_columns() {
    let (c, t) = setup_remote("sub_include");
    let ddl =
        "CREATE TABLE tab_include (a int, b text, CONSTRAINT covering PRIMARY KEY (a) INCLUDE (b))";
    c.execute(&format!("{ddl}; CREATE SCHEMA loc;"));
    t.execute(ddl);
    create_pipeline(&c, "l", "table", r#"{"schema": "loc"}"#);
    create_pipeline(&c, "r", "postgres", r#"{"server": "tgt"}"#);
    exec(
        &c,
        "SELECT tide.add_table('l', 'tab_include', backfill => false);
         SELECT tide.add_table('r', 'tab_include', backfill => false);",
    );
    c.execute("INSERT INTO tab_include SELECT generate_series(1, 50)");
    c.execute("DELETE FROM tab_include WHERE a > 20");
    c.execute("UPDATE tab_include SET a = -a");
    wait_pipeline(&c, "l", 60);
    wait_pipeline(&c, "r", 60);
    let expect = "20|-20|-1";
    let shown = |cl: &Cluster, table: &str| -> String {
        cl.query_scalar(&format!(
            "SELECT count(*) || '|' || min(a) || '|' || max(a) FROM {table}"
        ))
    };
    assert_eq!(shown(&c, "tab_include"), expect, "the source");
    assert_eq!(
        shown(&c, "loc.tab_include"),
        expect,
        "the local target\n{}",
        diag(&c)
    );
    assert_eq!(
        shown(&t, "tab_include"),
        expect,
        "the remote target\n{}",
        diag(&c)
    );
    let key: Vec<String> = c
        .query(
            "SELECT a.attname::text FROM pg_index i
               JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, ord) ON k.ord <= i.indnkeyatts
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
              WHERE i.indrelid = 'loc.tab_include'::regclass AND i.indisunique",
        )
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(key, ["a"], "the local target's key");
    let b_nullable: bool = c.query_scalar(
        "SELECT NOT attnotnull FROM pg_attribute WHERE attrelid = 'loc.tab_include'::regclass AND attname = 'b'",
    );
    assert!(b_nullable, "b is an ordinary column at the local target");
    assert_same_rows(
        "loc = source",
        &c,
        "tab_include",
        &c,
        "loc.tab_include",
        "a, b",
    );
}
