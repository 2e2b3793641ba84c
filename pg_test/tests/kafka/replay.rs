//! Messages back into rows: a topic replayed in stream order (identity order) with duplicate
//! identities dropped, loaded into a copy table and compared with the source both ways.

use crate::broker::Rec;
use pg_test::*;
use std::collections::{BTreeMap, HashMap, HashSet};

/// The rows a topic's messages leave, and what was dropped on the way.
#[derive(Debug, Default)]
pub struct Replayed {
    /// Row JSON by the message key.
    pub rows: BTreeMap<String, serde_json::Value>,
    /// Data events (distinct identities) applied.
    pub events: usize,
    /// Data messages whose identity had been seen already (broadcast copies not counted).
    pub duplicates: usize,
}

/// Replay the data messages of `recs` (tombstones skipped; truncate and schema copies, one per
/// partition, counted once) in identity order.
pub fn replay(recs: &[Rec]) -> Replayed {
    let mut seen: HashSet<(u64, i64)> = HashSet::new();
    let mut seen_copy: HashSet<((u64, i64), i32)> = HashSet::new();
    let mut out = Replayed::default();
    let mut events: Vec<&Rec> = Vec::new();
    for r in recs {
        let Some(id) = r.identity() else { continue };
        // The identity is in the headers too.
        assert_eq!(
            (
                r.headers.get("tide.position").map(String::as_str),
                r.headers.get("tide.commit_lsn")
            ),
            (
                Some(id.1.to_string().as_str()),
                r.value
                    .as_ref()
                    .and_then(|v| v["source"]["commit_lsn"].as_str().map(str::to_string))
                    .as_ref()
            ),
            "headers of {}/{}@{}",
            r.topic,
            r.partition,
            r.offset
        );
        let broadcast = matches!(r.op(), Some("t" | "schema"));
        if broadcast {
            if !seen_copy.insert((id, r.partition)) {
                out.duplicates += 1;
            }
            if seen.insert(id) {
                events.push(r);
            }
        } else if seen.insert(id) {
            events.push(r);
        } else {
            out.duplicates += 1;
        }
    }
    events.sort_by_key(|r| r.identity());
    out.events = events.len();
    for r in events {
        let v = r.value.as_ref().expect("data message");
        match r.op() {
            Some("c" | "u" | "r") => {
                let key = r.key.clone().expect("a data message has a key");
                out.rows.insert(key, v["after"].clone());
            }
            Some("d") => {
                let key = r.key.clone().expect("a delete has a key");
                out.rows.remove(&key);
            }
            Some("t") => out.rows.clear(),
            _ => {}
        }
    }
    out
}

/// Per key: one partition, and increasing identities once duplicates are dropped.
pub fn check_order(recs: &[Rec]) -> Result<(), String> {
    let mut part: HashMap<(String, String), i32> = HashMap::new();
    let mut last: HashMap<(String, String), (u64, i64)> = HashMap::new();
    let mut seen: HashSet<(u64, i64)> = HashSet::new();
    let mut sorted: Vec<&Rec> = recs.iter().filter(|r| r.identity().is_some()).collect();
    sorted.sort_by_key(|r| (r.topic.clone(), r.partition, r.offset));
    for r in sorted {
        let (Some(id), Some(key)) = (r.identity(), r.key.clone()) else {
            continue;
        };
        let k = (r.topic.clone(), key);
        if let Some(p) = part.insert(k.clone(), r.partition) {
            if p != r.partition {
                return Err(format!(
                    "key {} of {} is in partitions {p} and {}",
                    k.1, k.0, r.partition
                ));
            }
        }
        if !seen.insert(id) {
            continue;
        }
        if let Some(prev) = last.insert(k.clone(), id) {
            if prev >= id {
                return Err(format!(
                    "key {} of {}: identity {id:?} at offset {} follows {prev:?}",
                    k.1, k.0, r.offset
                ));
            }
        }
    }
    Ok(())
}

/// `copy` (created LIKE `source`) holds exactly `rows`; returns the rows only in the source and
/// only in the copy (set difference both ways).
pub fn compare_with_copy(
    c: &Cluster,
    source: &str,
    copy: &str,
    rows: &BTreeMap<String, serde_json::Value>,
) -> (i64, i64) {
    let arr = serde_json::Value::Array(rows.values().cloned().collect()).to_string();
    let mut client = c.client();
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {copy}; CREATE TABLE {copy} (LIKE {source});"
        ))
        .expect("copy table");
    client
        .execute(
            &format!("INSERT INTO {copy} SELECT * FROM jsonb_populate_recordset(NULL::{copy}, $1::text::jsonb)"),
            &[&arr],
        )
        .unwrap_or_else(|e| panic!("load {copy}: {}", describe_error(&e)));
    let only_src: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM (SELECT * FROM {source} EXCEPT ALL SELECT * FROM {copy}) x"
    ));
    let only_copy: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM (SELECT * FROM {copy} EXCEPT ALL SELECT * FROM {source}) x"
    ));
    (only_src, only_copy)
}
