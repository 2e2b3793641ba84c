//! A table without a key (`REPLICA IDENTITY FULL`, README "Tables without a key") into Kafka,
//! in both value formats (`debezium` JSON and `debezium-schema`): an audit table with duplicate
//! rows and NULLs, copied by pg_tide's backfill of such a table (one copy at a point of the
//! stream) while rows are inserted, one of several equal rows updated or deleted, and many rows
//! updated and deleted at once. Checked on each topic:
//! - every data message has no key (as Debezium writes a table without a primary key) and no
//!   tombstone follows a delete (a tombstone without a key removes nothing);
//! - every data message is on one partition of the topic (a message without a key goes to one
//!   fixed partition), so a consumer reads the table's changes in stream order; the copy's
//!   `resync` start and end are on every partition;
//! - an update's and a delete's `before` is the whole old row;
//! - a consumer that keeps a multiset of rows (`resync` start: drop them; `r`/`c`: add `after`;
//!   `u`: replace one row equal to `before` by `after`; `d`: remove one row equal to `before`)
//!   ends with the source's rows, each as many times as the source holds it.
//!
//! Then the JSON pipeline's slot is lost while rows change: its resync copies the table (the
//! resync's start and end around the copy's own on every partition), and the same consumer ends
//! with the source's rows again.

use crate::broker::*;
use pg_test::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// A row as the consumer compares it: its columns `a` and `b` (the JSON forms of both formats
/// agree for an int and a text).
fn row_text(v: &Value) -> String {
    json!({"a": v["a"], "b": v["b"]}).to_string()
}

/// Each message's envelope: the value itself (`debezium`), or its `payload`
/// (`debezium-schema`).
fn envelope(r: &Rec) -> Option<&Value> {
    let v = r.value.as_ref()?;
    Some(if v.get("payload").is_some() {
        &v["payload"]
    } else {
        v
    })
}

/// The multiset of rows a consumer of the topic's partition `part` holds at its end (see the
/// module header).
fn consumed(recs: &[&Rec]) -> BTreeMap<String, i64> {
    let mut held: BTreeMap<String, i64> = BTreeMap::new();
    let remove = |held: &mut BTreeMap<String, i64>, row: String, at: i64| {
        let n = held
            .get_mut(&row)
            .unwrap_or_else(|| panic!("offset {at}: the old row {row} is not held"));
        *n -= 1;
        if *n == 0 {
            held.remove(&row);
        }
    };
    for r in recs {
        let Some(v) = envelope(r) else { continue };
        match v["op"].as_str() {
            Some("resync") if v["resync"]["phase"] == "start" => held.clear(),
            Some("r" | "c") => *held.entry(row_text(&v["after"])).or_default() += 1,
            Some("u") => {
                remove(&mut held, row_text(&v["before"]), r.offset);
                *held.entry(row_text(&v["after"])).or_default() += 1;
            }
            Some("d") => remove(&mut held, row_text(&v["before"]), r.offset),
            _ => {}
        }
    }
    held
}

/// The source's rows as the consumer holds them.
fn source_rows(c: &Cluster) -> BTreeMap<String, i64> {
    let mut source: BTreeMap<String, i64> = BTreeMap::new();
    for r in c.query("SELECT a, b FROM hist") {
        let (a, b): (Option<i32>, Option<String>) = (r.get(0), r.get(1));
        *source
            .entry(row_text(&json!({"a": a, "b": b})))
            .or_default() += 1;
    }
    source
}

#[test]
fn keyless_table_into_kafka_without_a_key() {
    let b = Broker::start("keyless");
    let c = start_cluster(Cluster::builder("kafka_keyless"));
    init_extension(&c);
    c.execute(
        "CREATE TABLE hist (a int, b text);
         ALTER TABLE hist REPLICA IDENTITY FULL;
         INSERT INTO hist SELECT g % 50, CASE WHEN g % 7 = 0 THEN NULL ELSE 'n' || g % 5 END
           FROM generate_series(1, 400) g;",
    );
    create_kafka_server(&c, "events", &b, "postgres");
    c.execute(
        r#"SELECT tide.create_pipeline('k', 'kafka', '{"server": "events", "partitions": 3}')"#,
    );
    c.execute(
        r#"SELECT tide.create_pipeline('ks', 'kafka', '{"server": "events", "partitions": 3, "value_format": "debezium-schema"}')"#,
    );
    wait_streaming(&c, "k", Duration::from_secs(30));
    wait_streaming(&c, "ks", Duration::from_secs(30));
    c.execute("SELECT tide.add_table('k', 'hist')");
    c.execute("SELECT tide.add_table('ks', 'hist')");
    // Changes while the copies are queued or taken, then after.
    let changes = [
        "INSERT INTO hist SELECT 7, 'dup' FROM generate_series(1, 3)",
        "UPDATE hist SET b = 'one' WHERE ctid = (SELECT ctid FROM hist WHERE b = 'dup' LIMIT 1)",
        "DELETE FROM hist WHERE ctid = (SELECT ctid FROM hist WHERE b = 'dup' LIMIT 1)",
        "UPDATE hist SET a = a + 100 WHERE a % 10 = 3",
        "DELETE FROM hist WHERE a % 10 = 4",
        "INSERT INTO hist VALUES (NULL, NULL), (NULL, NULL)",
    ];
    c.execute(changes[0]);
    c.execute(changes[1]);
    wait_backfill(&c, "hist", "k", 120);
    wait_backfill(&c, "hist", "ks", 120);
    for sql in &changes[2..] {
        c.execute(sql);
    }
    c.execute(
        "DELETE FROM hist WHERE ctid = (SELECT ctid FROM hist WHERE a IS NULL LIMIT 1);
         UPDATE hist SET b = 'x' WHERE b = 'n1' AND a < 20;",
    );
    wait_pipeline(&c, "k", 120);
    wait_pipeline(&c, "ks", 120);
    let source = source_rows(&c);
    assert!(
        source.values().any(|&n| n > 1),
        "the source holds duplicate rows"
    );
    for topic in ["k.public.hist", "ks.public.hist"] {
        let recs = consume(&b.addr(), &[topic]);
        // Data messages (and any tombstone: a message without a value).
        let data: Vec<&Rec> = recs
            .iter()
            .filter(|r| {
                r.value.is_none()
                    || matches!(
                        envelope(r).and_then(|v| v["op"].as_str()),
                        Some("r" | "c" | "u" | "d")
                    )
            })
            .collect();
        assert!(data.len() > 400, "{topic}: {} data messages", data.len());
        assert!(
            data.iter().all(|r| r.value.is_some()),
            "{topic}: a tombstone (a message without a value)"
        );
        let keyed: Vec<&&Rec> = data.iter().filter(|r| r.key.is_some()).collect();
        assert!(
            keyed.is_empty(),
            "{topic}: {} messages have a key, e.g. {:?}",
            keyed.len(),
            keyed.first().map(|r| &r.key)
        );
        let parts: std::collections::BTreeSet<i32> = data.iter().map(|r| r.partition).collect();
        assert_eq!(
            parts.len(),
            1,
            "{topic}: the data messages are on partitions {parts:?}"
        );
        let part = *parts.iter().next().unwrap();
        let mut ops: BTreeMap<String, usize> = BTreeMap::new();
        for r in &data {
            let v = envelope(r).unwrap();
            let op = v["op"].as_str().unwrap().to_string();
            if op == "u" || op == "d" {
                // The whole old row: both columns present (a NULL as null).
                let before = v["before"]
                    .as_object()
                    .unwrap_or_else(|| panic!("{topic}@{}: {op} without before: {v}", r.offset));
                assert!(
                    before.contains_key("a") && before.contains_key("b"),
                    "{topic}@{}: before {v}",
                    r.offset
                );
            }
            *ops.entry(op).or_default() += 1;
        }
        for op in ["r", "c", "u", "d"] {
            assert!(ops.contains_key(op), "{topic}: no {op} message: {ops:?}");
        }
        // Each copy's resync start and end on every partition.
        for p in 0..3 {
            let phases: Vec<String> = recs
                .iter()
                .filter(|r| r.partition == p)
                .filter_map(|r| envelope(r))
                .filter(|v| v["op"] == "resync")
                .map(|v| v["resync"]["phase"].as_str().unwrap_or("").to_string())
                .collect();
            assert_eq!(phases, ["start", "end"], "{topic}/{p}: resync messages");
        }
        let mut ordered: Vec<&Rec> = recs.iter().filter(|r| r.partition == part).collect();
        ordered.sort_by_key(|r| r.offset);
        assert_eq!(
            consumed(&ordered),
            source,
            "{topic}: the consumer's multiset of rows against the source's"
        );
    }
    // The slot of `k` lost while it is paused, with rows deleted, updated and inserted
    // meanwhile: the resync's backfill of the table is its copy, framed on every partition by
    // the resync's start and end; the consumer ends with the source's rows again.
    c.execute("SELECT tide.pause_pipeline('k')");
    c.execute(
        "DELETE FROM hist WHERE a % 10 = 1;
         UPDATE hist SET b = 'gap' WHERE ctid = (SELECT ctid FROM hist WHERE b = 'n2' LIMIT 1);
         INSERT INTO hist VALUES (5, 'gap'), (5, 'gap');",
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
    wait_pipeline(&c, "k", 120);
    let state: String = c.query_scalar(
        "SELECT state FROM tide.backfill WHERE pipeline = 'k' AND resync ORDER BY id DESC LIMIT 1",
    );
    assert_eq!(state, "done", "the resync's copy");
    let recs = consume(&b.addr(), &["k.public.hist"]);
    for p in 0..3 {
        let phases: Vec<String> = recs
            .iter()
            .filter(|r| r.partition == p && r.op() == Some("resync"))
            .map(|r| {
                r.value.as_ref().unwrap()["resync"]["phase"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        // The first copy; the resync's start, its copy's start and end, the resync's end.
        assert_eq!(
            phases,
            ["start", "end", "start", "start", "end", "end"],
            "k.public.hist/{p}: resync messages after the lost slot"
        );
    }
    let parts: std::collections::BTreeSet<i32> = recs
        .iter()
        .filter(|r| matches!(r.op(), Some("r" | "c" | "u" | "d")))
        .map(|r| r.partition)
        .collect();
    assert_eq!(parts.len(), 1, "data messages on partitions {parts:?}");
    let mut ordered: Vec<&Rec> = recs
        .iter()
        .filter(|r| parts.contains(&r.partition))
        .collect();
    ordered.sort_by_key(|r| r.offset);
    assert_eq!(
        consumed(&ordered),
        source_rows(&c),
        "k.public.hist after the resync: the consumer's multiset of rows against the source's"
    );
}
