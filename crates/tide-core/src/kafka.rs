//! The `kafka` target's messages, planned purely: topic names, the Debezium envelope of each
//! event, the transaction metadata records (`BEGIN`/`END`), the position record, and which
//! producer settings a user may pass through. The sink (`src/sink/kafka`) sends what this module
//! renders; nothing here talks to a broker.
//!
//! Owns: the exact JSON of every message pg_tide writes to Kafka (README "Kafka target" documents
//! it field by field), and the list of librdkafka settings the target's guarantees rest on.
//!
//! Guarantees:
//! - A data message's key is the event's key JSON exactly as the outbox has it (the same
//!   renderer for stream and backfill), so a key always hashes to the same partition.
//! - Every data message carries its event identity `(commit_lsn, position)`: in the envelope
//!   (`source.commit_lsn`, `source.position`) and in the headers [`HEADER_COMMIT_LSN`],
//!   [`HEADER_POSITION`]. Within a source transaction `transaction.total_order` is the position
//!   and `data_collection_order` counts the events of the same table; the `END` record's
//!   `event_count` is the number of events of the transaction and `data_collections` the count
//!   per table ([`TxnCounter`]).
//! - Topic names only ever contain Kafka's legal characters (`[A-Za-z0-9._-]`, at most 249).
//! - [`refused_setting`] names every setting that would weaken idempotence, acknowledgement or
//!   per-key order; [`secret_setting`] every setting that holds a secret (which belongs in a
//!   user mapping, never in a table or option other roles can read).

use crate::json::push_string;
use crate::lsn::Lsn;
use crate::model::Op;

/// Header naming the commit LSN of an event's source transaction (text, `pg_lsn` form).
pub const HEADER_COMMIT_LSN: &str = "tide.commit_lsn";
/// Header naming the event's 1-based position in its source transaction (decimal text).
pub const HEADER_POSITION: &str = "tide.position";
/// Header naming pg_tide's op of the event (`insert`, ..., `schema`; as the outbox's `op`).
pub const HEADER_OP: &str = "tide.op";

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_US: i64 = 946_684_800_000_000;

/// A PostgreSQL timestamp (microseconds since 2000-01-01) as Unix milliseconds.
pub fn unix_ms(pg_us: i64) -> i64 {
    (pg_us + PG_EPOCH_US).div_euclid(1000)
}

/// Debezium's op letter for an event (`schema` has none in Debezium: pg_tide writes `schema`).
pub fn op_code(op: Op) -> &'static str {
    match op {
        Op::Insert => "c",
        Op::Update => "u",
        Op::Delete => "d",
        Op::Read => "r",
        Op::Truncate => "t",
        Op::Schema => "schema",
    }
}

/// Whether a message of this op goes to every partition of its topic instead of the key's
/// partition: a truncate and a schema change concern every key, so each partition gets a copy
/// in its order (all copies carry the same identity).
pub fn broadcast(op: Op) -> bool {
    matches!(op, Op::Truncate | Op::Schema)
}

/// A topic name made legal: every character outside `[A-Za-z0-9._-]` becomes `_`, and the
/// name is cut at 249 characters (Kafka's limit). An empty name becomes `_`.
pub fn legal_topic(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(249)
        .collect();
    if out.is_empty() || out == "." || out == ".." {
        out.push('_');
    }
    out
}

/// The topic of a table: `template` with `{prefix}`, `{schema}` and `{table}` replaced (the
/// unquoted names), then made legal ([`legal_topic`]).
pub fn topic_for(template: &str, prefix: &str, schema: &str, table: &str) -> String {
    legal_topic(
        &template
            .replace("{prefix}", prefix)
            .replace("{schema}", schema)
            .replace("{table}", table),
    )
}

/// Whether a topic template is usable: only the placeholders `{prefix}`, `{schema}`, `{table}`.
pub fn valid_template(template: &str) -> Result<(), String> {
    let mut rest = template;
    while let Some(i) = rest.find('{') {
        let after = &rest[i..];
        let Some(j) = after.find('}') else {
            return Err(format!("unclosed '{{' in topic template \"{template}\""));
        };
        let name = &after[..=j];
        if !matches!(name, "{prefix}" | "{schema}" | "{table}") {
            return Err(format!(
                "unknown placeholder {name} in topic template \"{template}\""
            ));
        }
        rest = &after[j + 1..];
    }
    if template.trim().is_empty() {
        return Err("the topic template is empty".to_string());
    }
    Ok(())
}

/// Split `schema.table` as the stream names relations (each part quoted where needed) into the
/// unquoted schema and table names.
pub fn split_qualified(q: &str) -> (String, String) {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = q.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            '.' if !quoted => parts.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    parts.push(cur);
    let table = parts.pop().unwrap_or_default();
    (parts.join("."), table)
}

/// The transaction id of a source transaction, as Debezium's PostgreSQL connector writes it:
/// `txId:lsn` (the commit LSN as a number).
pub fn txn_id(xid: u32, commit_lsn: Lsn) -> String {
    format!("{xid}:{}", commit_lsn.0)
}

/// The fixed parts of every envelope's `source` block.
#[derive(Debug, Clone)]
pub struct SourceInfo {
    /// pg_tide's version.
    pub version: String,
    /// The topic prefix (Debezium's `topic.prefix`, its `source.name`).
    pub name: String,
    /// The database.
    pub db: String,
}

/// One event to render as a Debezium envelope.
#[derive(Debug, Clone)]
pub struct EnvelopeEvent<'a> {
    pub op: Op,
    /// JSON object of the key columns.
    pub key: Option<&'a str>,
    /// JSON object of the row's sent columns.
    pub row: Option<&'a str>,
    /// Columns not sent (unchanged TOAST).
    pub unchanged: &'a [String],
    /// Unquoted schema and table names of the source table.
    pub schema: &'a str,
    pub table: &'a str,
    pub xid: u32,
    pub commit_lsn: Lsn,
    /// 1-based position in the source transaction.
    pub position: i32,
    /// Commit time, PostgreSQL microseconds.
    pub commit_time: i64,
    /// (backfill id, chunk) of a `read` event.
    pub backfill: Option<(i64, i64)>,
    /// This table's events so far in the transaction, this one included.
    pub data_collection_order: u64,
    /// Processing time, Unix milliseconds.
    pub now_ms: i64,
    /// For op `schema`: the change (the outbox schema event's `row`).
    pub schema_change: Option<&'a str>,
}

/// Render the Debezium envelope of an event (the message value):
/// `{"before", "after", "source", "op", "ts_ms", "transaction"}`, plus `schema_change` for op
/// `schema`. `before` is the key columns of a delete (Debezium's form with the default replica
/// identity), else null; `after` the row of c/u/r, else null (for a truncate of some partitions
/// of a partitioned table, `{"partition", "where"}` as in the outbox).
pub fn envelope(src: &SourceInfo, e: &EnvelopeEvent<'_>, out: &mut String) {
    out.push_str("{\"before\":");
    match (e.op, e.key) {
        (Op::Delete, Some(k)) => out.push_str(k),
        _ => out.push_str("null"),
    }
    out.push_str(",\"after\":");
    match (e.op, e.row) {
        (Op::Insert | Op::Update | Op::Read | Op::Truncate, Some(r)) => out.push_str(r),
        _ => out.push_str("null"),
    }
    out.push_str(",\"source\":{\"version\":");
    push_string(out, &src.version);
    out.push_str(",\"connector\":\"pg_tide\",\"name\":");
    push_string(out, &src.name);
    out.push_str(&format!(
        ",\"ts_ms\":{},\"snapshot\":\"{}\",\"db\":",
        unix_ms(e.commit_time),
        if e.op == Op::Read {
            "incremental"
        } else {
            "false"
        }
    ));
    push_string(out, &src.db);
    out.push_str(",\"schema\":");
    push_string(out, e.schema);
    out.push_str(",\"table\":");
    push_string(out, e.table);
    out.push_str(&format!(
        ",\"txId\":{},\"lsn\":{},\"commit_lsn\":\"{}\",\"position\":{}",
        e.xid, e.commit_lsn.0, e.commit_lsn, e.position
    ));
    if let Some((b, c)) = e.backfill {
        out.push_str(&format!(",\"backfill_id\":{b},\"chunk\":{c}"));
    }
    if !e.unchanged.is_empty() {
        out.push_str(",\"unchanged\":[");
        for (i, c) in e.unchanged.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_string(out, c);
        }
        out.push(']');
    }
    out.push_str("},\"op\":");
    push_string(out, op_code(e.op));
    out.push_str(&format!(
        ",\"ts_ms\":{},\"transaction\":{{\"id\":",
        e.now_ms
    ));
    push_string(out, &txn_id(e.xid, e.commit_lsn));
    out.push_str(&format!(
        ",\"total_order\":{},\"data_collection_order\":{}}}",
        e.position, e.data_collection_order
    ));
    if let Some(c) = e.schema_change {
        out.push_str(",\"schema_change\":");
        out.push_str(c);
    }
    out.push('}');
}

/// Counts the events of one source transaction per table, for `data_collection_order` and the
/// `END` record.
#[derive(Debug, Clone, Default)]
pub struct TxnCounter {
    /// (data collection `schema.table`, events), in order of first appearance.
    pub collections: Vec<(String, u64)>,
    /// Events of the transaction.
    pub events: u64,
}

impl TxnCounter {
    /// Count one event of `collection`; returns its `data_collection_order`.
    pub fn count(&mut self, collection: &str) -> u64 {
        self.events += 1;
        if let Some(c) = self.collections.iter_mut().find(|c| c.0 == collection) {
            c.1 += 1;
            return c.1;
        }
        self.collections.push((collection.to_string(), 1));
        1
    }
}

/// The key of a transaction metadata record: `{"id": "txId:lsn"}`.
pub fn txn_key(xid: u32, commit_lsn: Lsn) -> String {
    let mut out = String::from("{\"id\":");
    push_string(&mut out, &txn_id(xid, commit_lsn));
    out.push('}');
    out
}

/// A `BEGIN` record (`counts` None) or an `END` record of a source transaction, as Debezium
/// writes them to its transaction topic.
pub fn txn_record(
    xid: u32,
    commit_lsn: Lsn,
    commit_time: i64,
    counts: Option<&TxnCounter>,
) -> String {
    let mut out = String::from("{\"status\":");
    push_string(&mut out, if counts.is_some() { "END" } else { "BEGIN" });
    out.push_str(",\"id\":");
    push_string(&mut out, &txn_id(xid, commit_lsn));
    out.push_str(&format!(",\"ts_ms\":{}", unix_ms(commit_time)));
    match counts {
        None => out.push_str(",\"event_count\":null,\"data_collections\":null"),
        Some(c) => {
            out.push_str(&format!(
                ",\"event_count\":{},\"data_collections\":[",
                c.events
            ));
            for (i, (name, n)) in c.collections.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str("{\"data_collection\":");
                push_string(&mut out, name);
                out.push_str(&format!(",\"event_count\":{n}}}"));
            }
            out.push(']');
        }
    }
    out.push_str(&format!(",\"commit_lsn\":\"{commit_lsn}\"}}"));
    out
}

/// The value of a position record: the pipeline and the end LSN of the last source transaction
/// whose every message the broker acknowledged.
pub fn position_record(pipeline: &str, applied: Lsn) -> String {
    let mut out = String::from("{\"pipeline\":");
    push_string(&mut out, pipeline);
    out.push_str(&format!(",\"applied_lsn\":\"{applied}\"}}"));
    out
}

/// The applied LSN of a position record's value, if it is one.
pub fn parse_position_record(value: &[u8]) -> Option<Lsn> {
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    v.get("applied_lsn")?.as_str()?.parse().ok()
}

/// A librdkafka property name as users may write it: `security_protocol` for
/// `security.protocol` (option names of a foreign server are identifiers). A name with a `.`
/// is taken as it is.
pub fn property_name(name: &str) -> String {
    if name.contains('.') {
        name.to_string()
    } else {
        name.replace('_', ".")
    }
}

/// Why a producer setting may not be set by the user (`None`: it may), for the settings the
/// target's guarantees rest on: pg_tide sets them itself.
pub fn refused_setting(property: &str) -> Option<&'static str> {
    Some(match property {
        "enable.idempotence" | "enable.gapless.guarantee" => {
            "the producer is idempotent (no duplicate or reordering by a retry within a session), which pg_tide sets"
        }
        "acks" | "request.required.acks" => {
            "a message counts as delivered only once every in-sync replica has it (acks=all), which pg_tide sets"
        }
        "max.in.flight.requests.per.connection" | "max.in.flight" | "retries"
        | "message.send.max.retries" | "queuing.strategy" => {
            "per-key order rests on the idempotent producer's retry and in-flight settings, which pg_tide sets"
        }
        "partitioner" | "partitioner_cb" | "sticky.partitioning.linger.ms" => {
            "a key always goes to the same partition (murmur2 of the key, as Java clients do), which pg_tide sets"
        }
        "transactional.id" | "transaction.timeout.ms" => {
            "Kafka transactions are not supported by this target yet"
        }
        "bootstrap.servers" | "metadata.broker.list" => {
            "the brokers are the foreign server's option brokers"
        }
        "client.id" => "pg_tide names its clients after the pipeline",
        "produce.offset.report" | "delivery.report.only.error" | "dr_cb" | "dr_msg_cb" => {
            "pg_tide confirms the slot from every message's delivery report"
        }
        _ => return None,
    })
}

/// Whether a property holds a secret: allowed only in a user mapping (whose options only the
/// mapped role and superusers can read), never in a foreign server's options (readable by
/// every role) or a pipeline's options.
pub fn secret_setting(property: &str) -> bool {
    property.contains("password")
        || property.contains("secret")
        || matches!(
            property,
            "ssl.key.pem" | "ssl_key" | "sasl.oauthbearer.config" | "ssl.keystore.location"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src() -> SourceInfo {
        SourceInfo {
            version: "0.2.0".into(),
            name: "shop".into(),
            db: "postgres".into(),
        }
    }

    fn ev<'a>(op: Op, key: Option<&'a str>, row: Option<&'a str>) -> EnvelopeEvent<'a> {
        EnvelopeEvent {
            op,
            key,
            row,
            unchanged: &[],
            schema: "public",
            table: "Order Lines",
            xid: 571,
            commit_lsn: Lsn(0x16B3748),
            position: 2,
            commit_time: 0,
            backfill: None,
            data_collection_order: 1,
            now_ms: 5,
            schema_change: None,
        }
    }

    #[test]
    fn envelopes_are_json_with_the_identity() {
        let mut out = String::new();
        envelope(
            &src(),
            &ev(Op::Update, Some(r#"{"id":1}"#), Some(r#"{"id":1,"v":"x"}"#)),
            &mut out,
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["op"], "u");
        assert_eq!(v["before"], serde_json::Value::Null);
        assert_eq!(v["after"]["v"], "x");
        assert_eq!(v["source"]["commit_lsn"], "0/16B3748");
        assert_eq!(v["source"]["lsn"], 0x16B3748u64);
        assert_eq!(v["source"]["position"], 2);
        assert_eq!(v["source"]["table"], "Order Lines");
        assert_eq!(v["source"]["snapshot"], "false");
        assert_eq!(v["source"]["ts_ms"], 946_684_800_000i64);
        assert_eq!(v["transaction"]["id"], format!("571:{}", 0x16B3748u64));
        assert_eq!(v["transaction"]["total_order"], 2);
        let mut out = String::new();
        envelope(&src(), &ev(Op::Delete, Some(r#"{"id":1}"#), None), &mut out);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            (v["op"].as_str(), v["before"]["id"].as_i64()),
            (Some("d"), Some(1))
        );
        assert!(v["after"].is_null());
        let mut r = ev(Op::Read, Some(r#"{"id":1}"#), Some(r#"{"id":1}"#));
        r.backfill = Some((3, 4));
        let u = vec!["big".to_string()];
        r.unchanged = &u;
        let mut out = String::new();
        envelope(&src(), &r, &mut out);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["source"]["snapshot"], "incremental");
        assert_eq!(v["source"]["chunk"], 4);
        assert_eq!(v["source"]["unchanged"][0], "big");
        let mut s = ev(Op::Schema, None, None);
        s.schema_change = Some(r#"{"added":[]}"#);
        let mut out = String::new();
        envelope(&src(), &s, &mut out);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["op"], "schema");
        assert!(v["schema_change"]["added"].is_array());
    }

    #[test]
    fn transaction_records_count_per_table() {
        let mut c = TxnCounter::default();
        assert_eq!(c.count("public.a"), 1);
        assert_eq!(c.count("public.b"), 1);
        assert_eq!(c.count("public.a"), 2);
        let end: serde_json::Value =
            serde_json::from_str(&txn_record(7, Lsn(9), 0, Some(&c))).unwrap();
        assert_eq!(end["status"], "END");
        assert_eq!(end["event_count"], 3);
        assert_eq!(end["data_collections"][0]["data_collection"], "public.a");
        assert_eq!(end["data_collections"][0]["event_count"], 2);
        let begin: serde_json::Value =
            serde_json::from_str(&txn_record(7, Lsn(9), 0, None)).unwrap();
        assert_eq!(begin["status"], "BEGIN");
        assert!(begin["event_count"].is_null());
        assert_eq!(txn_key(7, Lsn(9)), r#"{"id":"7:9"}"#);
    }

    #[test]
    fn topics_are_legal() {
        assert_eq!(
            topic_for("{prefix}.{schema}.{table}", "shop", "public", "Order Lines"),
            "shop.public.Order_Lines"
        );
        assert_eq!(legal_topic("a\"b/é"), "a_b__");
        assert_eq!(legal_topic(""), "_");
        assert_eq!(legal_topic(&"x".repeat(300)).len(), 249);
        assert!(valid_template("{prefix}.{table}").is_ok());
        assert!(valid_template("{prefix}.{tabel}").is_err());
        assert!(valid_template("{prefix").is_err());
        assert!(valid_template(" ").is_err());
    }

    #[test]
    fn splits_quoted_names() {
        assert_eq!(
            split_qualified("public.\"Order Lines\""),
            ("public".into(), "Order Lines".into())
        );
        assert_eq!(
            split_qualified("\"a.b\".\"c\"\"d\""),
            ("a.b".into(), "c\"d".into())
        );
        assert_eq!(split_qualified("t"), ("".into(), "t".into()));
    }

    #[test]
    fn positions_round_trip() {
        let r = position_record("k", Lsn(0x1_0000_0010));
        assert_eq!(
            parse_position_record(r.as_bytes()),
            Some(Lsn(0x1_0000_0010))
        );
        assert_eq!(parse_position_record(b"{}"), None);
        assert_eq!(parse_position_record(b"not json"), None);
    }

    #[test]
    fn guarantees_and_secrets_are_guarded() {
        for p in [
            "enable.idempotence",
            "acks",
            "max.in.flight",
            "partitioner",
            "transactional.id",
        ] {
            assert!(refused_setting(p).is_some(), "{p}");
        }
        assert_eq!(refused_setting("linger.ms"), None);
        assert_eq!(property_name("sasl_username"), "sasl.username");
        assert_eq!(property_name("ssl.ca.location"), "ssl.ca.location");
        assert!(secret_setting("sasl.password"));
        assert!(secret_setting("ssl.key.password"));
        assert!(!secret_setting("sasl.username"));
    }
}
