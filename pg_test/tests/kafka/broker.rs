//! A tansu broker on 127.0.0.1 (a free port, sqlite storage in a temporary directory), stopped
//! when dropped (also when the test fails), and a consumer that reads whole topics.

use pg_test::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The tansu binary: `TIDE_TANSU`, else where `scripts/setup.sh` installs it.
pub fn tansu_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TIDE_TANSU") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let cached = PathBuf::from(home).join(".cache/pg_tide/tansu-0.6.0/bin/tansu");
    assert!(
        cached.exists(),
        "tansu is not installed at {} (TIDE_SETUP_TANSU=1 scripts/setup.sh installs it, as scripts/test.sh does; or set TIDE_TANSU)",
        cached.display()
    );
    cached
}

pub struct Broker {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

impl Broker {
    pub fn start(tag: &str) -> Broker {
        let dir = std::env::temp_dir().join(format!("tide_kafka_{tag}_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("broker dir");
        let mut b = Broker {
            port: free_port(),
            dir,
            child: None,
        };
        b.resume();
        b
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Start (again) on the same port and storage.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "the broker runs already");
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("broker.log"))
            .expect("broker log");
        let child = Command::new(tansu_bin())
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            // A path after sqlite:// is relative (tansu strips the leading slash): run in the
            // broker's directory.
            .args(["--storage-engine", "sqlite://tansu.db"])
            .current_dir(&self.dir)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start tansu: {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(self.addr()).is_err() {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("tansu exited ({st}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "tansu did not listen on {} within 30 s:\n{}",
                self.addr(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kill the broker (its storage stays).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("broker.log"))
            .map(|s| {
                s.lines()
                    .rev()
                    .take(40)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("kafka broker log kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
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

/// Every message of `topics` from their first offset to their end now, per partition in order.
pub fn consume(brokers: &str, topics: &[&str]) -> Vec<Rec> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "pg_test_reader")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    let mut ends: HashMap<(String, i32), i64> = HashMap::new();
    for t in topics {
        let md = consumer
            .fetch_metadata(Some(t), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("metadata of {t}: {e}"));
        let Some(mt) = md.topics().iter().find(|x| x.name() == *t) else {
            continue;
        };
        for p in mt.partitions() {
            let (lo, hi) = consumer
                .fetch_watermarks(t, p.id(), Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("watermarks of {t}/{}: {e}", p.id()));
            if hi > lo {
                ends.insert((t.to_string(), p.id()), hi);
                tpl.add_partition_offset(t, p.id(), Offset::Offset(lo))
                    .expect("add partition");
            }
        }
    }
    let mut out = Vec::new();
    if ends.is_empty() {
        return out;
    }
    consumer.assign(&tpl).expect("assign");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut left = ends.len();
    let mut last: HashMap<(String, i32), i64> = HashMap::new();
    while left > 0 {
        assert!(
            Instant::now() < deadline,
            "reading {topics:?} took over 120 s: (topic, partition) -> end offset {ends:?}, last offset read {last:?}"
        );
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(e)) => panic!("consume {topics:?}: {e}"),
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
                let k = (m.topic().to_string(), m.partition());
                last.insert(k.clone(), m.offset());
                let end = ends.get(&k).copied().unwrap_or(0);
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
                if m.offset() == end - 1 {
                    left -= 1;
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
