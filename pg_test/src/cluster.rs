//! Scratch clusters: `scripts/cluster.sh` driven by [`ClusterBuilder`], the [`Cluster`] handle
//! (connections, statements and queries that panic with the server log's tail, stop and start,
//! removal on drop), and commands run as the `postgres` OS user.

use crate::wait::poll_until;
use crate::{describe_error, Pgbench, TestResult};
use postgres::{Client, NoTls, Row};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// PostgreSQL 15 binaries (override with `TIDE_PG_BIN`).
pub fn pg_bin() -> PathBuf {
    std::env::var_os("TIDE_PG_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

/// The repository root (`pg_test/..`).
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .expect("pg_test lives inside the repository")
        .to_path_buf()
}

fn cluster_script() -> PathBuf {
    repo_root().join("scripts").join("cluster.sh")
}

/// Run `scripts/cluster.sh` with `args`; `pg_bin` (a PostgreSQL installation's bin directory)
/// overrides the caller's `TIDE_PG_BIN` for this call.
fn run_cluster_script(pg_bin: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(cluster_script()).args(args).stdin(Stdio::null());
    if let Some(bin) = pg_bin {
        cmd.env("TIDE_PG_BIN", bin);
    }
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("could not run scripts/cluster.sh {args:?}: {e}"));
    output
}

fn cluster_script_ok(pg_bin: Option<&Path>, args: &[&str]) -> String {
    let out = run_cluster_script(pg_bin, args);
    if !out.status.success() {
        panic!(
            "scripts/cluster.sh {} failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Whether the current process is running as the given OS user.
fn current_user_is(user: &str) -> bool {
    let out = Command::new("id").arg("-un").output();
    matches!(out, Ok(o) if String::from_utf8_lossy(&o.stdout).trim() == user)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A `Command` that runs `program` as the `postgres` OS user
/// (directly, via `runuser` as root, else via `sudo -n`).
pub fn command_as_postgres(program: impl AsRef<std::ffi::OsStr>) -> Command {
    if current_user_is("postgres") {
        Command::new(program)
    } else if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        let mut c = Command::new("sudo");
        c.args(["-n", "-u", "postgres", "--"]).arg(program);
        c
    }
}

pub(crate) static SEQ: AtomicUsize = AtomicUsize::new(0);

fn unique_name(base: &str) -> String {
    let clean: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(24)
        .collect();
    format!(
        "t_{}_{}_{}",
        clean,
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

/// How to stop a cluster (`pg_ctl -m`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopMode {
    Fast,
    Immediate,
    Smart,
}

impl StopMode {
    fn as_str(self) -> &'static str {
        match self {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
            StopMode::Smart => "smart",
        }
    }
}

/// Options for a scratch cluster; see [`Cluster::builder`].
#[derive(Clone, Debug)]
pub struct ClusterBuilder {
    base_name: String,
    preload: bool,
    wal_level: Option<String>,
    conf: Vec<String>,
    initdb: Vec<String>,
    pg_bin: Option<PathBuf>,
}

impl ClusterBuilder {
    /// Run the cluster from another PostgreSQL installation's bin directory (default: the
    /// caller's `TIDE_PG_BIN`), e.g. a private copy holding another pg_tide version.
    pub fn pg_bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.pg_bin = Some(bin.into());
        self
    }

    /// Leave `shared_preload_libraries` empty (pg_tide is not preloaded).
    pub fn no_preload(mut self) -> Self {
        self.preload = false;
        self
    }

    /// `wal_level` (default `logical`).
    pub fn wal_level(mut self, level: &str) -> Self {
        self.wal_level = Some(level.to_string());
        self
    }

    /// One extra `postgresql.conf` line, e.g. `conf("tide.database='x'")`.
    pub fn conf(mut self, line: &str) -> Self {
        self.conf.push(line.to_string());
        self
    }

    /// One extra `initdb` argument, e.g. `initdb_arg("--no-data-checksums")`.
    pub fn initdb_arg(mut self, arg: &str) -> Self {
        self.initdb.push(arg.to_string());
        self
    }

    /// Initialize the cluster without starting it.
    pub fn init(self) -> Cluster {
        let name = unique_name(&self.base_name);
        let mut args: Vec<String> = vec!["init".into(), name.clone()];
        if !self.preload {
            args.push("--no-preload".into());
        }
        if let Some(level) = &self.wal_level {
            args.push("--wal-level".into());
            args.push(level.clone());
        }
        for c in &self.conf {
            args.push("--conf".into());
            args.push(c.clone());
        }
        for a in &self.initdb {
            args.push("--initdb".into());
            args.push(a.clone());
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let bin = self.pg_bin.as_deref();
        cluster_script_ok(bin, &argv);
        Cluster::made(name, self.pg_bin)
    }

    /// Initialize and start the cluster (waits until it accepts connections).
    pub fn start(self) -> Cluster {
        let c = self.init();
        c.start();
        c
    }
}

/// A scratch PostgreSQL 15 cluster made by `scripts/cluster.sh`.
#[derive(Debug)]
pub struct Cluster {
    name: String,
    port: u16,
    log_path: PathBuf,
    /// The installation the server runs from, when not the caller's `TIDE_PG_BIN`.
    pg_bin: Option<PathBuf>,
}

impl Cluster {
    /// The cluster `name` that `scripts/cluster.sh` just made (its port and log as the script
    /// reports them), run with the binaries of `pg_bin` (None: [`pg_bin`]).
    fn made(name: String, pg_bin: Option<PathBuf>) -> Cluster {
        let bin = pg_bin.as_deref();
        // The script prints the port it recorded: a failure is the harness's, not the test's.
        let port: u16 = cluster_script_ok(bin, &["port", &name])
            .parse()
            .expect("scripts/cluster.sh port printed a number");
        let log_path = PathBuf::from(cluster_script_ok(bin, &["log", &name]));
        Cluster {
            name,
            port,
            log_path,
            pg_bin,
        }
    }

    /// A started cluster with pg_tide preloaded and `wal_level=logical`.
    pub fn new(name: &str) -> Cluster {
        Cluster::builder(name).start()
    }

    pub fn builder(name: &str) -> ClusterBuilder {
        ClusterBuilder {
            base_name: name.to_string(),
            preload: true,
            wal_level: None,
            conf: Vec::new(),
            initdb: Vec::new(),
            pg_bin: None,
        }
    }

    /// The unique cluster name (as understood by `scripts/cluster.sh`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Path of the server log.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The whole server log so far (empty if unreadable).
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last `n` lines of the server log.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// How many times `needle` occurs in the server log.
    pub fn log_count(&self, needle: &str) -> usize {
        self.log().matches(needle).count()
    }

    /// Start (no-op if running); panics with the log tail if it fails.
    pub fn start(&self) {
        cluster_script_ok(self.pg_bin.as_deref(), &["start", &self.name]);
    }

    /// Stop (no-op if stopped).
    pub fn stop(&self, mode: StopMode) {
        cluster_script_ok(self.pg_bin.as_deref(), &["stop", &self.name, mode.as_str()]);
    }

    /// Fast stop, then start.
    pub fn restart(&self) {
        cluster_script_ok(self.pg_bin.as_deref(), &["restart", &self.name]);
    }

    /// A new cluster `name` made by `pg_basebackup` of this running one (its own port and
    /// socket, the same configuration: pg_tide preloaded if this one preloads it), not started.
    /// `standby`: a streaming standby of this one (`-R`), else a standalone copy.
    pub fn basebackup(&self, name: &str, standby: bool) -> Cluster {
        let name = unique_name(name);
        let bin = self.pg_bin.as_deref();
        let mut args = vec!["basebackup", name.as_str(), self.name.as_str()];
        if standby {
            args.push("--standby");
        }
        cluster_script_ok(bin, &args);
        Cluster::made(name, self.pg_bin.clone())
    }

    /// Promote this standby (returns once it accepts writes).
    pub fn promote(&self) {
        cluster_script_ok(self.pg_bin.as_deref(), &["promote", &self.name]);
    }

    /// Whether the postmaster is running.
    pub fn is_running(&self) -> bool {
        run_cluster_script(self.pg_bin.as_deref(), &["status", &self.name])
            .status
            .success()
    }

    /// Connection settings for database `db`.
    pub fn config(&self, db: &str) -> postgres::Config {
        let mut cfg = postgres::Config::new();
        cfg.host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(db)
            .application_name("pg_test")
            .connect_timeout(Duration::from_secs(10));
        cfg
    }

    /// Connect to database `db`.
    pub fn try_connect_db(&self, db: &str) -> Result<Client, postgres::Error> {
        self.config(db).connect(NoTls)
    }

    /// Connect to database `db`; panics with the server log tail on failure.
    pub fn connect_db(&self, db: &str) -> Client {
        self.try_connect_db(db).unwrap_or_else(|e| {
            panic!(
                "cannot connect to cluster {} (port {}) db {db}: {e}\n{}",
                self.name,
                self.port,
                self.log_context()
            )
        })
    }

    /// Connect to database `postgres`.
    pub fn try_client(&self) -> Result<Client, postgres::Error> {
        self.try_connect_db("postgres")
    }

    /// Connect to database `postgres`; panics with the server log tail on failure.
    pub fn client(&self) -> Client {
        self.connect_db("postgres")
    }

    /// Run one or more statements (simple protocol) in database `postgres`.
    pub fn try_execute(&self, sql: &str) -> Result<(), postgres::Error> {
        self.try_client()?.batch_execute(sql)
    }

    /// Run statements; panics with the error (code, message, hint) and log tail.
    pub fn execute(&self, sql: &str) {
        if let Err(e) = self.try_execute(sql) {
            panic!(
                "SQL failed: {sql}\n{}\n{}",
                describe_error(&e),
                self.log_context()
            );
        }
    }

    /// Run statements in database `db`.
    pub fn execute_in(&self, db: &str, sql: &str) {
        if let Err(e) = self
            .try_connect_db(db)
            .and_then(|mut c| c.batch_execute(sql))
        {
            panic!(
                "SQL failed in db {db}: {sql}\n{}\n{}",
                describe_error(&e),
                self.log_context()
            );
        }
    }

    /// All rows of a query (no parameters).
    pub fn try_query(&self, sql: &str) -> Result<Vec<Row>, postgres::Error> {
        self.try_client()?.query(sql, &[])
    }

    pub fn query(&self, sql: &str) -> Vec<Row> {
        self.try_query(sql).unwrap_or_else(|e| {
            panic!(
                "query failed: {sql}\n{}\n{}",
                describe_error(&e),
                self.log_context()
            )
        })
    }

    /// Exactly one row.
    pub fn try_query_one(&self, sql: &str) -> Result<Row, postgres::Error> {
        self.try_client()?.query_one(sql, &[])
    }

    pub fn query_one(&self, sql: &str) -> Row {
        self.try_query_one(sql).unwrap_or_else(|e| {
            panic!(
                "query failed: {sql}\n{}\n{}",
                describe_error(&e),
                self.log_context()
            )
        })
    }

    /// The first column of exactly one row, e.g. `query_scalar::<i64>("SELECT count(*) ...")`.
    pub fn try_query_scalar<T>(&self, sql: &str) -> Result<T, postgres::Error>
    where
        T: for<'a> postgres::types::FromSql<'a>,
    {
        self.try_query_one(sql)?.try_get(0)
    }

    pub fn query_scalar<T>(&self, sql: &str) -> T
    where
        T: for<'a> postgres::types::FromSql<'a>,
    {
        self.try_query_scalar(sql).unwrap_or_else(|e| {
            panic!(
                "query failed: {sql}\n{}\n{}",
                describe_error(&e),
                self.log_context()
            )
        })
    }

    /// Like [`wait_until`], but the timeout panic also shows the server log tail.
    #[track_caller]
    pub fn wait_until<F>(&self, what: &str, timeout: Duration, poll: Duration, f: F) -> Duration
    where
        F: FnMut() -> TestResult<bool>,
    {
        match poll_until(timeout, poll, f) {
            Ok(elapsed) => elapsed,
            Err(msg) => panic!(
                "timed out waiting for {what}: {msg}\n{}",
                self.log_context()
            ),
        }
    }

    /// Run pgbench against this cluster; see [`Pgbench`].
    pub fn pgbench(&self, script: &str) -> Pgbench<'_> {
        Pgbench::new(self, script)
    }

    fn log_context(&self) -> String {
        format!(
            "--- last 30 lines of {} ---\n{}\n--- end of server log ---",
            self.log_path.display(),
            self.log_tail(30)
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = run_cluster_script(self.pg_bin.as_deref(), &["stop", &self.name, "fast"]);
            eprintln!(
                "pg_test: test failed; kept cluster {} (port {}). Server log: {}\n\
                 pg_test: remove it with: scripts/cluster.sh destroy {}",
                self.name,
                self.port,
                self.log_path.display(),
                self.name
            );
        } else {
            let out = run_cluster_script(self.pg_bin.as_deref(), &["destroy", &self.name]);
            if !out.status.success() {
                eprintln!(
                    "pg_test: could not destroy cluster {}: {}",
                    self.name,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

/// Run a command; its stdout (trimmed), or a panic with its output if it fails.
#[track_caller]
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_short() {
        let a = unique_name("a very/long name with spaces and more");
        let b = unique_name("a very/long name with spaces and more");
        assert_ne!(a, b);
        assert!(a.starts_with("t_a_very_long_name_with_sp"));
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    }
}
