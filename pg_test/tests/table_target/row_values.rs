//! Backfill chunks reach a local table target as row values of the source's row type (one
//! array, one upsert; no JSON), when the target table has the chunk's columns with the same
//! types; otherwise as one JSON event per row, as before.

use crate::common::*;

/// The two transports are told apart by a value JSON cannot carry to a table target: a JSON
/// `null` inside a json or jsonb column arrives as SQL NULL through `json_populate_recordset`
/// (README, Limitations), but as the JSON value `null` when the row travels as a row value.
/// Pipeline `lv` writes tables pg_tide creates (same types: row values); pipeline `lj` writes a
/// table created beforehand whose `name` column is `text` where the source has `varchar(20)`
/// (a wider type: JSON events). Both must hold every other value exactly; writes run during the
/// backfills and a column is added in the middle of them.
#[test]
fn chunks_reach_local_targets_as_row_values() {
    let c = setup("tt_rowval");
    c.execute(
        "CREATE TABLE rv (id int PRIMARY KEY, j jsonb, k json, name varchar(20), n numeric(10,2), ch char(5), t timestamptz);
         INSERT INTO rv SELECT g, CASE WHEN g % 2 = 0 THEN 'null'::jsonb ELSE jsonb_build_object('g', g) END,
                               CASE WHEN g % 3 = 0 THEN 'null'::json WHEN g % 3 = 1 THEN '{\"k\":  1}'::json END,
                               'n' || g, g / 7.0, 'ab', timestamptz '2024-01-01 00:00:00+00' + g * interval '1 minute'
           FROM generate_series(1, 12000) g;
         CREATE SCHEMA rj;
         CREATE TABLE rj.rv (id int PRIMARY KEY, j jsonb, k json, name text, n numeric(10,2), ch char(5), t timestamptz);",
    );
    create_pipeline(&c, "lv", "table", r#"{"schema": "rep"}"#);
    create_pipeline(&c, "lj", "table", r#"{"schema": "rj"}"#);
    for p in ["lv", "lj"] {
        exec(
            &c,
            &format!("SELECT tide.add_table('{p}', 'rv', backfill => false)"),
        );
        exec(
            &c,
            &format!("SELECT tide.start_backfill('rv', '{p}', chunk_size => 1000)"),
        );
    }
    // Writes while the chunks are read: updates (JSON null set and cleared), deletes, inserts.
    for round in 0..6 {
        c.execute(&format!(
            "UPDATE rv SET j = CASE WHEN j = 'null'::jsonb THEN '{{\"u\": {round}}}'::jsonb ELSE 'null'::jsonb END,
                           name = 'u{round}-' || id
              WHERE id % 97 = {round};
             DELETE FROM rv WHERE id % 101 = {round};
             INSERT INTO rv VALUES (20000 + {round}, 'null', 'null', 'ins', 1.5, 'x', now())"
        ));
        if round == 3 {
            c.execute("ALTER TABLE rv ADD COLUMN extra int DEFAULT 7");
        }
    }
    wait_backfill(&c, "rv", "lv", 120);
    wait_backfill(&c, "rv", "lj", 120);
    wait_pipeline(&c, "lv", 60);
    wait_pipeline(&c, "lj", 60);

    // Every value exactly, JSON nulls included, at the row-values target — for the rows the
    // stream did not write since they were read: a streamed event is JSON (README,
    // Limitations), so a JSON null the stream wrote arrives as SQL NULL, unless a chunk read
    // the row after that write. Those rows (`id % 97 < 6` updated, `id > 12000` inserted) are
    // compared with JSON null read as SQL NULL, like the JSON target below.
    let all = "id, j::text, k::text, name, n, ch, t, extra";
    let untouched = |t: &str| format!("(SELECT * FROM {t} WHERE id <= 12000 AND id % 97 >= 6) r");
    let touched = |t: &str| format!("(SELECT * FROM {t} WHERE id > 12000 OR id % 97 < 6) r");
    assert_same_rows(
        "row values",
        &c,
        &untouched("public.rv"),
        &c,
        &untouched("rep.rv"),
        all,
    );
    assert_same_rows(
        "row values, rows the stream wrote",
        &c,
        &touched("public.rv"),
        &c,
        &touched("rep.rv"),
        "id, nullif(j::text, 'null'), nullif(k::text, 'null'), name, n, ch, t, extra",
    );
    // The JSON target: the same rows, where JSON null reads as SQL NULL.
    let json_null_as_sql =
        "id, nullif(j::text, 'null'), nullif(k::text, 'null'), name, n, ch, t, extra";
    assert_same_rows(
        "json events",
        &c,
        "public.rv",
        &c,
        "rj.rv",
        json_null_as_sql,
    );

    // What tells the transports apart, on the rows the backfill wrote (the stream's writes are
    // events for both). `id % 97 < 6` rows were updated through the stream.
    let count = |table: &str, cond: &str| -> i64 {
        c.query_scalar(&format!(
            "SELECT count(*) FROM {table} WHERE id <= 12000 AND id % 97 >= 6 AND {cond}"
        ))
    };
    let json_nulls = count("public.rv", "j = 'null'::jsonb");
    assert!(json_nulls > 5000, "the source has {json_nulls} JSON nulls");
    assert_eq!(
        count("rep.rv", "j = 'null'::jsonb"),
        json_nulls,
        "the row-values target keeps every JSON null of the backfilled rows"
    );
    assert_eq!(count("rep.rv", "j IS NULL"), 0);
    assert_eq!(
        count("rj.rv", "j IS NULL"),
        json_nulls,
        "the JSON target gets SQL NULL for them (it went through JSON: the check can fail)"
    );
    assert_eq!(count("rj.rv", "j = 'null'::jsonb"), 0);
}
