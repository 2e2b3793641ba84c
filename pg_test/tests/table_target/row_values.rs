//! Backfill chunks reach a local table target as row values of the source's row type (loaded
//! in bulk or upserted; no text, no JSON), when the target table has the chunk's columns with
//! the same types; otherwise as one `read` event per row, each value as its text output.

use crate::common::*;

/// Pipeline `lv` writes tables pg_tide creates (same types: row values, loaded in bulk or
/// upserted); pipeline `lj` writes a table created beforehand whose `name` column is `text`
/// where the source has `varchar(20)` (a wider type: one `read` event per row, as text). Both
/// must hold every value exactly — JSON `null` in json and jsonb columns included, through the
/// backfill and through the stream (which used to turn it into SQL NULL, through JSON: this test
/// then had to compare the rows the stream wrote with JSON null read as SQL NULL). Writes run
/// during the backfills and a column is added in the middle of them.
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

    let all = "id, j::text, k::text, name, n, ch, t, extra";
    assert_same_rows("row values", &c, "public.rv", &c, "rep.rv", all);
    assert_same_rows("text events", &c, "public.rv", &c, "rj.rv", all);
    let json_nulls: i64 = c.query_scalar("SELECT count(*) FROM rv WHERE j = 'null'::jsonb");
    assert!(json_nulls > 5000, "the source has {json_nulls} JSON nulls");
    for t in ["rep.rv", "rj.rv"] {
        assert_eq!(
            c.query_scalar::<i64>(&format!("SELECT count(*) FROM {t} WHERE j = 'null'::jsonb")),
            json_nulls,
            "{t} keeps every JSON null"
        );
    }
    // How the chunks were written: row values at `lv`, events at `lj`.
    let how = |p: &str| {
        texts(
            &c,
            &format!(
                "SELECT DISTINCT written_as FROM tide.chunks WHERE pipeline = '{p}' AND written_as IS NOT NULL ORDER BY 1"
            ),
        )
    };
    let lv = how("lv");
    assert!(
        !lv.is_empty() && lv.iter().all(|w| w == "bulk" || w == "upsert"),
        "lv: {lv:?}"
    );
    assert_eq!(how("lj"), vec!["events".to_string()]);
}
