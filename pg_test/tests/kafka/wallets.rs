//! Wallet transfers through Kafka: a consumer that applies each source transaction whole (its
//! `END` record in the transaction topic, then every data message whose `transaction.id` it
//! names, `event_count` of them) never sees the total change or a balance without its check
//! row; one that applies message by message does, which shows the check can fail.

use crate::broker::*;
use pg_test::*;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

// The wallets and the transfer script: pg_test's fixtures (WALLETS, WALLET_SCHEMA,
// WALLET_TRANSFER_SCRIPT, WALLET_START_BALANCE).

/// The consumer's copy of the three tables.
#[derive(Default)]
struct State {
    wallets: BTreeMap<i64, i64>,
    checks: BTreeMap<i64, i64>,
}

impl State {
    fn apply(&mut self, topic: &str, v: &Value) {
        let row = &v["after"];
        match (topic, v["op"].as_str()) {
            ("w.public.wallets", Some("c" | "u" | "r")) => {
                let id = row["id"].as_i64().expect("id");
                self.wallets
                    .insert(id, row["balance"].as_i64().expect("balance"));
            }
            ("w.public.transfer_check", Some("c" | "u" | "r")) => {
                let id = row["wallet_id"].as_i64().expect("wallet_id");
                self.checks.insert(id, row["net"].as_i64().expect("net"));
            }
            _ => {}
        }
    }

    /// What a reader of the copy must never see: a balance that disagrees with its check row,
    /// or (all wallets present) a total other than the constant one.
    fn violation(&self) -> Option<String> {
        for (id, bal) in &self.wallets {
            if let Some(net) = self.checks.get(id) {
                if *bal != WALLET_START_BALANCE + net {
                    return Some(format!("wallet {id}: balance {bal}, net {net}"));
                }
            }
        }
        if self.wallets.len() as i64 == WALLETS {
            let sum: i64 = self.wallets.values().sum();
            if sum != WALLETS * WALLET_START_BALANCE {
                return Some(format!("sum(balance) = {sum}"));
            }
        }
        None
    }
}

#[test]
fn kafka_transaction_consumer_never_sees_half_a_transfer() {
    let b = Broker::start("wallets");
    let c = setup("kafka_wallets");
    c.execute(WALLET_SCHEMA);
    create_kafka_server(&c, "events", &b, "postgres");
    create_pipeline(&c, "w", "kafka", r#"{"server": "events", "partitions": 2}"#);
    exec(&c, "SELECT tide.add_table('w', 'ledger')");
    let script = pg_test::write_script("kafka_wallets", WALLET_TRANSFER_SCRIPT);
    let run = spawn_pgbench(&c, &script, 3, 8, Some(150));
    std::thread::sleep(Duration::from_secs(2));
    // Added (and backfilled) while the transfers run.
    exec(
        &c,
        "BEGIN; SELECT tide.add_table('w', 'wallets'); SELECT tide.add_table('w', 'transfer_check'); COMMIT;",
    );
    wait_backfill(&c, "wallets", "w", 120);
    wait_backfill(&c, "transfer_check", "w", 120);
    let (txns, ok, summary) = run.finish_summary();
    assert!(ok, "pgbench: {summary}");
    wait_pipeline(&c, "w", 120);

    let data = consume(
        &b.addr(),
        &[
            "w.public.wallets",
            "w.public.transfer_check",
            "w.public.ledger",
        ],
    );
    let txn_records = consume(&b.addr(), &["w.transaction"]);
    // Data messages by transaction id, each identity once.
    let mut by_txn: HashMap<String, Vec<(i64, String, Value)>> = HashMap::new();
    let mut seen = HashSet::new();
    let mut all: Vec<((u64, i64), String, Value)> = Vec::new();
    for r in &data {
        let (Some(id), Some(v)) = (r.identity(), r.value.clone()) else {
            continue;
        };
        if !seen.insert(id) {
            continue;
        }
        let t = v["transaction"]["id"]
            .as_str()
            .expect("transaction.id")
            .to_string();
        let order = v["transaction"]["total_order"]
            .as_i64()
            .expect("total_order");
        assert_eq!(order, id.1, "total_order is the event's position");
        by_txn
            .entry(t)
            .or_default()
            .push((order, r.topic.clone(), v.clone()));
        all.push((id, r.topic.clone(), v));
    }
    // The buffering consumer: transactions in the order of their END records.
    let mut st = State::default();
    let mut applied = HashSet::new();
    let mut ends = 0;
    for r in &txn_records {
        let v = r.value.as_ref().expect("transaction record");
        if v["status"] != "END" {
            continue;
        }
        let id = v["id"].as_str().expect("id").to_string();
        if !applied.insert(id.clone()) {
            continue; // sent again after a failed batch
        }
        ends += 1;
        let mut events = by_txn.remove(&id).unwrap_or_default();
        let count = v["event_count"].as_u64().expect("event_count") as usize;
        assert_eq!(
            events.len(),
            count,
            "transaction {id}: END says {count} events, {} arrived",
            events.len()
        );
        let per_table: u64 = v["data_collections"]
            .as_array()
            .expect("data_collections")
            .iter()
            .map(|d| d["event_count"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(
            per_table as usize, count,
            "transaction {id}: per-table counts"
        );
        events.sort_by_key(|e| e.0);
        for (_, topic, ev) in &events {
            st.apply(topic, ev);
        }
        if let Some(v) = st.violation() {
            panic!("after transaction {id} the consumer sees {v}");
        }
    }
    assert!(
        by_txn.is_empty(),
        "{} transactions without an END record",
        by_txn.len()
    );
    assert_eq!(st.wallets.len() as i64, WALLETS);
    let src: Vec<(i32, i64)> = c
        .query("SELECT id, balance FROM wallets ORDER BY id")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let copy: Vec<(i32, i64)> = st.wallets.iter().map(|(k, v)| (*k as i32, *v)).collect();
    assert_eq!(src, copy, "the consumer's wallets equal the source's");

    // The same messages applied one by one: a reader between them sees half a transfer.
    all.sort_by_key(|e| e.0);
    let mut naive = State::default();
    let mut seen_half = None;
    for (_, topic, v) in &all {
        naive.apply(topic, v);
        if seen_half.is_none() {
            seen_half = naive.violation();
        }
    }
    assert!(
        seen_half.is_some(),
        "applying message by message never showed half a transfer: the check could not fail"
    );
    eprintln!(
        "kafka wallets: {txns} transfers, {ends} source transactions applied whole; message by message a reader saw: {}",
        seen_half.unwrap_or_default()
    );
}
