//! A Kafka Connect standalone worker (4.4.0) with Debezium's connectors, run by
//! `scripts/debezium.sh` from the jars it fetched (`scripts/setup.sh` with `TIDE_SETUP_KAFKA=1`
//! does it): stopped when dropped (also when the test fails). Without the jars a test that needs
//! them fails, naming the command that fetches them; it is never skipped.

use pg_test::*;
use std::path::PathBuf;
use std::process::Command;

fn script() -> PathBuf {
    repo_root().join("scripts").join("debezium.sh")
}

/// The fetched cache (`scripts/debezium.sh dir`), or a failure that says how to fetch it.
pub fn debezium_home() -> PathBuf {
    let out = Command::new("bash")
        .arg(script())
        .arg("dir")
        .output()
        .expect("run scripts/debezium.sh dir");
    assert!(
        out.status.success(),
        "Kafka Connect and Debezium are not fetched: run `bash scripts/debezium.sh fetch` \
         (scripts/setup.sh does it with TIDE_SETUP_KAFKA=1, as scripts/test.sh runs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

pub struct Connect {
    pub dir: PathBuf,
}

impl Connect {
    /// A worker on `brokers` (JsonConverter with schemas for keys and values, file offsets in
    /// its directory) running the connectors given as (name, properties).
    pub fn start(tag: &str, brokers: &str, connectors: &[(&str, String)]) -> Connect {
        let _ = debezium_home();
        let dir = std::env::temp_dir().join(format!("tide_connect_{tag}_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("connect dir");
        let worker = dir.join("worker.in.properties");
        std::fs::write(
            &worker,
            format!(
                "bootstrap.servers={brokers}
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=true
value.converter.schemas.enable=true
offset.storage.file.filename={}
offset.flush.interval.ms=1000
listeners=http://127.0.0.1:0
",
                dir.join("offsets").display()
            ),
        )
        .expect("worker properties");
        let mut args = vec![
            "start".to_string(),
            dir.display().to_string(),
            worker.display().to_string(),
        ];
        for (name, props) in connectors {
            let p = dir.join(format!("{name}.properties"));
            std::fs::write(&p, format!("name={name}\n{props}")).expect("connector properties");
            args.push(p.display().to_string());
        }
        let st = Command::new("bash")
            .arg(script())
            .args(&args)
            .status()
            .expect("run scripts/debezium.sh start");
        assert!(st.success(), "scripts/debezium.sh start failed");
        Connect { dir }
    }

    /// The worker's log: its errors and warnings (stack frames left out), the last 60.
    pub fn log(&self) -> String {
        let s = std::fs::read_to_string(self.dir.join("connect.log")).unwrap_or_default();
        let lines: Vec<&str> = s
            .lines()
            .filter(|l| !l.trim_start().starts_with("at ") && !l.trim_start().starts_with("..."))
            .collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// Whether the worker's JVM still runs and no task of it has died (Connect keeps running
    /// with a task killed by an "unrecoverable exception").
    pub fn alive(&self) -> bool {
        let log = std::fs::read_to_string(self.dir.join("connect.log")).unwrap_or_default();
        !log.contains("Task is being killed")
            && std::fs::read_to_string(self.dir.join("connect.pid"))
                .ok()
                .and_then(|p| p.trim().parse::<u32>().ok())
                .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
    }
}

impl Drop for Connect {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
        if std::thread::panicking() {
            eprintln!(
                "kafka connect's log kept in {}:\n{}",
                self.dir.display(),
                self.log()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
