//! The `kafka` target's messages, planned purely: topic names, the Debezium envelope of each
//! event, the transaction metadata records (`BEGIN`/`END`), the position record, and which
//! producer settings a user may pass through. The target (`src/target/kafka`) sends what this module
//! renders; nothing here talks to a broker.
//!
//! Owns: the exact JSON of every message pg_tide writes to Kafka (docs/kafka.md documents
//! it field by field), and which librdkafka settings pg_tide takes from whom (the allow-list,
//! [`access`]).
//!
//! Guarantees:
//! - A data message's key is the event's key JSON exactly as the outbox has it (the same
//!   renderer for stream and backfill), so a key always hashes to the same partition; with
//!   `key_format = 'json-schema'` it is that key with its Connect schema (`crate::connect`),
//!   rendered from the key columns' text, the same for stream and backfill too.
//! - Every data message carries its event identity `(commit_lsn, position)`: in the envelope
//!   (`source.commit_lsn`, `source.position`) and in the headers [`HEADER_COMMIT_LSN`],
//!   [`HEADER_POSITION`]. Within a source transaction `transaction.total_order` is the position
//!   and `data_collection_order` counts the events of the same table; the `END` record's
//!   `event_count` is the number of events of the transaction and `data_collections` the count
//!   per table ([`TxnCounter`]).
//! - Topic names only ever contain Kafka's legal characters (`[A-Za-z0-9._-]`, at most 249).
//! - [`access`] is the allow-list of librdkafka properties: what anyone may tune, what only a
//!   server or user mapping may say (how to connect), what only a superuser may write (a
//!   property that names a file, a program or a library: librdkafka reads, runs or loads it
//!   inside PostgreSQL's processes), what pg_tide sets itself ([`refused_setting`]: every
//!   setting that would weaken idempotence, acknowledgement or per-key order); anything else is
//!   refused. [`secret_setting`] names every setting that holds a secret (which belongs in a
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

/// The fields of an envelope's `source` block that `json` and `debezium-schema` values share.
pub struct SourceHead<'a> {
    pub commit_time: i64,
    pub op: Op,
    pub schema: &'a str,
    pub table: &'a str,
    pub xid: u32,
    pub commit_lsn: Lsn,
    pub position: i32,
}

/// `,"source":{"version": ... "position":N` (the block is left open for what follows): one
/// writer for both value formats, so they never disagree on the source block.
pub fn push_source_head(out: &mut String, src: &SourceInfo, h: &SourceHead<'_>) {
    out.push_str(",\"source\":{\"version\":");
    push_string(out, &src.version);
    out.push_str(",\"connector\":\"pg_tide\",\"name\":");
    push_string(out, &src.name);
    out.push_str(&format!(
        ",\"ts_ms\":{},\"snapshot\":\"{}\",\"db\":",
        unix_ms(h.commit_time),
        if h.op == Op::Read {
            "incremental"
        } else {
            "false"
        }
    ));
    push_string(out, &src.db);
    out.push_str(&format!(
        ",\"ts_us\":{},\"ts_ns\":{},\"schema\":",
        h.commit_time + PG_EPOCH_US,
        i128::from(h.commit_time + PG_EPOCH_US) * 1000
    ));
    push_string(out, h.schema);
    out.push_str(",\"table\":");
    push_string(out, h.table);
    out.push_str(&format!(
        ",\"txId\":{},\"lsn\":{},\"commit_lsn\":\"{}\",\"position\":{}",
        h.xid, h.commit_lsn.0, h.commit_lsn, h.position
    ));
}

/// A PostgreSQL timestamp (microseconds since 2000-01-01) as Unix milliseconds.
pub fn unix_ms(pg_us: i64) -> i64 {
    (pg_us + PG_EPOCH_US).div_euclid(1000)
}

/// Debezium's op letter for an event (`schema` and `resync` have none in Debezium: pg_tide
/// writes them as they are).
pub fn op_code(op: Op) -> &'static str {
    match op {
        Op::Insert => "c",
        Op::Update => "u",
        Op::Delete => "d",
        Op::Read => "r",
        Op::Truncate => "t",
        Op::Schema => "schema",
        Op::Resync => "resync",
    }
}

/// Whether a message of this op goes to every partition of its topic instead of the key's
/// partition: a truncate and a schema change concern every key, so each partition gets a copy
/// in its order (all copies carry the same identity).
pub fn broadcast(op: Op) -> bool {
    matches!(op, Op::Truncate | Op::Schema | Op::Resync)
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
    /// The whole old row (JSON object) of an update or a delete of a table without a key
    /// (`REPLICA IDENTITY FULL`): `before`, as Debezium writes it under that identity.
    pub before: Option<&'a str>,
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
    /// Processing time, Unix microseconds.
    pub now_us: i64,
    /// For op `schema`: the change (the outbox schema event's `row`).
    pub schema_change: Option<&'a str>,
    /// For op `resync`: the phase (the outbox resync event's `row`: `{"phase": "start",
    /// "reason", "slot_lost_at"}` or `{"phase": "end", "complete"}`).
    pub resync: Option<&'a str>,
}

/// Render the Debezium envelope of an event (the message value):
/// `{"before", "after", "source", "op", "ts_ms", "transaction"}`, plus `schema_change` for op
/// `schema`. `before` is the key columns of a delete (Debezium's form with the default replica
/// identity), or the whole old row of an update or a delete of a table without a key (`before`,
/// as Debezium's under `REPLICA IDENTITY FULL`), else null; `after` the row of c/u/r, else null (for a truncate of some partitions
/// of a partitioned table, `{"partition", "where"}` as in the outbox).
pub fn envelope(src: &SourceInfo, e: &EnvelopeEvent<'_>, out: &mut String) {
    out.push_str("{\"before\":");
    match (e.op, e.before, e.key) {
        (Op::Update | Op::Delete, Some(b), _) => out.push_str(b),
        (Op::Delete, None, Some(k)) => out.push_str(k),
        _ => out.push_str("null"),
    }
    out.push_str(",\"after\":");
    match (e.op, e.row) {
        (Op::Insert | Op::Update | Op::Read | Op::Truncate, Some(r)) => out.push_str(r),
        _ => out.push_str("null"),
    }
    push_source_head(
        out,
        src,
        &SourceHead {
            commit_time: e.commit_time,
            op: e.op,
            schema: e.schema,
            table: e.table,
            xid: e.xid,
            commit_lsn: e.commit_lsn,
            position: e.position,
        },
    );
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
    push_processing_time(out, e.now_us);
    out.push_str(",\"transaction\":{\"id\":");
    push_string(out, &txn_id(e.xid, e.commit_lsn));
    out.push_str(&format!(
        ",\"total_order\":{},\"data_collection_order\":{}}}",
        e.position, e.data_collection_order
    ));
    if let Some(c) = e.schema_change {
        out.push_str(",\"schema_change\":");
        out.push_str(c);
    }
    if let Some(r) = e.resync {
        out.push_str(",\"resync\":");
        out.push_str(r);
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
/// is taken as it is. `delivery.timeout.ms` (the Java clients' name) is librdkafka's alias of
/// `message.timeout.ms`, which pg_tide reads itself: it becomes that.
pub fn property_name(name: &str) -> String {
    let p = if name.contains('.') {
        name.to_string()
    } else {
        name.replace('_', ".")
    };
    if p == "delivery.timeout.ms" {
        return "message.timeout.ms".to_string();
    }
    p
}

/// Who may set a librdkafka property, and where: pg_tide's allow-list ([`access`];
/// docs/kafka.md lists it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Producer and connection tuning ([`TUNING`]): anyone who may write the place, in a foreign
    /// server's options, a user mapping or a pipeline's `producer` option.
    Anywhere,
    /// How to connect and authenticate ([`CONNECTION`]): a foreign server's options or a user
    /// mapping (anyone who may write them), never a pipeline's `producer` option, whose writer
    /// (the pipeline's owner) would otherwise decide how credentials that may not be theirs
    /// (PUBLIC's user mapping) are sent.
    Connection,
    /// Names a file, a program or a library that librdkafka (or OpenSSL) reads, runs or loads
    /// inside PostgreSQL's processes, or authenticates with the server host's own identity
    /// ([`SUPERUSER`], and `sasl.mechanism` `GSSAPI`): only in a foreign server's or user
    /// mapping's options written by a superuser, never in `producer`. The text says what it does.
    Superuser(&'static str),
    /// pg_tide sets it itself ([`refused_setting`], the reason): refused everywhere.
    PgTide(&'static str),
    /// Not on the allow-list: refused everywhere.
    Unknown,
}

/// Where the allow-list is documented, for hints.
pub const ALLOW_LIST_DOC: &str = "docs/kafka.md, under \"The server and the user mapping\" (the allow-list is tide_core::kafka::access in crates/tide-core/src/kafka.rs)";

/// Producer and connection tuning anyone may set (class [`Access::Anywhere`]): sizes, batching,
/// compression, timeouts, retries' back-off, sockets, metadata refresh. None names a file, a
/// program or a library, enables a callback or logging, or touches the guarantees.
pub const TUNING: &[&str] = &[
    // batching and compression
    "linger.ms",
    "queue.buffering.max.ms",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "queue.buffering.backpressure.threshold",
    "batch.num.messages",
    "batch.size",
    "compression.type",
    "compression.codec",
    "compression.level",
    // sizes
    "message.max.bytes",
    "message.copy.max.bytes",
    "receive.message.max.bytes",
    // timeouts and back-off
    "message.timeout.ms",
    "transaction.timeout.ms",
    "request.timeout.ms",
    "socket.timeout.ms",
    "socket.connection.setup.timeout.ms",
    "connections.max.idle.ms",
    "reconnect.backoff.ms",
    "reconnect.backoff.max.ms",
    "retry.backoff.ms",
    "retry.backoff.max.ms",
    "api.version.request",
    "api.version.request.timeout.ms",
    "api.version.fallback.ms",
    "broker.version.fallback",
    // sockets and addresses
    "socket.send.buffer.bytes",
    "socket.receive.buffer.bytes",
    "socket.keepalive.enable",
    "socket.nagle.disable",
    "socket.max.fails",
    "broker.address.ttl",
    "broker.address.family",
    "client.dns.lookup",
    "client.rack",
    // metadata
    "metadata.recovery.strategy",
    "metadata.recovery.rebootstrap.trigger.ms",
    "metadata.max.age.ms",
    "topic.metadata.refresh.interval.ms",
    "topic.metadata.refresh.fast.interval.ms",
    "topic.metadata.refresh.sparse",
    "topic.metadata.propagation.max.ms",
    "enable.metrics.push",
];

/// How to connect and authenticate (class [`Access::Connection`]): values, never files. The
/// secrets among them ([`secret_setting`]) belong in a user mapping.
pub const CONNECTION: &[&str] = &[
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.certificate.pem",
    "ssl.ca.pem",
    "ssl.keystore.password",
    "ssl.cipher.suites",
    "ssl.curves.list",
    "ssl.sigalgs.list",
    "enable.ssl.certificate.verification",
    "ssl.endpoint.identification.algorithm",
];

/// Properties that name a file, a program or a library, or use the server host's identity
/// (class [`Access::Superuser`]), with what librdkafka does with them.
pub const SUPERUSER: &[(&str, &str)] = &[
    ("plugin.library.paths", "librdkafka loads each library named into the process (dlopen) the moment the property is set"),
    ("ssl.engine.location", "OpenSSL loads the engine library named"),
    ("ssl.engine.id", "OpenSSL loads the engine of that id from its engines directory"),
    ("ssl.providers", "OpenSSL loads the providers named, which may be paths to libraries"),
    ("ssl.key.location", "it names a file of the server host (a private key)"),
    ("ssl.certificate.location", "it names a file of the server host (a certificate)"),
    ("ssl.ca.location", "it names a file or directory of the server host (CA certificates)"),
    ("ssl.crl.location", "it names a file of the server host (a revocation list)"),
    ("ssl.keystore.location", "it names a file of the server host (a PKCS#12 keystore)"),
    ("https.ca.location", "it names a file or directory of the server host (CA certificates)"),
    ("sasl.kerberos.kinit.cmd", "librdkafka runs it as a shell command"),
    ("sasl.kerberos.keytab", "it names a file of the server host (a Kerberos keytab)"),
    ("sasl.kerberos.principal", "Kerberos authenticates with the server host's own tickets and keytab"),
    ("sasl.kerberos.service.name", "Kerberos authenticates with the server host's own tickets and keytab"),
    ("sasl.kerberos.min.time.before.relogin", "Kerberos authenticates with the server host's own tickets and keytab (it schedules kinit)"),
    ("sasl.oauthbearer.assertion.file", "it names a file of the server host"),
    ("sasl.oauthbearer.assertion.private.key.file", "it names a file of the server host (a private key)"),
    ("sasl.oauthbearer.assertion.jwt.template.file", "it names a file of the server host"),
    ("sasl.oauthbearer.metadata.authentication.type", "it authenticates with the server host's own cloud identity"),
];

/// Who may set `property` to `value`, and where (pg_tide's allow-list). `property` is as
/// [`property_name`] returns it. Only `sasl.mechanism(s)` depends on the value: `GSSAPI`
/// (Kerberos) authenticates with the server host's tickets and runs `kinit`.
pub fn access(property: &str, value: &str) -> Access {
    if let Some(why) = refused_setting(property) {
        return Access::PgTide(why);
    }
    if let Some((_, why)) = SUPERUSER.iter().find(|(p, _)| *p == property) {
        return Access::Superuser(why);
    }
    if CONNECTION.contains(&property) {
        if matches!(property, "sasl.mechanism" | "sasl.mechanisms")
            && value.trim().eq_ignore_ascii_case("gssapi")
        {
            return Access::Superuser(
                "Kerberos (GSSAPI) authenticates with the server host's own tickets and keytab, and runs kinit",
            );
        }
        return Access::Connection;
    }
    if TUNING.contains(&property) {
        return Access::Anywhere;
    }
    Access::Unknown
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
        "transactional.id" => {
            "pg_tide derives each pipeline's transactional id from the server, the database and the pipeline, so that only another writer of the same pipeline is fenced by it (another value could fence another role's pipeline)"
        }
        "bootstrap.servers" | "metadata.broker.list" => {
            "the brokers are the foreign server's option brokers"
        }
        "client.id" => "pg_tide names its clients after the pipeline",
        "produce.offset.report" | "delivery.report.only.error" | "dr_cb" | "dr_msg_cb" => {
            "pg_tide confirms the slot from every message's delivery report"
        }
        "group.id" | "enable.auto.commit" | "enable.auto.offset.store" | "enable.partition.eof"
        | "isolation.level" => "pg_tide reads its position topic with a consumer it configures itself",
        _ => return None,
    })
}

/// Whether a property holds a secret: allowed only in a user mapping (whose options only the
/// mapped role and superusers can read), never in a foreign server's options (readable by
/// every role) or a pipeline's options.
pub fn secret_setting(property: &str) -> bool {
    property.contains("password")
        || property.contains("passphrase")
        || property.contains("secret")
        || matches!(
            property,
            "ssl.key.pem"
                | "ssl_key"
                | "sasl.oauthbearer.config"
                | "sasl.oauthbearer.assertion.private.key.pem"
                | "ssl.keystore.location"
        )
}

/// `,"ts_ms":..,"ts_us":..,"ts_ns":..` of the processing time (Unix µs), as Debezium 3 writes
/// the envelope's times.
pub fn push_processing_time(out: &mut String, now_us: i64) {
    out.push_str(&format!(
        ",\"ts_ms\":{},\"ts_us\":{now_us},\"ts_ns\":{}",
        now_us.div_euclid(1000),
        i128::from(now_us) * 1000
    ));
}

#[cfg(test)]
#[path = "kafka_tests.rs"]
mod tests;
