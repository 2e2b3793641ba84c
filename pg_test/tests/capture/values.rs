//! Values: every type round trips through the outbox; an unchanged out-of-line (TOAST) value is
//! listed as unchanged, never sent as a placeholder.

use crate::common::*;

#[test]
fn types_round_trip() {
    let c = setup("types");
    c.execute(
        r#"
CREATE TYPE mood AS ENUM ('sad', 'ok', 'it''s "fine"');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TABLE src (
    id          int PRIMARY KEY,
    c_int2      smallint,
    c_int4      integer,
    c_int8      bigint,
    c_num       numeric(30,10),
    c_numany    numeric,
    c_real      real,
    c_dbl       double precision,
    c_bool      boolean,
    c_text      text,
    c_vc        varchar(10),
    c_ch        char(3),
    c_bytea     bytea,
    c_uuid      uuid,
    c_date      date,
    c_time      time,
    c_timetz    timetz,
    c_ts        timestamp,
    c_tstz      timestamptz,
    c_iv        interval,
    c_json      json,
    c_jsonb     jsonb,
    c_intarr    int[],
    c_textarr   text[],
    c_numarr    numeric[],
    c_enum      mood,
    c_dom       posint,
    c_inet      inet,
    c_cidr      cidr,
    c_mac       macaddr,
    c_point     point,
    c_range     int4range,
    c_tsv       tsvector,
    c_bit       bit(4),
    c_varbit    varbit,
    c_oid       oid,
    "Mixed Case ""col"""  text
);
"#,
    );
    capture_table(&c, "types", "src");

    c.execute(
        r#"
INSERT INTO src VALUES (1, -32768, 2147483647, -9223372036854775808,
    12345678901234567890.0123456789, 'NaN', 1.1, 1e300, true,
    E'He said "hi" \\ back\\slash\nline 2\ttab ünïcødé 😀 \u2028',
    'ünï "x"', 'ab', '\x00ff10', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
    '2024-02-29', '23:59:59.999999', '12:00:00+05:30', '2000-01-01 00:00:00.123456',
    '2024-06-01 12:34:56.789+02', '1 year 2 mons 3 days 04:05:06.789',
    '{"b": 1,   "a": [1, 2.50, "x"], "a": "dup"}', '{"k": "v", "n": null, "e": "\u00e9"}',
    '{1,2,NULL,4}', ARRAY['a "q"', NULL, 'b\c', '', 'NULL', 'x,y', '{}'], '{1.50,NaN,-0.001}',
    'it''s "fine"', 42, '192.168.1.5/24', '10.0.0.0/8', '08:00:2b:01:02:03', '(1.5,-2.25)',
    '[1,10)', 'a fat cat sat', B'1010', B'101', 12345, 'x');
INSERT INTO src (id, c_real, c_dbl, c_numany, c_int4, c_text, c_json, c_jsonb, c_textarr, c_intarr, c_bytea)
    VALUES (2, '-0', '-0', '-0.000', 0, '', '"just a string"', '[1, "two", {"3": [4]}]', '{}', '{{1,2},{3,4}}', '\x');
INSERT INTO src (id, c_real, c_dbl, c_numany, c_num) VALUES (3, 'Infinity', '-Infinity', 'Infinity', -0.0000000001);
INSERT INTO src (id, c_real, c_dbl, c_numany) VALUES (4, 'NaN', 'NaN', '-Infinity');
INSERT INTO src (id) VALUES (5);
INSERT INTO src (id, c_text, c_vc, c_ch, c_int8, c_dbl, c_real, c_date, c_ts, c_tstz, c_iv, c_jsonb, "Mixed Case ""col""")
    VALUES (6, E'ctl \x01\x1f end {"not": "json"}', '', 'abc', 9223372036854775807,
            5e-324, 3.4028235e38, 'infinity', 'infinity', '-infinity', '-1 day -00:00:01',
            '"\\u0000 is not allowed, but \\\\ is"', E'quote'' and \\');
INSERT INTO src (id, c_dbl, c_real, c_num, c_numany) VALUES (7, 0.1, 1e-45, 0, 1e-100);
"#,
    );
    // An update carries the whole new row too: row 4 gets row 1's values.
    c.execute(
        "UPDATE src SET (c_int2, c_int4, c_int8, c_num, c_numany, c_real, c_dbl, c_bool, c_text, c_vc, c_ch,
                         c_bytea, c_uuid, c_date, c_time, c_timetz, c_ts, c_tstz, c_iv, c_json, c_jsonb,
                         c_intarr, c_textarr, c_numarr, c_enum, c_dom, c_inet, c_cidr, c_mac, c_point,
                         c_range, c_tsv, c_bit, c_varbit, c_oid)
                    = (SELECT c_int2, c_int4, c_int8, c_num, c_numany, c_real, c_dbl, c_bool, c_text, c_vc, c_ch,
                              c_bytea, c_uuid, c_date, c_time, c_timetz, c_ts, c_tstz, c_iv, c_json, c_jsonb,
                              c_intarr, c_textarr, c_numarr, c_enum, c_dom, c_inet, c_cidr, c_mac, c_point,
                              c_range, c_tsv, c_bit, c_varbit, c_oid FROM src WHERE id = 1)
          WHERE id = 4",
    );
    wait_pipeline(&c, "types", 60);

    let nrows: i64 = c.query_scalar("SELECT count(*) FROM src");
    let ninserts: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE pipeline = 'types' AND relation = 'public.src' AND op = 'insert'",
    );
    assert_eq!(ninserts, nrows, "one insert event per source row");
    assert_no_rows(
        &c,
        "events with unchanged columns or a key other than {id}",
        "SELECT id, key, unchanged FROM tide.outbox WHERE pipeline = 'types'
          AND (unchanged IS NOT NULL OR key - 'id' <> '{}'::jsonb OR NOT key ? 'id')",
    );
    // The insert of the all-NULL row carries every column as JSON null.
    let all_null: String = c.query_scalar(
        "SELECT \"row\"::text FROM tide.outbox WHERE pipeline = 'types' AND op = 'insert' AND key = '{\"id\": 5}'",
    );
    let ncols: i64 = c.query_scalar(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = 'src'::regclass AND attnum > 0 AND NOT attisdropped",
    );
    let keys: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM jsonb_object_keys('{}'::jsonb)",
        all_null.replace('\'', "''")
    ));
    assert_eq!(
        keys, ncols,
        "the all-NULL row should list every column: {all_null}"
    );
    assert!(
        all_null.contains("\"Mixed Case \\\"col\\\"\": null"),
        "the oddly named column is keyed by its exact name: {all_null}"
    );

    // For each source row, its latest event must rebuild it exactly, column by column
    // (text forms, so float -0 and NaN are compared exactly; json compared as jsonb, whose
    // normalization of whitespace, key order and duplicate keys is documented).
    let cols: Vec<(String, String)> = c
        .query(
            "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute
              WHERE attrelid = 'src'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        )
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let checks: Vec<String> = cols
        .iter()
        .map(|(name, ty)| {
            let q = format!("\"{}\"", name.replace('"', "\"\""));
            let lit = name.replace('\'', "''");
            let cast = if ty == "json" {
                "::jsonb::text"
            } else {
                "::text"
            };
            format!("('{lit}', (p.s).{q}{cast}, (p.r).{q}{cast})")
        })
        .collect();
    let sql = format!(
        "WITH last AS (
             SELECT DISTINCT ON ((key->>'id')::int) (key->>'id')::int AS id, op, \"row\"
               FROM tide.outbox WHERE pipeline = 'types' AND relation = 'public.src'
              ORDER BY (key->>'id')::int, id DESC),
         p AS (SELECT s.id, l.op, s, jsonb_populate_record(NULL::src, l.\"row\") AS r
                 FROM src s LEFT JOIN last l ON l.id = s.id)
         SELECT p.id, p.op, v.col, v.source, v.rebuilt
           FROM p, LATERAL (VALUES {}) AS v(col, source, rebuilt)
          WHERE v.source IS DISTINCT FROM v.rebuilt
          ORDER BY p.id, v.col",
        checks.join(",\n")
    );
    assert_no_rows(&c, "columns that do not rebuild from the outbox", &sql);
    let last_ops = sample(
        &c,
        "SELECT op, count(*) FROM (SELECT DISTINCT ON (key) op FROM tide.outbox
           WHERE pipeline = 'types' ORDER BY key, id DESC) x GROUP BY 1 ORDER BY 1",
        5,
    );
    assert!(
        last_ops.contains("\"op\":\"update\""),
        "the update of row 4 is not the latest event of any row: {last_ops}"
    );
    // Numbers stay JSON numbers (digit for digit); floats -0/NaN/Infinity are strings.
    let kinds: String = c.query_scalar(
        "SELECT string_agg(k || '=' || jsonb_typeof(\"row\"->k), ' ' ORDER BY k)
           FROM tide.outbox, unnest(ARRAY['c_int8', 'c_num', 'c_real', 'c_dbl', 'c_bool', 'c_jsonb']) k
          WHERE pipeline = 'types' AND op = 'insert' AND key = '{\"id\": 1}'",
    );
    assert_eq!(
        kinds,
        "c_bool=boolean c_dbl=number c_int8=number c_jsonb=object c_num=number c_real=number"
    );
    let num: String = c.query_scalar(
        "SELECT \"row\"->>'c_num' FROM tide.outbox WHERE pipeline = 'types' AND op = 'insert' AND key = '{\"id\": 1}'",
    );
    assert_eq!(num, "12345678901234567890.0123456789");
    // The same rows backfilled (`read` events: their JSON parsed into jsonb where the chunk was
    // read: by the worker for the first chunk, by its reader for the next ones) rebuild the
    // same way, and are the streamed rows' jsonb exactly.
    let id: i64 = c.query_scalar("SELECT tide.start_backfill('src', 'types', chunk_size => 1)");
    wait_backfill(&c, "src", "types", 60);
    assert_eq!(
        c.query_scalar::<String>(&format!("SELECT state FROM tide.backfills WHERE id = {id}")),
        "done"
    );
    let read_sql = sql.replace(
        "WHERE pipeline = 'types' AND relation = 'public.src'",
        "WHERE pipeline = 'types' AND relation = 'public.src' AND op = 'read'",
    );
    assert_ne!(read_sql, sql);
    assert_no_rows(
        &c,
        "columns that do not rebuild from the backfill's events",
        &read_sql,
    );
    assert_no_rows(
        &c,
        "backfilled rows that differ from the latest streamed row",
        "WITH r AS (SELECT key, \"row\" FROM tide.outbox WHERE pipeline = 'types' AND op = 'read'),
              s AS (SELECT DISTINCT ON (key) key, op, \"row\" FROM tide.outbox
                     WHERE pipeline = 'types' AND op <> 'read' ORDER BY key, id DESC)
         SELECT r.key, r.\"row\", s.\"row\" FROM r JOIN s USING (key)
          WHERE s.op IN ('insert', 'update') AND r.\"row\" IS DISTINCT FROM s.\"row\"",
    );
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM tide.outbox WHERE pipeline = 'types' AND op = 'read'"
        ),
        c.query_scalar::<i64>("SELECT count(*) FROM src"),
        "one read event per row"
    );
}

#[test]
fn toast_unchanged_is_not_a_placeholder() {
    let c = setup("toast");
    c.execute(
        "CREATE TABLE doc (id int PRIMARY KEY, n int, big text);
         ALTER TABLE doc ALTER COLUMN big SET STORAGE EXTERNAL;",
    );
    capture_table(&c, "toast", "doc");
    // ~100 kB of random text, stored out of line uncompressed.
    c.execute(
        "INSERT INTO doc SELECT 1, 0, string_agg(md5(random()::text), '') FROM generate_series(1, 3200);
         INSERT INTO doc SELECT 2, 0, string_agg(md5(random()::text), '') FROM generate_series(1, 3200);",
    );
    let toast_rows: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM {}",
        c.query_scalar::<String>(
            "SELECT reltoastrelid::regclass::text FROM pg_class WHERE relname = 'doc'"
        )
    ));
    assert!(
        toast_rows > 0,
        "the big value is not stored out of line; the test would prove nothing"
    );

    c.execute("UPDATE doc SET n = 1 WHERE id = 1");
    c.execute("UPDATE doc SET big = big || 'tail' WHERE id = 1");
    // A key change that leaves the out-of-line value alone.
    c.execute("UPDATE doc SET id = 3, n = 7 WHERE id = 2");
    wait_pipeline(&c, "toast", 60);

    let evs = events(&c, "toast", "public.doc");
    assert_eq!(
        evs,
        ["insert:1", "insert:2", "update:1", "update:1", "delete:2", "insert:3"],
        "{}",
        diag(&c)
    );
    let rows = c.query(
        "SELECT op, key::text, \"row\" ? 'big', coalesce(length(\"row\"->>'big'), -1), unchanged, \"row\"->>'n'
           FROM tide.outbox WHERE pipeline = 'toast' ORDER BY id",
    );
    let ev = |i: usize| -> (
        String,
        String,
        bool,
        i32,
        Option<Vec<String>>,
        Option<String>,
    ) {
        let r = &rows[i];
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5))
    };
    let src_len: i32 = c.query_scalar("SELECT length(big) FROM doc WHERE id = 1");
    // insert: full value
    let (_, _, has_big, len, unchanged, _) = ev(0);
    assert!(
        has_big && len == src_len - 4,
        "insert must carry the whole big value (len {len})"
    );
    assert_eq!(unchanged, None);
    // update of n only: big is listed as unchanged and absent from the row
    let (op, key, has_big, _, unchanged, n) = ev(2);
    assert_eq!((op.as_str(), key.as_str()), ("update", "{\"id\": 1}"));
    assert!(
        !has_big,
        "the unchanged big column must be absent from the row"
    );
    assert_eq!(unchanged, Some(vec!["big".to_string()]));
    assert_eq!(n.as_deref(), Some("1"));
    // update of big: the whole new value
    let (_, _, has_big, len, unchanged, _) = ev(3);
    assert!(has_big, "an update of big must carry it");
    assert_eq!(len, src_len, "the updated big value has the wrong length");
    assert_eq!(unchanged, None);
    let same: bool = c.query_scalar(
        "SELECT (SELECT \"row\"->>'big' FROM tide.outbox WHERE pipeline = 'toast' ORDER BY id OFFSET 3 LIMIT 1)
                = (SELECT big FROM doc WHERE id = 1)",
    );
    assert!(same, "the updated big value differs from the source");

    // The documented way to apply it: jsonb_populate_record(previous, row) rebuilds the row.
    let keeps_big: bool = c.query_scalar(
        "WITH e AS (SELECT \"row\", row_number() OVER (ORDER BY id) AS k FROM tide.outbox WHERE pipeline = 'toast'),
              r AS (SELECT jsonb_populate_record(jsonb_populate_record(NULL::doc, (SELECT \"row\" FROM e WHERE k = 1)),
                                                 (SELECT \"row\" FROM e WHERE k = 3)) AS d)
         SELECT (r.d).n = 1 AND (r.d).big = (SELECT \"row\"->>'big' FROM e WHERE k = 1) FROM r",
    );
    assert!(
        keeps_big,
        "jsonb_populate_record(previous, row) of the n-only update does not keep the big value"
    );

    // Key change of a row whose out-of-line value did not change: delete + insert. PostgreSQL
    // does not log the unchanged value, so the insert must list it as unchanged (no placeholder,
    // no NULL); a consumer carries it over from the deleted row.
    let (op, key, has_big, _, unchanged, n) = ev(5);
    assert_eq!((op.as_str(), key.as_str()), ("insert", "{\"id\": 3}"));
    assert_eq!(n.as_deref(), Some("7"));
    assert!(
        has_big || unchanged == Some(vec!["big".to_string()]),
        "the key-change insert neither carries big nor lists it as unchanged: unchanged={unchanged:?}"
    );
    if !has_big {
        eprintln!(
            "toast: note: the insert of a key-changing UPDATE lists big as unchanged (not sent)"
        );
    }

    // Nowhere a placeholder.
    assert_no_rows(
        &c,
        "outbox values that look like an unchanged-TOAST placeholder",
        "SELECT id, left(\"row\"::text, 200) FROM tide.outbox
          WHERE coalesce(\"row\"::text, '') || coalesce(key::text, '') ~* 'unchanged.toast|toast.datum|__unchanged'",
    );
    assert_no_rows(
        &c,
        "events whose row has big = null",
        "SELECT id FROM tide.outbox WHERE \"row\" ? 'big' AND \"row\"->'big' = 'null'::jsonb",
    );
}
