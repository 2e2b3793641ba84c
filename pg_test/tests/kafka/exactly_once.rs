//! Exactly once to Kafka: under a writer's load, three kill -9s of the worker, an immediate
//! restart of PostgreSQL, a broker restart (clean), a broker crash (kill -9) and a broker outage
//! (stopped, left down while the writer goes on, started again); then a `read_committed`
//! consumer reads every topic and finds every change exactly once.
//!
//! What the writer makes, so the consumer can tell a duplicate and a gap apart from a reorder:
//! each of its transactions raises one key's version (`eo.v = v + 1`, keys 1..=KEYS) and inserts
//! that (key, version) into `eo_log`. A committed version is never rolled back, so the versions
//! of a key the source committed are exactly 1..=v (its final value). The consumer then checks:
//! - per key of `eo`: the versions of its update messages, in partition order, are exactly
//!   1, 2, ..., v: no duplicate, no gap, per-key order;
//! - `eo_log`: one insert message per row of the source table, none for a row it does not have;
//! - the transaction topic: exactly one `BEGIN` and one `END` per source transaction, `BEGIN`
//!   first, and `END`'s `event_count` equal to the data messages of that transaction read.
//!
//! `TIDE_TEST_DELIVERY=at-least-once` runs the same test with the pipeline's `delivery` option
//! set so (no Kafka transactions): it is expected to fail, with the duplicates counted in its
//! message (README, Kafka target > Delivery guarantees). A `read_uncommitted` consumer's view of
//! the same topics is printed too (what an aborted transaction left in the log).

use crate::broker::*;
use pg_test::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const KEYS: i64 = 200;
const DATA: [&str; 2] = ["x.public.eo", "x.public.eo_log"];
const TXN_TOPIC: &str = "x.transaction";

/// One writer transaction after another until `stop`, reconnecting across server restarts.
fn writer(c: &Cluster, stop: &AtomicBool, done: &AtomicU64) {
    let mut n: i64 = 0;
    while !stop.load(Ordering::SeqCst) {
        let Ok(mut client) = c.try_client() else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        while !stop.load(Ordering::SeqCst) {
            n += 1;
            let k = 1 + (n * 7919) % KEYS;
            let sql = format!(
                "WITH u AS (UPDATE eo SET v = v + 1 WHERE k = {k} RETURNING k, v)
                 INSERT INTO eo_log (k, v) SELECT k, v FROM u"
            );
            if client.batch_execute(&sql).is_err() {
                break;
            }
            done.fetch_add(1, Ordering::Relaxed);
            // At most a few hundred transactions a second: load, not a backlog the test then
            // waits minutes for.
            std::thread::sleep(Duration::from_millis(3));
        }
    }
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn kdiag(c: &Cluster, b: &Broker) -> String {
    format!("{}\n--- broker log ---\n{}", diag(c), b.log())
}

/// Wait until the pipeline streams again and has applied something new (its worker's pid
/// differs from `old`).
fn recovered(c: &Cluster, b: &Broker, old: Option<i32>) {
    wait_recovered(c, "x", old, Duration::from_secs(120), || kdiag(c, b));
    let before: String = c.query_scalar(
        "SELECT coalesce(applied_lsn::text, '0/0') FROM tide.pipelines WHERE name = 'x'",
    );
    c.wait_until(
        "the pipeline applies again",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<bool>(&format!(
                "SELECT coalesce((SELECT applied_lsn > '{before}'::pg_lsn FROM tide.pipelines WHERE name = 'x'), false)"
            ))?)
        },
    );
}

/// What the read_committed consumer found wrong; empty when every change arrived once.
#[derive(Default, Debug)]
struct Tally {
    updates: usize,
    inserts: usize,
    duplicates: usize,
    gaps: usize,
    out_of_order: usize,
    missing_inserts: usize,
    extra_inserts: usize,
    problems: Vec<String>,
}

fn check(
    recs: &[Rec],
    txn_recs: &[Rec],
    finals: &HashMap<i64, i64>,
    log: &HashSet<(i64, i64)>,
) -> Tally {
    let mut t = Tally::default();
    // Per key: versions in partition order.
    let mut versions: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut inserted: BTreeMap<(i64, i64), usize> = BTreeMap::new();
    let mut per_txn: HashMap<String, usize> = HashMap::new();
    for r in recs {
        let Some(v) = &r.value else { continue };
        if let Some(id) = v["transaction"]["id"].as_str() {
            *per_txn.entry(id.to_string()).or_default() += 1;
        }
        let after = &v["after"];
        match (r.topic.as_str(), r.op()) {
            ("x.public.eo", Some("u")) => {
                t.updates += 1;
                let (Some(k), Some(ver)) = (after["k"].as_i64(), after["v"].as_i64()) else {
                    t.problems.push(format!("an update without k and v: {v}"));
                    continue;
                };
                versions.entry(k).or_default().push(ver);
            }
            ("x.public.eo_log", Some("c")) => {
                t.inserts += 1;
                let (Some(k), Some(ver)) = (after["k"].as_i64(), after["v"].as_i64()) else {
                    t.problems.push(format!("an insert without k and v: {v}"));
                    continue;
                };
                *inserted.entry((k, ver)).or_default() += 1;
            }
            (topic, op) => t
                .problems
                .push(format!("unexpected {op:?} in {topic}: {v}")),
        }
    }
    for (k, last) in finals {
        let got = versions.remove(k).unwrap_or_default();
        let mut seen = HashSet::new();
        let mut prev = 0;
        for &ver in &got {
            if !seen.insert(ver) {
                t.duplicates += 1;
            } else if ver < prev {
                t.out_of_order += 1;
            }
            prev = prev.max(ver);
        }
        let gaps = (1..=*last).filter(|v| !seen.contains(v)).count();
        t.gaps += gaps;
        if seen.iter().any(|v| *v > *last) {
            t.problems
                .push(format!("key {k}: a version above the source's {last}"));
        }
        if (gaps > 0 || got.len() != *last as usize) && t.problems.len() < 5 {
            t.problems.push(format!(
                "key {k}: source version {last}, versions read {got:?}"
            ));
        }
    }
    if !versions.is_empty() {
        t.problems.push(format!(
            "updates of keys the source lacks: {:?}",
            versions.keys()
        ));
    }
    for (row, n) in &inserted {
        if !log.contains(row) {
            t.extra_inserts += 1;
        }
        if *n > 1 {
            t.duplicates += n - 1;
        }
    }
    t.missing_inserts = log.iter().filter(|r| !inserted.contains_key(r)).count();
    // The transaction topic: one BEGIN then one END per source transaction, END's count equal
    // to the data messages read of it.
    let mut begun: HashSet<String> = HashSet::new();
    let mut ended: HashSet<String> = HashSet::new();
    for r in txn_recs {
        let Some(v) = &r.value else { continue };
        let id = v["id"].as_str().unwrap_or_default().to_string();
        match v["status"].as_str() {
            Some("BEGIN") => {
                if !begun.insert(id.clone()) {
                    t.problems.push(format!("transaction {id}: a second BEGIN"));
                }
            }
            Some("END") => {
                if !begun.contains(&id) {
                    t.problems
                        .push(format!("transaction {id}: END without BEGIN"));
                }
                if !ended.insert(id.clone()) {
                    t.problems.push(format!("transaction {id}: a second END"));
                }
                let count = v["event_count"].as_u64().unwrap_or(0) as usize;
                let read = per_txn.get(&id).copied().unwrap_or(0);
                if count != read {
                    t.problems.push(format!(
                        "transaction {id}: END says {count} events, {read} read"
                    ));
                }
            }
            other => t
                .problems
                .push(format!("a transaction record of status {other:?}")),
        }
    }
    if begun.len() != ended.len() {
        t.problems.push(format!(
            "{} BEGIN records, {} END records",
            begun.len(),
            ended.len()
        ));
    }
    let without_end = per_txn.keys().filter(|id| !ended.contains(*id)).count();
    if without_end > 0 {
        t.problems.push(format!(
            "{without_end} transactions of data messages without an END record"
        ));
    }
    t.problems.truncate(12);
    t
}

#[test]
fn kafka_exactly_once_through_kills_restarts_and_outages() {
    let t0 = Instant::now();
    let delivery = std::env::var("TIDE_TEST_DELIVERY").unwrap_or_else(|_| "exactly-once".into());
    let mut b = Broker::own("eos");
    let c = start_cluster(Cluster::builder("kafka_eos").conf("tide.batch_events = 200"));
    init_extension(&c);
    c.execute(&format!(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE TABLE eo (k int PRIMARY KEY, v bigint NOT NULL);
         INSERT INTO eo SELECT g, 0 FROM generate_series(1, {KEYS}) g;
         CREATE TABLE eo_log (k int, v bigint, PRIMARY KEY (k, v));
         GRANT SELECT ON eo, eo_log TO alice;"
    ));
    create_kafka_server(&c, "events", &b, "alice");
    let mut alice = connect_as(&c, "alice");
    alice
        .batch_execute(&format!(
            r#"SELECT tide.create_pipeline('x', 'kafka', '{{"server": "events", "partitions": 3, "delivery": "{delivery}", "producer": {{"message.timeout.ms": 10000}}}}');
               SELECT tide.add_table('x', 'eo', backfill => false);
               SELECT tide.add_table('x', 'eo_log', backfill => false);"#
        ))
        .unwrap_or_else(|e| panic!("create_pipeline: {}\n{}", describe_error(&e), kdiag(&c, &b)));
    wait_streaming(&c, "x", Duration::from_secs(30));

    let stop = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    let mut faults = Vec::new();
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| writer(&c, &stop, &writes));
        let busy = |what: &str| {
            let from = writes.load(Ordering::Relaxed);
            c.wait_until(
                what,
                Duration::from_secs(60),
                Duration::from_millis(50),
                || Ok(writes.load(Ordering::Relaxed) >= from + 300),
            );
        };
        // Three kill -9s of the worker (each a crash restart of the server), under writes.
        for i in 0..3 {
            busy("writes before a kill -9");
            let pid = worker_pid(&c, "x").expect("the worker runs");
            kill9_and_wait_restart(&c, pid, Duration::from_secs(60));
            recovered(&c, &b, Some(pid));
            faults.push(format!("kill -9 #{}", i + 1));
        }
        // An immediate shutdown and start of PostgreSQL.
        busy("writes before the immediate restart");
        let pid = worker_pid(&c, "x");
        c.stop(StopMode::Immediate);
        c.start();
        recovered(&c, &b, pid);
        faults.push("immediate restart of PostgreSQL".into());
        // A clean broker restart, then a broker crash and start.
        busy("writes before the broker restart");
        b.stop();
        b.resume();
        c.wait_until(
            "applies after the broker restart",
            Duration::from_secs(120),
            Duration::from_millis(200),
            || {
                Ok(c.try_query_scalar::<bool>(
                    "SELECT coalesce((SELECT state = 'streaming' FROM tide.pipelines WHERE name = 'x'), false)",
                )?)
            },
        );
        faults.push("broker restart (SIGTERM)".into());
        busy("writes before the broker crash");
        b.kill();
        b.resume();
        faults.push("broker kill -9 and start".into());
        // An outage: down while the writer goes on; the pipeline shows the error, then catches up.
        busy("writes before the outage");
        b.stop();
        c.wait_until(
            "state error with the reason",
            Duration::from_secs(90),
            Duration::from_millis(200),
            || {
                Ok(c.try_query_scalar::<bool>(
                    "SELECT coalesce((SELECT state = 'error' AND last_error LIKE 'kafka target:%' FROM tide.pipelines WHERE name = 'x'), false)",
                )?)
            },
        );
        std::thread::sleep(Duration::from_secs(3));
        b.resume();
        faults.push("broker outage".into());
        busy("writes after the outage");
        stop.store(true, Ordering::SeqCst);
    });
    wait_pipeline(&c, "x", 300);

    let finals: HashMap<i64, i64> = c
        .query("SELECT k::int8, v FROM eo WHERE v > 0")
        .into_iter()
        .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)))
        .collect();
    let log: HashSet<(i64, i64)> = c
        .query("SELECT k::int8, v FROM eo_log")
        .into_iter()
        .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)))
        .collect();
    let committed = consume(&b.addr(), &DATA);
    let txn_recs = consume(&b.addr(), &[TXN_TOPIC]);
    let t = check(&committed, &txn_recs, &finals, &log);
    let raw = consume_as(&b.addr(), &DATA, "read_uncommitted");
    let raw_txn = consume_as(&b.addr(), &[TXN_TOPIC], "read_uncommitted");
    let u = check(&raw, &raw_txn, &finals, &log);
    let summary = format!(
        "delivery {delivery}: {} writer transactions ({} in the source), faults: {}; read_committed: {} updates, {} inserts, {} duplicates, {} gaps, {} out of order, {} missing and {} extra inserts; read_uncommitted: {} messages, {} duplicates; {:.0?}",
        writes.load(Ordering::Relaxed),
        log.len(),
        faults.join(", "),
        t.updates,
        t.inserts,
        t.duplicates,
        t.gaps,
        t.out_of_order,
        t.missing_inserts,
        t.extra_inserts,
        raw.len(),
        u.duplicates,
        t0.elapsed()
    );
    eprintln!("kafka exactly-once: {summary}");
    assert!(log.len() >= 1500, "too few writes: {summary}");
    assert_eq!(
        t.updates,
        log.len(),
        "one update message per source change: {summary}\n{:?}",
        t.problems
    );
    assert!(
        t.duplicates == 0
            && t.gaps == 0
            && t.out_of_order == 0
            && t.missing_inserts == 0
            && t.extra_inserts == 0
            && t.problems.is_empty(),
        "not exactly once: {summary}\n{:#?}\n{}",
        t.problems,
        kdiag(&c, &b)
    );
}
