//! The `kafka` target: every event as a message in a Kafka topic (Debezium's envelope, JSON;
//! with `value_format = 'debezium-schema'` the envelope with its Kafka Connect schema, rendered
//! from each column's text by `tide_core::connect` with the table's shape from [`schema`]), with
//! Debezium-style transaction metadata, written by a transactional (or, with `delivery =
//! 'at-least-once'`, an idempotent) producer that lives on a thread of its own ([`client`]).
//!
//! Owns: turning events into messages (topic per table, key, envelope, headers, tombstones, the
//! `BEGIN`/`END` records of each source transaction; the JSON itself is rendered by
//! `tide_core::kafka`), the pipeline's position in the broker (the position topic), the
//! pipeline's `transactional.id` ([`transactional_id`]), and mapping the client's failures to
//! [`TideError`]s.
//!
//! Guarantees:
//! - Per-key order: a message's key is the row's key and the partitioner is fixed (murmur2), so
//!   every event of a key goes to one partition, where the idempotent producer keeps them in
//!   stream order. Truncates and schema events go to every partition of the table's topic, so
//!   each partition has them at their place in the stream. A table without a key (`REPLICA
//!   IDENTITY FULL`) has no message key (as Debezium; its update or delete carries the whole old
//!   row as `before`, [`keyless_key`]), and every message without a key goes to one partition of
//!   its topic (murmur2 of no key), so its messages keep the stream's order too.
//! - Exactly once (`delivery` `exactly-once`, the default): a batch (one worker iteration, whole
//!   source transactions, with their `BEGIN`/`END` records) and then the position record it
//!   brings the pipeline to go out in one Kafka transaction, committed by [`Target::commit`]
//!   before the worker commits its own transaction and confirms the slot. A `read_committed`
//!   consumer sees a batch whole with its position, or nothing of it. After any failure or
//!   crash, [`Target::begin`] reads the position back (`read_committed`, after
//!   `init_transactions` settled whatever an earlier producer of the pipeline left open, and only
//!   once the position topic's last stable offset reached its end: a transaction still undecided
//!   there fails the read, which is retried) and the worker skips every source transaction at or
//!   below it: nothing is committed twice, nothing is skipped. A second writer of the pipeline
//!   (same `transactional.id`) fences this one: the pipeline pauses with 55006 ([`kafka_err`]).
//! - At least once (`delivery` `at-least-once`, for brokers without transactions):
//!   [`Target::commit`] waits until the broker acknowledged every message of the batch, then
//!   writes the position record and waits for that too; after a crash what is sent twice is at
//!   most the batch that was in flight (its messages carry the same identities), and nothing
//!   after a clean shutdown (a termination request waits up to `client::COMMIT_GRACE` for a
//!   commit being acknowledged).
//! - Nothing is sent for a batch before [`Target::commit`] unless it grows beyond
//!   [`SHIP_MESSAGES`] or [`SHIP_BYTES`] (a large source transaction): an interrupted decode
//!   leaves nothing behind (exactly-once: what was sent early stays in the open Kafka
//!   transaction, aborted with it). Memory: the batch, one batch handed to the sink thread and
//!   the producer's queue ([`DEFAULT_QUEUE_KBYTES`]), whatever the transaction's size. Time: a
//!   batch's Kafka transaction must commit within `transaction.timeout.ms`
//!   ([`DEFAULT_TRANSACTION_TIMEOUT_MS`] unless the producer option sets it), or the broker
//!   aborts it and the batch is tried again (a source transaction too large to produce in that
//!   time fails each time, with that reason).

pub mod client;
pub mod schema;
pub mod server;

pub use server::{check_server_usage, kafka_server_options, WRAPPER};

use crate::catalog::pipelines::PipelineRow;
use crate::error::{TideError, TideResult};
use crate::target::options::{KafkaOptions, Options};
use crate::target::{
    Change, CommitPoint, Event, Kind, Row, RowForm, SchemaEvent, Tableless, Target,
};
use client::{ClientSettings, KafkaFailure, KafkaSink, Msg, Work};
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::spi::SpiClient;
use std::collections::HashMap;
use std::time::Duration;
use tide_core::applied::KnownApplied;
use tide_core::change::At;
use tide_core::connect;
use tide_core::kafka::{self as fmt, EnvelopeEvent, SourceInfo, TxnCounter};
use tide_core::lsn::Lsn;
use tide_core::model::{ChunkWrite, Op, RelDesc};

/// Messages a batch holds before they are handed to the producer ahead of the commit.
pub const SHIP_MESSAGES: usize = 10_000;
/// Bytes of messages (keys, values, headers) a batch holds before they are handed over early.
pub const SHIP_BYTES: usize = 2 << 20;
/// The producer's queue (`queue.buffering.max.kbytes`) unless the user sets it: librdkafka's
/// default (1 GiB) would let one huge source transaction fill the worker's memory while the
/// broker is slower than the decoding; with this bound the producer waits instead (issue 34).
pub const DEFAULT_QUEUE_KBYTES: u32 = 8 * 1024;
/// How long the worker waits for the position topic to be read.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `message.timeout.ms`: how long the broker may take to acknowledge a message.
pub const DEFAULT_DELIVERY_TIMEOUT_MS: u64 = 30_000;
/// Default of `transaction.timeout.ms` (exactly-once): how long one batch's Kafka transaction may
/// stay open before the broker aborts it. Kafka's own default cap on it
/// (`transaction.max.timeout.ms`) is 15 minutes; a batch is one worker iteration, so a source
/// transaction whose messages take longer than this to produce never commits (README).
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 900_000;

/// Kafka topics, as the SQL API and the worker tell kinds of target apart.
pub const KIND: Kind = Kind {
    alterable: &["producer", "tombstones"],
    tableless: Some(Tableless {
        writes_to: "Kafka topics",
        target_table: (
            ", which are named by its options, not by target_table",
            "Omit target_table for kafka pipelines; the pipeline's topic option names each table's topic.",
        ),
        verify_hint: "tide.verify compares table targets ('table' or 'postgres'). For Kafka, replay the topics onto a copy and compare that (README, Kafka target).",
    }),
    local_tables: false,
    remote: false,
    outside: true,
    consumers: false,
    resync_marks: true,
};

/// The options of a kafka pipeline with their defaults applied.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub server: String,
    pub prefix: String,
    pub topic: String,
    pub transaction_topic: Option<String>,
    pub position_topic: String,
    pub tombstones: bool,
    pub partitions: i32,
    pub replication_factor: i32,
    pub producer: Vec<(String, String)>,
    /// Values with their Kafka Connect schema (`value_format` `debezium-schema`).
    pub value_schema: bool,
    /// Keys with their Kafka Connect schema (`key_format` `json-schema`).
    pub key_schema: bool,
    /// Kafka transactions (`delivery` `exactly-once`, the default).
    pub transactional: bool,
}

/// Apply the defaults to a kafka pipeline's options.
pub fn resolve(pipeline: &str, o: &KafkaOptions) -> Resolved {
    let prefix = o
        .topic_prefix
        .clone()
        .unwrap_or_else(|| pipeline.to_string());
    Resolved {
        server: o.server.clone().unwrap_or_default(),
        topic: o
            .topic
            .clone()
            .unwrap_or_else(|| "{prefix}.{schema}.{table}".to_string()),
        transaction_topic: match o.transaction_topic.as_deref() {
            Some("") => None,
            Some(t) => Some(fmt::legal_topic(t)),
            None => Some(fmt::legal_topic(&format!("{prefix}.transaction"))),
        },
        position_topic: fmt::legal_topic(
            &o.position_topic
                .clone()
                .unwrap_or_else(|| format!("{prefix}.pg_tide.position")),
        ),
        tombstones: o.tombstones.unwrap_or(true),
        partitions: o.partitions.unwrap_or(1),
        replication_factor: o.replication_factor.unwrap_or(1),
        producer: o.producer_settings(),
        value_schema: o.value_schema(),
        key_schema: o.key_schema(),
        transactional: o.transactional(),
        prefix,
    }
}

/// The librdkafka properties of a kafka pipeline: the server's and user mapping's options (as
/// [`kafka_server_options`] reads and checks them against the allow-list), the
/// pipeline's pass-through settings (checked by `KafkaOptions`), then pg_tide's own, which
/// nothing overrides (with `transactional_id` when the pipeline's delivery is exactly-once).
/// Returns them with `message.timeout.ms` and `transaction.timeout.ms`.
pub fn properties(
    pipeline: &str,
    server_options: &[(String, String)],
    r: &Resolved,
    transactional_id: &str,
) -> (Vec<(String, String)>, Duration, Duration) {
    let mut props: Vec<(String, String)> = Vec::new();
    for (k, v) in server_options {
        let k = if k == "brokers" {
            "bootstrap.servers".to_string()
        } else {
            fmt::property_name(k)
        };
        props.push((k, v.clone()));
    }
    props.extend(r.producer.iter().cloned());
    let mut timeout_ms = DEFAULT_DELIVERY_TIMEOUT_MS;
    if let Some((_, v)) = props.iter().rev().find(|(k, _)| k == "message.timeout.ms") {
        timeout_ms = v.parse().unwrap_or(DEFAULT_DELIVERY_TIMEOUT_MS);
    } else {
        props.push(("message.timeout.ms".into(), timeout_ms.to_string()));
    }
    let mut txn_timeout_ms = DEFAULT_TRANSACTION_TIMEOUT_MS;
    if let Some((_, v)) = props
        .iter()
        .rev()
        .find(|(k, _)| k == "transaction.timeout.ms")
    {
        txn_timeout_ms = v.parse().unwrap_or(DEFAULT_TRANSACTION_TIMEOUT_MS);
    } else if r.transactional {
        props.push(("transaction.timeout.ms".into(), txn_timeout_ms.to_string()));
    }
    if !r.transactional {
        props.retain(|(k, _)| k != "transaction.timeout.ms");
    }
    if !props.iter().any(|(k, _)| k == "queue.buffering.max.kbytes") {
        props.push((
            "queue.buffering.max.kbytes".into(),
            DEFAULT_QUEUE_KBYTES.to_string(),
        ));
    }
    for (k, v) in [
        ("enable.idempotence", "true"),
        ("enable.gapless.guarantee", "true"),
        ("acks", "all"),
        ("max.in.flight.requests.per.connection", "5"),
        // murmur2: Java clients' hash of the key; a message without a key (a table without a
        // key) goes to one fixed partition of its topic, so such a table's messages keep the
        // stream's order (murmur2_random would scatter them).
        ("partitioner", "murmur2"),
        ("client.id", &format!("pg_tide-{pipeline}")),
    ] {
        props.push((k.to_string(), v.to_string()));
    }
    if r.transactional {
        props.push(("transactional.id".into(), transactional_id.to_string()));
    }
    (
        props,
        Duration::from_millis(timeout_ms),
        Duration::from_millis(txn_timeout_ms),
    )
}

/// The `transactional.id` of a pipeline of this database: `pg_tide-<system identifier>-<database
/// OID>-<pipeline>`. The same for every worker of the pipeline on this server and on its
/// physical copies (a standby promoted, a base backup started), so that whichever initialises
/// its transactions last fences the others; another pipeline, database or server never shares
/// it.
pub fn transactional_id(pipeline: &str) -> String {
    // SAFETY: GetSystemIdentifier reads the control file's copy in shared memory (set before
    // any backend starts, never written again); MyDatabaseId is set once this backend connected.
    let (sysid, db) = unsafe {
        (
            pgrx::pg_sys::GetSystemIdentifier(),
            pgrx::pg_sys::MyDatabaseId.to_u32(),
        )
    };
    format!("pg_tide-{sysid}-{db}-{pipeline}")
}

/// A client failure as the pipeline's error.
pub fn kafka_err(e: KafkaFailure) -> TideError {
    if e.fenced {
        let mut err = TideError::new(
            PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
            format!("kafka target: this pipeline's producer was fenced: another writer initialised the same transactional id, so nothing more of this worker's is committed ({})", e.message),
        )
        .hint("Another worker of this pipeline writes its topics: a copy of this server (a base backup or clone started with pg_tide, a standby promoted while this server runs) or a second worker. The pipeline is paused. If this server is the one that must write the topics, stop the other writer, then SELECT tide.resume_pipeline('<pipeline>'); (resuming fences the other one in turn).");
        err.pause_pipeline = true;
        return err;
    }
    if e.config {
        return TideError::invalid(format!("kafka target: {}", e.message)).hint(
            "Fix the setting in the foreign server's or user mapping's options (ALTER SERVER / ALTER USER MAPPING ... OPTIONS (SET ...)) or the pipeline's producer option; see librdkafka's CONFIGURATION.md for the property.",
        );
    }
    if e.transient {
        return TideError::new(
            PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
            format!("kafka target: {}", e.message),
        )
        .hint(e.hint.unwrap_or("The broker is unreachable or slow; the worker retries with back-off, and the slot keeps the WAL meanwhile (unless max_slot_wal_keep_size invalidates it first: see slot_warning and safe_wal_size in tide.pipelines). Check the server's brokers option and the broker."));
    }
    TideError::new(
        PgSqlErrorCode::ERRCODE_FDW_ERROR,
        format!("kafka target: {}", e.message),
    )
    .hint("The broker refused the batch (see the message: authorization, message size, topic); fix that and the worker retries by itself.")
}

/// The open source transaction: its BEGIN was written, its END is due.
struct Open {
    xid: u32,
    lsn: Lsn,
    commit_time: i64,
    counter: TxnCounter,
}

/// What a JSON message says besides its place, its table and its op: the fields of
/// Debezium's envelope ([`EnvelopeEvent`]) an event, a schema change or a resync mark fills.
#[derive(Default)]
struct Says<'a> {
    key: Option<&'a str>,
    before: Option<&'a str>,
    row: Option<&'a str>,
    unchanged: &'a [String],
    backfill: Option<(i64, i64)>,
    schema_change: Option<&'a str>,
    resync: Option<&'a str>,
}

/// A kafka pipeline's target.
pub struct KafkaTarget {
    r: Resolved,
    source: SourceInfo,
    sink: KafkaSink,
    /// The batch's messages not yet handed to the sink thread.
    buf: Vec<Msg>,
    /// What `buf`'s messages hold (keys, values, headers), to hand them over at [`SHIP_BYTES`].
    buf_bytes: usize,
    /// Messages handed to the sink thread in this batch.
    shipped: bool,
    open: Option<Open>,
    /// The broker's position, once read.
    applied: KnownApplied,
    /// Topic, schema and table of each relation (by OID).
    names: HashMap<u32, (String, String, String)>,
    /// The Connect shapes of the tables (`value_format` `debezium-schema`).
    shapes: schema::Shapes,
    delivery_timeout: Duration,
}

/// The target of a kafka pipeline: options, the server's settings, the sink thread.
pub fn for_pipeline(p: &PipelineRow) -> TideResult<Box<dyn Target>> {
    // Options the rules of this build refuse (a producer setting no longer taken, say) keep
    // their SQLSTATE and reason: the pipeline fails with them until it is created again.
    let opts = Options::parse(p.target, &p.options).map_err(|e| TideError {
        message: format!(
            "pipeline \"{}\" has options pg_tide does not take: {}",
            p.name, e.message
        ),
        hint: Some(format!(
            "{} Drop the pipeline and create it again without it.",
            e.hint.as_deref().unwrap_or_default()
        )),
        ..e
    })?;
    let Options::Kafka(o) = opts else {
        return Err(TideError::internal("not a kafka pipeline"));
    };
    let r = resolve(&p.name, &o);
    let server_options = {
        // USAGE revoked since create_pipeline: the pipeline fails with 42501 until granted.
        check_server_usage(&r.server, &p.owner)?;
        kafka_server_options(&r.server, &p.owner)?
    };
    let (properties, delivery_timeout, transaction_timeout) =
        properties(&p.name, &server_options, &r, &transactional_id(&p.name));
    let db = crate::sql::one::<String>("SELECT current_database()::text", &[])?.unwrap_or_default();
    let sink = KafkaSink::start(ClientSettings {
        properties,
        pipeline: p.name.clone(),
        position_topic: r.position_topic.clone(),
        transaction_topic: r.transaction_topic.clone(),
        partitions: r.partitions,
        replication_factor: r.replication_factor,
        delivery_timeout,
        transactional: r.transactional,
        transaction_timeout,
    });
    Ok(Box::new(KafkaTarget {
        source: SourceInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            name: r.prefix.clone(),
            db,
        },
        r,
        sink,
        buf: Vec::new(),
        buf_bytes: 0,
        shipped: false,
        open: None,
        applied: KnownApplied::default(),
        names: HashMap::new(),
        shapes: schema::Shapes::default(),
        delivery_timeout,
    }))
}

/// The message key and `before` of a JSON event: a table without a key (`REPLICA IDENTITY FULL`;
/// its update or delete carries the whole old row in [`Event::old`]) has no message key, as
/// Debezium writes it, and its old row is `before`; any other event is keyed by its key.
fn keyless_key(ev: &Event) -> (Option<&str>, Option<&str>) {
    match &ev.old {
        Row::Json(old) => (None, Some(old.as_str())),
        _ => (ev.key.as_deref(), None),
    }
}

/// Columns by name with their text (a delete's key, a keyless table's old row) as a Connect
/// `Value` struct of the table's shape (absent columns null).
fn named_row(shape: &connect::Shape, named: &[(String, Option<String>)]) -> Result<String, String> {
    let columns: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
    let values: Vec<Option<String>> = named.iter().map(|(_, v)| v.clone()).collect();
    let mut out = String::with_capacity(128);
    shape.row(
        &connect::RowText {
            columns: &columns,
            values: &values,
            unchanged: &[],
        },
        &mut out,
    )?;
    Ok(out)
}

/// Key columns by name with their text from an event's key JSON (a string as it is, anything
/// else as its JSON text).
fn key_from_json(key: &str) -> Vec<(String, Option<String>)> {
    let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(key) else {
        return Vec::new();
    };
    m.into_iter()
        .map(|(k, v)| {
            let t = match v {
                serde_json::Value::Null => None,
                serde_json::Value::String(s) => Some(s),
                other => Some(other.to_string()),
            };
            (k, t)
        })
        .collect()
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

impl KafkaTarget {
    fn names(&mut self, relid: u32, relation: &str) -> (String, String, String) {
        if let Some(n) = self.names.get(&relid) {
            if n.1.is_empty() || relation.is_empty() {
                return n.clone();
            }
        }
        let (schema, table) = fmt::split_qualified(relation);
        let topic = fmt::topic_for(&self.r.topic, &self.r.prefix, &schema, &table);
        let n = (topic, schema, table);
        self.names.insert(relid, n.clone());
        n
    }

    /// The transaction metadata of `t`: END of the open one when `t` is another, BEGIN of `t`.
    fn enter(&mut self, t: At) {
        if self
            .open
            .as_ref()
            .is_some_and(|o| o.lsn == t.lsn && o.xid == t.xid)
        {
            return;
        }
        self.close();
        if let Some(topic) = &self.r.transaction_topic {
            self.add(Msg {
                topic: topic.clone(),
                key: Some(fmt::txn_key(t.xid, t.lsn)),
                value: Some(fmt::txn_record(t.xid, t.lsn, t.commit_time, None)),
                headers: vec![(fmt::HEADER_COMMIT_LSN, t.lsn.to_string())],
                broadcast: false,
            });
        }
        self.open = Some(Open {
            xid: t.xid,
            lsn: t.lsn,
            commit_time: t.commit_time,
            counter: TxnCounter::default(),
        });
    }

    /// The END record of the open transaction.
    fn close(&mut self) {
        let Some(o) = self.open.take() else {
            return;
        };
        if let Some(topic) = &self.r.transaction_topic {
            self.add(Msg {
                topic: topic.clone(),
                key: Some(fmt::txn_key(o.xid, o.lsn)),
                value: Some(fmt::txn_record(
                    o.xid,
                    o.lsn,
                    o.commit_time,
                    Some(&o.counter),
                )),
                headers: vec![(fmt::HEADER_COMMIT_LSN, o.lsn.to_string())],
                broadcast: false,
            });
        }
    }

    /// Enter `t` and count one message of the table: (topic, schema, table,
    /// data_collection_order).
    fn start(&mut self, t: At, relid: u32, relation: &str) -> (String, String, String, u64) {
        self.enter(t);
        let (topic, schema, table) = self.names(relid, relation);
        let collection = format!("{schema}.{table}");
        let order = match self.open.as_mut() {
            Some(o) => o.counter.count(&collection),
            None => 1,
        };
        (topic, schema, table, order)
    }

    /// A JSON message (Debezium's envelope) of `op` on table `relid` (`relation`) at `t`.
    fn message(
        &mut self,
        t: At,
        (relid, relation): (u32, &str),
        op: Op,
        says: Says<'_>,
    ) -> TideResult<()> {
        let (topic, schema, table, order) = self.start(t, relid, relation);
        let mut value = String::with_capacity(256 + says.row.map_or(0, str::len));
        fmt::envelope(
            &self.source,
            &EnvelopeEvent {
                op,
                key: says.key,
                before: says.before,
                row: says.row,
                unchanged: says.unchanged,
                schema: &schema,
                table: &table,
                xid: t.xid,
                commit_lsn: t.lsn,
                position: t.position,
                commit_time: t.commit_time,
                backfill: says.backfill,
                data_collection_order: order,
                now_us: now_us(),
                schema_change: says.schema_change,
                resync: says.resync,
            },
            &mut value,
        );
        self.send(topic, t, op, says.key.map(str::to_string), value)
    }

    /// Queue a data message (and the tombstone after a delete); `key` is dropped for a message
    /// that goes to every partition.
    fn send(
        &mut self,
        topic: String,
        t: At,
        op: Op,
        key: Option<String>,
        value: String,
    ) -> TideResult<()> {
        let headers = vec![
            (fmt::HEADER_COMMIT_LSN, t.lsn.to_string()),
            (fmt::HEADER_POSITION, t.position.to_string()),
            (fmt::HEADER_OP, op.as_str().to_string()),
        ];
        let broadcast = fmt::broadcast(op);
        let key = if broadcast { None } else { key };
        let tombstone = op == Op::Delete && self.r.tombstones && key.is_some();
        self.add(Msg {
            topic: topic.clone(),
            key: key.clone(),
            value: Some(value),
            headers: headers.clone(),
            broadcast,
        });
        if tombstone {
            self.add(Msg {
                topic,
                key,
                value: None,
                headers,
                broadcast: false,
            });
        }
        if self.buf.len() >= SHIP_MESSAGES || self.buf_bytes >= SHIP_BYTES {
            self.ship()?;
        }
        Ok(())
    }

    /// Queue a message in the batch.
    fn add(&mut self, m: Msg) {
        self.buf_bytes += m.topic.len()
            + m.key.as_ref().map_or(0, String::len)
            + m.value.as_ref().map_or(0, String::len)
            + m.headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
        self.buf.push(m);
    }

    /// An event as `{"schema", "payload"}` (`value_format` `debezium-schema`; rows arrive as
    /// text, [`RowForm::Text`]), its key with its schema when `key_format` is `json-schema`.
    fn connect_message(
        &mut self,
        t: At,
        ev: &Event,
        schema_change: Option<&str>,
    ) -> TideResult<()> {
        let (topic, schema, table, order) = self.start(t, ev.relid, &ev.relation);
        let key_names: Vec<String>;
        let columns: &[String] = match (&ev.row, &ev.old) {
            (Row::Key(kv), _) | (Row::None, Row::Key(kv)) => {
                key_names = kv.iter().map(|(n, _)| n.clone()).collect();
                &key_names
            }
            (Row::Text(_), _) => &ev.columns,
            _ => &[],
        };
        let cached = self
            .shapes
            .get(ev.relid, (&self.r.prefix, &schema, &table), columns)?;
        let bad = |e: String| {
            TideError::internal(format!(
                "kafka target: cannot render a row of {schema}.{table} with its Connect schema: {e}"
            ))
        };
        let mut before = None;
        let mut after = None;
        let mut truncated = None;
        let mut key_values: Vec<(String, Option<String>)> = Vec::new();
        match &ev.row {
            Row::Text(values) => {
                let mut out = String::with_capacity(256);
                cached
                    .shape
                    .row(
                        &connect::RowText {
                            columns: &ev.columns,
                            values,
                            unchanged: &ev.unchanged,
                        },
                        &mut out,
                    )
                    .map_err(bad)?;
                after = Some(out);
                for k in &cached.shape.key {
                    if let Some(i) = ev.columns.iter().position(|c| c == k) {
                        key_values.push((k.clone(), values.get(i).cloned().flatten()));
                    }
                }
            }
            Row::Key(kv) => {
                before = Some(named_row(&cached.shape, kv).map_err(bad)?);
                key_values = kv.clone();
            }
            Row::Json(j) if ev.op == Op::Truncate => truncated = Some(j.clone()),
            Row::None => {}
            _ => return Err(TideError::internal(
                "the kafka target (value_format debezium-schema) was handed a row that is not text",
            )),
        }
        // A table without a key: its whole old row is `before` (and the message has no key).
        if let Row::Key(old) = &ev.old {
            before = Some(named_row(&cached.shape, old).map_err(bad)?);
        }
        let key = match (&ev.key, self.r.key_schema) {
            (Some(k), true) => {
                // A key column the row does not carry (an unchanged TOASTed key): from the
                // event's key JSON.
                if key_values.len() < cached.shape.key.len() {
                    key_values = key_from_json(k);
                }
                Some(cached.shape.key_message(&key_values).map_err(bad)?)
            }
            (k, _) => k.clone(),
        };
        let mut value = String::with_capacity(cached.envelope.len() + 512);
        connect::message(
            &cached.envelope,
            &self.source,
            &connect::Payload {
                op: ev.op,
                before: before.as_deref(),
                after: after.as_deref(),
                schema: &schema,
                table: &table,
                xid: t.xid,
                commit_lsn: t.lsn,
                position: t.position,
                commit_time: t.commit_time,
                backfill: ev.backfill,
                unchanged: &ev.unchanged,
                data_collection_order: order,
                now_us: now_us(),
                schema_change,
                truncated: truncated.as_deref(),
            },
            &mut value,
        );
        self.send(topic, t, ev.op, key, value)
    }

    fn ship(&mut self) -> TideResult<()> {
        self.buf_bytes = 0;
        let msgs = std::mem::take(&mut self.buf);
        if !msgs.is_empty() {
            self.shipped = true;
            let wait = self.delivery_timeout * 2 + Duration::from_secs(10);
            self.sink.produce(msgs, wait).map_err(kafka_err)?;
        }
        Ok(())
    }
}

impl Target for KafkaTarget {
    /// Rows as JSON (the envelope's `before`/`after`), or as text with `value_format`
    /// `debezium-schema` (rendered by the column's Connect schema, `tide_core::connect`).
    fn row_form(
        &mut self,
        _relid: u32,
        _chunk: Option<&[(String, String)]>,
    ) -> TideResult<RowForm> {
        Ok(if self.r.value_schema {
            RowForm::Text
        } else {
            RowForm::Json
        })
    }

    /// The position the target keeps in its position topic (read once, then kept).
    fn begin(&mut self, _c: &mut SpiClient<'_>, _p: &PipelineRow) -> TideResult<Option<Lsn>> {
        let sink = &mut self.sink;
        self.applied.read_once(|| {
            sink.call(Work::ReadPosition, READ_TIMEOUT, false)
                .map_err(kafka_err)
        })
    }

    /// A change: a message per event (truncates one after the other), on every partition of
    /// the table's topic for a schema change or a resync.
    fn apply(
        &mut self,
        _c: &mut SpiClient<'_>,
        at: At,
        change: Change<'_>,
    ) -> TideResult<Option<ChunkWrite>> {
        match change {
            Change::Relation { relid, rel } => self.relation(relid, rel)?,
            Change::Row(ev) => self.push(at, ev)?,
            Change::Truncate { events, .. } => {
                for (i, ev) in events.into_iter().enumerate() {
                    self.push(at.after(i), ev)?;
                }
            }
            Change::Schema(ev) => self.schema(at, ev)?,
            Change::Resync(marks) => self.resync(at, marks)?,
            Change::Chunk(b) => return Err(crate::target::refused_batch(&b)),
        }
        Ok(None)
    }

    /// Produce the batch, then record the position: in the batch's Kafka transaction and commit
    /// it (exactly-once), or after every acknowledgement (at-least-once).
    fn commit(
        &mut self,
        _c: &mut SpiClient<'_>,
        _pipeline: &str,
        applied: Option<Lsn>,
        at: CommitPoint,
    ) -> TideResult<()> {
        if at != CommitPoint::End {
            // Acknowledged and recorded once per iteration, at its end.
            return Ok(());
        }
        self.close();
        if self.buf.is_empty() && !self.shipped && applied.is_none() {
            return Ok(());
        }
        self.ship()?;
        self.shipped = false;
        let wait = self.delivery_timeout * 2 + Duration::from_secs(10);
        let sent = self.sink.call(Work::Commit(applied), wait, true);
        self.applied.committed(applied, sent).map_err(kafka_err)?;
        Ok(())
    }

    fn reset(&mut self) {
        self.buf.clear();
        self.buf_bytes = 0;
        self.open = None;
        self.applied.forget();
        self.shipped = false;
        // Whatever the producer still holds of the failed batch is purged with it.
        let _ = self.sink.call(Work::Discard, Duration::from_secs(5), false);
    }
}

impl KafkaTarget {
    /// A relation's (new) description.
    fn relation(&mut self, relid: u32, rel: &RelDesc) -> TideResult<()> {
        // A renamed table keeps its topic until the worker restarts; a new description of the
        // same name changes nothing.
        if !self.names.contains_key(&relid) {
            self.names(relid, &rel.qualified);
        }
        // The stream describes the table anew (a restart, a schema change): its Connect shape
        // has these columns, read again at its next message.
        self.shapes.describe(
            relid,
            Some(
                rel.columns
                    .iter()
                    .map(|c| schema::Described {
                        name: c.name.clone(),
                        type_oid: Some(c.type_oid),
                        key: c.key,
                    })
                    .collect(),
            ),
        );
        Ok(())
    }

    /// One event: a message of the table's topic.
    fn push(&mut self, t: At, ev: Event) -> TideResult<()> {
        if self.r.value_schema {
            return self.connect_message(t, &ev, None);
        }
        let row = match &ev.row {
            Row::None => None,
            Row::Json(s) => Some(s.as_str()),
            _ => {
                return Err(TideError::internal(
                    "the kafka target was handed a row that is not JSON",
                ))
            }
        };
        let (key, before) = keyless_key(&ev);
        let says = Says {
            key,
            before,
            row,
            unchanged: &ev.unchanged,
            backfill: ev.backfill,
            ..Says::default()
        };
        self.message(t, (ev.relid, &ev.relation), ev.op, says)
    }

    /// A schema event: op `schema`, the change as the outbox's schema event has it
    /// (`schema_change`), on every partition of the table's topic.
    fn schema(&mut self, t: At, ev: SchemaEvent) -> TideResult<()> {
        let mut change: serde_json::Value = serde_json::from_str(&ev.payload).map_err(|e| {
            TideError::internal(format!("a schema marker's payload is not JSON: {e}"))
        })?;
        if let Some(o) = change.as_object_mut() {
            o.insert("rewrite".to_string(), serde_json::Value::Bool(ev.rewrite));
        }
        let change = change.to_string();
        if self.r.value_schema {
            // The new shape, which this message carries and later messages use.
            let (_, schema, table) = self.names(ev.relid, &ev.relation);
            let columns = (!ev.dropped).then(|| {
                ev.change
                    .columns
                    .iter()
                    .map(|(name, _)| schema::Described {
                        name: name.clone(),
                        type_oid: None,
                        key: ev.change.key.contains(name),
                    })
                    .collect()
            });
            self.shapes.describe(ev.relid, columns);
            self.shapes
                .refresh(ev.relid, (&self.r.prefix, &schema, &table))?;
            let bare = Event::bare(ev.relid, ev.relation.clone(), Op::Schema, None);
            return self.connect_message(t, &bare, Some(&change));
        }
        let says = Says {
            schema_change: Some(&change),
            ..Says::default()
        };
        self.message(t, (ev.relid, &ev.relation), Op::Schema, says)
    }

    /// A resync's events: op `resync`, the phase in `resync`, on every partition of each
    /// table's topic (at its place in each: a start before the partition's re-read rows, an end
    /// after them), as the pseudo transaction `at`.
    fn resync(&mut self, at: At, marks: &[crate::target::ResyncMark]) -> TideResult<()> {
        for (i, m) in marks.iter().enumerate() {
            let says = Says {
                resync: Some(&m.payload),
                ..Says::default()
            };
            self.message(at.after(i), (m.relid, &m.relation), Op::Resync, says)?;
        }
        Ok(())
    }
}
