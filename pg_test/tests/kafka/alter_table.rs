//! A kafka pipeline's row filter changed mid-stream (`tide.alter_table`, README "Concepts >
//! Changing a row filter or a column list"): the table's topic gets the schema message
//! (`schema_change` with `"altered": true` and both filters) between the rows written just
//! before and just after the change (the pipeline paused around it, so both are decoded in one
//! go), the rows after it pass the new filter, and a consumer that, at that message, drops the
//! rows the new filter does not pass ends with `SELECT ... WHERE <new filter>`; one that does not
//! keeps rows the new filter leaves out.

use crate::broker::*;
use pg_test::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const OLD: &str = "region = 'eu'";
const NEW: &str = "status <> 'draft'";

/// The rows `(id,region,status)` a consumer of `recs` (one partition, in offset order) holds:
/// c/u/r upsert, d deletes; with `apply_filter`, at an altered schema message the rows whose
/// status is 'draft' (the new filter, which the message names) are dropped.
fn consumed(recs: &[&Rec], apply_filter: bool) -> BTreeSet<String> {
    let mut held: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for r in recs {
        let (Some(v), Some(op)) = (r.value.as_ref(), r.op()) else {
            continue;
        };
        let key = r.key.clone().unwrap_or_default();
        match op {
            "c" | "u" | "r" => {
                held.insert(key, v["after"].clone());
            }
            "d" => {
                held.remove(&key);
            }
            "schema" if apply_filter => {
                let change = schema_change(v);
                if change["altered"] == serde_json::Value::Bool(true) {
                    assert_eq!(change["row_filter"], NEW, "{change}");
                    held.retain(|_, a| a["status"] != "draft");
                }
            }
            _ => {}
        }
    }
    held.values()
        .map(|a| format!("({},{},{})", a["id"], a["region"], a["status"]))
        .collect()
}

/// A schema message's `schema_change` (an object, or JSON text).
fn schema_change(v: &serde_json::Value) -> serde_json::Value {
    match &v["schema_change"] {
        serde_json::Value::String(s) => serde_json::from_str(s).expect("schema_change JSON"),
        other => other.clone(),
    }
}

#[test]
fn kafka_filter_changed_mid_stream() {
    let b = Broker::start("alter");
    let c = start_cluster(Cluster::builder("kafka_alter"));
    init_extension(&c);
    c.execute(
        "CREATE TABLE orders (id int PRIMARY KEY, region text NOT NULL, status text NOT NULL);
         ALTER TABLE orders REPLICA IDENTITY FULL;
         INSERT INTO orders SELECT g, (ARRAY['eu', 'us', 'eu'])[g % 3 + 1],
                (ARRAY['paid', 'draft', 'shipped', 'paid'])[g % 4 + 1]
           FROM generate_series(1, 600) g;",
    );
    create_kafka_server(&c, "events", &b, "postgres");
    c.execute(
        r#"SELECT tide.create_pipeline('k', 'kafka', '{"server": "events", "partitions": 1}')"#,
    );
    wait_streaming(&c, "k", Duration::from_secs(30));
    c.execute(&format!(
        "SELECT tide.add_table('k', 'orders', row_filter => $f${OLD}$f$)"
    ));
    wait_for_backfill(&c, "orders", Some("k"), 120, || diag(&c));
    wait_for_pipeline(&c, "k", 60, || diag(&c));
    c.execute("SELECT tide.pause_pipeline('k')");
    c.execute(
        "UPDATE orders SET region = 'us' WHERE id % 10 = 0 AND id < 900000;      -- out of the old filter
         UPDATE orders SET status = 'draft' WHERE id % 10 = 1 AND id < 900000;   -- out of the new one
         INSERT INTO orders VALUES (900001, 'us', 'paid'), (900002, 'eu', 'draft');",
    );
    c.execute(&format!(
        "SELECT tide.alter_table('k', 'orders', row_filter => $f${NEW}$f$)"
    ));
    c.execute(
        "INSERT INTO orders VALUES (900003, 'us', 'paid'), (900004, 'eu', 'draft');
         UPDATE orders SET region = 'eu', status = 'paid' WHERE id % 10 = 2 AND id < 900000;
         UPDATE orders SET status = 'draft' WHERE id % 10 = 3 AND id < 900000;
         DELETE FROM orders WHERE id % 10 = 4 AND id < 900000;",
    );
    c.execute("SELECT tide.resume_pipeline('k')");
    wait_for_pipeline(&c, "k", 120, || diag(&c));
    wait_for_backfill(&c, "orders", Some("k"), 120, || diag(&c));
    let recs = consume(&b.addr(), &["k.public.orders"]);
    let mut msgs: Vec<&Rec> = recs.iter().collect();
    msgs.sort_by_key(|r| (r.partition, r.offset));
    assert!(
        msgs.iter().all(|r| r.partition == msgs[0].partition),
        "one partition"
    );
    let altered: Vec<i64> = msgs
        .iter()
        .filter(|r| r.op() == Some("schema"))
        .filter(|r| schema_change(r.value.as_ref().unwrap())["altered"] == true)
        .map(|r| r.offset)
        .collect();
    assert_eq!(altered.len(), 1, "one altered schema message");
    let at = altered[0];
    let change = schema_change(
        msgs.iter()
            .find(|r| r.offset == at)
            .and_then(|r| r.value.as_ref())
            .unwrap(),
    );
    assert_eq!(change["previous_row_filter"], OLD, "{change}");
    assert_eq!(change["row_filter"], NEW, "{change}");
    // Stream messages (not backfilled rows) of the rows written around the change.
    let streamed = |id: i64| -> String {
        msgs.iter()
            .filter(|r| {
                r.value.as_ref().is_some_and(|v| {
                    v["source"]["snapshot"] == "false"
                        && (v["after"]["id"] == id || v["before"]["id"] == id)
                })
            })
            .map(|r| {
                format!(
                    "{}{}",
                    r.op().unwrap_or("?"),
                    if r.offset < at { "<" } else { ">" }
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    assert_eq!(streamed(900001), "", "before, new filter only");
    assert_eq!(streamed(900002), "c<", "before, old filter only");
    assert_eq!(streamed(900003), "c>", "after, new filter only");
    assert_eq!(streamed(900004), "", "after, old filter only");
    // After the change, every row passes the new filter.
    let drafts_after = msgs
        .iter()
        .filter(|r| r.offset > at && matches!(r.op(), Some("c" | "u" | "r")))
        .filter(|r| {
            r.value
                .as_ref()
                .is_some_and(|v| v["after"]["status"] == "draft")
        })
        .count();
    assert_eq!(
        drafts_after, 0,
        "rows outside the new filter after the change"
    );
    let source: BTreeSet<String> = c
        .query(&format!(
            "SELECT format('(%s,\"%s\",\"%s\")', id, region, status) FROM orders WHERE {NEW}"
        ))
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(source.len() > 100, "the new filter keeps rows");
    assert_eq!(
        consumed(&msgs, true),
        source,
        "the consumer that applies the new filter at the schema message"
    );
    assert_ne!(
        consumed(&msgs, false),
        source,
        "the naive consumer keeps rows the new filter leaves out"
    );
}
