//! Apache Kafka (KRaft, one node, `scripts/kafka.sh`) on 127.0.0.1 for the kafka suite, and a
//! consumer that reads whole topics.
//!
//! Two kinds of [`Broker`]: [`Broker::start`] hands out the suite's shared broker (one JVM for
//! every test that never stops its broker; each test gets it with no topic left by an earlier
//! one, and tests take it one at a time), [`Broker::own`] starts a broker of the test's own (a
//! free port, a temporary directory) that the test may stop, kill and start again. Every JVM is
//! started from one long-lived thread with `PR_SET_PDEATHSIG`, so it dies with the test process
//! whatever happens to it; an own broker is also stopped when its `Broker` is dropped (also when
//! the test fails).

use pg_test::*;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Headers;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::collections::{HashMap, HashSet};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

fn kafka_script() -> PathBuf {
    repo_root().join("scripts").join("kafka.sh")
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// Spawns every broker JVM from one thread that lives as long as the test process: a child's
/// `PR_SET_PDEATHSIG` fires when the thread that spawned it ends, and a test's thread ends with
/// the test.
fn spawn_kept(mut cmd: Command) -> std::io::Result<Child> {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static KEEPER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("kafka-keeper".into())
            .spawn(move || {
                while let Ok((mut cmd, reply)) = rx.recv() {
                    let _ = reply.send(cmd.spawn());
                }
                // The senders live in a static: this thread never gets here before exit.
                loop {
                    std::thread::park();
                }
            })
            .expect("the broker keeper thread");
        Mutex::new(tx)
    });
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    keeper
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send((cmd, tx))
        .expect("the broker keeper thread runs");
    rx.recv().expect("the broker keeper thread answers")
}

/// One broker JVM: its directory (storage, config, `broker.log`) and ports.
struct Jvm {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// Remove the broker directories of test processes that are gone (the shared broker's outlives
/// its process: a static is never dropped).
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix("tide_kafka_") else {
            continue;
        };
        let Some(pid) = rest.rsplit('_').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl Jvm {
    fn new(tag: &str) -> Jvm {
        remove_stale_dirs();
        let dir = std::env::temp_dir().join(format!("tide_kafka_{tag}_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("broker dir");
        let mut j = Jvm {
            port: free_port(),
            dir,
            child: None,
        };
        j.start();
        j
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Start (again: same ports, same storage) and wait until it takes connections.
    fn start(&mut self) {
        assert!(self.child.is_none(), "the broker runs already");
        let mut cmd = Command::new("bash");
        cmd.arg(kafka_script()).arg("run").arg(&self.dir);
        if !self.dir.join("server.properties").exists() {
            cmd.arg(self.port.to_string()).arg(free_port().to_string());
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child =
            spawn_kept(cmd).unwrap_or_else(|e| panic!("cannot start scripts/kafka.sh: {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(120);
        while TcpStream::connect(self.addr()).is_err() {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = c.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    self.child = None;
                    panic!("the Kafka broker exited ({st}): {err}\n{}", self.log());
                }
            }
            assert!(
                Instant::now() < deadline,
                "the Kafka broker did not listen on {} within 120 s:\n{}",
                self.addr(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM (a clean shutdown) or SIGKILL, and wait for the JVM to exit.
    fn stop(&mut self, signal: i32) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(c.id() as i32, signal);
            }
            let deadline = Instant::now() + Duration::from_secs(60);
            while c.try_wait().ok().flatten().is_none() {
                if Instant::now() >= deadline {
                    let _ = c.kill();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("broker.log"))
            .map(|s| {
                let lines: Vec<&str> = s.lines().collect();
                lines[lines.len().saturating_sub(40)..].join("\n")
            })
            .unwrap_or_default()
    }
}

impl Drop for Jvm {
    fn drop(&mut self) {
        self.stop(libc::SIGKILL);
        if std::thread::panicking() {
            eprintln!("kafka broker log kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The suite's shared broker (none until a test asks for it).
fn shared() -> &'static Mutex<Option<Jvm>> {
    static SHARED: OnceLock<Mutex<Option<Jvm>>> = OnceLock::new();
    SHARED.get_or_init(|| Mutex::new(None))
}

/// A broker for one test: the shared one (held for the test) or one of its own.
pub struct Broker {
    pub port: u16,
    own: Option<Jvm>,
    shared: Option<MutexGuard<'static, Option<Jvm>>>,
}

impl Broker {
    /// The suite's shared broker, started on first use, with no topic of an earlier test
    /// (deleted here, and gone from the metadata before this returns). Held until dropped: tests
    /// that share it run one at a time whatever `--test-threads` says.
    pub fn start(_tag: &str) -> Broker {
        let mut g = shared().lock().unwrap_or_else(PoisonError::into_inner);
        if !g.as_mut().is_some_and(Jvm::alive) {
            *g = Some(Jvm::new("shared"));
        }
        let port = g.as_ref().map(|j| j.port).expect("the shared broker");
        let b = Broker {
            port,
            own: None,
            shared: Some(g),
        };
        delete_topics(&b.addr());
        b
    }

    /// A broker of the test's own, which it may stop and start again.
    pub fn own(tag: &str) -> Broker {
        let j = Jvm::new(tag);
        Broker {
            port: j.port,
            own: Some(j),
            shared: None,
        }
    }

    fn jvm(&mut self) -> &mut Jvm {
        assert!(
            self.shared.is_none(),
            "the shared broker is never stopped: use Broker::own"
        );
        self.own.as_mut().expect("an own broker")
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Start again on the same port and storage.
    pub fn resume(&mut self) {
        self.jvm().start();
    }

    /// A clean shutdown (SIGTERM; the storage stays).
    pub fn stop(&mut self) {
        self.jvm().stop(libc::SIGTERM);
    }

    /// kill -9 (the storage stays; the next start recovers its logs).
    pub fn kill(&mut self) {
        self.jvm().stop(libc::SIGKILL);
    }

    /// The last lines of the broker's log.
    pub fn log(&self) -> String {
        match (&self.own, &self.shared) {
            (Some(j), _) => j.log(),
            (None, Some(g)) => g.as_ref().map(Jvm::log).unwrap_or_default(),
            _ => String::new(),
        }
    }
}

/// Delete every topic but Kafka's own, and wait until the metadata lists none of them.
fn delete_topics(brokers: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let md = admin
            .inner()
            .fetch_metadata(None, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("metadata of the shared broker: {e}"));
        let names: Vec<String> = md
            .topics()
            .iter()
            .map(|t| t.name().to_string())
            .filter(|n| !n.starts_with("__"))
            .collect();
        if names.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "topics {names:?} still there 60 s after their deletion"
        );
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let _ = futures_executor::block_on(admin.delete_topics(&refs, &opts));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One message read back.
#[derive(Debug, Clone)]
pub struct Rec {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub value: Option<serde_json::Value>,
    pub headers: HashMap<String, String>,
}

impl Rec {
    /// The event identity (commit LSN as a number, position) of a data message.
    pub fn identity(&self) -> Option<(u64, i64)> {
        let v = self.value.as_ref()?;
        Some((
            v["source"]["lsn"].as_u64()?,
            v["source"]["position"].as_i64()?,
        ))
    }
    pub fn op(&self) -> Option<&str> {
        self.value.as_ref()?.get("op")?.as_str()
    }
}

/// Every message of `topics` from their first offset to their end now, per partition in order,
/// as a `read_committed` consumer sees them (what a transaction aborted or still open holds is
/// left out).
pub fn consume(brokers: &str, topics: &[&str]) -> Vec<Rec> {
    consume_as(brokers, topics, "read_committed")
}

/// [`consume`] with the consumer's `isolation.level` (`read_committed`, `read_uncommitted`).
/// A partition is read until the consumer reaches its end (EOF: the high watermark, or for
/// `read_committed` the last stable offset, which an open transaction holds back); offsets may
/// have gaps (each commit or abort marker of a transaction takes one).
pub fn consume_as(brokers: &str, topics: &[&str], isolation: &str) -> Vec<Rec> {
    let mut out = Vec::new();
    for t in topics {
        out.extend(consume_topic(brokers, t, isolation));
    }
    out
}

/// One topic's messages (one consumer per topic: an EOF names its partition, not its topic).
fn consume_topic(brokers: &str, topic: &str, isolation: &str) -> Vec<Rec> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "pg_test_reader")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    let mut ends: HashMap<i32, i64> = HashMap::new();
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("metadata of {topic}: {e}"));
    let Some(mt) = md.topics().iter().find(|x| x.name() == topic) else {
        return Vec::new();
    };
    for p in mt.partitions() {
        let (lo, hi) = consumer
            .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("watermarks of {topic}/{}: {e}", p.id()));
        if hi > lo {
            ends.insert(p.id(), hi);
            tpl.add_partition_offset(topic, p.id(), Offset::Offset(lo))
                .expect("add partition");
        }
    }
    let mut out = Vec::new();
    if ends.is_empty() {
        return out;
    }
    consumer.assign(&tpl).expect("assign");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut done: HashSet<i32> = HashSet::new();
    let mut last: HashMap<i32, i64> = HashMap::new();
    while done.len() < ends.len() {
        assert!(
            Instant::now() < deadline,
            "reading {topic} took over 120 s: partition -> end offset {ends:?}, last offset read {last:?}"
        );
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                done.insert(p);
            }
            Some(Err(e)) => panic!("consume {topic}: {e}"),
            Some(Ok(m)) => {
                let mut headers = HashMap::new();
                if let Some(h) = m.headers() {
                    for x in h.iter() {
                        headers.insert(
                            x.key.to_string(),
                            x.value
                                .map(|v| String::from_utf8_lossy(v).to_string())
                                .unwrap_or_default(),
                        );
                    }
                }
                last.insert(m.partition(), m.offset());
                let end = ends.get(&m.partition()).copied().unwrap_or(0);
                if m.offset() < end {
                    out.push(Rec {
                        topic: m.topic().to_string(),
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key().map(|k| String::from_utf8_lossy(k).to_string()),
                        value: m.payload().map(|p| {
                            serde_json::from_slice(p).unwrap_or_else(|e| {
                                panic!("a message of {} is not JSON: {e}", m.topic())
                            })
                        }),
                        headers,
                    });
                }
                if m.offset() >= end - 1 {
                    done.insert(m.partition());
                }
            }
        }
    }
    out
}

/// On `c`: the wrapper's server `name` pointing at the broker, with a user mapping for
/// `owner` and USAGE for it.
pub fn create_kafka_server(c: &Cluster, name: &str, b: &Broker, owner: &str) {
    c.execute(&format!(
        "CREATE SERVER {name} FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers '{}');
         CREATE USER MAPPING FOR {owner} SERVER {name} OPTIONS (sasl_username '{owner}', sasl_password 's3cret-{owner}');
         GRANT USAGE ON FOREIGN SERVER {name} TO {owner};",
        b.addr()
    ));
}
