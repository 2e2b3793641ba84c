//! The Kafka client of one pipeline, owned by a thread of its own ([`KafkaSink`]).
//!
//! Owns: the sink thread, its librdkafka producer (transactional by default, else idempotent),
//! the admin client that creates topics, the consumer that reads the position topic, and the
//! request/reply protocol with the worker's main thread.
//!
//! Guarantees:
//! - The sink thread never calls into PostgreSQL and blocks every signal before it creates a
//!   librdkafka client, so librdkafka's own threads (which inherit the mask) never run
//!   PostgreSQL's signal handlers. Every failure is a [`KafkaFailure`] value; a panic inside the
//!   client is caught and returned as one.
//! - Transactional (`ClientSettings::transactional`, the default): a batch's messages (also those
//!   handed over before its commit) and then its position record go out in one Kafka
//!   transaction, begun before the batch's first message; [`Work::Commit`] answers `Ok` only once
//!   `commit_transaction` did, so a `read_committed` consumer sees the batch and the position it
//!   brings the pipeline to together or neither. The producer is initialised
//!   (`init_transactions`, which completes or aborts whatever an earlier producer of the same
//!   `transactional.id` left open, and fences that producer) before [`Work::ReadPosition`] reads
//!   the position back with `isolation.level = read_committed`, and only once the position
//!   topic's last stable offset reached the end its log had then (no record of an undecided
//!   transaction before it; else the read fails and is retried): the position read is the last
//!   committed one, never one a transaction may still commit, or abort, after it was read.
//! - At-least-once (`transactional` false): [`Work::Commit`] answers `Ok` only once the broker
//!   acknowledged every message produced since the previous commit and then the position record
//!   that follows them: the position topic never names a transaction the broker does not hold
//!   whole.
//! - Any failure drops the producer (a new one serves the next batch; a transaction left open is
//!   aborted first when possible, else by the next producer's `init_transactions`), so a batch is
//!   never half-retried inside librdkafka behind the worker's back. A producer fenced by a newer
//!   one of the same `transactional.id` fails with [`KafkaFailure::fenced`].
//! - The main thread waits as every sink thread's is waited for (`crate::target::wait`: slices,
//!   the postmaster and interrupts between them; [`KafkaSink::call`]), bounded by its timeout. A
//!   termination request (SIGTERM: shutdown, `drop_pipeline`) that arrives while a commit is
//!   being acknowledged is held for up to [`COMMIT_GRACE`], so a clean shutdown records the
//!   batch's position instead of leaving it to be sent again.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::target::wait::Waited;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use tide_core::lsn::Lsn;

mod failure;
mod position;

pub use failure::{KafkaFailure, UNDECIDED_HINT};

/// How long a termination request waits for a commit being acknowledged.
pub const COMMIT_GRACE: Duration = Duration::from_secs(5);
/// Timeout of one metadata, watermark or admin request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How many position records are read per step when looking back for the pipeline's last one.
const POSITION_WINDOW: i64 = 100;
/// How long a failed batch's or a stopping sink's open transaction may take to be aborted.
const ABORT_TIMEOUT: Duration = Duration::from_secs(3);

/// One message to produce.
#[derive(Debug, Clone)]
pub struct Msg {
    pub topic: String,
    /// The key (JSON text); none for a message every partition gets.
    pub key: Option<String>,
    /// The value; none for a tombstone.
    pub value: Option<String>,
    pub headers: Vec<(&'static str, String)>,
    /// A copy goes to every partition of the topic (truncate, schema change).
    pub broadcast: bool,
}

/// What the sink thread is asked to do.
pub enum Work {
    /// Produce these messages: the reply (always `Ok`) says they are in the producer's queue;
    /// failures are reported by the next commit.
    Produce(Vec<Msg>),
    /// Transactional: write the position record (when given) and commit the open transaction.
    /// Otherwise: wait until every message produced since the last commit is acknowledged, then
    /// write the position record (when given) and wait for its acknowledgement.
    Commit(Option<Lsn>),
    /// The pipeline's last committed position in the position topic (none: no record), read
    /// once the producer is initialised (transactional: after `init_transactions`).
    ReadPosition,
    /// Connect and read the cluster's metadata (create_pipeline's check).
    Check,
    /// Forget the open batch: purge what is not acknowledged, drop the producer.
    Discard,
}

/// Settings of the sink thread's clients.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    /// librdkafka properties: the foreign server's and the user mapping's options, then the
    /// pipeline's pass-through `producer` settings (validated), then pg_tide's own.
    pub properties: Vec<(String, String)>,
    /// The pipeline (the position record's key).
    pub pipeline: String,
    pub position_topic: String,
    /// The transaction metadata topic (one partition: its records are in commit order).
    pub transaction_topic: Option<String>,
    /// Partitions and replication factor of the topics pg_tide creates.
    pub partitions: i32,
    pub replication_factor: i32,
    /// How long the broker may take to acknowledge a message (`message.timeout.ms`).
    pub delivery_timeout: Duration,
    /// Kafka transactions (`properties` hold the `transactional.id`): exactly once for
    /// `read_committed` consumers. Otherwise the idempotent producer alone (at least once).
    pub transactional: bool,
    /// `transaction.timeout.ms`: how long one transaction (one batch) may stay open before the
    /// broker aborts it.
    pub transaction_timeout: Duration,
}

struct Request {
    seq: u64,
    work: Work,
}

struct Reply {
    seq: u64,
    result: Result<Option<Lsn>, KafkaFailure>,
}

/// State both threads see.
#[derive(Default)]
struct Shared {
    /// Highest request the main thread gave up on.
    abandoned: AtomicU64,
    /// The sink thread must exit.
    stop: AtomicBool,
}

/// Delivery reports and global errors of the producer.
#[derive(Default)]
struct Reports {
    acked: AtomicU64,
    failed: AtomicU64,
    first_failure: Mutex<Option<KafkaError>>,
    last_error: Mutex<Option<String>>,
}

struct Ctx(Arc<Reports>);

impl ClientContext for Ctx {
    fn error(&self, error: KafkaError, reason: &str) {
        *self
            .0
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(format!("{error}: {reason}"));
    }
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, _fac: &str, _message: &str) {}
}

impl ProducerContext for Ctx {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.0.acked.fetch_add(1, Ordering::SeqCst);
            }
            Err((e, _)) => {
                self.0.failed.fetch_add(1, Ordering::SeqCst);
                let mut first = self
                    .0
                    .first_failure
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if first.is_none() {
                    *first = Some(e.clone());
                }
            }
        }
    }
}

/// The sink thread's clients and the open batch.
struct State {
    settings: ClientSettings,
    producer: Option<(BaseProducer<Ctx>, Arc<Reports>)>,
    admin: Option<AdminClient<DefaultClientContext>>,
    /// Messages handed to the producer in the open batch.
    sent: u64,
    /// A failure of the open batch, reported at its commit.
    failure: Option<KafkaFailure>,
    /// Topics known to exist, with their partition count once read.
    topics: HashSet<String>,
    partitions: HashMap<String, i32>,
    /// Transactional: the producer's `init_transactions` succeeded.
    initialized: bool,
    /// Transactional: the open transaction, since when (begun before a batch's first message).
    txn_since: Option<Instant>,
}

fn config(properties: &[(String, String)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in properties {
        c.set(k, v);
    }
    c
}

/// Block every signal in the calling thread (and the threads it creates).
fn block_signals() {
    // SAFETY: `set` is initialised by sigfillset before use; a null `old` is allowed.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

impl State {
    fn producer(&mut self) -> Result<&(BaseProducer<Ctx>, Arc<Reports>), KafkaFailure> {
        if self.producer.is_none() {
            let reports = Arc::new(Reports::default());
            let p: BaseProducer<Ctx> = config(&self.settings.properties)
                .create_with_context(Ctx(Arc::clone(&reports)))
                .map_err(|e| KafkaFailure::from_kafka("cannot create the Kafka producer", &e))?;
            self.producer = Some((p, reports));
        }
        self.producer
            .as_ref()
            .ok_or_else(|| KafkaFailure::transient("no producer"))
    }

    /// The producer, its transactions initialised (transactional), and the batch's transaction
    /// begun when `begin` (transactional).
    fn ready(&mut self, begin: bool) -> Result<&(BaseProducer<Ctx>, Arc<Reports>), KafkaFailure> {
        let transactional = self.settings.transactional;
        // Within the worker's wait for a position read (30 s).
        let timeout = REQUEST_TIMEOUT + Duration::from_secs(10);
        if transactional && !self.initialized {
            let (p, _) = self.producer()?;
            if let Err(e) = p.init_transactions(timeout) {
                let f = self.txn_failure("cannot initialise the Kafka transactions", &e);
                self.producer = None;
                return Err(f);
            }
            self.initialized = true;
        }
        if transactional && begin && self.txn_since.is_none() {
            let (p, _) = self.producer()?;
            if let Err(e) = p.begin_transaction() {
                let f = self.txn_failure("cannot begin a Kafka transaction", &e);
                return Err(f);
            }
            self.txn_since = Some(Instant::now());
        }
        self.producer()
    }

    /// A failure of a transactional call: fenced when the producer's fatal error says a newer
    /// producer of the transactional id took over (and the transaction did not merely outlive
    /// `transaction.timeout.ms`, which the broker reports the same way to some clients).
    fn txn_failure(&self, context: &str, e: &KafkaError) -> KafkaFailure {
        let mut f = KafkaFailure::from_kafka(context, e);
        let fatal = self
            .producer
            .as_ref()
            .and_then(|(p, _)| p.client().fatal_error());
        let code = fatal.as_ref().map(|(c, _)| *c).or(e.rdkafka_error_code());
        if let Some((_, why)) = &fatal {
            if !f.message.contains(why.as_str()) {
                f.message.push_str(&format!(" (fatal: {why})"));
            }
        }
        if matches!(
            code,
            Some(RDKafkaErrorCode::Fenced | RDKafkaErrorCode::ProducerFenced)
        ) {
            let open_for = self.txn_since.map(|t| t.elapsed()).unwrap_or_default();
            if open_for + Duration::from_secs(1) >= self.settings.transaction_timeout {
                f.message = format!(
                    "the Kafka transaction of this batch stayed open {} s, longer than transaction.timeout.ms = {} ms, and the broker aborted it: {}",
                    open_for.as_secs(),
                    self.settings.transaction_timeout.as_millis(),
                    f.message
                );
                f.transient = false;
            } else {
                f.fenced = true;
                f.transient = false;
            }
        }
        f
    }

    fn last_error(&self) -> Option<String> {
        self.producer.as_ref().and_then(|(_, r)| {
            r.last_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        })
    }

    /// Create `topic` unless it is known to exist (compacted for the position topic).
    fn ensure_topic(&mut self, topic: &str, compacted: bool) -> Result<(), KafkaFailure> {
        if self.topics.contains(topic) {
            return Ok(());
        }
        if self.admin.is_none() {
            let mut props = self.settings.properties.clone();
            props.retain(|(k, _)| !PRODUCER_ONLY.contains(&k.as_str()));
            let a: AdminClient<DefaultClientContext> = config(&props).create().map_err(|e| {
                KafkaFailure::from_kafka("cannot create the Kafka admin client", &e)
            })?;
            self.admin = Some(a);
        }
        let Some(admin) = self.admin.as_ref() else {
            return Err(KafkaFailure::transient("no admin client"));
        };
        let single = compacted || self.settings.transaction_topic.as_deref() == Some(topic);
        let partitions = if single { 1 } else { self.settings.partitions };
        let mut t = NewTopic::new(
            topic,
            partitions,
            TopicReplication::Fixed(self.settings.replication_factor),
        );
        if compacted {
            t = t.set("cleanup.policy", "compact");
        }
        let opts = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
        let results = futures_executor::block_on(admin.create_topics([&t], &opts))
            .map_err(|e| KafkaFailure::from_kafka(&format!("cannot create topic {topic}"), &e))?;
        for r in results {
            if let Err((name, code)) = r {
                if code != RDKafkaErrorCode::TopicAlreadyExists {
                    return Err(KafkaFailure::from_kafka(
                        &format!("cannot create topic {name}"),
                        &KafkaError::AdminOp(code),
                    ));
                }
            }
        }
        self.topics.insert(topic.to_string());
        Ok(())
    }

    fn partition_count(&mut self, topic: &str) -> Result<i32, KafkaFailure> {
        if let Some(n) = self.partitions.get(topic) {
            return Ok(*n);
        }
        let (p, _) = self.producer()?;
        // A topic created a moment ago may not show its partitions yet.
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let n = loop {
            let md = p
                .client()
                .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
                .map_err(|e| {
                    KafkaFailure::from_kafka(
                        &format!("cannot read the metadata of topic {topic}"),
                        &e,
                    )
                })?;
            let n = md
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .map_or(0, |t| t.partitions().len() as i32);
            if n > 0 {
                break n;
            }
            if Instant::now() >= deadline {
                return Err(KafkaFailure::transient(format!(
                    "topic {topic} has no partitions yet"
                )));
            }
            thread::sleep(Duration::from_millis(100));
        };
        self.partitions.insert(topic.to_string(), n);
        Ok(n)
    }

    /// Hand one record to the producer, waiting while its queue is full.
    fn send_one(
        &mut self,
        m: &Msg,
        partition: Option<i32>,
        shared: &Shared,
        seq: u64,
    ) -> Result<(), KafkaFailure> {
        let (topic, key, value, headers) = (
            m.topic.as_str(),
            m.key.as_deref(),
            m.value.as_deref(),
            &m.headers,
        );
        let deadline = Instant::now() + self.settings.delivery_timeout;
        let (p, _) = self.ready(true)?;
        loop {
            let mut h = OwnedHeaders::new_with_capacity(headers.len());
            for (k, v) in headers {
                h = h.insert(Header {
                    key: k,
                    value: Some(v.as_bytes()),
                });
            }
            let mut r: BaseRecord<'_, str, str, ()> = BaseRecord::to(topic).headers(h);
            if let Some(k) = key {
                r = r.key(k);
            }
            if let Some(v) = value {
                r = r.payload(v);
            }
            if let Some(n) = partition {
                r = r.partition(n);
            }
            match p.send(r) {
                Ok(()) => {
                    self.sent += 1;
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    p.poll(Duration::from_millis(50));
                    if Instant::now() >= deadline || shared.abandoned.load(Ordering::SeqCst) >= seq
                    {
                        return Err(KafkaFailure::transient(
                            "the producer's queue stayed full: the broker does not take messages",
                        ));
                    }
                }
                Err((e, _)) => {
                    let context = format!("cannot produce to topic {topic}");
                    return Err(if self.settings.transactional {
                        self.txn_failure(&context, &e)
                    } else {
                        KafkaFailure::from_kafka(&context, &e)
                    });
                }
            }
        }
    }

    fn produce(&mut self, msgs: Vec<Msg>, shared: &Shared, seq: u64) {
        if self.failure.is_some() {
            return;
        }
        for m in msgs {
            let r = (|| {
                self.ensure_topic(&m.topic, false)?;
                if m.broadcast {
                    let n = self.partition_count(&m.topic)?;
                    for part in 0..n {
                        self.send_one(&m, Some(part), shared, seq)?;
                    }
                    Ok(())
                } else {
                    self.send_one(&m, None, shared, seq)
                }
            })();
            if let Err(e) = r {
                self.failure = Some(e);
                return;
            }
        }
    }

    /// Wait until every message handed over is acknowledged (or failed).
    fn drain(&mut self, shared: &Shared, seq: u64) -> Result<(), KafkaFailure> {
        let deadline = Instant::now() + self.settings.delivery_timeout + Duration::from_secs(5);
        let sent = self.sent;
        let Some((p, reports)) = self.producer.as_ref() else {
            return if sent == 0 {
                Ok(())
            } else {
                Err(KafkaFailure::transient("the producer is gone"))
            };
        };
        loop {
            let done = reports.acked.load(Ordering::SeqCst) + reports.failed.load(Ordering::SeqCst);
            if done >= sent {
                break;
            }
            if shared.abandoned.load(Ordering::SeqCst) >= seq {
                return Err(KafkaFailure::transient("abandoned"));
            }
            if Instant::now() >= deadline {
                return Err(KafkaFailure::transient(format!(
                    "the broker did not acknowledge {} of {sent} messages in time (message.timeout.ms = {})",
                    sent - done,
                    self.settings.delivery_timeout.as_millis()
                )));
            }
            p.poll(Duration::from_millis(20));
        }
        if reports.failed.load(Ordering::SeqCst) > 0 {
            let e = reports
                .first_failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            let mut f = match e {
                Some(e) => KafkaFailure::from_kafka("the broker did not take a message", &e),
                None => KafkaFailure::transient("the broker did not take a message"),
            };
            if let Some(last) = self.last_error() {
                f.message.push_str(&format!(" (last client error: {last})"));
            }
            return Err(f);
        }
        Ok(())
    }

    fn commit(
        &mut self,
        position: Option<Lsn>,
        shared: &Shared,
        seq: u64,
    ) -> Result<Option<Lsn>, KafkaFailure> {
        if let Some(f) = self.failure.take() {
            return Err(f);
        }
        if !self.settings.transactional {
            self.drain(shared, seq)?;
        }
        if let Some(lsn) = position {
            let topic = self.settings.position_topic.clone();
            self.ensure_topic(&topic, true)?;
            let value = tide_core::kafka::position_record(&self.settings.pipeline, lsn);
            let key = self.settings.pipeline.clone();
            let record = Msg {
                topic,
                key: Some(key),
                value: Some(value),
                headers: Vec::new(),
                broadcast: false,
            };
            self.send_one(&record, Some(0), shared, seq)?;
            if !self.settings.transactional {
                self.drain(shared, seq)?;
            }
        }
        if self.settings.transactional && self.txn_since.is_some() {
            self.commit_transaction(shared, seq)?;
        }
        Ok(position)
    }

    /// Commit the open transaction: librdkafka flushes its messages (the position record last),
    /// then the coordinator writes the commit markers.
    fn commit_transaction(&mut self, shared: &Shared, seq: u64) -> Result<(), KafkaFailure> {
        let timeout = self.settings.delivery_timeout + Duration::from_secs(5);
        let r = match self.producer.as_ref() {
            Some((p, _)) => p.commit_transaction(timeout),
            None => return Err(KafkaFailure::transient("the producer is gone")),
        };
        match r {
            Ok(()) => {
                self.txn_since = None;
                Ok(())
            }
            Err(e) => {
                let mut f = self.txn_failure("cannot commit the Kafka transaction", &e);
                // The broker's reason for a message it refused (size, authorization) first.
                let refused = self.producer.as_ref().and_then(|(_, r)| {
                    r.first_failure
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clone()
                });
                if let Some(m) = refused.filter(|_| !f.fenced) {
                    let why = KafkaFailure::from_kafka("the broker did not take a message", &m);
                    f.message = format!("{} ({})", why.message, f.message);
                    f.transient = why.transient;
                }
                if let Some(last) = self.last_error().filter(|_| !f.fenced) {
                    f.message.push_str(&format!(" (last client error: {last})"));
                }
                if shared.abandoned.load(Ordering::SeqCst) >= seq {
                    f.transient = true;
                }
                Err(f)
            }
        }
    }

    /// Forget the open batch: its transaction is aborted (at most [`ABORT_TIMEOUT`]; else the
    /// next producer's `init_transactions` aborts it), whatever librdkafka still holds is purged
    /// with the producer.
    fn discard(&mut self) {
        self.abort_open();
        self.producer = None;
        self.initialized = false;
        self.txn_since = None;
        self.sent = 0;
        self.failure = None;
        self.partitions.clear();
    }

    /// Abort the open transaction, if any and if the producer can (best effort).
    fn abort_open(&mut self) {
        if self.txn_since.take().is_none() {
            return;
        }
        if let Some((p, _)) = self.producer.as_ref() {
            if p.client().fatal_error().is_none() {
                let _ = p.abort_transaction(ABORT_TIMEOUT);
            }
        }
    }

    fn check(&mut self) -> Result<Option<Lsn>, KafkaFailure> {
        let (p, _) = self.producer()?;
        p.client()
            .fetch_metadata(None, REQUEST_TIMEOUT)
            .map_err(|e| KafkaFailure::from_kafka("cannot read the cluster's metadata", &e))?;
        Ok(None)
    }
}

/// Properties only a producer accepts (left out of the position consumer's and the admin
/// client's configuration).
const PRODUCER_ONLY: &[&str] = &[
    "transactional.id",
    "transaction.timeout.ms",
    "enable.idempotence",
    "acks",
    "max.in.flight.requests.per.connection",
    "enable.gapless.guarantee",
    "partitioner",
    "message.timeout.ms",
    "linger.ms",
    "queue.buffering.max.ms",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "batch.num.messages",
    "batch.size",
    "compression.type",
    "compression.codec",
    "compression.level",
    "message.send.max.retries",
    "retries",
    "retry.backoff.ms",
    "request.timeout.ms",
    "sticky.partitioning.linger.ms",
];

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

fn sink_thread(
    settings: ClientSettings,
    requests: Receiver<Request>,
    replies: Sender<Reply>,
    shared: Arc<Shared>,
) {
    block_signals();
    let mut st = State {
        settings,
        producer: None,
        admin: None,
        sent: 0,
        failure: None,
        topics: HashSet::new(),
        partitions: HashMap::new(),
        initialized: false,
        txn_since: None,
    };
    while let Ok(Request { seq, work }) = requests.recv() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let result = catch_unwind(AssertUnwindSafe(|| match work {
            Work::Produce(msgs) => {
                st.produce(msgs, &shared, seq);
                Ok(None)
            }
            Work::Commit(position) => {
                let r = st.commit(position, &shared, seq);
                if r.is_err() {
                    st.discard();
                } else {
                    st.sent = 0;
                    if let Some((_, reports)) = st.producer.as_ref() {
                        reports.acked.store(0, Ordering::SeqCst);
                        reports.failed.store(0, Ordering::SeqCst);
                    }
                }
                r
            }
            Work::ReadPosition => st.read_position(),
            Work::Check => st.check(),
            Work::Discard => {
                st.discard();
                Ok(None)
            }
        }))
        .unwrap_or_else(|p| {
            st.failure = None;
            st.producer = None;
            st.initialized = false;
            st.txn_since = None;
            st.sent = 0;
            Err(KafkaFailure {
                message: format!(
                    "internal error in the Kafka client: {}",
                    panic_text(p.as_ref())
                ),
                transient: false,
                config: false,
                fenced: false,
                hint: None,
            })
        });
        let _ = replies.send(Reply { seq, result });
    }
    // A stopping worker (shutdown, drop_pipeline) leaves no transaction open: read_committed
    // consumers would wait for it until transaction.timeout.ms.
    let _ = catch_unwind(AssertUnwindSafe(move || {
        st.abort_open();
        drop(st)
    }));
}

/// The main thread's handle on one Kafka sink thread.
pub struct KafkaSink {
    settings: ClientSettings,
    requests: Option<Sender<Request>>,
    replies: Option<Receiver<Reply>>,
    handle: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    seq: u64,
    /// The last [`Work::Produce`] request whose reply (the messages are in the producer's
    /// queue) was not waited for yet.
    handed: Option<u64>,
}

impl KafkaSink {
    /// Start the sink thread; it connects lazily, on the first request.
    pub fn start(settings: ClientSettings) -> KafkaSink {
        let mut s = KafkaSink {
            settings,
            requests: None,
            replies: None,
            handle: None,
            shared: Arc::new(Shared::default()),
            seq: 0,
            handed: None,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let (rq_tx, rq_rx) = mpsc::channel();
        let (rp_tx, rp_rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let thread_shared = Arc::clone(&shared);
        let settings = self.settings.clone();
        let handle = thread::Builder::new()
            .name("tide-kafka".into())
            .spawn(move || sink_thread(settings, rq_rx, rp_tx, thread_shared))
            .ok();
        self.requests = handle.as_ref().map(|_| rq_tx);
        self.replies = handle.as_ref().map(|_| rp_rx);
        self.handle = handle;
        self.shared = shared;
    }

    fn alive(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }

    fn submit(&mut self, work: Work) -> Result<u64, KafkaFailure> {
        if !self.alive() {
            self.stop();
            self.spawn();
        }
        self.seq += 1;
        let seq = self.seq;
        match self.requests.as_ref() {
            Some(tx) if tx.send(Request { seq, work }).is_ok() => Ok(seq),
            _ => Err(KafkaFailure::transient(
                "the Kafka sink thread is not running",
            )),
        }
    }

    /// Hand messages to the sink thread. It does not wait for them, but for the messages handed
    /// before (at most `timeout`): they must be in the producer's queue (bounded by
    /// `queue.buffering.max.kbytes`) first, so at most one batch waits in the channel and the
    /// worker's memory stays bounded when the broker is slower than the decoding.
    pub fn produce(&mut self, msgs: Vec<Msg>, timeout: Duration) -> Result<(), KafkaFailure> {
        if msgs.is_empty() {
            return Ok(());
        }
        if let Some(prev) = self.handed.take() {
            self.wait_for(prev, timeout, false)?;
        }
        let seq = self.submit(Work::Produce(msgs))?;
        self.handed = Some(seq);
        Ok(())
    }

    /// Ask the sink thread and wait for its answer, at most `timeout`. `graceful`: a
    /// termination request waits up to [`COMMIT_GRACE`] for the answer first.
    pub fn call(
        &mut self,
        work: Work,
        timeout: Duration,
        graceful: bool,
    ) -> Result<Option<Lsn>, KafkaFailure> {
        let seq = self.submit(work)?;
        // Replies come in request order: every earlier produce's is skipped by this wait.
        self.handed = None;
        self.wait_for(seq, timeout, graceful)
    }

    /// Wait for the reply to request `seq` (see [`crate::target::wait::reply`]).
    fn wait_for(
        &mut self,
        seq: u64,
        timeout: Duration,
        graceful: bool,
    ) -> Result<Option<Lsn>, KafkaFailure> {
        let Some(rx) = self.replies.as_ref() else {
            return Err(KafkaFailure::transient(
                "the Kafka sink thread is not running",
            ));
        };
        let shared = Arc::clone(&self.shared);
        let waited = crate::target::wait::reply(
            rx,
            timeout,
            graceful.then_some(COMMIT_GRACE),
            |r: Reply| (r.seq == seq).then_some(r.result),
            &mut || {
                shared.abandoned.fetch_max(seq, Ordering::SeqCst);
            },
        );
        match waited {
            Waited::Reply(r) => r,
            Waited::Gone => Err(KafkaFailure::transient(
                "the Kafka sink thread stopped unexpectedly",
            )),
            Waited::TimedOut => {
                self.abandon(seq);
                Err(KafkaFailure::transient(format!(
                    "the Kafka broker did not answer within {} s",
                    timeout.as_secs()
                )))
            }
        }
    }

    fn abandon(&self, seq: u64) {
        self.shared.abandoned.fetch_max(seq, Ordering::SeqCst);
    }

    /// Stop the sink thread (waiting up to 2 s; a thread blocked in the network is left to
    /// exit by itself).
    fn stop(&mut self) {
        self.handed = None;
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.abandoned.store(u64::MAX, Ordering::SeqCst);
        self.requests = None;
        self.replies = None;
        if let Some(h) = self.handle.take() {
            let deadline = Instant::now() + Duration::from_secs(2);
            while !h.is_finished() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(5));
            }
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        self.stop();
    }
}
