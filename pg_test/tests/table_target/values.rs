//! Values at the target: json text kept exactly; unchanged TOAST values stay at the target.

use crate::common::*;

/// A `json` column keeps its text exactly (whitespace, key order, duplicate keys, a bare JSON
/// string's escapes) at local and remote table targets, through the backfill and through the
/// stream. (Through jsonb, as the targets' statements once parsed the rows, objects and arrays
/// arrived normalized; through json_populate_recordset, a bare string arrived re-escaped: a
/// permanent difference that verify reports and repair cannot fix. This test failed so.)
#[test]
fn json_text_reaches_table_targets_exactly() {
    let (c, t) = setup_remote("tt_json");
    let values = [
        r#"{"b": 1,  "a": [1, 2.50]}"#,
        r#"{"a":1,"a":2}"#,
        "[1, 2.50,\n 3e2]",
        r#""str\u00e9""#,
    ];
    c.execute("CREATE TABLE j (id int PRIMARY KEY, k json, b jsonb)");
    for (i, v) in values.iter().enumerate() {
        c.execute(&format!(
            "INSERT INTO j VALUES ({i}, '{}', '{}')",
            v.replace('\'', "''"),
            v.replace('\'', "''")
        ));
    }
    create_pipeline(&c, "lj", "table", r#"{"schema": "rep"}"#);
    create_pipeline(&c, "rj", "postgres", r#"{"server": "tgt"}"#);
    exec(&c, "SELECT tide.add_table('lj', 'j')");
    exec(&c, "SELECT tide.add_table('rj', 'j')");
    wait_backfill(&c, "j", "lj", 60);
    wait_backfill(&c, "j", "rj", 60);
    // And through the stream.
    for (i, v) in values.iter().enumerate() {
        c.execute(&format!(
            "INSERT INTO j VALUES ({}, '{}', '{}')",
            i + 100,
            v.replace('\'', "''"),
            v.replace('\'', "''")
        ));
    }
    wait_pipeline(&c, "lj", 60);
    wait_pipeline(&c, "rj", 60);
    let rows = |cl: &Cluster, table: &str| -> Vec<(i32, String, String)> {
        cl.query(&format!(
            "SELECT id, k::text, b::text FROM {table} ORDER BY id"
        ))
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
    };
    let src = rows(&c, "public.j");
    assert_eq!(src.len(), 2 * values.len());
    assert_eq!(src[0].1, values[0], "the source keeps the json text");
    assert_eq!(rows(&c, "rep.j"), src, "local target");
    assert_eq!(rows(&t, "public.j"), src, "remote target");
}

#[test]
fn toast_unchanged_keeps_target_value() {
    let c = setup("tt_toast");
    // ~100 kB of random hex per row, stored out of line and uncompressed.
    c.execute(
        "CREATE TABLE docs (id int PRIMARY KEY, small int NOT NULL, big text);
         ALTER TABLE docs ALTER COLUMN big SET STORAGE EXTERNAL;
         CREATE FUNCTION big_value(seed text) RETURNS text LANGUAGE sql AS
           $$ SELECT string_agg(md5(seed || '-' || i || '-' || random()), '') FROM generate_series(1, 3200) i $$;
         INSERT INTO docs SELECT g, 0, big_value('seed' || g) FROM generate_series(1, 5) g;",
    );
    let toasted: i64 = c.query_scalar(
        "SELECT count(*) FROM docs WHERE pg_column_size(big) > 90000 AND pg_column_size(big) < octet_length(big) + 100",
    );
    assert_eq!(toasted, 5, "the big values are not ~100 kB uncompressed");
    create_pipeline(&c, "tt", "table", r#"{"schema": "rep"}"#);
    // An outbox pipeline too, to prove the updates below do send big as unchanged TOAST.
    create_pipeline(&c, "ob", "outbox", "{}");
    exec(&c, "SELECT tide.add_table('tt', 'docs')");
    exec(&c, "SELECT tide.add_table('ob', 'docs', backfill => false)");
    wait_backfill(&c, "docs", "tt", 60);
    // Rows arriving through the stream too.
    c.execute(
        "INSERT INTO docs SELECT g, 0, big_value('stream' || g) FROM generate_series(6, 8) g",
    );
    wait_pipeline(&c, "tt", 60);
    let cols = "id, small, md5(big), length(big)";
    assert_same_rows(
        "after backfill and inserts",
        &c,
        "public.docs",
        &c,
        "rep.docs",
        cols,
    );

    // Only the small column changes (several times, and mixed with a change of big in one
    // transaction).
    c.execute("UPDATE docs SET small = small + 1");
    c.execute("UPDATE docs SET small = small + 10 WHERE id % 2 = 0");
    c.execute(
        "BEGIN;
         UPDATE docs SET small = small + 100 WHERE id = 1;
         UPDATE docs SET big = big_value('changed'), small = small + 100 WHERE id = 2;
         UPDATE docs SET small = small + 100 WHERE id = 3;
         COMMIT;",
    );
    wait_pipeline(&c, "tt", 60);
    wait_pipeline(&c, "ob", 60);
    let unchanged_events: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE pipeline = 'ob' AND op = 'update' AND 'big' = ANY (unchanged)",
    );
    assert!(
        unchanged_events >= 8,
        "only {unchanged_events} update events sent big as unchanged TOAST: the test does not exercise the case\n{}",
        sample(&c, "SELECT id, op, key, unchanged FROM tide.outbox WHERE pipeline = 'ob'", 20)
    );
    let t_small: Vec<String> = texts(&c, "SELECT row(id, small)::text FROM rep.docs ORDER BY id");
    let s_small: Vec<String> = texts(&c, "SELECT row(id, small)::text FROM docs ORDER BY id");
    assert_eq!(t_small, s_small, "the small column did not follow");
    let nulls: i64 =
        c.query_scalar("SELECT count(*) FROM rep.docs WHERE big IS NULL OR length(big) < 100000");
    assert_eq!(
        nulls,
        0,
        "the target lost big values:\n{}",
        sample(&c, "SELECT id, small, length(big) FROM rep.docs", 10)
    );
    assert_same_rows(
        "after small-column updates",
        &c,
        "public.docs",
        &c,
        "rep.docs",
        cols,
    );
    eprintln!(
        "toast: {unchanged_events} updates with big unchanged; big values intact at the target"
    );
}
