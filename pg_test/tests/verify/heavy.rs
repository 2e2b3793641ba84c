//! No false alarms under heavy writes over the whole key space: rated writes, then an
//! unthrottled burst.

use crate::common::*;
use std::time::{Duration, Instant};

/// Writes per second of the rated heavy phase (3 clients in total; `TIDE_VERIFY_HEAVY_RATE`,
/// 0 = unthrottled). The default stays below what the pipeline applies on a small machine:
/// pgbench unthrottled writes several times faster than a pipeline applies (12,900 tx/s against
/// a few thousand applied per second on the 2-core test box), the lag then grows without bound
/// and every re-check of `tide.verify` waits for a catch-up that does not come.
fn heavy_rate() -> Option<u32> {
    match std::env::var("TIDE_VERIFY_HEAVY_RATE") {
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(_) => panic!("TIDE_VERIFY_HEAVY_RATE must be a number, not {v:?}"),
        },
        Err(_) => Some(3000),
    }
}

fn lag_bytes(c: &Cluster) -> String {
    c.try_query_scalar::<Option<i64>>("SELECT lag_bytes::int8 FROM tide.pipelines WHERE name = 'v'")
        .ok()
        .flatten()
        .map_or("?".into(), |l| l.to_string())
}

/// One `tide.verify` of the uncorrupted target while the writer runs, printed as `label`. A wait
/// that timed out is reported as such (inconclusive), not as a difference; only a reported
/// difference on this uncorrupted target is a false alarm, recorded in `failures`. Returns how
/// long it took and whether the writer still ran at its end.
fn verify_while_writing(c: &Cluster, label: &str, failures: &mut Vec<String>) -> (Duration, bool) {
    let lag = lag_bytes(c);
    let v = verify(c, "'public.t', 'v'");
    let writing = bench_connected(c);
    eprintln!(
        "[heavy] {label}: {:.2?} (lag at start: {lag} bytes; writer still running at its end: {writing}): {}",
        v.took, v.summary.kind
    );
    if v.differ != 0 {
        failures.push(format!("{label}:\n{}", v.dump()));
    }
    (v.took, writing)
}

#[test]
fn no_false_alarms_under_heavy_writes() {
    let t0 = Instant::now();
    let c = setup("verify_heavy");
    replicated_t(&c, ROWS, "table", r#"{"schema": "replica"}"#, 120);
    let script = write_script("verify_heavy", &writer_script(1, ROWS));
    let mut failures = Vec::new();

    // Phase A: 3 clients writing random keys over the whole key space, at a rate the pipeline
    // sustains; at least 5 verify runs while they write.
    let rate = heavy_rate();
    let bench = spawn_pgbench(&c, &script, 3, 600, rate);
    c.wait_until("pgbench to connect", Duration::from_secs(10), POLL, || {
        Ok(bench_connected(&c))
    });
    std::thread::sleep(Duration::from_secs(2));
    const RUNS: usize = 6;
    let mut times = Vec::new();
    for i in 1..=RUNS {
        let (took, writing) = verify_while_writing(&c, &format!("rated run {i}"), &mut failures);
        times.push(took);
        assert!(
            writing,
            "the writer must still be running after verify run {i}"
        );
    }
    let (txns, elapsed, status) = stop_bench(&c, bench);
    eprintln!("[heavy] writer (rate {rate:?}): {txns} transactions in {elapsed:.1?}, {status}");
    eprintln!(
        "[heavy] verify times: {}",
        times
            .iter()
            .map(|t| format!("{:.2}s", t.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let caught_up = wait_pipeline(&c, "v", 120);
    eprintln!("[heavy] pipeline caught up {caught_up:.1?} after the writer stopped");
    assert_same_rows("after the rated writes", &c, "t", &c, "replica.t", COLS);

    // Phase B: an unthrottled burst (15 s); one verify started 2 s into it. The pipeline falls
    // behind, so the re-checks wait for it: the run is slow, but must report nothing.
    let burst = spawn_pgbench(&c, &script, 3, 15, None);
    c.wait_until("pgbench to connect", Duration::from_secs(10), POLL, || {
        Ok(bench_connected(&c))
    });
    std::thread::sleep(Duration::from_secs(2));
    verify_while_writing(&c, "burst run", &mut failures);
    let (txns, elapsed, status) = stop_bench(&c, burst);
    eprintln!("[heavy] burst writer: {txns} transactions in {elapsed:.1?}, {status}");
    let _ = std::fs::remove_file(&script);
    let caught_up = wait_pipeline(&c, "v", 180);
    eprintln!("[heavy] pipeline caught up {caught_up:.1?} after the burst");
    // Independent check that the target really was equal (so any report was a false alarm).
    assert_same_rows("after the burst", &c, "t", &c, "replica.t", COLS);
    assert!(
        failures.is_empty(),
        "false alarms: {} verify runs reported differing ranges on an uncorrupted target:\n{}\n{}",
        failures.len(),
        failures.join("\n"),
        diag(&c)
    );
    let v = verify(&c, "'public.t', 'v'");
    assert_eq!(v.differ, 0, "quiet: 0 differ\n{}", v.dump());
    eprintln!("[heavy] total {:.1?}", t0.elapsed());
}
