//! Debezium as the oracle of pg_tide's envelope: the same source changes captured by Debezium
//! 3.6.1's PostgreSQL connector (pgoutput, its own slot and publication, in a Kafka Connect 4.4.0
//! standalone worker with `JsonConverter`, `schemas.enable=true`) and by a pg_tide pipeline with
//! `value_format = 'debezium-schema'`, into the same broker, compared message by message: key
//! (schema and payload), `op`, `before`, `after` (each field's Connect schema and value), the
//! `source` fields both fill, the `transaction` block, and the envelope's Connect schema; and the
//! transaction topics (each streamed transaction's `BEGIN` and `END`, `event_count`,
//! `data_collections`).
//!
//! The changes: the types suite's table (`pg_test::TYPES_SUITE_TABLE`, every common built-in
//! type with edge values) snapshotted by Debezium and backfilled by pg_tide, then inserts,
//! updates, a delete, a primary-key change, an update that leaves TOASTed values unchanged, an
//! `ALTER TABLE ... ADD COLUMN` of more types, and rows that use them.
//!
//! Every difference must be one listed here with its reason (README "Kafka target", "Compared
//! with Debezium", lists the same): any other fails the test, and so does a listed one that no
//! longer occurs (so the list stays exact).

use crate::broker::*;
use crate::connect::Connect;
use pg_test::*;
use serde_json::Value;
use std::collections::HashSet;
use std::time::{Duration, Instant};

const DBZ_TOPIC: &str = "shop.public.ty";
const TIDE_TOPIC: &str = "tide.public.ty";

/// Columns Debezium 3.6.1 leaves out of its messages ("No converter found for column ... The
/// column will not be part of change events"); pg_tide writes their text.
const DEBEZIUM_DROPS: &[&str] = &[
    "c_pair", "c_box", "c_circle", "c_line", "c_lseg", "c_path", "c_poly", "c_mrange", "c_tsq",
    "c_lsn",
];

/// Columns whose Connect schema differs on purpose.
const SCHEMA_DIFFERS: &[(&str, &str)] = &[(
    "c_money",
    "Debezium: Decimal of scale 2; pg_tide: its text, whose format depends on lc_monetary",
)];

/// Values that differ on purpose: (column, the types suite's variant `id % 5` or any, why).
const VALUE_DIFFERS: &[(&str, Option<i64>, &str)] = &[
    ("c_money", None, "Decimal against text (SCHEMA_DIFFERS)"),
    (
        "c_date",
        Some(1),
        "'infinity': Debezium writes an overflowed day count (different in snapshot and stream); pg_tide int32 max",
    ),
    (
        "c_ts",
        Some(1),
        "'-infinity': Debezium writes -9223372036832400000; pg_tide int64 min",
    ),
    (
        "c_intarr",
        Some(1),
        "'{{1,2},{3,4}}': Debezium writes [null, null]; pg_tide flattens it, [1,2,3,4]",
    ),
    (
        "c_date",
        Some(0),
        "'0044-03-15 BC': Debezium drops the era (the day count of 44 AD); pg_tide 44 BC's",
    ),
    (
        "c_date",
        Some(3),
        "'4713-01-01 BC': Debezium drops the era; pg_tide 4713 BC's",
    ),
    (
        "c_numarr",
        Some(0),
        "'{1.50,NaN,-0.001}': Debezium writes null for the whole array; pg_tide null for the NaN",
    ),
];

/// `source` fields Debezium fills that pg_tide does not write: `sequence` (its last commit LSN
/// and this change's LSN), `xmin`, `origin`, `origin_lsn` (null here).
const SOURCE_ONLY_DEBEZIUM: &[&str] = &["sequence", "xmin", "origin", "origin_lsn"];

/// The changes after the snapshot / backfill (ids 1-10).
fn stream_changes(c: &Cluster) {
    for id in 11..=15 {
        c.execute(&types_suite_row(id));
    }
    c.execute("UPDATE ty SET c_int2 = 7, c_text = 'upd' WHERE id = 11");
    // Large values stored out of line, then an update that leaves them unchanged (TOAST).
    c.execute(
        "UPDATE ty SET c_text = (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g),
                       c_bytea = (SELECT decode(string_agg(md5(g::text), ''), 'hex') FROM generate_series(1, 400) g),
                       c_jsonb = (SELECT jsonb_agg(md5(g::text)) FROM generate_series(1, 400) g),
                       c_textarr = (SELECT array_agg(md5(g::text)) FROM generate_series(1, 400) g),
                       c_intarr = (SELECT array_agg(g) FROM generate_series(1, 4000) g)
          WHERE id = 12",
    );
    c.execute("UPDATE ty SET c_int2 = 8 WHERE id = 12");
    c.execute("DELETE FROM ty WHERE id = 13");
    c.execute("UPDATE ty SET id = 114 WHERE id = 14");
    // The schema change, and rows that use the new columns.
    c.execute(
        "ALTER TABLE ty ADD COLUMN c_tstz3 timestamptz(3), ADD COLUMN c_tstz0 timestamptz(0),
                        ADD COLUMN c_bit1 bit(1), ADD COLUMN c_vb5 varbit(5), ADD COLUMN c_bigarr bigint[]",
    );
    c.execute(
        "INSERT INTO ty (id, c_tstz3, c_tstz0, c_bit1, c_vb5, c_bigarr, c_iv) VALUES
           (21, '2024-01-01 10:00:00.5+00', '2024-01-01 10:00:00.7+00', B'1', B'101', '{1,2}', '178000000 years'),
           (26, '2024-01-01 10:00:00+00', '2024-01-01 10:00:00+00', B'0', B'', '{}', '-1 mon -2 days')",
    );
    c.execute(
        "UPDATE ty SET c_bigarr = (SELECT array_agg(g::bigint) FROM generate_series(1, 4000) g) WHERE id = 26",
    );
    c.execute("UPDATE ty SET c_int2 = 99 WHERE id = 26");
    c.execute("UPDATE ty SET c_tstz3 = '1999-12-31 23:59:59.999+00' WHERE id = 15");
}

/// The fields of a struct schema by name, in order.
fn fields(s: &Value) -> Vec<(&str, &Value)> {
    s["fields"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| (f["field"].as_str().unwrap_or(""), f))
                .collect()
        })
        .unwrap_or_default()
}

fn field<'a>(s: &'a Value, name: &str) -> &'a Value {
    fields(s)
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or(&Value::Null, |(_, f)| f)
}

/// `b`'s names keep `a`'s relative order.
fn same_order(a: &[&str], b: &[&str]) -> bool {
    let common: Vec<&&str> = b.iter().filter(|n| a.contains(n)).collect();
    let mine: Vec<&&str> = a.iter().filter(|n| b.contains(n)).collect();
    common == mine
}

/// Two JSON values equal as Connect values of schema `s`: numbers by value (a `float` as f32:
/// `1e-45` and `1.4E-45` are the same float), structs and arrays element by element.
fn same(a: &Value, b: &Value, s: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if let (Some(i), Some(j)) = (x.as_i64(), y.as_i64()) {
                return i == j;
            }
            let (f, g) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            if s["type"] == "float" {
                (f as f32) == (g as f32)
            } else {
                f == g
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q, &s["items"]))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same(v, w, field(s, k))))
        }
        _ => a == b,
    }
}

/// What the comparison found, beyond the listed differences.
#[derive(Default)]
struct Findings {
    problems: Vec<String>,
    seen_values: HashSet<(String, Option<i64>)>,
    seen_schemas: HashSet<String>,
}

impl Findings {
    fn fail(&mut self, at: &str, what: String) {
        if self.problems.len() < 60 {
            self.problems.push(format!("{at}: {what}"));
        }
    }
}

/// Compare the `before` or `after` struct (schema and value) of one message pair.
fn compare_row(at: &str, part: &str, d: &Value, t: &Value, f: &mut Findings) {
    let (ds, ts) = (field(&d["schema"], part), field(&t["schema"], part));
    if ds["name"] != ts["name"] || ds["optional"] != ts["optional"] {
        f.fail(at, format!("{part} struct: Debezium {ds} pg_tide {ts}"));
    }
    let dn: Vec<&str> = fields(ds).iter().map(|x| x.0).collect();
    let tn: Vec<&str> = fields(ts).iter().map(|x| x.0).collect();
    let extra: Vec<&str> = tn.iter().filter(|n| !dn.contains(n)).copied().collect();
    if extra.iter().any(|n| !DEBEZIUM_DROPS.contains(n)) || dn.iter().any(|n| !tn.contains(n)) {
        f.fail(at, format!("{part} fields: Debezium {dn:?} pg_tide {tn:?}"));
    }
    if !same_order(&dn, &tn) {
        f.fail(
            at,
            format!("{part} field order: Debezium {dn:?} pg_tide {tn:?}"),
        );
    }
    for (name, dfs) in fields(ds) {
        let tfs = field(ts, name);
        if dfs != tfs {
            if SCHEMA_DIFFERS.iter().any(|(c, _)| *c == name) {
                f.seen_schemas.insert(name.to_string());
            } else {
                f.fail(
                    at,
                    format!("{part}.{name} schema: Debezium {dfs} pg_tide {tfs}"),
                );
            }
        }
    }
    let (dv, tv) = (&d["payload"][part], &t["payload"][part]);
    if dv.is_null() != tv.is_null() {
        f.fail(at, format!("{part}: Debezium {dv} pg_tide {tv}"));
        return;
    }
    if dv.is_null() {
        return;
    }
    let row = if dv["id"].is_i64() { dv } else { tv };
    let variant = row["id"].as_i64().map(|i| i % 5);
    for (name, dfs) in fields(ds) {
        let (a, b) = (&dv[name], &tv[name]);
        if same(a, b, dfs) {
            continue;
        }
        match VALUE_DIFFERS
            .iter()
            .find(|(c, v, _)| *c == name && (v.is_none() || *v == variant))
        {
            Some((c, v, _)) => {
                f.seen_values.insert((c.to_string(), *v));
            }
            None => {
                let (sa, sb) = (a.to_string(), b.to_string());
                f.fail(
                    at,
                    format!(
                        "{part}.{name}: Debezium {} pg_tide {}",
                        &sa[..sa.len().min(160)],
                        &sb[..sb.len().min(160)]
                    ),
                );
            }
        }
    }
}

/// Compare the envelope's schema: Debezium's fields all in pg_tide's, in its order, with equal
/// schemas (`before`/`after` by [`compare_row`], `source` field by field).
fn compare_envelope(at: &str, d: &Value, t: &Value, f: &mut Findings) {
    let (ds, ts) = (&d["schema"], &t["schema"]);
    for k in ["name", "version", "optional", "type"] {
        if ds[k] != ts[k] {
            f.fail(
                at,
                format!("envelope {k}: Debezium {} pg_tide {}", ds[k], ts[k]),
            );
        }
    }
    let dn: Vec<&str> = fields(ds).iter().map(|x| x.0).collect();
    let tn: Vec<&str> = fields(ts).iter().map(|x| x.0).collect();
    if dn.iter().any(|n| !tn.contains(n)) || !same_order(&dn, &tn) {
        f.fail(
            at,
            format!("envelope fields: Debezium {dn:?} pg_tide {tn:?}"),
        );
    }
    for name in ["transaction", "op", "ts_ms", "ts_us", "ts_ns"] {
        if field(ds, name) != field(ts, name) {
            f.fail(
                at,
                format!(
                    "envelope field {name}: Debezium {} pg_tide {}",
                    field(ds, name),
                    field(ts, name)
                ),
            );
        }
    }
    let (dsrc, tsrc) = (field(ds, "source"), field(ts, "source"));
    for k in ["name", "version", "optional", "type"] {
        if dsrc[k] != tsrc[k] {
            f.fail(
                at,
                format!("source {k}: Debezium {} pg_tide {}", dsrc[k], tsrc[k]),
            );
        }
    }
    let sn: Vec<&str> = fields(dsrc).iter().map(|x| x.0).collect();
    let tsn: Vec<&str> = fields(tsrc).iter().map(|x| x.0).collect();
    if !same_order(&sn, &tsn) {
        f.fail(
            at,
            format!("source field order: Debezium {sn:?} pg_tide {tsn:?}"),
        );
    }
    for (name, s) in fields(dsrc) {
        let mine = field(tsrc, name);
        if mine.is_null() && SOURCE_ONLY_DEBEZIUM.contains(&name) {
            continue;
        }
        if s != mine {
            f.fail(
                at,
                format!("source.{name} schema: Debezium {s} pg_tide {mine}"),
            );
        }
    }
}

/// Compare the payload's `source`, `transaction` and `op`.
fn compare_payload(at: &str, d: &Value, t: &Value, f: &mut Findings) {
    let (dp, tp) = (&d["payload"], &t["payload"]);
    let op = dp["op"].as_str().unwrap_or("");
    if dp["op"] != tp["op"] {
        f.fail(
            at,
            format!("op: Debezium {} pg_tide {}", dp["op"], tp["op"]),
        );
    }
    let (ds, ts) = (&dp["source"], &tp["source"]);
    for k in ["name", "db", "schema", "table"] {
        if ds[k] != ts[k] {
            f.fail(
                at,
                format!("source.{k}: Debezium {} pg_tide {}", ds[k], ts[k]),
            );
        }
    }
    if op == "r" {
        // Debezium's initial snapshot against pg_tide's watermark backfill (an incremental
        // snapshot): the snapshot marker, and the transaction, differ by design.
        let marks = [
            "first",
            "true",
            "last",
            "first_in_data_collection",
            "last_in_data_collection",
        ];
        if !marks.contains(&ds["snapshot"].as_str().unwrap_or(""))
            || ts["snapshot"] != "incremental"
        {
            f.fail(
                at,
                format!(
                    "source.snapshot: Debezium {} pg_tide {}",
                    ds["snapshot"], ts["snapshot"]
                ),
            );
        }
        return;
    }
    for k in ["snapshot", "txId", "ts_ms", "ts_us", "ts_ns"] {
        if ds[k] != ts[k] {
            f.fail(
                at,
                format!("source.{k}: Debezium {} pg_tide {}", ds[k], ts[k]),
            );
        }
    }
    // Debezium's `lsn` is the change's own LSN, pg_tide's the commit's (its identity is
    // (commit_lsn, position)): the change comes first.
    if ds["lsn"].as_u64() > ts["lsn"].as_u64() {
        f.fail(
            at,
            format!(
                "source.lsn: Debezium {} after pg_tide's commit LSN {}",
                ds["lsn"], ts["lsn"]
            ),
        );
    }
    let (dt, tt) = (&dp["transaction"], &tp["transaction"]);
    for k in ["total_order", "data_collection_order"] {
        if dt[k] != tt[k] {
            f.fail(
                at,
                format!("transaction.{k}: Debezium {} pg_tide {}", dt[k], tt[k]),
            );
        }
    }
    // `txId:lsn`: the same transaction (Debezium's LSN is its first change's, pg_tide's the
    // commit's).
    let xid = |v: &Value| {
        v["id"]
            .as_str()
            .and_then(|s| s.split(':').next())
            .map(str::to_string)
    };
    if xid(dt).is_none() || xid(dt) != xid(tt) {
        f.fail(
            at,
            format!("transaction.id: Debezium {} pg_tide {}", dt["id"], tt["id"]),
        );
    }
}

/// The transaction topics: every transaction Debezium records (streamed changes) has a `BEGIN` and
/// an `END` in pg_tide's too, with the same `event_count` and `data_collections` (matched by the
/// xid, the part of the id both share); pg_tide's others are its backfill's (the high watermarks'
/// transactions) and the schema change's.
fn compare_transactions(b: &Broker, tide: &[(Value, Option<Value>)], f: &mut Findings) {
    let xid = |id: &Value| {
        id.as_str()
            .and_then(|s| s.split(':').next())
            .map(str::to_string)
    };
    let records = |topic: &str, schema: bool| -> Vec<(String, Value)> {
        consume(&b.addr(), &[topic])
            .into_iter()
            .filter_map(|r| r.value)
            .map(|v| if schema { v["payload"].clone() } else { v })
            .filter_map(|v| Some((xid(&v["id"])?, v)))
            .collect()
    };
    let dbz = records("shop.transaction", true);
    let mine = records("tide.transaction", false);
    let streamed: HashSet<String> = tide
        .iter()
        .filter_map(|(_, v)| v.as_ref())
        .filter(|v| v["payload"]["op"] != "r")
        .filter_map(|v| xid(&v["payload"]["transaction"]["id"]))
        .collect();
    // stream_changes commits 14 transactions with row changes.
    if streamed.len() != 14 {
        f.fail(
            "transaction topic",
            format!("{} streamed transactions, not 14", streamed.len()),
        );
    }
    let ends: Vec<&(String, Value)> = dbz.iter().filter(|(_, v)| v["status"] == "END").collect();
    let dbz_xids: HashSet<String> = ends.iter().map(|(x, _)| x.clone()).collect();
    if dbz_xids != streamed {
        f.fail(
            "transaction topic",
            format!("Debezium's END records name the transactions {dbz_xids:?}, pg_tide's streamed messages {streamed:?}"),
        );
    }
    for (x, d) in ends {
        let begins = |recs: &[(String, Value)]| {
            recs.iter()
                .filter(|(y, v)| y == x && v["status"] == "BEGIN")
                .count()
        };
        let t = mine
            .iter()
            .find(|(y, v)| y == x && v["status"] == "END")
            .map(|(_, v)| v);
        let Some(t) = t else {
            f.fail(
                "transaction topic",
                format!("no END of transaction {x} from pg_tide"),
            );
            continue;
        };
        if begins(&dbz) != 1 || begins(&mine) != 1 {
            f.fail(
                "transaction topic",
                format!(
                    "transaction {x}: BEGIN records {} / {}",
                    begins(&dbz),
                    begins(&mine)
                ),
            );
        }
        for k in ["event_count", "data_collections"] {
            if d[k] != t[k] {
                f.fail(
                    "transaction topic",
                    format!("transaction {x}: {k} Debezium {} pg_tide {}", d[k], t[k]),
                );
            }
        }
    }
}

/// The data messages of a topic: (key, value or None for a tombstone), pg_tide's own `schema`
/// messages left out.
fn data_messages(b: &Broker, topic: &str) -> Vec<(Value, Option<Value>)> {
    consume(&b.addr(), &[topic])
        .into_iter()
        .filter(|r| {
            r.value
                .as_ref()
                .is_none_or(|v| v["payload"]["op"] != "schema")
        })
        .map(|r| {
            let k = r.key.as_deref().map_or(Value::Null, |k| {
                serde_json::from_str(k).expect("a JSON key")
            });
            (k, r.value)
        })
        .collect()
}

fn wait_for(
    b: &Broker,
    connect: &Connect,
    topic: &str,
    n: usize,
    what: &str,
) -> Vec<(Value, Option<Value>)> {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let m = data_messages(b, topic);
        if m.len() >= n {
            return m;
        }
        assert!(
            connect.alive(),
            "the Connect worker died:\n{}",
            connect.log()
        );
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {n} messages in {topic} after 240 s:\n{}",
            m.len(),
            connect.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn debezium_and_pg_tide_write_the_same_envelope() {
    let b = Broker::start("debezium");
    let c = start_cluster(Cluster::builder("kafka_debezium"));
    init_extension(&c);
    c.execute(TYPES_SUITE_TYPES);
    c.execute(TYPES_SUITE_TABLE);
    for id in 1..=10 {
        c.execute(&types_suite_row(id));
    }
    create_kafka_server(&c, "events", &b, "postgres");
    exec(
        &c,
        r#"SELECT tide.create_pipeline('tp', 'kafka', '{"server": "events", "value_format": "debezium-schema",
             "topic_prefix": "shop", "topic": "tide.{schema}.{table}", "transaction_topic": "tide.transaction"}')"#,
    );
    wait_streaming(&c, "tp", Duration::from_secs(30));
    exec(&c, "SELECT tide.add_table('tp', 'ty')");
    let connect = Connect::start(
        "debezium",
        &b.addr(),
        &[(
            "dbz-source",
            format!(
                "connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
database.hostname=127.0.0.1
database.port={}
database.user=postgres
database.password=unused
database.dbname=postgres
topic.prefix=shop
plugin.name=pgoutput
slot.name=dbz_oracle
publication.name=dbz_oracle
publication.autocreate.mode=filtered
table.include.list=public.ty
provide.transaction.metadata=true
snapshot.mode=initial
",
                c.port()
            ),
        )],
    );
    wait_backfill(&c, "ty", "tp", 120);
    // Both have read the ten rows before anything changes (the changes are then streamed by both).
    wait_for(&b, &connect, DBZ_TOPIC, 10, "Debezium's snapshot");
    stream_changes(&c);
    wait_pipeline(&c, "tp", 120);
    let tide = data_messages(&b, TIDE_TOPIC);
    let dbz = wait_for(&b, &connect, DBZ_TOPIC, tide.len(), "Debezium's stream");
    assert_eq!(
        dbz.len(),
        tide.len(),
        "as many messages from Debezium as from pg_tide"
    );
    let ops: Vec<String> = tide
        .iter()
        .map(|(_, v)| {
            v.as_ref()
                .map_or("tombstone".into(), |v| v["payload"]["op"].to_string())
        })
        .collect();
    // 10 r, 5 c, 3 u, d + tombstone, key change (d + tombstone + c), 2 c, 3 u.
    assert_eq!(
        ops.len(),
        10 + 5 + 3 + 2 + 3 + 2 + 3,
        "pg_tide's messages: {ops:?}"
    );
    let mut f = Findings::default();
    for (i, ((dk, dv), (tk, tv))) in dbz.iter().zip(&tide).enumerate() {
        let at = format!("message {i} (key {})", dk["payload"]);
        if dk != tk {
            f.fail(&at, format!("key: Debezium {dk} pg_tide {tk}"));
        }
        let (Some(dv), Some(tv)) = (dv, tv) else {
            if dv.is_some() != tv.is_some() {
                f.fail(&at, "a tombstone in one topic only".into());
            }
            continue;
        };
        compare_envelope(&at, dv, tv, &mut f);
        compare_payload(&at, dv, tv, &mut f);
        compare_row(&at, "before", dv, tv, &mut f);
        compare_row(&at, "after", dv, tv, &mut f);
    }
    compare_transactions(&b, &tide, &mut f);
    for (c, v, why) in VALUE_DIFFERS {
        if !f.seen_values.contains(&(c.to_string(), *v)) {
            f.problems.push(format!(
                "the listed difference of {c} (variant {v:?}: {why}) did not occur: update the list and docs/kafka.md"
            ));
        }
    }
    for (c, why) in SCHEMA_DIFFERS {
        if !f.seen_schemas.contains(*c) {
            f.problems.push(format!(
                "the listed schema difference of {c} ({why}) did not occur"
            ));
        }
    }
    assert!(
        f.problems.is_empty(),
        "{} difference(s) between Debezium 3.6.1 and pg_tide:\n{}",
        f.problems.len(),
        f.problems.join("\n")
    );
}

/// A table without a key (`REPLICA IDENTITY FULL`), duplicate rows and a NULL included, captured
/// by both (Debezium's snapshot and pg_tide's copy, then the same streamed insert, updates and
/// delete of one of two equal rows): the same messages, compared as above (envelope, `source`,
/// `before` and `after` field by field), every one **without a key** in both; `before` of an
/// update and a delete is the whole old row in both. The one difference, listed in the README:
/// Debezium sends a tombstone without a key after the delete (which removes nothing), pg_tide
/// none. pg_tide's copy is framed by its `resync` messages, which Debezium has not.
#[test]
fn debezium_and_pg_tide_agree_on_a_table_without_a_key() {
    let b = Broker::start("debezium");
    let c = start_cluster(Cluster::builder("kafka_debezium_keyless"));
    init_extension(&c);
    c.execute(
        "CREATE TABLE kl (a int, b text);
         ALTER TABLE kl REPLICA IDENTITY FULL;
         INSERT INTO kl VALUES (1, 'x'), (1, 'x'), (2, NULL);",
    );
    create_kafka_server(&c, "events", &b, "postgres");
    exec(
        &c,
        r#"SELECT tide.create_pipeline('tp', 'kafka', '{"server": "events", "value_format": "debezium-schema",
             "topic_prefix": "shop", "topic": "tide.{schema}.{table}", "transaction_topic": "tide.transaction"}')"#,
    );
    wait_streaming(&c, "tp", Duration::from_secs(30));
    exec(&c, "SELECT tide.add_table('tp', 'kl')");
    let connect = Connect::start(
        "debezium_keyless",
        &b.addr(),
        &[(
            "dbz-source",
            format!(
                "connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
database.hostname=127.0.0.1
database.port={}
database.user=postgres
database.password=unused
database.dbname=postgres
topic.prefix=shop
plugin.name=pgoutput
slot.name=dbz_keyless
publication.name=dbz_keyless
publication.autocreate.mode=filtered
table.include.list=public.kl
provide.transaction.metadata=true
snapshot.mode=initial
",
                c.port()
            ),
        )],
    );
    wait_backfill(&c, "kl", "tp", 120);
    wait_for(&b, &connect, "shop.public.kl", 3, "Debezium's snapshot");
    c.execute("INSERT INTO kl VALUES (3, 'y')");
    c.execute("UPDATE kl SET b = 'z' WHERE ctid = (SELECT ctid FROM kl WHERE a = 1 LIMIT 1)");
    c.execute("DELETE FROM kl WHERE ctid = (SELECT ctid FROM kl WHERE b = 'x' LIMIT 1)");
    c.execute("UPDATE kl SET b = 'w' WHERE a = 2");
    wait_pipeline(&c, "tp", 120);
    let tide: Vec<(Value, Option<Value>)> = data_messages(&b, "tide.public.kl")
        .into_iter()
        // (its resync messages are written without a Connect schema, `op` at the top)
        .filter(|(_, v)| v.as_ref().is_none_or(|v| v["op"] != "resync"))
        .collect();
    // 3 r, c, u, d, u; Debezium's tombstone after the d besides.
    assert_eq!(tide.len(), 7, "pg_tide's messages: {tide:?}");
    let dbz_all = wait_for(&b, &connect, "shop.public.kl", 8, "Debezium's stream");
    let tombstones: Vec<&(Value, Option<Value>)> =
        dbz_all.iter().filter(|(_, v)| v.is_none()).collect();
    assert_eq!(tombstones.len(), 1, "Debezium's tombstones: {tombstones:?}");
    assert!(tombstones[0].0.is_null(), "Debezium's tombstone has no key");
    let dbz: Vec<&(Value, Option<Value>)> = dbz_all.iter().filter(|(_, v)| v.is_some()).collect();
    assert_eq!(dbz.len(), tide.len(), "as many data messages");
    let mut f = Findings::default();
    for (i, ((dk, dv), (tk, tv))) in dbz.into_iter().zip(&tide).enumerate() {
        let at = format!("keyless message {i}");
        if !dk.is_null() || !tk.is_null() {
            f.fail(&at, format!("a key: Debezium {dk} pg_tide {tk}"));
        }
        let (Some(dv), Some(tv)) = (dv, tv) else {
            f.fail(&at, "a tombstone in pg_tide's topic".into());
            continue;
        };
        compare_envelope(&at, dv, tv, &mut f);
        compare_payload(&at, dv, tv, &mut f);
        compare_row(&at, "before", dv, tv, &mut f);
        compare_row(&at, "after", dv, tv, &mut f);
        let op = tv["payload"]["op"].as_str().unwrap_or("");
        if (op == "u" || op == "d") && tv["payload"]["before"]["a"].is_null() {
            f.fail(&at, format!("{op} without the old row: {}", tv["payload"]));
        }
    }
    assert!(
        f.problems.is_empty(),
        "{} difference(s) between Debezium 3.6.1 and pg_tide on a table without a key:\n{}",
        f.problems.len(),
        f.problems.join("\n")
    );
}
