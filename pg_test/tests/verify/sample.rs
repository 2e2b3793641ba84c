//! `sample => N` names the differing columns.

use crate::common::*;

#[test]
fn sample_reports_column_names() {
    let c = setup("verify_sample");
    exec(
        &c,
        // e, f, g: types whose output function and text cast differ (t/true, 'ab   '/'ab',
        // ::1/::1/128), which once made every row of a clean target look changed.
        "CREATE TABLE s (id int PRIMARY KEY, a int, b text, c timestamptz, d numeric,
                         e boolean, f char(5), g inet);
         INSERT INTO s SELECT g, g, 'b' || g, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 hour', g / 3.0,
                              g % 2 = 0, 'ab', CASE WHEN g % 2 = 0 THEN '::1' ELSE '10.0.0.1' END::inet
           FROM generate_series(1, 60) g;",
    );
    create_pipeline(&c, "v", "table", r#"{"schema": "replica"}"#);
    exec(&c, "SELECT tide.add_table('v', 'public.s')");
    wait_backfill(&c, "public.s", "v", 60);

    // Sampling a clean target reports nothing (and types render alike on both sides).
    let v0 = verify(&c, "'public.s', 'v', sample => 60");
    assert_eq!(v0.differ, 0, "{}", v0.dump());
    assert!(
        v0.columns.is_empty(),
        "clean target, no column rows:\n{}",
        v0.dump()
    );

    exec(
        &c,
        "UPDATE replica.s SET b = 'corrupt', d = -1 WHERE id = 17",
    );
    let v = verify(&c, "'public.s', 'v', sample => 60");
    eprintln!("[sample] {:.1?}\n{}", v.took, v.dump());
    assert_eq!(
        v.columns.len(),
        1,
        "exactly one 'column values' row:\n{}",
        v.dump()
    );
    let r = &v.columns[0];
    assert_eq!(r.key_from, Some(vec!["17".to_string()]), "{r:?}");
    let mut cols = r.columns.clone().unwrap_or_default();
    cols.sort();
    assert_eq!(cols, vec!["b".to_string(), "d".to_string()], "{r:?}");
    assert_eq!(r.range, None, "{r:?}");
    // The range check reports the same row as changed.
    assert_eq!(v.differ, 1, "{}", v.dump());
    assert_eq!(v.ranges[0].kind, "changed values");
    assert_eq!(v.ranges[0].changed, 1);

    // A sample smaller than the table reports at most that row; sample 0 reports none.
    let v = verify(&c, "'public.s', 'v', sample => 0");
    assert!(v.columns.is_empty());
    let v = verify(&c, "'public.s', 'v', sample => 1000");
    assert_eq!(
        v.columns.len(),
        1,
        "sample larger than the table: {}",
        v.dump()
    );
}
