//! Bounded memory and snapshot age: the worker's memory stays flat and no transaction of its
//! outlives a chunk during a big backfill, while the stream stays live.

use crate::common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
struct MemSample {
    at: Duration,
    rows_read: i64,
    state: String,
    pid: Option<i32>,
    vm_rss_kb: Option<i64>,
    rss_anon_kb: Option<i64>,
    rss_shmem_kb: Option<i64>,
    xmin_age: Option<i64>,
    xact_age_s: Option<f64>,
}

/// `VmRSS`, `RssAnon` and `RssShmem` (kB) from /proc/<pid>/status.
fn proc_rss(pid: i32) -> (Option<i64>, Option<i64>, Option<i64>) {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return (None, None, None);
    };
    let field = |name: &str| {
        status.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.trim().trim_end_matches("kB").trim().parse().ok())
        })
    };
    (field("VmRSS:"), field("RssAnon:"), field("RssShmem:"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[test]
fn bounded_memory_and_snapshot_age() {
    const P: &str = "mem";
    const ROWS: i64 = 300_000;
    let c = setup("bf_memory");
    c.execute(&format!(
        "CREATE TABLE big (id int PRIMARY KEY, pad text);
         INSERT INTO big SELECT g, repeat(md5(g::text), 3) FROM generate_series(1, {ROWS}) g;
         ANALYZE big;
         CREATE TABLE light (id int PRIMARY KEY, v int);"
    ));
    let row_bytes: i64 = c.query_scalar("SELECT (pg_relation_size('big') / 300000)::int8");
    create_pipeline(&c, P);
    add_table(&c, P, "big", false);
    add_table(&c, P, "light", false);
    let script = write_script(
        "light",
        "\\set k random(1, 100000)\nINSERT INTO light VALUES (:k, 1) ON CONFLICT (id) DO UPDATE SET v = light.v + 1;\n",
    );
    let load = spawn_pgbench(&c, &script, 1, 300, Some(100));
    c.wait_until(
        "the light load to stream",
        Duration::from_secs(30),
        POLL,
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.outbox WHERE relation = 'public.light'",
            )? >= 50)
        },
    );
    let pid0 = worker_pid(&c, P).expect("worker pid");
    let xid0: i64 = c.query_scalar("SELECT txid_current()");
    let id: i64 = c.query_scalar("SELECT tide.start_backfill('big', chunk_size => 2000)");
    let t0 = Instant::now();

    let stop = AtomicBool::new(false);
    let (samples, probes, elapsed, xid1) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut cl = c.client();
            let mut out: Vec<MemSample> = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let r = cl
                    .query_one(
                        "SELECT b.rows_read, b.state, a.pid, age(a.backend_xmin)::int8,
                                extract(epoch FROM clock_timestamp() - a.xact_start)::float8
                           FROM tide.backfill b
                           LEFT JOIN pg_stat_activity a ON a.backend_type = 'pg_tide worker'
                          WHERE b.id = $1",
                        &[&id],
                    )
                    .expect("sample");
                let pid: Option<i32> = r.get(2);
                let (vm, anon, shmem) = pid.map(proc_rss).unwrap_or((None, None, None));
                out.push(MemSample {
                    at: t0.elapsed(),
                    rows_read: r.get(0),
                    state: r.get(1),
                    pid,
                    vm_rss_kb: vm,
                    rss_anon_kb: anon,
                    rss_shmem_kb: shmem,
                    xmin_age: r.get(3),
                    xact_age_s: r.get(4),
                });
                std::thread::sleep(Duration::from_millis(100));
            }
            out
        });

        // Latency probes: insert into the other captured table, time until it is in the outbox.
        let mut cl = c.client();
        let mut probes: Vec<(Duration, bool)> = Vec::new();
        let mut i = 0;
        loop {
            let running: bool = cl
                .query_one(
                    "SELECT state <> 'done' FROM tide.backfill WHERE id = $1",
                    &[&id],
                )
                .unwrap()
                .get(0);
            if !running || probes.len() >= 40 {
                break;
            }
            i += 1;
            let key = 1_000_000 + i;
            let before: i64 = cl
                .query_one("SELECT coalesce(max(id), 0) FROM tide.outbox", &[])
                .unwrap()
                .get(0);
            cl.execute("INSERT INTO light VALUES ($1, 0)", &[&key])
                .unwrap();
            let t = Instant::now();
            let key_text = key.to_string();
            if let Err(msg) = poll_every(Duration::from_secs(60), Duration::from_millis(10), || {
                Ok(cl
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM tide.outbox WHERE id > $1 AND relation = 'public.light'
                                           AND op = 'insert' AND key->>'id' = $2)",
                        &[&before, &key_text],
                    )?
                    .get(0))
            }) {
                panic!("probe {key} never reached the outbox: {msg}\n{}", diag(&c));
            }
            probes.push((t.elapsed(), running));
            std::thread::sleep(Duration::from_millis(100)); // pacing, not an assertion
        }
        let elapsed = wait_backfill(&c, "big", 300) + t0.elapsed();
        let xid1: i64 = c.query_scalar("SELECT txid_current()");
        stop.store(true, Ordering::SeqCst);
        (sampler.join().expect("sampler"), probes, elapsed, xid1)
    });
    let backfill_time = t0.elapsed();
    c.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgbench'",
    );
    let _ = load.finish_summary();
    let _ = std::fs::remove_file(&script);
    let _ = elapsed;

    assert_eq!(
        bf_i64(&c, id, "rows_emitted"),
        ROWS,
        "every row is emitted (no writes to big)"
    );
    check_backfill_invariants(&c, id);

    // The same worker did the whole backfill (no crash, no restart).
    let pids: std::collections::BTreeSet<i32> = samples.iter().filter_map(|s| s.pid).collect();
    assert_eq!(
        pids.into_iter().collect::<Vec<_>>(),
        vec![pid0],
        "the worker changed during the backfill\n{}",
        diag(&c)
    );

    // Memory: flat between 20% and 90% done.
    let at = |f: f64| {
        samples
            .iter()
            .find(|s| s.rows_read as f64 >= f * ROWS as f64 && s.rss_anon_kb.is_some())
            .cloned()
            .unwrap_or_else(|| {
                panic!(
                    "no sample at {:.0}% done; samples: {}",
                    f * 100.0,
                    samples.len()
                )
            })
    };
    let (s20, s90) = (at(0.2), at(0.9));
    let anon_growth = s90.rss_anon_kb.unwrap() - s20.rss_anon_kb.unwrap();
    let vm_growth = s90.vm_rss_kb.unwrap_or(0) - s20.vm_rss_kb.unwrap_or(0);
    let shmem_growth = s90.rss_shmem_kb.unwrap_or(0) - s20.rss_shmem_kb.unwrap_or(0);
    let peak_anon = samples
        .iter()
        .filter_map(|s| s.rss_anon_kb)
        .max()
        .unwrap_or(0);
    let peak_vm = samples
        .iter()
        .filter_map(|s| s.vm_rss_kb)
        .max()
        .unwrap_or(0);

    // Snapshot age: no worker transaction lives longer than a chunk.
    let in_tx: Vec<&MemSample> = samples.iter().filter(|s| s.xact_age_s.is_some()).collect();
    let max_xact = in_tx
        .iter()
        .filter_map(|s| s.xact_age_s)
        .fold(0.0, f64::max);
    let max_xmin = samples.iter().filter_map(|s| s.xmin_age).max().unwrap_or(0);
    let xid_rate = (xid1 - xid0) as f64 / backfill_time.as_secs_f64();

    let mut during: Vec<Duration> = probes.iter().filter(|p| p.1).map(|p| p.0).collect();
    during.sort();
    let (p50, p95, pmax) = (
        percentile(&during, 0.5),
        percentile(&during, 0.95),
        percentile(&during, 1.0),
    );
    eprintln!(
        "memory: {ROWS} rows of ~{row_bytes} bytes in chunks of 2000, backfill {backfill_time:.1?}, {} samples\n\
         memory: worker RssAnon {} kB at 20% ({:.1?}) -> {} kB at 90% ({:.1?}): growth {anon_growth} kB; peak {peak_anon} kB\n\
         memory: worker VmRSS  {} kB at 20% -> {} kB at 90%: growth {vm_growth} kB, of which RssShmem (shared buffers touched) {shmem_growth} kB; peak {peak_vm} kB\n\
         memory: worker in a transaction in {}/{} samples; oldest transaction {max_xact:.3} s; max age(backend_xmin) {max_xmin} xids \
         (xid rate {xid_rate:.0}/s, {:.2} s worth)\n\
         memory: stream latency during the backfill over {} probes: p50 {p50:.0?}, p95 {p95:.0?}, max {pmax:.0?}",
        samples.len(),
        s20.rss_anon_kb.unwrap(),
        s20.at,
        s90.rss_anon_kb.unwrap(),
        s90.at,
        s20.vm_rss_kb.unwrap_or(0),
        s90.vm_rss_kb.unwrap_or(0),
        in_tx.len(),
        samples.len(),
        if xid_rate > 0.0 { max_xmin as f64 / xid_rate } else { 0.0 },
        during.len(),
    );
    assert!(
        samples.iter().filter(|s| s.state == "running").count() >= 10,
        "too few samples while the backfill ran for the figures to mean anything"
    );
    assert!(
        anon_growth < 32 * 1024,
        "worker private memory grew by {anon_growth} kB between 20% and 90% done: not bounded by a chunk"
    );
    assert!(
        max_xact < 5.0,
        "a worker transaction was {max_xact:.1} s old: the backfill holds a snapshot across chunks"
    );
    assert!(
        (max_xmin as f64) < xid_rate * 5.0 + 200.0,
        "the worker's xmin was {max_xmin} xids old ({xid_rate:.0} xids/s): older than a few seconds"
    );
    assert!(
        during.len() >= 10,
        "only {} latency probes ran during the backfill",
        during.len()
    );
    assert!(
        p95 < Duration::from_secs(2),
        "stream latency during the backfill: p95 {p95:?} >= 2 s (probes: {during:?})"
    );
}
