//! Backfill progress on tables without statistics: `tide.backfills.fraction_done` and
//! `estimated_time_left` are never NULL while the backfill runs (a freshly loaded table has
//! `reltuples = -1`; both used to stay NULL for the whole run), and the estimate is close: from
//! the key range for an integer key, from the planner's guess otherwise.

use pg_test::*;
use std::time::{Duration, Instant};

/// Backfill `table` (`rows` rows, never analyzed) throttled, sampling `tide.backfills` every
/// 100 ms: fraction_done is never NULL and in [0, 1) while active; from the first chunk on,
/// estimated_time_left is set and the estimated total lies within `[lo, hi]` times `rows`.
fn watch_progress(c: &Cluster, table: &str, rows: i64, lo: f64, hi: f64) {
    let reltuples: f32 = c.query_scalar(&format!(
        "SELECT reltuples FROM pg_class WHERE oid = '{table}'::regclass"
    ));
    assert_eq!(
        reltuples, -1.0,
        "{table} must have no statistics for this test"
    );
    c.execute(&format!(
        "SELECT tide.add_table('p', '{table}', backfill => false)"
    ));
    wait_for_pipeline(c, "p", 30, || diag(c));
    c.execute(&format!(
        "SELECT tide.start_backfill('{table}', 'p', chunk_size => 500);
         SELECT tide.alter_backfill('{table}', 'p', rows_per_second => 5000);"
    ));
    let started = Instant::now();
    let (mut samples, mut after_first) = (0, 0);
    loop {
        let r = c.query_one(&format!(
            "SELECT state, fraction_done, estimated_time_left IS NOT NULL, chunks_done, estimated_rows
               FROM tide.backfills WHERE source = '{table}'::regclass ORDER BY id DESC LIMIT 1"
        ));
        let state: String = r.get(0);
        let fraction: Option<f64> = r.get(1);
        if state == "done" {
            assert_eq!(fraction, Some(1.0), "a done backfill is 1.0 done");
            break;
        }
        let has_eta: bool = r.get(2);
        let chunks: i64 = r.get(3);
        let estimated: Option<i64> = r.get(4);
        let f = fraction.unwrap_or_else(|| {
            panic!(
                "fraction_done is NULL while the backfill of {table} is {state}\n{}",
                diag(c)
            )
        });
        assert!(
            (0.0..1.0).contains(&f),
            "fraction_done {f} out of [0, 1) while the backfill of {table} is {state}"
        );
        if state == "running" && chunks >= 1 {
            assert!(
                has_eta,
                "estimated_time_left is NULL after {chunks} chunks\n{}",
                diag(c)
            );
            let e = estimated.unwrap_or(0) as f64 / rows as f64;
            assert!(
                (lo..=hi).contains(&e),
                "after {chunks} chunks the estimate of {table} is {estimated:?} rows, {e:.2} times the {rows} it has\n{}",
                diag(c)
            );
            after_first += 1;
        }
        samples += 1;
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the backfill of {table} did not finish\n{}",
            diag(c)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        after_first >= 10,
        "only {after_first} of {samples} samples saw the backfill of {table} past its first chunk"
    );
    let r = c.query_one(&format!(
        "SELECT rows_read, estimated_rows FROM tide.backfills WHERE source = '{table}'::regclass ORDER BY id DESC LIMIT 1"
    ));
    let (read, est): (i64, i64) = (r.get(0), r.get(1));
    assert_eq!(read, rows);
    assert_eq!(est, rows, "a finished backfill's estimate is what it read");
}

#[test]
fn progress_without_statistics() {
    let c = setup("progress");
    c.execute("SELECT tide.create_pipeline('p')");
    // Not analyzed, and autovacuum off for them: their statistics stay unknown for the run.
    c.execute(
        "CREATE TABLE by_int (id int PRIMARY KEY, v int, pad text) WITH (autovacuum_enabled = false);
         INSERT INTO by_int SELECT g * 3, g, repeat('p', 60) FROM generate_series(1, 15000) g;
         CREATE TABLE by_text (id text PRIMARY KEY, v int, pad text) WITH (autovacuum_enabled = false);
         INSERT INTO by_text SELECT lpad(g::text, 8, '0'), g, repeat('p', 60) FROM generate_series(1, 10000) g;",
    );
    let est: i64 = c.query_scalar("SELECT tide._estimate_rows('by_text'::regclass)");
    assert!(
        (5_000..20_000).contains(&est),
        "the planner-style estimate {est} is not near the 10000 rows"
    );
    // An integer key: the key range gives the total to within the last chunks.
    watch_progress(&c, "by_int", 15_000, 0.95, 1.1);
    // A text key: the planner's estimate, refreshed as chunks advance (within a factor of two).
    watch_progress(&c, "by_text", 10_000, 0.5, 2.0);
}
