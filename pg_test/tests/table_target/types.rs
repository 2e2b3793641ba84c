//! Every common built-in type reaches local and remote table targets exactly, through the
//! backfill and through the stream, and `tide.verify` (with a column-by-column sample) finds
//! nothing to report.

use crate::common::*;

/// Backfilled rows (ids 1-40, read by chunks of 7) and streamed rows (inserts 100-139, and
/// updates that give rows 1-40 the values of other rows), to a local and a remote target. Each
/// column's text at each target equals the source's, byte for byte (json's text, JSON `null`
/// and SQL NULL apart, a bare JSON string, -0, NaN, BC dates, ...). The JSON transport the
/// stream used before failed this: a JSON `null` arrived as SQL NULL and `"str\u00e9"` as
/// `"stré"`.
#[test]
fn every_type_reaches_table_targets_exactly() {
    let (c, t) = setup_remote("tt_types");
    c.execute(TYPES_SUITE_TYPES);
    t.execute(TYPES_SUITE_TYPES);
    c.execute(TYPES_SUITE_TABLE);
    for id in 1..=40 {
        c.execute(&types_suite_row(id));
    }
    create_pipeline(&c, "tl", "table", r#"{"schema": "rep"}"#);
    create_pipeline(&c, "tr", "postgres", r#"{"server": "tgt"}"#);
    for p in ["tl", "tr"] {
        exec(
            &c,
            &format!("SELECT tide.add_table('{p}', 'ty', backfill => false)"),
        );
        exec(
            &c,
            &format!("SELECT tide.start_backfill('ty', '{p}', chunk_size => 7)"),
        );
    }
    for p in ["tl", "tr"] {
        wait_backfill(&c, "ty", p, 120);
    }
    // The stream: inserts, and updates that copy another row's values (every column).
    for id in 100..140 {
        c.execute(&types_suite_row(id));
    }
    let cols: Vec<String> = texts(
        &c,
        "SELECT quote_ident(attname) FROM pg_attribute
          WHERE attrelid = 'ty'::regclass AND attnum > 1 AND NOT attisdropped ORDER BY attnum",
    );
    let list = cols.join(", ");
    c.execute(&format!(
        "UPDATE ty SET ({list}) = (SELECT {list} FROM ty o WHERE o.id = 100 + (ty.id + 2) % 40)
          WHERE ty.id <= 40"
    ));
    c.execute("DELETE FROM ty WHERE id IN (7, 107)");
    for p in ["tl", "tr"] {
        wait_pipeline(&c, p, 60);
    }
    // Every column as text, the money column included (both sides run with the same lc_monetary).
    let all = format!(
        "id, {}",
        cols.iter()
            .map(|q| format!("{q}::text"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert_same_rows("local", &c, "public.ty", &c, "rep.ty", &all);
    assert_same_rows("remote", &c, "public.ty", &t, "public.ty", &all);
    let json_nulls: i64 = c.query_scalar("SELECT count(*) FROM ty WHERE c_jsonb = 'null'");
    assert!(json_nulls >= 8, "{json_nulls} JSON nulls at the source");
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM rep.ty WHERE c_jsonb = 'null'"),
        json_nulls,
        "JSON nulls at the local target"
    );
    // verify, with every row sampled column by column: nothing differs.
    for p in ["tl", "tr"] {
        let reported = sample(
            &c,
            &format!(
                "SELECT kind, columns, key_from FROM tide.verify('ty', '{p}', sample => 100)
                  WHERE kind NOT LIKE 'summary: % ranges checked, 0 differ%'"
            ),
            10,
        );
        let n: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM tide.verify('ty', '{p}', sample => 100)
              WHERE kind NOT LIKE 'summary: % ranges checked, 0 differ%'"
        ));
        assert_eq!(n, 0, "verify ({p}) reports: {reported}");
    }
}
