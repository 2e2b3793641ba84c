//! A kafka pipeline whose slot is lost (README, Concepts > Lost slots; Kafka target): every
//! partition of each table's topic gets a `resync` start message before the table's re-read
//! rows and an end message after them, so a consumer that drops, at the end, the keys it did not
//! see since the start ends with the source's rows; one that does not keeps the rows deleted
//! while the slot was lost.

use crate::broker::*;
use pg_test::*;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

/// One topic's messages as a consumer applies them: per partition, in offset order.
fn by_partition(recs: &[Rec]) -> BTreeMap<i32, Vec<&Rec>> {
    let mut parts: BTreeMap<i32, Vec<&Rec>> = BTreeMap::new();
    for r in recs {
        parts.entry(r.partition).or_default().push(r);
    }
    for p in parts.values_mut() {
        p.sort_by_key(|r| r.offset);
    }
    parts
}

/// The rows (`(id,v)`) a consumer of `recs` holds: c/u/r upsert, d deletes; with `drop_unseen`,
/// at a partition's `resync` end the keys it did not see (c/u/r, not deleted since) after that
/// partition's start are dropped.
fn consumed(recs: &[Rec], drop_unseen: bool) -> BTreeSet<String> {
    let mut rows = BTreeSet::new();
    for part in by_partition(recs).values() {
        let mut held: BTreeMap<String, String> = BTreeMap::new();
        let mut seen: Option<HashSet<String>> = None;
        for r in part {
            let (Some(v), Some(op)) = (r.value.as_ref(), r.op()) else {
                continue;
            };
            match op {
                "c" | "u" | "r" => {
                    let key = r.key.clone().unwrap_or_default();
                    let a = &v["after"];
                    held.insert(key.clone(), format!("({},{})", a["id"], a["v"]));
                    if let Some(s) = seen.as_mut() {
                        s.insert(key);
                    }
                }
                "d" => {
                    let key = r.key.clone().unwrap_or_default();
                    held.remove(&key);
                    if let Some(s) = seen.as_mut() {
                        s.remove(&key);
                    }
                }
                "resync" if drop_unseen => match v["resync"]["phase"].as_str() {
                    Some("start") => seen = Some(HashSet::new()),
                    Some("end") => {
                        if let Some(s) = seen.take() {
                            if v["resync"]["complete"] == serde_json::Value::Bool(true) {
                                held.retain(|k, _| s.contains(k));
                            }
                        }
                    }
                    _ => {}
                },
                _ => {}
            }
        }
        rows.extend(held.into_values());
    }
    rows
}

#[test]
fn kafka_resync_events_frame_the_reread() {
    let b = Broker::start("resync");
    let c = start_cluster(Cluster::builder("kafka_resync"));
    init_extension(&c);
    c.execute(
        "CREATE TABLE a (id int PRIMARY KEY, v int);
         INSERT INTO a SELECT g, g FROM generate_series(1, 600) g;
         CREATE TABLE b (id int PRIMARY KEY, v int);
         INSERT INTO b SELECT g, g FROM generate_series(1, 400) g;",
    );
    create_kafka_server(&c, "events", &b, "postgres");
    c.execute(
        r#"SELECT tide.create_pipeline('k', 'kafka', '{"server": "events", "partitions": 2}')"#,
    );
    wait_streaming(&c, "k", Duration::from_secs(30));
    for sql in [
        "SELECT tide.add_table('k', 'a')",
        "SELECT tide.add_table('k', 'b')",
        "SELECT tide.alter_backfill('a', 'k', chunk_size => 100)",
        "SELECT tide.alter_backfill('b', 'k', chunk_size => 100)",
    ] {
        c.execute(sql);
    }
    wait_for_backfill(&c, "a", Some("k"), 120, || diag(&c));
    wait_for_backfill(&c, "b", Some("k"), 120, || diag(&c));
    wait_for_pipeline(&c, "k", 60, || diag(&c));
    // Lost while paused: deletes, updates and inserts the new slot never delivers.
    c.execute("SELECT tide.pause_pipeline('k')");
    c.execute(
        "DELETE FROM a WHERE id <= 200; UPDATE a SET v = -v WHERE id > 500;
         DELETE FROM b WHERE id > 300; INSERT INTO b SELECT g, g FROM generate_series(1001, 1050) g;",
    );
    c.wait_until(
        "the paused worker to let go of its slot",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT NOT active FROM pg_replication_slots WHERE slot_name = 'tide_5_k'",
            )?)
        },
    );
    c.execute("SELECT pg_drop_replication_slot('tide_5_k')");
    c.execute("SELECT tide.resume_pipeline('k')");
    c.wait_until(
        "the resync to be over",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT resync IS NULL AND slot_lost_at IS NOT NULL AND state = 'streaming'
                                    FROM tide.pipelines WHERE name = 'k'), false)",
            )?)
        },
    );
    wait_for_pipeline(&c, "k", 60, || diag(&c));
    let resync_backfills: HashSet<i64> = c
        .query("SELECT id FROM tide.backfill WHERE pipeline = 'k' AND resync")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(resync_backfills.len(), 2, "{}", diag(&c));
    for table in ["a", "b"] {
        let topic = format!("k.public.{table}");
        let recs = consume(&b.addr(), &[&topic]);
        let parts = by_partition(&recs);
        assert_eq!(parts.len(), 2, "{topic}: partitions with messages");
        for (p, msgs) in &parts {
            // Exactly one start and one end on every partition, in that order, naming the table.
            let marks: Vec<(i64, String)> = msgs
                .iter()
                .filter(|r| r.op() == Some("resync"))
                .map(|r| {
                    let v = r.value.as_ref().unwrap();
                    assert_eq!(v["source"]["table"], table, "{v}");
                    assert_eq!(r.headers.get("tide.op").map(String::as_str), Some("resync"));
                    // At a WAL page boundary, where no source transaction commits.
                    assert_eq!(
                        v["source"]["lsn"].as_u64().map(|l| l % 8192),
                        Some(0),
                        "{v}"
                    );
                    assert_eq!(v["source"]["txId"], 0, "{v}");
                    match v["resync"]["phase"].as_str() {
                        Some("start") => assert!(v["resync"]["reason"].is_string(), "{v}"),
                        Some("end") => assert_eq!(v["resync"]["complete"], true, "{v}"),
                        _ => panic!("{topic}/{p}: a resync message without a phase: {v}"),
                    }
                    (r.offset, v["resync"]["phase"].as_str().unwrap().to_string())
                })
                .collect();
            let phases: Vec<&str> = marks.iter().map(|(_, ph)| ph.as_str()).collect();
            assert_eq!(phases, ["start", "end"], "{topic}/{p}");
            let (start, end) = (marks[0].0, marks[1].0);
            // Every row the resync read again lies between them.
            let reread: Vec<i64> = msgs
                .iter()
                .filter(|r| {
                    r.op() == Some("r")
                        && r.value
                            .as_ref()
                            .and_then(|v| v["source"]["backfill_id"].as_i64())
                            .is_some_and(|id| resync_backfills.contains(&id))
                })
                .map(|r| r.offset)
                .collect();
            assert!(!reread.is_empty(), "{topic}/{p}: no row read again");
            assert!(
                reread.iter().all(|&o| o > start && o < end),
                "{topic}/{p}: re-read rows at offsets {reread:?} outside the start ({start}) and end ({end})"
            );
        }
        let source: BTreeSet<String> = c
            .query(&format!("SELECT format('(%s,%s)', id, v) FROM {table}"))
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(
            consumed(&recs, true),
            source,
            "{topic}: the consumer that drops unseen keys"
        );
        // Without the rule, the rows deleted while the slot was lost stay.
        assert_ne!(
            consumed(&recs, false),
            source,
            "{topic}: the naive consumer"
        );
    }
}
