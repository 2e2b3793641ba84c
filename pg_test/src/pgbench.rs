//! pgbench: a builder that runs it to the end ([`Pgbench`]), scripts in temporary files, and
//! runs in the background ([`spawn_pgbench`]).

use crate::cluster::SEQ;
use crate::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A pgbench run against a [`Cluster`] with a custom script, run as the
/// `postgres` OS user (`pgbench -n`: no vacuum, no pgbench tables needed).
///
/// ```no_run
/// # let c = pg_test::Cluster::new("x");
/// let out = c.pgbench("INSERT INTO t VALUES (1);")
///     .clients(4)
///     .duration(std::time::Duration::from_secs(10))
///     .rate(500.0)
///     .run();
/// let tps = pg_test::pgbench_tps(&out).unwrap();
/// ```
pub struct Pgbench<'a> {
    cluster: &'a Cluster,
    script: String,
    clients: u32,
    jobs: Option<u32>,
    duration: Duration,
    rate: Option<f64>,
    db: String,
    extra: Vec<String>,
}

impl<'a> Pgbench<'a> {
    pub fn new(cluster: &'a Cluster, script: &str) -> Self {
        Pgbench {
            cluster,
            script: script.to_string(),
            clients: 1,
            jobs: None,
            duration: Duration::from_secs(5),
            rate: None,
            db: "postgres".into(),
            extra: Vec::new(),
        }
    }

    /// `-c` (default 1).
    pub fn clients(mut self, n: u32) -> Self {
        self.clients = n.max(1);
        self
    }

    /// `-j` (default: min(clients, available cores)).
    pub fn jobs(mut self, n: u32) -> Self {
        self.jobs = Some(n.max(1));
        self
    }

    /// `-T`, rounded up to whole seconds (default 5 s).
    pub fn duration(mut self, d: Duration) -> Self {
        self.duration = d;
        self
    }

    /// `-R` target transactions per second (default: as fast as possible).
    pub fn rate(mut self, tps: f64) -> Self {
        self.rate = Some(tps);
        self
    }

    /// Database (default `postgres`).
    pub fn db(mut self, db: &str) -> Self {
        self.db = db.to_string();
        self
    }

    /// Any other pgbench argument, e.g. `.arg("-P").arg("1")` or `.arg("-Dn=10")`.
    pub fn arg(mut self, a: &str) -> Self {
        self.extra.push(a.to_string());
        self
    }

    /// Run it; returns pgbench's stdout. Panics with stderr if pgbench fails.
    pub fn run(self) -> String {
        run_pgbench(
            self.cluster,
            &self.script,
            self.clients,
            self.jobs,
            self.duration,
            self.rate,
            &self.db,
            &self.extra,
        )
    }
}

#[allow(clippy::too_many_arguments)]
fn run_pgbench(
    cluster: &Cluster,
    script: &str,
    clients: u32,
    jobs: Option<u32>,
    duration: Duration,
    rate: Option<f64>,
    db: &str,
    extra: &[String],
) -> String {
    // The script file must be readable by the postgres OS user: a 0644 file in the temp dir.
    let path = std::env::temp_dir().join(format!(
        "pg_tide_pgbench_{}_{}.sql",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    ));
    {
        let mut f = std::fs::File::create(&path)
            .unwrap_or_else(|e| panic!("cannot write pgbench script {}: {e}", path.display()));
        f.write_all(script.as_bytes())
            .expect("write pgbench script");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
            .expect("chmod pgbench script");
    }

    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let jobs = jobs.unwrap_or_else(|| clients.min(cores)).min(clients);
    let secs = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    let mut cmd = command_as_postgres(pg_bin().join("pgbench"));
    cmd.current_dir("/")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &cluster.port().to_string(),
            "-U",
            "postgres",
        ])
        .arg("-n")
        .arg("-f")
        .arg(&path)
        .args(["-c", &clients.to_string(), "-j", &jobs.to_string()])
        .args(["-T", &secs.max(1).to_string()]);
    if let Some(r) = rate {
        cmd.args(["-R", &format!("{r}")]);
    }
    cmd.args(extra).arg(db).stdin(Stdio::null());

    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("could not run pgbench: {e}"));
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        panic!(
            "pgbench failed ({}): {:?}\n--- script ---\n{script}\n--- stderr ---\n{}\n--- stdout ---\n{stdout}",
            out.status,
            cmd,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    stdout
}

/// The `tps = N` figure from pgbench output.
pub fn pgbench_tps(output: &str) -> Option<f64> {
    output
        .lines()
        .find_map(|l| l.trim().strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// A pgbench script in a temporary file readable by the `postgres` user.
pub fn write_script(tag: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("pg_tide_{tag}_{}.sql", std::process::id()));
    std::fs::write(&path, body).expect("write pgbench script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
        .expect("make the pgbench script readable");
    path
}

/// A pgbench running in the background (see [`spawn_pgbench`]).
pub struct PgbenchRun {
    pub child: std::process::Child,
    pub started: Instant,
}

/// What a pgbench run reported.
pub struct PgbenchResult {
    /// "number of transactions actually processed".
    pub txns: u64,
    /// It exited with status 0.
    pub ok: bool,
    /// "exit status: N after 3.0s".
    pub status: String,
    /// pgbench's "number of failed transactions" line, if it printed one.
    pub failed: String,
    /// The first three lines of its stderr, joined with " | ".
    pub errors: String,
    /// Everything it printed.
    pub stdout: String,
    pub stderr: String,
}

impl PgbenchResult {
    /// "exit status: N after 3.0s; number of failed transactions: ... [first errors]".
    pub fn summary(&self) -> String {
        let mut s = self.status.clone();
        if !self.failed.is_empty() {
            s.push_str("; ");
            s.push_str(&self.failed);
        }
        if !self.errors.is_empty() {
            s.push_str(&format!(" [{}]", self.errors));
        }
        s
    }
}

/// [`spawn_pgbench_tries`] retrying serialization failures and deadlocks up to 20 times.
pub fn spawn_pgbench(
    c: &Cluster,
    script: &Path,
    clients: u32,
    secs: u64,
    rate: Option<u32>,
) -> PgbenchRun {
    spawn_pgbench_tries(c, script, clients, secs, rate, 20)
}

/// Start pgbench on `c`'s database postgres with `script`: `clients` clients (on at most two
/// threads) for `secs` seconds, at `rate` transactions per second in total when given, retrying
/// serialization failures and deadlocks up to `max_tries` times.
pub fn spawn_pgbench_tries(
    c: &Cluster,
    script: &Path,
    clients: u32,
    secs: u64,
    rate: Option<u32>,
    max_tries: u32,
) -> PgbenchRun {
    let mut cmd = command_as_postgres(pg_bin().join("pgbench"));
    cmd.current_dir("/")
        .args(["-h", "127.0.0.1", "-U", "postgres", "-n"])
        .arg("-p")
        .arg(c.port().to_string())
        .arg("-f")
        .arg(script)
        .arg("-c")
        .arg(clients.to_string())
        .arg("-j")
        .arg(clients.clamp(1, 2).to_string())
        .arg("-T")
        .arg(secs.to_string())
        .arg(format!("--max-tries={max_tries}"));
    if let Some(r) = rate {
        cmd.arg("-R").arg(r.to_string());
    }
    cmd.arg("postgres")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    PgbenchRun {
        child: cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start pgbench: {e}")),
        started: Instant::now(),
    }
}

impl PgbenchRun {
    /// [`PgbenchRun::finish`] as (transactions, success, [`PgbenchResult::summary`]).
    pub fn finish_summary(self) -> (u64, bool, String) {
        let r = self.finish();
        (r.txns, r.ok, r.summary())
    }

    /// Wait for pgbench to end and read what it reported.
    pub fn finish(self) -> PgbenchResult {
        let out = self.child.wait_with_output().expect("wait for pgbench");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let txns = stdout
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("number of transactions actually processed: ")
            })
            .and_then(|s| s.split(|ch: char| !ch.is_ascii_digit()).next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let failed = stdout
            .lines()
            .find(|l| l.trim().starts_with("number of failed transactions"))
            .unwrap_or("")
            .trim()
            .to_string();
        PgbenchResult {
            txns,
            ok: out.status.success(),
            status: format!("{} after {:.1?}", out.status, self.started.elapsed()),
            failed,
            errors: stderr.lines().take(3).collect::<Vec<_>>().join(" | "),
            stdout: stdout.to_string(),
            stderr: stderr.to_string(),
        }
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
}
