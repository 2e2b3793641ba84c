//! Target tables: created when missing (same columns, types, NOT NULL and key as the source),
//! checked when present; option errors.

use crate::common::*;
use std::time::{Duration, Instant};

/// (column, type, not null) of a table, in column order; and its primary key columns in key
/// order.
fn shape(c: &Cluster, table: &str) -> (Vec<(String, String, bool)>, Vec<String>) {
    let cols = c
        .query(&format!(
            "SELECT attname::text, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute
              WHERE attrelid = to_regclass('{table}') AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        ))
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let key = texts(
        c,
        &format!(
            "SELECT a.attname::text FROM pg_index i
               JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
              WHERE i.indrelid = to_regclass('{table}') AND i.indisprimary ORDER BY k.ord"
        ),
    );
    (cols, key)
}

/// `target` (on `tgt`), created by add_table, has the columns (names, types, NOT NULL, in order)
/// and the primary key of `source` (on `src`); `what` names the target in the failure. Returns
/// the source's key.
#[track_caller]
fn assert_same_shape(
    what: &str,
    src: &Cluster,
    source: &str,
    tgt: &Cluster,
    target: &str,
) -> Vec<String> {
    let (src_cols, src_key) = shape(src, source);
    let (tgt_cols, tgt_key) = shape(tgt, target);
    assert_eq!(
        tgt_cols, src_cols,
        "the created {what}'s columns differ from the source's"
    );
    assert_eq!(
        tgt_key, src_key,
        "the created {what}'s primary key differs from the source's"
    );
    src_key
}

/// `sql`, an add_table of the table `mism` whose existing target differs from it, fails with
/// 42P16 and a DETAIL naming each difference (the missing column, the column of another type,
/// the key). Returns the DETAIL.
#[track_caller]
fn expect_mismatch(c: &Cluster, sql: &str) -> String {
    let db = expect_fail(c, sql, "42P16", None);
    let detail = db.detail().unwrap_or("").to_string();
    for needle in ["missing_col", "typed_col", "key"] {
        assert!(
            detail.contains(needle),
            "the DETAIL does not mention {needle:?}: {detail:?}"
        );
    }
    detail
}

#[test]
fn target_table_checks() {
    let c = setup("tt_checks");
    c.execute(
        "CREATE TABLE shape_src (a int, b text, v numeric(10,2) NOT NULL, t varchar(20), arr int[], ts timestamptz DEFAULT now(),
                                 PRIMARY KEY (b, a));
         CREATE TABLE pre (id int PRIMARY KEY, a int NOT NULL, s text);
         CREATE TABLE mism (id int PRIMARY KEY, missing_col int, typed_col int, ok_col text);
         CREATE TABLE named (id int PRIMARY KEY, x text);
         CREATE TABLE named2 (id int PRIMARY KEY, x text);",
    );
    create_pipeline(&c, "l", "table", r#"{"schema": "rep"}"#);

    // Created when missing: same columns, types, NOT NULL and key as the source.
    exec(&c, "SELECT tide.add_table('l', 'shape_src')");
    let src_key = assert_same_shape("target", &c, "public.shape_src", &c, "rep.shape_src");
    assert_eq!(src_key, vec!["b".to_string(), "a".to_string()]);

    // target_table: 'name' (in the schema option) and 'schema.name'.
    exec(
        &c,
        "SELECT tide.add_table('l', 'named', target_table => 'renamed')",
    );
    exec(
        &c,
        "SELECT tide.add_table('l', 'named2', target_table => 'elsewhere.other_name')",
    );
    assert!(c.query_scalar::<bool>("SELECT to_regclass('rep.renamed') IS NOT NULL AND to_regclass('elsewhere.other_name') IS NOT NULL"));

    // An existing matching table is used as it is (wider compatible type, extra row kept).
    c.execute(
        "CREATE TABLE rep.pre (id int PRIMARY KEY, a bigint NOT NULL, s text);
         INSERT INTO rep.pre VALUES (-1, -1, 'was here before');",
    );
    exec(&c, "SELECT tide.add_table('l', 'pre', backfill => false)");
    c.execute(
        "INSERT INTO pre VALUES (1, 10, 'one'), (2, 20, 'two');
         INSERT INTO shape_src (a, b, v, t, arr) VALUES (1, 'k', 1.5, 'short', '{1,2}');
         INSERT INTO named VALUES (1, 'n'); INSERT INTO named2 VALUES (1, 'n2');",
    );
    wait_pipeline(&c, "l", 60);
    assert_eq!(
        texts(&c, "SELECT row(id, a, s)::text FROM rep.pre ORDER BY id"),
        vec!["(-1,-1,\"was here before\")", "(1,10,one)", "(2,20,two)"],
        "the existing target table was not used as it is"
    );
    assert_same_rows(
        "shape_src",
        &c,
        "public.shape_src",
        &c,
        "rep.shape_src",
        "a, b, v, t, arr, ts",
    );
    assert_same_rows("named", &c, "public.named", &c, "rep.renamed", "id, x");
    assert_same_rows(
        "named2",
        &c,
        "public.named2",
        &c,
        "elsewhere.other_name",
        "id, x",
    );
    assert_eq!(
        c.query_scalar::<String>("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'rep.pre'::regclass AND attname = 'a'"),
        "bigint",
        "the existing table was altered"
    );

    // A mismatching one: each difference in the DETAIL, nothing captured.
    c.execute("CREATE TABLE rep.mism (id int, typed_col text, ok_col text, other int PRIMARY KEY)");
    let detail = expect_mismatch(&c, "SELECT tide.add_table('l', 'mism')");
    assert!(
        !detail.contains("ok_col"),
        "the DETAIL lists a column that matches: {detail:?}"
    );
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM tide.pipeline_table WHERE relid = 'mism'::regclass"
        ),
        0,
        "a refused table is captured anyway"
    );
    // Only a different key.
    c.execute("CREATE TABLE rep.named3 (id int, x text PRIMARY KEY); CREATE TABLE named3 (id int PRIMARY KEY, x text);");
    let db = expect_fail(&c, "SELECT tide.add_table('l', 'named3')", "42P16", None);
    assert!(
        db.detail().unwrap_or("").contains("key"),
        "DETAIL: {:?}",
        db.detail()
    );

    // The source itself as the target.
    expect_fail(
        &c,
        "SELECT tide.add_table('l', 'mism', target_table => 'public.mism')",
        "22023",
        None,
    );
    create_pipeline(&c, "selfp", "table", r#"{"schema": "public"}"#);
    expect_fail(&c, "SELECT tide.add_table('selfp', 'mism')", "22023", None);

    // target_table on an outbox pipeline.
    create_pipeline(&c, "ob", "outbox", "{}");
    expect_fail(
        &c,
        "SELECT tide.add_table('ob', 'mism', target_table => 'x.y')",
        "22023",
        None,
    );

    // Options.
    expect_fail(
        &c,
        "SELECT tide.create_pipeline('e1', 'table', '{}')",
        "22023",
        Some("schema"),
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e2', 'table', '{"schema": 5}')"#,
        "22023",
        None,
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e3', 'table', '{"schema": "r", "schema_changes": "later"}')"#,
        "22023",
        None,
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e4', 'table', '{"schema": "r", "schema_changes": 1}')"#,
        "22023",
        None,
    );
    expect_fail(
        &c,
        "SELECT tide.create_pipeline('e5', 'postgres', '{}')",
        "22023",
        Some("server"),
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e6', 'postgres', '{"server": 7}')"#,
        "22023",
        None,
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e7', 'postgres', '{"server": "nope"}')"#,
        "42704",
        Some("CREATE SERVER"),
    );
    c.execute(
        "CREATE EXTENSION postgres_fdw;
         CREATE FOREIGN DATA WRAPPER dummy_fdw;
         CREATE SERVER dummy FOREIGN DATA WRAPPER dummy_fdw;
         CREATE USER MAPPING FOR postgres SERVER dummy;
         CREATE SERVER nomap FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1', port '1', dbname 'postgres');
         CREATE SERVER down FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1', port '1', dbname 'postgres');
         CREATE USER MAPPING FOR postgres SERVER down OPTIONS (user 'postgres');",
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e8', 'postgres', '{"server": "dummy"}')"#,
        "22023",
        None,
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e9', 'postgres', '{"server": "nomap"}')"#,
        "42704",
        Some("CREATE USER MAPPING"),
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e10', 'postgres', '{"server": "down"}')"#,
        "08001",
        None,
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.pipeline WHERE name LIKE 'e%'"),
        0,
        "a refused pipeline was created"
    );
}

#[test]
fn target_table_checks_remote() {
    let (c, t) = setup_remote("tt_checks_remote");
    c.execute(
        "CREATE TABLE shape_src (a int, b text, v numeric(10,2) NOT NULL, t varchar(20), arr int[], PRIMARY KEY (b, a));
         CREATE TABLE pre (id int PRIMARY KEY, a int NOT NULL);
         CREATE TABLE mism (id int PRIMARY KEY, missing_col int, typed_col int);
         CREATE TABLE named (id int PRIMARY KEY, x text);
         CREATE TABLE later (id int PRIMARY KEY, x text);",
    );
    // schema defaults to public on the remote.
    create_pipeline(&c, "r", "postgres", r#"{"server": "tgt"}"#);
    exec(&c, "SELECT tide.add_table('r', 'shape_src')");
    assert_same_shape(
        "remote target",
        &c,
        "public.shape_src",
        &t,
        "public.shape_src",
    );
    // On another server, a table named like the source is not the source: no 22023.
    exec(
        &c,
        "SELECT tide.add_table('r', 'named', target_table => 'other.named_here')",
    );
    t.execute(
        "CREATE TABLE public.pre (id int PRIMARY KEY, a bigint NOT NULL);
         INSERT INTO public.pre VALUES (-1, -1);
         CREATE TABLE public.mism (id int, typed_col text, other int PRIMARY KEY);",
    );
    exec(&c, "SELECT tide.add_table('r', 'pre', backfill => false)");
    expect_mismatch(&c, "SELECT tide.add_table('r', 'mism')");
    c.execute(
        "INSERT INTO shape_src VALUES (1, 'k', 2.5, 'x', '{3}'); INSERT INTO pre VALUES (1, 1);
         INSERT INTO named VALUES (1, 'one');",
    );
    wait_pipeline(&c, "r", 60);
    assert_same_rows(
        "shape_src",
        &c,
        "public.shape_src",
        &t,
        "public.shape_src",
        "a, b, v, t, arr",
    );
    assert_same_rows("named", &c, "public.named", &t, "other.named_here", "id, x");
    assert_eq!(
        texts(&t, "SELECT row(id, a)::text FROM public.pre ORDER BY id"),
        vec!["(-1,-1)", "(1,1)"],
        "the existing remote table was not used as it is"
    );
    let n: i64 = t.query_scalar("SELECT count(*) FROM public.tide_applied WHERE pipeline = 'r'");
    assert_eq!(n, 1, "the remote has no applied position for pipeline r");

    // A schema option naming a schema the remote does not have yet: add_table creates it (with
    // the table); the new pipeline must not be in error before that.
    let t_rs = Instant::now();
    exec(
        &c,
        r#"SELECT tide.create_pipeline('rs', 'postgres', '{"server": "tgt", "schema": "replica"}')"#,
    );
    let streaming = poll_every(Duration::from_secs(15), POLL, || {
        Ok(c.try_query_scalar::<bool>(
            "SELECT coalesce((SELECT state = 'streaming' AND last_error IS NULL FROM tide.pipelines WHERE name = 'rs'), false)",
        )?)
    });
    let before_add = pipeline_row(&c, "rs");
    exec(&c, "SELECT tide.add_table('rs', 'later')");
    c.execute("INSERT INTO later VALUES (1, 'l')");
    wait_pipeline(&c, "rs", 60);
    assert_same_rows("later", &c, "public.later", &t, "replica.later", "id, x");
    assert_eq!(
        t.query_scalar::<i64>("SELECT count(*) FROM replica.tide_applied WHERE pipeline = 'rs'"),
        1,
        "the applied position is not kept in the schema option's schema"
    );
    if let Err(msg) = streaming {
        panic!(
            "a new 'postgres' pipeline whose schema option names a schema the remote does not have yet \
             is not streaming {:.1?} after create_pipeline ({msg}), before any add_table:\n{before_add}",
            t_rs.elapsed()
        );
    }
}
