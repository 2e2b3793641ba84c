//! One source transaction far larger than the worker's buffers reaches the broker with the
//! worker's memory flat (issue 34): messages go to the producer every 10,000, and the
//! producer's queue is bounded (`queue.buffering.max.kbytes`, 16 MiB unless set), so a broker
//! slower than the decoding makes the worker wait instead of holding the transaction.

use crate::broker::*;
use pg_test::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Rows of the transaction, ~1 kB each as messages: ~100 MB through the producer.
const ROWS: i64 = 100_000;
/// The most the worker's private memory may grow meanwhile.
const BOUND_KB: i64 = 32 * 1024;

fn rss_anon_kb(pid: i32) -> Option<i64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix("RssAnon:")
            .and_then(|r| r.trim().trim_end_matches("kB").trim().parse().ok())
    })
}

#[test]
fn kafka_huge_transaction_at_flat_memory() {
    let b = Broker::start("large");
    let c = start_cluster(Cluster::builder("kafka_large").conf("tide.decoding_work_mem = '4MB'"));
    init_extension(&c);
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE TABLE big (id int8 PRIMARY KEY, b text);
         GRANT SELECT ON big TO alice;",
    );
    create_kafka_server(&c, "events", &b, "alice");
    let mut alice = connect_as(&c, "alice");
    alice
        .batch_execute(r#"SELECT tide.create_pipeline('k', 'kafka', '{"server": "events"}')"#)
        .unwrap_or_else(|e| panic!("create_pipeline: {}\n{}", describe_error(&e), diag(&c)));
    wait_streaming(&c, "k", Duration::from_secs(30));
    alice
        .batch_execute("SELECT tide.add_table('k', 'big', backfill => false)")
        .unwrap();
    c.execute("INSERT INTO big VALUES (0, 'warm')");
    wait_pipeline(&c, "k", 120);
    let pid = worker_pid(&c, "k").expect("worker");
    let idle = rss_anon_kb(pid).expect("RssAnon");
    let mut peak = idle;
    let mut during = 0u32;
    let inserted = AtomicBool::new(false);
    let t0 = Instant::now();
    let sample = |peak: &mut i64, during: &mut u32| {
        assert!(
            t0.elapsed() < Duration::from_secs(900),
            "not applied in 15 minutes\n{}",
            diag(&c)
        );
        if let Some(kb) = rss_anon_kb(pid) {
            *peak = (*peak).max(kb);
        }
        if inserted.load(Ordering::SeqCst) {
            *during += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The insert's commit position, sampling meanwhile (the worker may start on it before the
    // writer's thread hears of the commit).
    let commit_lsn: String = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            c.execute(&format!(
                "INSERT INTO big SELECT g, repeat(md5(g::text), 28) FROM generate_series(1, {ROWS}) g"
            ));
            inserted.store(true, Ordering::SeqCst);
            c.query_scalar::<String>("SELECT pg_current_wal_lsn()::text")
        });
        while !writer.is_finished() {
            sample(&mut peak, &mut during);
        }
        writer.join().expect("writer")
    });
    // Then until the worker applied past it.
    let applied = format!(
        "SELECT coalesce(applied_lsn >= '{commit_lsn}'::pg_lsn, false) FROM tide.pipelines WHERE name = 'k'"
    );
    let mut polled = Instant::now();
    loop {
        sample(&mut peak, &mut during);
        if polled.elapsed() >= Duration::from_millis(100) {
            polled = Instant::now();
            if c.query_scalar::<bool>(&applied) {
                break;
            }
        }
    }
    let report = format!(
        "kafka worker: idle {idle} kB, peak {peak} kB, growth {} kB, {during} samples while applying, {:.1?}",
        peak - idle,
        t0.elapsed()
    );
    eprintln!("{report}");
    assert_eq!(
        worker_pid(&c, "k"),
        Some(pid),
        "the worker restarted\n{}",
        diag(&c)
    );
    assert!(during >= 20, "too few samples: {report}");
    assert!(
        peak - idle <= BOUND_KB,
        "the kafka worker's memory grew by {} kB for one transaction of {ROWS} rows (bound {BOUND_KB} kB)\n{report}\n{}",
        peak - idle,
        b.log()
    );
}
