//! The topics replayed onto a copy equal the source after writes, a backfill, a kill -9 of the
//! worker, a broker outage and a clean restart; duplicates are bounded by one batch after the
//! kill -9 and absent after the clean restart.

use crate::broker::*;
use crate::replay::*;
use pg_test::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Small on purpose: the test reads the topic back three times, on a machine it shares.
const ROWS: i64 = 4000;
const BATCH_EVENTS: i64 = 500;
const CHUNK: i64 = 500;
const TOPIC: &str = "k.public.items";

/// Churn on `items` until `stop`, reconnecting across server restarts.
fn writer(c: &Cluster, stop: &AtomicBool, done: &AtomicU64) {
    let sql = churn_sql("items", ROWS);
    while !stop.load(Ordering::SeqCst) {
        let Ok(mut client) = c.try_client() else {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        while !stop.load(Ordering::SeqCst) {
            if client.batch_execute(&sql).is_err() {
                break;
            }
            done.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

/// Sets the flag when dropped: a writer thread stops even when the test panics (a scoped
/// thread that never ends would hang the test instead of failing it).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn kdiag(c: &Cluster, b: &Broker) -> String {
    format!("{}\n--- broker log ---\n{}", diag(c), b.log())
}

#[test]
fn kafka_converges_through_backfill_kill9_outage_and_restart() {
    let t0 = Instant::now();
    let mut b = Broker::own("conv");
    let c = start_cluster(
        Cluster::builder("kafka_conv").conf(&format!("tide.batch_events = {BATCH_EVENTS}")),
    );
    init_extension(&c);
    c.execute(&format!(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, pad text);
         INSERT INTO items SELECT g, g, repeat('p', 50) FROM generate_series(1, {ROWS}) g;
         GRANT SELECT ON items TO alice;"
    ));
    create_kafka_server(&c, "events", &b, "alice");
    // The pipeline belongs to an ordinary role, as a DBA would set it up.
    let mut alice = connect_as(&c, "alice");
    alice
        .batch_execute(
            r#"SELECT tide.create_pipeline('k', 'kafka', '{"server": "events", "partitions": 3, "producer": {"message.timeout.ms": 5000, "linger.ms": "5"}}')"#,
        )
        .unwrap_or_else(|e| panic!("create_pipeline as alice: {}\n{}", describe_error(&e), kdiag(&c, &b)));
    wait_streaming(&c, "k", Duration::from_secs(30));

    let stop = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    let mut dup_after_kill = 0;
    let mut dup_after_outage = 0;
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| writer(&c, &stop, &writes));
        std::thread::sleep(Duration::from_millis(500));
        alice
            .batch_execute(&format!(
                "SELECT tide.add_table('k', 'items'); SELECT tide.alter_backfill('items', 'k', chunk_size => {CHUNK});"
            ))
            .unwrap_or_else(|e| panic!("add_table as alice: {}", describe_error(&e)));
        // kill -9 of the worker mid-backfill, under writes.
        c.wait_until(
            "a few chunks",
            Duration::from_secs(60),
            Duration::from_millis(50),
            || {
                Ok(c.try_query_scalar::<i64>(
                    "SELECT coalesce(max(chunks_done), 0) FROM tide.backfill",
                )? >= 3)
            },
        );
        let pid = worker_pid(&c, "k");
        kill9(pid.expect("the worker runs"));
        wait_recovered(&c, "k", pid, Duration::from_secs(60), || kdiag(&c, &b));
        c.wait_until(
            "progress after the kill",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || {
                Ok(c.try_query_scalar::<i64>(
                    "SELECT coalesce(max(chunks_done), 0) FROM tide.backfill",
                )? >= 6)
            },
        );
        let r = replay(&consume(&b.addr(), &[TOPIC]));
        dup_after_kill = r.duplicates;
        eprintln!(
            "kafka: {} events, {} duplicate messages after the kill -9",
            r.events, r.duplicates
        );

        // Broker outage: the pipeline shows the error with the reason, then catches up.
        b.stop();
        c.wait_until("state error with the reason", Duration::from_secs(60), Duration::from_millis(200), || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT state = 'error' AND last_error LIKE 'kafka target:%' AND remedy LIKE '%retries%'
                                    FROM tide.pipelines WHERE name = 'k'), false)",
            )?)
        });
        let shown: String = c.query_scalar("SELECT last_error || ' / ' || last_error_sqlstate FROM tide.pipelines WHERE name = 'k'");
        eprintln!("kafka: during the outage tide.pipelines shows: {shown}");
        std::thread::sleep(Duration::from_secs(2));
        b.resume();
        wait_streaming(&c, "k", Duration::from_secs(90));
        wait_backfill(&c, "items", "k", 300);
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::SeqCst);
    });
    wait_pipeline(&c, "k", 120);
    let recs = consume(&b.addr(), &[TOPIC]);
    let r = replay(&recs);
    dup_after_outage += r.duplicates - dup_after_kill;
    check_order(&recs).unwrap_or_else(|e| panic!("per-key order: {e}"));
    let (only_src, only_copy) = compare_with_copy(&c, "items", "items_copy", &r.rows);
    assert_eq!(
        (only_src, only_copy),
        (0, 0),
        "the replayed topic differs from the source: rows only in items, only in the copy\n{}",
        kdiag(&c, &b)
    );
    let tombstones = recs.iter().filter(|r| r.value.is_none()).count();
    let deletes = recs.iter().filter(|r| r.op() == Some("d")).count();
    assert_eq!(tombstones, deletes, "one tombstone after each delete");
    let reads = recs.iter().filter(|r| r.op() == Some("r")).count();
    assert!(reads > 0, "backfilled rows arrive as op r");
    let bound = (BATCH_EVENTS + CHUNK) as usize;
    assert!(
        dup_after_kill <= bound,
        "{dup_after_kill} duplicates after a kill -9: more than one batch ({bound})"
    );
    assert!(
        dup_after_outage <= bound,
        "{dup_after_outage} duplicates after the broker outage: more than one batch ({bound})"
    );

    // A clean restart (fast shutdown) under writes: no duplicate at all.
    let before = r.duplicates;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| writer(&c, &stop, &writes));
        // Each restart comes right after a transaction of 2000 events, so its termination
        // request is likely to find the worker producing or waiting for acknowledgements.
        for _ in 0..2 {
            std::thread::sleep(Duration::from_secs(1));
            exec(&c, "UPDATE items SET v = v + 1 WHERE id <= 2000");
            std::thread::sleep(Duration::from_millis(30));
            c.restart();
            wait_streaming(&c, "k", Duration::from_secs(60));
        }
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::SeqCst);
    });
    wait_pipeline(&c, "k", 120);
    let recs = consume(&b.addr(), &[TOPIC]);
    let r = replay(&recs);
    let (only_src, only_copy) = compare_with_copy(&c, "items", "items_copy", &r.rows);
    assert_eq!(
        (only_src, only_copy),
        (0, 0),
        "after the clean restarts\n{}",
        kdiag(&c, &b)
    );
    check_order(&recs).unwrap_or_else(|e| panic!("per-key order: {e}"));
    let dup_after_restart = r.duplicates - before;
    eprintln!(
        "kafka: {} writer rounds, {} events; duplicates: {dup_after_kill} after kill -9, {dup_after_outage} after the outage, {dup_after_restart} after two clean restarts (bound {bound}); {:.0?}",
        writes.load(Ordering::Relaxed),
        r.events,
        t0.elapsed()
    );
    assert_eq!(dup_after_restart, 0, "duplicates after a clean restart");
}
