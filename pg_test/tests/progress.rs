//! Backfill progress on a table without statistics: `tide.backfills.fraction_done` and
//! `estimated_time_left` are never NULL while the backfill runs (issue: a freshly loaded table
//! has `reltuples = -1`, and both stayed NULL for the whole run).

use pg_test::*;
use std::time::{Duration, Instant};

const ROWS: i64 = 20_000;

fn diag(c: &Cluster) -> String {
    format!(
        "--- tide.backfills ---\n{}\n--- last 30 lines of {} ---\n{}",
        sample(
            c,
            "SELECT id, state, chunks_done, rows_read, estimated_rows, fraction_done, estimated_time_left, error FROM tide.backfills",
            5
        ),
        c.log_path().display(),
        c.log_tail(30)
    )
}

#[test]
fn progress_without_statistics() {
    let c = setup("progress");
    // No ANALYZE, and autovacuum off for the table: its statistics stay unknown for the run.
    c.execute(&format!(
        "CREATE TABLE fresh (id int PRIMARY KEY, v int, pad text) WITH (autovacuum_enabled = false);
         INSERT INTO fresh SELECT g, g, repeat('p', 60) FROM generate_series(1, {ROWS}) g;"
    ));
    let reltuples: f32 =
        c.query_scalar("SELECT reltuples FROM pg_class WHERE oid = 'fresh'::regclass");
    assert_eq!(
        reltuples, -1.0,
        "the table must have no statistics for this test"
    );
    let est: i64 = c.query_scalar("SELECT tide._estimate_rows('fresh'::regclass)");
    assert!(
        est > ROWS / 2 && est < ROWS * 2,
        "the planner-style estimate {est} is not near the {ROWS} rows"
    );
    c.execute("SELECT tide.create_pipeline('p')");
    c.execute("SELECT tide.add_table('p', 'fresh', backfill => false)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    c.execute(
        "SELECT tide.start_backfill('fresh', 'p', chunk_size => 500);
         SELECT tide.alter_backfill('fresh', 'p', rows_per_second => 4000);",
    );
    let started = Instant::now();
    let (mut samples, mut with_rate, mut last_fraction) = (0, 0, 0.0f64);
    loop {
        let r = c.query_one(
            "SELECT state, fraction_done, estimated_time_left IS NOT NULL, chunks_done, estimated_rows
               FROM tide.backfills WHERE source = 'fresh'::regclass",
        );
        let state: String = r.get(0);
        if state == "done" {
            let f: Option<f64> = r.get(1);
            assert_eq!(f, Some(1.0), "a done backfill is 1.0 done");
            break;
        }
        let fraction: Option<f64> = r.get(1);
        let has_eta: bool = r.get(2);
        let chunks: i64 = r.get(3);
        let estimated: Option<i64> = r.get(4);
        let f = fraction.unwrap_or_else(|| {
            panic!(
                "fraction_done is NULL while the backfill is {state}\n{}",
                diag(&c)
            )
        });
        assert!(
            (0.0..1.0).contains(&f),
            "fraction_done {f} out of [0, 1) while the backfill is {state}"
        );
        if state == "running" && chunks >= 1 {
            assert!(
                has_eta,
                "estimated_time_left is NULL after {chunks} chunks (estimated rows {estimated:?})\n{}",
                diag(&c)
            );
            with_rate += 1;
        }
        last_fraction = f;
        samples += 1;
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the backfill did not finish\n{}",
            diag(&c)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        with_rate >= 10,
        "only {with_rate} of {samples} samples saw the backfill running past its first chunk"
    );
    assert!(
        last_fraction > 0.5,
        "the last running sample was only {last_fraction} done: the estimate is far too high"
    );
    let (rows_read, est): (i64, i64) = {
        let r = c.query_one(
            "SELECT rows_read, estimated_rows FROM tide.backfills WHERE source = 'fresh'::regclass",
        );
        (r.get(0), r.get(1))
    };
    assert_eq!(rows_read, ROWS);
    assert_eq!(est, ROWS, "a finished backfill's estimate is what it read");
}
