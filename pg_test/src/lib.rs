//! End-to-end test harness for pg_tide.
//!
//! Every e2e suite runs against real scratch PostgreSQL 15 clusters made by
//! `scripts/cluster.sh` (as the `postgres` OS user, on 127.0.0.1, trust auth).
//! The pg_tide extension must already be installed into the system PostgreSQL
//! (`scripts/install.sh`; `scripts/test.sh` does that before running these).
//!
//! ```no_run
//! use pg_test::*;
//! use std::time::Duration;
//!
//! let c = Cluster::builder("my_test").conf("tide.database='postgres'").start();
//! c.execute("CREATE EXTENSION pg_tide");
//! c.wait_until("the launcher to appear", Duration::from_secs(30), Duration::from_millis(200), || {
//!     Ok(c.query_scalar::<i64>("SELECT count(*) FROM pg_stat_activity
//!                                WHERE backend_type = 'pg_tide launcher'") == 1)
//! });
//! let err = c.try_execute("SELECT tide.check()").unwrap_err();
//! assert_db_error(&err, "55000", Some("wal_level"));
//! ```
//!
//! Clusters get a unique name (`t_<name>_<pid>_<seq>`) so suites may run in
//! parallel; `scripts/test.sh` runs them with `--test-threads=1`. On drop a
//! cluster is stopped and removed, except when the test is panicking: then it
//! is stopped and kept, and the path of its server log is printed.

use std::fmt::Debug;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use postgres;
pub use postgres::error::{DbError, SqlState};
pub use postgres::{Client, NoTls, Row};

/// Error type for closures given to [`wait_until`]: `?` works on any error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Result type for closures given to [`wait_until`].
pub type TestResult<T> = Result<T, BoxError>;

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

static SEQ: AtomicUsize = AtomicUsize::new(0);

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
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let bin = self.pg_bin.as_deref();
        cluster_script_ok(bin, &argv);
        let port: u16 = cluster_script_ok(bin, &["port", &name])
            .parse()
            .expect("scripts/cluster.sh port printed a number");
        let log_path = PathBuf::from(cluster_script_ok(bin, &["log", &name]));
        Cluster {
            name,
            port,
            log_path,
            pg_bin: self.pg_bin,
        }
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

/// Poll `f` every `poll` until it returns `Ok(true)`, without panicking: Ok(how long it took) or
/// Err(what it last saw) after `timeout`. Errors count as "not yet".
pub fn poll_every<F>(timeout: Duration, poll: Duration, f: F) -> Result<Duration, String>
where
    F: FnMut() -> TestResult<bool>,
{
    poll_until(timeout, poll, f)
}

fn poll_until<F>(timeout: Duration, poll: Duration, mut f: F) -> Result<Duration, String>
where
    F: FnMut() -> TestResult<bool>,
{
    let start = Instant::now();
    let mut attempts = 0u64;
    let mut last: String;
    loop {
        attempts += 1;
        match f() {
            Ok(true) => return Ok(start.elapsed()),
            Ok(false) => last = "condition was false".to_string(),
            Err(e) => last = format!("error: {e}"),
        }
        if start.elapsed() >= timeout {
            return Err(format!(
                "not true after {:.1?} ({attempts} attempts, polled every {poll:?}); last: {last}",
                start.elapsed()
            ));
        }
        std::thread::sleep(poll);
    }
}

/// Poll `f` every `poll` until it returns `Ok(true)`; errors count as "not yet".
/// Panics, naming the caller's line, if it is not true within `timeout`.
/// Returns how long it took.
#[track_caller]
pub fn wait_until<F>(timeout: Duration, poll: Duration, f: F) -> Duration
where
    F: FnMut() -> TestResult<bool>,
{
    match poll_until(timeout, poll, f) {
        Ok(elapsed) => elapsed,
        Err(msg) => panic!("wait_until timed out: {msg}"),
    }
}

/// One line describing a `postgres::Error`: SQLSTATE, severity, message, detail, hint.
pub fn describe_error(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!(
            "{} SQLSTATE {}: {}{}{}",
            db.severity(),
            db.code().code(),
            db.message(),
            db.detail()
                .map(|d| format!("\nDETAIL: {d}"))
                .unwrap_or_default(),
            db.hint()
                .map(|h| format!("\nHINT: {h}"))
                .unwrap_or_default()
        ),
        None => format!("(not a server error) {e}"),
    }
}

/// The `DbError` of an `Err`, panicking if the result is `Ok` or not a server error.
#[track_caller]
pub fn expect_db_error<T: Debug>(res: Result<T, postgres::Error>) -> DbError {
    match res {
        Ok(v) => panic!("expected a server error, got Ok({v:?})"),
        Err(e) => match e.as_db_error() {
            Some(db) => db.clone(),
            None => panic!("expected a server error, got: {e}"),
        },
    }
}

/// Assert that `err` is a server error with SQLSTATE `code` (e.g. `"55000"`) and,
/// if `hint_contains` is given, a HINT containing that substring.
#[track_caller]
pub fn assert_db_error(err: &postgres::Error, code: &str, hint_contains: Option<&str>) {
    let db = err
        .as_db_error()
        .unwrap_or_else(|| panic!("expected SQLSTATE {code}, got a non-server error: {err}"));
    assert_eq!(
        db.code().code(),
        code,
        "expected SQLSTATE {code}, got {}",
        describe_error(err)
    );
    if let Some(needle) = hint_contains {
        match db.hint() {
            Some(hint) => assert!(
                hint.contains(needle),
                "expected a HINT containing {needle:?}, got {}",
                describe_error(err)
            ),
            None => panic!(
                "expected a HINT containing {needle:?}, got no hint: {}",
                describe_error(err)
            ),
        }
    }
}

/// Assert that `res` failed with SQLSTATE `code` (and a hint containing `hint_contains`).
#[track_caller]
pub fn assert_sql_fails<T: Debug>(
    res: Result<T, postgres::Error>,
    code: &str,
    hint_contains: Option<&str>,
) {
    match res {
        Ok(v) => panic!("expected SQLSTATE {code}, but the statement succeeded: {v:?}"),
        Err(e) => assert_db_error(&e, code, hint_contains),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tps_is_parsed() {
        let out = "latency average = 1.2 ms\ntps = 812.345678 (without initial connection time)\n";
        assert_eq!(pgbench_tps(out), Some(812.345678));
        assert_eq!(pgbench_tps("nothing"), None);
    }

    #[test]
    fn names_are_unique_and_short() {
        let a = unique_name("a very/long name with spaces and more");
        let b = unique_name("a very/long name with spaces and more");
        assert_ne!(a, b);
        assert!(a.starts_with("t_a_very_long_name_with_sp"));
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    }

    #[test]
    fn wait_until_returns_and_times_out() {
        let mut n = 0;
        wait_until(Duration::from_secs(5), Duration::from_millis(1), || {
            n += 1;
            Ok(n >= 3)
        });
        let r = poll_until(Duration::from_millis(20), Duration::from_millis(5), || {
            Err("boom".into())
        });
        assert!(r.unwrap_err().contains("boom"));
    }
}

// ------------------------------------------------------------------------------------------
// Shared by the suites
// ------------------------------------------------------------------------------------------

/// Init and start a cluster, retrying with another port when the start fails (a client socket
/// in TIME-WAIT can hold the port `cluster.sh` picked).
pub fn start_cluster(b: ClusterBuilder) -> Cluster {
    let mut failed = Vec::new();
    for attempt in 1..=4 {
        let c = b.clone().init();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.start())) {
            Ok(()) => return c,
            Err(_) => {
                eprintln!(
                    "pg_test: cluster {} did not start (attempt {attempt}), trying another port",
                    c.name()
                );
                failed.push(c);
            }
        }
    }
    panic!("no cluster could be started in 4 attempts");
}

/// A started cluster (pg_tide preloaded, `wal_level = logical`) with the extension created and
/// its launcher running.
pub fn setup(name: &str) -> Cluster {
    let c = start_cluster(Cluster::builder(name));
    c.execute("CREATE EXTENSION pg_tide");
    c.wait_until(
        "the pg_tide launcher",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide launcher'",
            )? == 1)
        },
    );
    c
}

/// A plain scratch cluster to serve as a remote target (pg_tide not preloaded).
pub fn target_cluster(name: &str) -> Cluster {
    start_cluster(Cluster::builder(name).no_preload())
}

/// On `src`: postgres_fdw, a foreign server `server` pointing at `tgt`, and a user mapping for
/// postgres (the harness clusters use trust auth, so no password).
pub fn create_server(src: &Cluster, server: &str, tgt: &Cluster) {
    src.execute(&format!(
        "CREATE EXTENSION IF NOT EXISTS postgres_fdw;
         CREATE SERVER {server} FOREIGN DATA WRAPPER postgres_fdw
                OPTIONS (host '127.0.0.1', port '{}', dbname 'postgres');
         CREATE USER MAPPING FOR postgres SERVER {server} OPTIONS (user 'postgres');",
        tgt.port()
    ));
}

/// Rows of a query as JSON lines (for failure messages), at most `limit`.
pub fn sample(c: &Cluster, sql: &str, limit: usize) -> String {
    match c.try_query(&format!(
        "SELECT row_to_json(q)::text FROM ({sql}) q LIMIT {limit}"
    )) {
        Ok(rows) => rows
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("(query failed: {})", describe_error(&e)),
    }
}

/// `tide.wait_for_pipeline(name, secs)`, which must return true: panics with `diag()` (the
/// calling suite's diagnostics) otherwise. Returns how long it took.
#[track_caller]
pub fn wait_for_pipeline(
    c: &Cluster,
    name: &str,
    secs: u32,
    diag: impl FnOnce() -> String,
) -> Duration {
    expect_true(
        c,
        "SELECT tide.wait_for_pipeline($1::text, $2::int4 * interval '1 second')",
        &[&name, &(secs as i32)],
        &format!("tide.wait_for_pipeline('{name}', '{secs} seconds')"),
        diag,
    )
}

/// `tide.wait_for_backfill(table, pipeline, secs)`, which must return true: panics with `diag()`
/// otherwise. `pipeline` None lets the function find the table's pipeline. Returns how long it
/// took.
#[track_caller]
pub fn wait_for_backfill(
    c: &Cluster,
    table: &str,
    pipeline: Option<&str>,
    secs: u32,
    diag: impl FnOnce() -> String,
) -> Duration {
    expect_true(
        c,
        "SELECT tide.wait_for_backfill($1::text::regclass, $2::text, $3::int4 * interval '1 second')",
        &[&table, &pipeline, &(secs as i32)],
        &format!("tide.wait_for_backfill('{table}', {pipeline:?}, '{secs} seconds')"),
        diag,
    )
}

/// Run `sql`, a query of one boolean, which must return true; `what` names it in the panic.
#[track_caller]
fn expect_true(
    c: &Cluster,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
    what: &str,
    diag: impl FnOnce() -> String,
) -> Duration {
    let t = Instant::now();
    let res = c
        .try_client()
        .and_then(|mut cl| cl.query_one(sql, params).map(|r| r.get::<_, bool>(0)));
    match res {
        Ok(true) => t.elapsed(),
        Ok(false) => panic!(
            "{what} returned false after {:.1?}\n{}",
            t.elapsed(),
            diag()
        ),
        Err(e) => panic!("{what} failed: {}\n{}", describe_error(&e), diag()),
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

mod pgbench;
mod suite;
pub use pgbench::*;
pub use suite::*;
