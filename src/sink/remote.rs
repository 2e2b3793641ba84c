//! The connection to a remote PostgreSQL target, owned by a dedicated thread.
//!
//! A pipeline worker whose target is a table in another PostgreSQL server writes through a
//! [`RemoteSink`]. pgrx forbids any thread but the backend's main thread from touching
//! PostgreSQL, so the remote connection (pure-Rust `postgres` client, no libpq) lives on a
//! thread of its own, and the main thread talks to it over a bounded channel.
//!
//! What this module owns: the sink thread, its single remote connection, the statements it
//! has prepared on that connection, and the request/reply protocol between the two threads.
//!
//! What it guarantees:
//! - The sink thread never calls pgrx or `pg_sys`, never logs through PostgreSQL and does not
//!   panic on a reachable path; every failure is returned as a [`RemoteError`] value. (Should
//!   the `postgres` crate panic, the panic is caught, the connection dropped and an error
//!   returned.) It blocks every signal, so PostgreSQL's handlers only run on the main thread.
//! - The caller never waits longer than the timeout it passes (plus, only when the remote is
//!   inside `COMMIT` at that moment, the same time again to learn the outcome). A request that
//!   timed out is abandoned: its in-flight statement is cancelled, its transaction is rolled
//!   back (the connection is dropped) unless `COMMIT` had already been sent, and its late
//!   reply is discarded by sequence number, never mistaken for a later request's reply.
//! - [`RemoteSink::transaction`] is all or nothing: either every statement ran and `COMMIT`
//!   succeeded (`Ok`), or the remote transaction was rolled back (`Err`). The one exception is
//!   inherent to any client: if the connection breaks (or the caller's time runs out) while
//!   `COMMIT` is in flight, the outcome is unknown, and the error says so.
//! - A broken connection is dropped and the next request reconnects. A reused connection
//!   that the server closed while it was idle (server restarted, backend terminated) fails
//!   on the request's first round trip, before any of the request's statements ran; the
//!   request is then retried once on a fresh connection, so the caller sees no error.
//! - A sink thread stuck in network I/O that no timeout can interrupt (a server that accepts
//!   TCP and never answers) is replaced by a new thread after [`STUCK_AFTER`]; at most
//!   [`MAX_RETIRED`] such threads are left behind before requests fail as "busy" instead.
//!
//! TLS follows libpq: the conninfo's `sslmode` (`disable`, `allow`, `prefer` — the default —,
//! `require`, `verify-ca`, `verify-full`), `sslrootcert` (a PEM file, or `system`), `sslcrl`,
//! `sslcrldir`, `sslcert`, `sslkey`, `sslpassword`, `sslcertmode`, `sslsni` and
//! `ssl_min/max_protocol_version` are honoured, through OpenSSL (`postgres-openssl`); see the
//! [`tls`] module for the details and the (stricter) differences from libpq. Certificate files
//! are read when connecting, on the sink thread. A certificate that does not verify, or a file
//! that cannot be read, is a non-transient error with a hint.

use std::collections::HashMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use postgres::config::{Host, SslMode};
use postgres::types::{FromSql, Kind, PgLsn, ToSql, Type};
use postgres::{CancelToken, Client, Config, NoTls, Row, Statement};
use postgres_openssl::MakeTlsConnector;

mod tls;
use tls::{TlsOptions, VerifyFailure};

/// Connect timeout used when the connection string does not set `connect_timeout`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// TCP keepalive idle time used when the connection string does not set `keepalives_idle`.
const DEFAULT_KEEPALIVES_IDLE: Duration = Duration::from_secs(30);
/// TCP keepalive probe interval used when `keepalives_interval` is not set.
const DEFAULT_KEEPALIVES_INTERVAL: Duration = Duration::from_secs(10);
/// TCP keepalive probe count used when `keepalives_count` is not set.
const DEFAULT_KEEPALIVES_RETRIES: u32 = 3;
/// `TCP_USER_TIMEOUT` used when `tcp_user_timeout` is not set: unacknowledged data for this
/// long breaks the connection instead of blocking the sink thread for the kernel's ~15 min.
const DEFAULT_TCP_USER_TIMEOUT: Duration = Duration::from_secs(60);
/// The `postgres` crate's default keepalive idle time (2 h), which we lower.
const POSTGRES_DEFAULT_KEEPALIVES_IDLE: Duration = Duration::from_secs(2 * 60 * 60);
/// Requests that may wait in the channel while the sink thread is busy.
const REQUEST_QUEUE: usize = 1;
/// How long `Drop` waits for the sink thread to exit before detaching it.
const STOP_WAIT: Duration = Duration::from_secs(2);
/// The longest the main thread waits for the sink thread without looking at interrupts and the
/// postmaster (see [`set_wait_check`]).
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// What the main thread does after every [`WAIT_SLICE`] of a wait for the sink thread's reply:
/// in a backend, process a pending interrupt (query cancel, SIGTERM: `drop_pipeline`,
/// `pg_terminate_backend`, shutdown) or exit if the postmaster died. It need not return; when
/// it will not, it calls `abandon` first, so the sink thread rolls the request back, cancels
/// its statement and drops the connection, as for a timeout.
pub type WaitCheck = fn(abandon: &mut dyn FnMut());

static WAIT_CHECK: OnceLock<WaitCheck> = OnceLock::new();

/// Install the [`WaitCheck`] (once per process; `_PG_init` does it). Without one (this module's
/// unit tests, which run outside a backend) a wait only ends on a reply or its timeout.
pub fn set_wait_check(check: WaitCheck) {
    let _ = WAIT_CHECK.set(check);
}
/// A sink thread still busy this long after its request was abandoned is replaced.
pub const STUCK_AFTER: Duration = Duration::from_secs(30);
/// Replaced (stuck) sink threads tolerated at once before requests fail as "busy".
pub const MAX_RETIRED: usize = 4;
/// Prepared statements kept per connection before the cache is cleared.
const STATEMENT_CACHE_MAX: usize = 256;

/// Rows of one statement: every column as its text output, NULL as `None`.
type Rows = Vec<Vec<Option<String>>>;

/// One SQL statement to run on the remote; parameters are sent as text (`$n` are text;
/// the SQL casts them, e.g. `$1::jsonb[]`), NULL as None. Arrays are passed as a single text
/// parameter in PostgreSQL array-literal syntax built by the caller.
///
/// Result columns are returned as text. Columns of type text, varchar, char(n), name, json,
/// jsonb, bool, int2, int4, int8, oid, pg_lsn, uuid, bytea, enums and domains over these are
/// read directly (in PostgreSQL's text output format); any other type must be cast to `::text`
/// in the SQL, or the statement fails (before it runs) with a non-transient error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteStatement {
    /// The SQL text: exactly one statement, parameters `$1..$n` typed `text`.
    pub sql: String,
    /// The values of `$1..$n`, as text; `None` is SQL NULL.
    pub params: Vec<Option<String>>,
}

/// Failure talking to the remote. `transient` = connection refused/reset/timeout/admin
/// shutdown/serialization failure etc. (retry later); otherwise a statement error the
/// user must fix (wrong table, constraint violation...). Carries SQLSTATE when the server sent one.
#[derive(Debug, Clone)]
pub struct RemoteError {
    /// What went wrong: the server's message (with its DETAIL, if any), or the client's.
    pub message: String,
    /// The SQLSTATE the server sent, if the error came from the server.
    pub sqlstate: Option<String>,
    /// The server's HINT, or advice from this module for errors it raises itself.
    pub hint: Option<String>,
    /// True if retrying later may succeed without anyone changing anything.
    pub transient: bool,
}

impl RemoteError {
    /// An error raised by this module that a retry may cure.
    fn transient(message: impl Into<String>) -> Self {
        RemoteError {
            message: message.into(),
            sqlstate: None,
            hint: None,
            transient: true,
        }
    }

    /// An error raised by this module that needs a configuration or SQL change.
    fn permanent(message: impl Into<String>) -> Self {
        RemoteError {
            message: message.into(),
            sqlstate: None,
            hint: None,
            transient: false,
        }
    }

    /// Attach a hint.
    fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Translate a `postgres` client error, classifying it (see [`is_transient`]).
    fn from_pg(e: &postgres::Error) -> Self {
        if let Some(db) = e.as_db_error() {
            let code = db.code().code();
            let mut message = db.message().to_string();
            if let Some(detail) = db.detail() {
                message.push_str(" (detail: ");
                message.push_str(detail);
                message.push(')');
            }
            RemoteError {
                message,
                sqlstate: Some(code.to_string()),
                hint: db.hint().map(str::to_string),
                transient: is_transient(Some(code)) || is_stale_plan(code, db.message()),
            }
        } else {
            RemoteError {
                message: error_chain(e),
                sqlstate: None,
                hint: None,
                transient: !is_client_side_permanent(&e.to_string()),
            }
        }
    }

    /// Prefix the message with context.
    fn context(mut self, what: &str) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

impl fmt::Display for RemoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RemoteError {}

/// Whether a remote failure is worth retrying later, from its SQLSTATE (`None`: the failure
/// was not reported by the server — I/O error, connection closed, timeout).
///
/// Transient: no SQLSTATE; class 08 (connection exception); 57P01 admin shutdown, 57P02
/// crash shutdown, 57P03 cannot connect now, 57P05 idle session timeout, 25P03 idle in
/// transaction timeout (the server closed the session); 57014 query canceled (statement
/// timeout or our cancel after the caller's timeout); 40001 serialization failure, 40P01
/// deadlock; 55P03 lock not available (lock_timeout); 53300 too many connections.
/// Everything else (undefined table, constraint violation, permission denied, bad
/// password, ...) needs someone to fix something.
pub fn is_transient(sqlstate: Option<&str>) -> bool {
    match sqlstate {
        None => true,
        Some(code) => {
            code.starts_with("08")
                || matches!(
                    code,
                    "57P01"
                        | "57P02"
                        | "57P03"
                        | "57P05"
                        | "25P03"
                        | "57014"
                        | "40001"
                        | "40P01"
                        | "55P03"
                        | "53300"
                )
        }
    }
}

/// `cached plan must not change result type`: a prepared statement outlived a change of the
/// remote table; the statement cache is cleared on any error, so a retry succeeds.
fn is_stale_plan(code: &str, message: &str) -> bool {
    code == "0A000" && message.contains("cached plan must not change result type")
}

/// Client-side errors (no SQLSTATE) that a retry cannot cure, recognised by the `postgres`
/// crate's fixed description of the error kind (the `Display` of the top-level error).
fn is_client_side_permanent(kind: &str) -> bool {
    const PERMANENT: [&str; 10] = [
        "invalid configuration",
        "invalid connection string",
        "error serializing parameter",
        "error deserializing column",
        "invalid column",
        "expected ",
        "query returned an unexpected number",
        "error performing TLS handshake",
        "authentication error",
        "unexpected message from server",
    ];
    PERMANENT.iter().any(|p| kind.starts_with(p))
}

/// True if `e` means the connection is gone (so a request that failed on its first
/// round trip over a reused connection can safely be retried on a fresh one).
fn connection_lost(e: &postgres::Error) -> bool {
    match e.code() {
        Some(code) => {
            let code = code.code();
            code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P05" | "25P03")
        }
        None => {
            let kind = e.to_string();
            e.is_closed()
                || kind.starts_with("error communicating with the server")
                || kind.starts_with("connection closed")
        }
    }
}

/// `e` and its causes, joined with ": " (the `postgres` crate's `Display` shows only the
/// error kind, e.g. "error connecting to server", not the I/O error behind it).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Connection strings
// ---------------------------------------------------------------------------------------------

/// Every keyword libpq (PostgreSQL 15–18) accepts in a connection string.
const LIBPQ_KEYWORDS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "sslnegotiation",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "sslkeylogfile",
    "requirepeer",
    "require_auth",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "min_protocol_version",
    "max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
    "oauth_issuer",
    "oauth_client_id",
    "oauth_client_secret",
    "oauth_scope",
];

/// Keywords the `postgres` crate understands, passed through unchanged.
const CLIENT_KEYWORDS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "options",
    "application_name",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// libpq keywords whose meaning this client cannot honour and that would weaken security or
/// change the target if silently ignored: refused.
const REFUSED_KEYWORDS: &[&str] = &["service", "replication", "require_auth", "requirepeer"];

/// Quote a conninfo value: `'...'` with `\` and `'` backslash-escaped.
fn quote_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        if c == '\\' || c == '\'' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

/// Build a conninfo string from `key=value` option pairs (foreign server options + user mapping
/// options, as postgres_fdw stores them: host, port, dbname, user, password, sslmode, ...),
/// quoting values correctly ('...' with \\ and \' escaped). Ignores options libpq does not
/// know that postgres_fdw adds (use_remote_estimate, fetch_size, updatable, truncatable, ...).
///
/// A key given twice keeps its position of first appearance and its last value (pass server
/// options first, then user mapping options, as postgres_fdw does). Every value is quoted, so
/// empty values and values with spaces survive.
pub fn conninfo_from_options(opts: &[(String, String)]) -> String {
    let mut order: Vec<&str> = Vec::new();
    let mut values: HashMap<&str, &str> = HashMap::new();
    for (key, value) in opts {
        let key = key.as_str();
        if !LIBPQ_KEYWORDS.contains(&key) {
            continue;
        }
        if values.insert(key, value.as_str()).is_none() {
            order.push(key);
        }
    }
    order
        .iter()
        .filter_map(|key| {
            values
                .get(key)
                .map(|value| format!("{key}={}", quote_value(value)))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Parse a libpq `key=value` connection string (values bare, or single-quoted with
/// backslash escapes; whitespace around `=` allowed).
fn parse_conninfo(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut it = s.chars().peekable();
    loop {
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = it.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.next() != Some('=') {
            return Err(format!(
                "missing \"=\" after \"{key}\" in connection string"
            ));
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if it.next_if_eq(&'\'').is_some() {
            loop {
                match it.next() {
                    None => return Err(format!("unterminated quoted string for \"{key}\"")),
                    Some('\'') => break,
                    Some('\\') => {
                        if let Some(c) = it.next() {
                            value.push(c);
                        }
                    }
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = it.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some(escaped) = it.next() {
                        value.push(escaped);
                    }
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return Err(format!("missing value for \"{key}\" in connection string"));
            }
        }
        pairs.push((key, value));
    }
}

/// Where and how to connect: the client configuration and the TLS options.
#[derive(Debug)]
struct Target {
    /// The client configuration (its `ssl_mode` is the first attempt's).
    config: Config,
    /// libpq's TLS options.
    tls: TlsOptions,
}

/// Turn the caller's conninfo into a client configuration and TLS options: keep what the
/// `postgres` crate understands, take the TLS options (see [`tls`]), ignore libpq keywords
/// without effect here (GSS, client_encoding, ...), refuse what cannot be honoured
/// (`service`, ...), and apply our defaults (connect timeout, keepalives, TCP user timeout,
/// default host, application name).
///
/// A `postgresql://` URI may only use the keywords of the `postgres` crate (so of TLS only
/// `sslmode`, and that only `disable`, `prefer` or `require`).
fn build_config(conninfo: &str, application_name: &str) -> Result<Target, RemoteError> {
    let trimmed = conninfo.trim();
    let mut tls = TlsOptions::default();
    let mut config = if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        let config = Config::from_str(trimmed).map_err(|e| {
            RemoteError::permanent(format!(
                "invalid remote connection URI: {}",
                error_chain(&e)
            ))
        })?;
        tls = TlsOptions::from_client_mode(config.get_ssl_mode());
        config
    } else {
        let pairs = parse_conninfo(trimmed).map_err(RemoteError::permanent)?;
        // Last value wins, as in libpq (the client would append repeated hosts instead).
        let mut order: Vec<String> = Vec::new();
        let mut values: HashMap<String, String> = HashMap::new();
        for (key, value) in pairs {
            let key = if key == "keepalives_count" {
                "keepalives_retries".to_string()
            } else {
                key
            };
            if values.insert(key.clone(), value).is_none() {
                order.push(key);
            }
        }
        let mut kept: Vec<String> = Vec::new();
        for key in &order {
            let Some(value) = values.get(key) else {
                continue;
            };
            let value = value.as_str();
            if tls.take(key, value)? {
                continue;
            }
            match key.as_str() {
                "gssencmode" if value == "require" => {
                    return Err(RemoteError::permanent(
                        "gssencmode=require is not supported by pg_tide's remote sink",
                    ))
                }
                k if CLIENT_KEYWORDS.contains(&k) => {
                    kept.push(format!("{k}={}", quote_value(value)));
                }
                k if REFUSED_KEYWORDS.contains(&k) => {
                    return Err(RemoteError::permanent(format!(
                        "connection option \"{k}\" is not supported by pg_tide's remote sink"
                    )))
                }
                k if LIBPQ_KEYWORDS.contains(&k) => {} // no effect without libpq/GSS
                k => {
                    return Err(RemoteError::permanent(format!(
                        "invalid connection option \"{k}\""
                    )))
                }
            }
        }
        Config::from_str(&kept.join(" ")).map_err(|e| {
            RemoteError::permanent(format!(
                "invalid remote connection string: {}",
                error_chain(&e)
            ))
        })?
    };
    tls.finish()?;
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        let port = config.get_ports().first().copied().unwrap_or(5432);
        config.host(&default_host(port));
    }
    if config.get_hostaddrs().is_empty()
        && config
            .get_hosts()
            .iter()
            .all(|h| !matches!(h, Host::Tcp(_)))
    {
        tls.disable(); // Unix-domain sockets only: libpq never uses TLS there
    }
    if config.get_hosts().is_empty() {
        // hostaddr alone: the client needs a name for the TLS handshake; libpq refuses to
        // verify a host name it was not given.
        if tls.mode == tls::SslMode::VerifyFull {
            return Err(RemoteError::permanent(
                "host name must be specified for a verified TLS connection (sslmode=verify-full)",
            )
            .with_hint("Set the foreign server's host option to the name in the server's certificate (hostaddr may stay, to skip the name lookup)."));
        }
        for addr in config.get_hostaddrs().to_vec() {
            config.host(&addr.to_string());
        }
    }
    config.ssl_mode(tls.mode.client_mode());
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    }
    if config.get_keepalives() {
        if config.get_keepalives_idle() == POSTGRES_DEFAULT_KEEPALIVES_IDLE {
            config.keepalives_idle(DEFAULT_KEEPALIVES_IDLE);
        }
        if config.get_keepalives_interval().is_none() {
            config.keepalives_interval(DEFAULT_KEEPALIVES_INTERVAL);
        }
        if config.get_keepalives_retries().is_none() {
            config.keepalives_retries(DEFAULT_KEEPALIVES_RETRIES);
        }
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(DEFAULT_TCP_USER_TIMEOUT);
    }
    if !application_name.is_empty() {
        config.application_name(application_name);
    }
    // Notices from the remote are dropped (the default handler would use the `log` crate).
    config.notice_callback(|_| {});
    Ok(Target { config, tls })
}

/// libpq's default when neither host nor hostaddr is given: `$PGHOST`, else the first of
/// the usual socket directories holding the server's socket, else localhost.
fn default_host(port: u16) -> String {
    if let Ok(host) = std::env::var("PGHOST") {
        if !host.is_empty() {
            return host;
        }
    }
    for dir in ["/var/run/postgresql", "/tmp"] {
        if std::path::Path::new(&format!("{dir}/.s.PGSQL.{port}")).exists() {
            return dir.to_string();
        }
    }
    "localhost".to_string()
}

// ---------------------------------------------------------------------------------------------
// Result columns as text
// ---------------------------------------------------------------------------------------------

/// A result column decoded from its binary wire format into PostgreSQL's text output.
struct AnyText(String);

/// True if [`AnyText`] can decode a column of type `ty`.
fn readable(ty: &Type) -> bool {
    match ty.kind() {
        Kind::Enum(_) => true,
        Kind::Domain(base) => readable(base),
        _ => {
            <String as FromSql>::accepts(ty)
                || [
                    Type::JSON,
                    Type::JSONB,
                    Type::BOOL,
                    Type::INT2,
                    Type::INT4,
                    Type::INT8,
                    Type::OID,
                    Type::PG_LSN,
                    Type::UUID,
                    Type::BYTEA,
                ]
                .contains(ty)
        }
    }
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decode one non-NULL value of a [`readable`] type to its text output.
fn text_of(ty: &Type, raw: &[u8]) -> Result<String, Box<dyn std::error::Error + Sync + Send>> {
    if let Kind::Domain(base) = ty.kind() {
        return text_of(base, raw);
    }
    if matches!(ty.kind(), Kind::Enum(_)) || *ty == Type::JSON {
        return Ok(std::str::from_utf8(raw)?.to_string());
    }
    if <String as FromSql>::accepts(ty) {
        return <String as FromSql>::from_sql(ty, raw);
    }
    Ok(match *ty {
        Type::JSONB => match raw.split_first() {
            Some((1, json)) => std::str::from_utf8(json)?.to_string(),
            _ => return Err("unsupported jsonb binary format version".into()),
        },
        Type::BOOL => if bool::from_sql(ty, raw)? { "t" } else { "f" }.to_string(),
        Type::INT2 => i16::from_sql(ty, raw)?.to_string(),
        Type::INT4 => i32::from_sql(ty, raw)?.to_string(),
        Type::INT8 => i64::from_sql(ty, raw)?.to_string(),
        Type::OID => u32::from_sql(ty, raw)?.to_string(),
        Type::PG_LSN => PgLsn::from_sql(ty, raw)?.to_string(),
        Type::UUID => {
            if raw.len() != 16 {
                return Err("invalid uuid length".into());
            }
            format!(
                "{}-{}-{}-{}-{}",
                hex(&raw[0..4]),
                hex(&raw[4..6]),
                hex(&raw[6..8]),
                hex(&raw[8..10]),
                hex(&raw[10..16])
            )
        }
        Type::BYTEA => format!("\\x{}", hex(raw)),
        _ => return Err(format!("cannot read type {ty} as text").into()),
    })
}

impl<'a> FromSql<'a> for AnyText {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        text_of(ty, raw).map(AnyText)
    }

    fn accepts(ty: &Type) -> bool {
        readable(ty)
    }
}

/// Fail (before execution) if a result column cannot be returned as text.
fn check_columns(statement: &Statement) -> Result<(), RemoteError> {
    for (i, column) in statement.columns().iter().enumerate() {
        if !readable(column.type_()) {
            return Err(RemoteError::permanent(format!(
                "result column {} (\"{}\") has type {}, which the remote sink cannot return as text",
                i + 1,
                column.name(),
                column.type_()
            ))
            .with_hint("cast the column to text in the SQL, e.g. expr::text"));
        }
    }
    Ok(())
}

/// Every value of every row, as text.
fn rows_as_text(rows: &[Row]) -> Result<Rows, RemoteError> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let mut values = Vec::with_capacity(row.len());
        for i in 0..row.len() {
            let value: Option<AnyText> = row.try_get(i).map_err(|e| {
                RemoteError::permanent(format!(
                    "could not read result column {}: {}",
                    i + 1,
                    error_chain(&e)
                ))
            })?;
            values.push(value.map(|v| v.0));
        }
        out.push(values);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The protocol between the main thread and the sink thread
// ---------------------------------------------------------------------------------------------

/// What a request asks the sink thread to do.
enum Work {
    /// Statements to run in one transaction, then commit.
    Transaction(Vec<RemoteStatement>),
    /// One statement outside an explicit transaction.
    Query(RemoteStatement),
}

/// A request to the sink thread.
struct Request {
    /// Sequence number, strictly increasing per [`RemoteSink`]; the reply carries it back.
    seq: u64,
    /// The work.
    work: Work,
    /// The caller's timeout, also used as the remote `statement_timeout`.
    timeout: Duration,
}

/// The sink thread's answer to request `seq`.
struct Reply {
    /// The request's sequence number.
    seq: u64,
    /// Rows of each statement, or the failure.
    result: Result<Vec<Rows>, RemoteError>,
}

/// Request bookkeeping shared by both threads, always updated under its mutex.
#[derive(Default)]
struct Control {
    /// The request the sink thread is executing, if any.
    inflight: Option<u64>,
    /// True once the in-flight transaction has decided to send `COMMIT`.
    committing: bool,
    /// Highest request sequence number the main thread has given up on.
    abandoned: u64,
    /// When the main thread gave up on the in-flight request.
    abandoned_at: Option<Instant>,
    /// How to cancel on the current connection.
    cancel: Option<Canceller>,
    /// A cancel request was sent for the in-flight request: the connection must be dropped
    /// afterwards, lest the cancel hit a later request's statement.
    cancel_fired: bool,
}

/// State shared between the main thread and one sink thread.
#[derive(Default)]
struct Shared {
    /// Request bookkeeping. The sink thread sends each reply while holding this lock, so
    /// the main thread holding it sees either the reply in the channel or the request as
    /// unfinished — never a finished request whose reply is still to come.
    ctl: Mutex<Control>,
    /// True while the sink thread holds an open connection.
    connected: AtomicBool,
    /// Set when the sink thread must exit after its current request.
    stop: AtomicBool,
}

/// Lock a mutex, ignoring poisoning (no code holding these locks can panic mid-update).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The main thread's handle on one sink thread.
struct Worker {
    /// Requests to the sink thread (bounded, [`REQUEST_QUEUE`]).
    requests: SyncSender<Request>,
    /// Replies from the sink thread (unbounded, so the sink thread never blocks on a reply).
    replies: Receiver<Reply>,
    /// The sink thread.
    handle: JoinHandle<()>,
    /// Shared state.
    shared: Arc<Shared>,
}

/// Main-thread state of a [`RemoteSink`].
struct SinkState {
    /// The current sink thread, if one is running.
    worker: Option<Worker>,
    /// Sink threads replaced because they were stuck, not yet exited.
    retired: Vec<JoinHandle<()>>,
    /// Last request sequence number used.
    next_seq: u64,
}

/// The remote PostgreSQL connection of one pipeline, owned by a dedicated thread.
///
/// Call it from one thread (the worker's main thread); calls are serialized internally.
pub struct RemoteSink {
    /// The caller's conninfo (may contain a password: never printed).
    conninfo: String,
    /// Application name given to the remote connection.
    application_name: String,
    /// Main-thread state.
    state: Mutex<SinkState>,
}

impl fmt::Debug for RemoteSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteSink")
            .field("application_name", &self.application_name)
            .field("connected", &self.connected())
            .finish_non_exhaustive()
    }
}

/// What cancelling a connection's statement needs: its cancel token, and the TLS connector
/// it was made with (the cancel request goes over the same kind of connection).
#[derive(Clone)]
struct Canceller {
    /// The connection's cancel token.
    token: CancelToken,
    /// The TLS connector, if the connection used one.
    tls: Option<MakeTlsConnector>,
}

/// Send a cancel request from a short-lived thread, so neither the main thread nor the
/// (blocked) sink thread waits for it.
fn spawn_cancel(canceller: Canceller) {
    let _ = thread::Builder::new()
        .name("tide-sink-cancel".into())
        .spawn(move || {
            block_signals();
            let Canceller { token, tls } = canceller;
            let _ = catch_unwind(AssertUnwindSafe(|| match tls {
                Some(tls) => token.cancel_query(tls),
                None => token.cancel_query(NoTls),
            }));
        });
}

/// Start a sink thread.
fn spawn_worker(conninfo: &str, application_name: &str) -> std::io::Result<Worker> {
    let (request_tx, request_rx) = mpsc::sync_channel(REQUEST_QUEUE);
    let (reply_tx, reply_rx) = mpsc::channel();
    let shared = Arc::new(Shared::default());
    let thread_shared = Arc::clone(&shared);
    let conninfo = conninfo.to_string();
    let application_name = application_name.to_string();
    let handle = thread::Builder::new()
        .name("tide-sink".into())
        .spawn(move || {
            sink_thread(
                &conninfo,
                &application_name,
                request_rx,
                reply_tx,
                &thread_shared,
            )
        })?;
    Ok(Worker {
        requests: request_tx,
        replies: reply_rx,
        handle,
        shared,
    })
}

impl RemoteSink {
    /// Start the sink thread. `conninfo` is a libpq-style key=value string (host, port, dbname,
    /// user, password, sslmode=disable, ...) built by the caller; connect lazily in the thread
    /// (the first request connects), with connect_timeout (default 5 s) and a TCP keepalive.
    ///
    /// A `postgresql://` URI is accepted too. A non-empty `application_name` overrides one in
    /// `conninfo`. An invalid conninfo is reported (non-transient) by the first request. If the
    /// thread cannot be spawned, requests report it (transient) and retry spawning.
    pub fn start(conninfo: String, application_name: &str) -> RemoteSink {
        let worker = spawn_worker(&conninfo, application_name).ok();
        RemoteSink {
            conninfo,
            application_name: application_name.to_string(),
            state: Mutex::new(SinkState {
                worker,
                retired: Vec::new(),
                next_seq: 0,
            }),
        }
    }

    /// Run statements in ONE remote transaction, then commit. All or nothing: on any error
    /// the remote transaction is rolled back and the error returned; on a broken connection
    /// the client is dropped and the next request reconnects.
    ///
    /// Returns the rows of every statement, in order. `timeout` bounds the whole call
    /// (connecting included) and is the remote `statement_timeout` of each statement. On
    /// timeout the error is transient and the remote transaction is rolled back — unless
    /// `COMMIT` was already sent: then the call waits up to `timeout` more for its outcome,
    /// and if it still has none, returns a transient error saying the outcome is unknown.
    /// An empty `stmts` returns `Ok(vec![])` without contacting the remote. `timeout` should
    /// be well above the round-trip time (a zero timeout always fails).
    ///
    /// Statements of one call are pipelined in order over one round trip each (plus one for
    /// `BEGIN` and one for `COMMIT`); a statement's text is prepared once per connection and
    /// the prepared statement reused.
    pub fn transaction(
        &self,
        stmts: Vec<RemoteStatement>,
        timeout: Duration,
    ) -> Result<Vec<Vec<Vec<Option<String>>>>, RemoteError> {
        if stmts.is_empty() {
            return Ok(Vec::new());
        }
        self.call(Work::Transaction(stmts), timeout)
    }

    /// Run one statement outside an explicit transaction and return its rows as text
    /// (use simple-query or text-typed results: every column as its text output, NULL as None).
    ///
    /// The statement runs on its own (autocommit); parameters and result columns follow the
    /// rules of [`RemoteStatement`]. `timeout` bounds the call and is the statement's remote
    /// `statement_timeout`.
    pub fn query(
        &self,
        sql: &str,
        params: Vec<Option<String>>,
        timeout: Duration,
    ) -> Result<Vec<Vec<Option<String>>>, RemoteError> {
        let statement = RemoteStatement {
            sql: sql.to_string(),
            params,
        };
        let mut results = self.call(Work::Query(statement), timeout)?;
        Ok(results.pop().unwrap_or_default())
    }

    /// True if the thread currently holds an open connection (for the view).
    ///
    /// A connection the server closed while idle counts as open until the next request
    /// notices.
    pub fn connected(&self) -> bool {
        let state = lock(&self.state);
        state
            .worker
            .as_ref()
            .is_some_and(|w| w.shared.connected.load(Ordering::SeqCst))
    }

    /// Send a request to the sink thread and wait for its reply.
    fn call(&self, work: Work, timeout: Duration) -> Result<Vec<Rows>, RemoteError> {
        let mut state = lock(&self.state);
        state.retired.retain(|h| !h.is_finished());
        state.next_seq += 1;
        let seq = state.next_seq;
        let mut request = Request { seq, work, timeout };
        for _ in 0..2 {
            let dead = state.worker.as_ref().is_none_or(|w| w.handle.is_finished());
            if dead {
                if let Some(old) = state.worker.take() {
                    let _ = old.handle.join(); // finished: returns at once
                }
                let worker = spawn_worker(&self.conninfo, &self.application_name).map_err(|e| {
                    RemoteError::transient(format!("could not start the remote sink thread: {e}"))
                })?;
                state.worker = Some(worker);
            }
            let Some(worker) = state.worker.as_ref() else {
                break;
            };
            while worker.replies.try_recv().is_ok() {} // replies to abandoned requests
            match worker.requests.try_send(request) {
                Ok(()) => return wait_for_reply(worker, seq, timeout),
                Err(TrySendError::Disconnected(r)) => {
                    // The thread exited (it should not): start another one.
                    request = r;
                    if let Some(old) = state.worker.take() {
                        state.retired.push(old.handle);
                    }
                }
                Err(TrySendError::Full(r)) => {
                    // Still busy with an abandoned request. If it has been stuck for long,
                    // leave that thread behind and start another one.
                    request = r;
                    if !is_stuck(&worker.shared) || state.retired.len() >= MAX_RETIRED {
                        return Err(RemoteError::transient(
                            "the remote sink is still busy with an earlier request that did not \
                             finish in time",
                        ));
                    }
                    if let Some(old) = state.worker.take() {
                        retire(&old);
                        state.retired.push(old.handle);
                    }
                }
            }
        }
        Err(RemoteError::transient(
            "the remote sink thread is not running",
        ))
    }

    /// Stop the sink thread: tell it to stop, cancel what it runs, wait up to `wait` for it
    /// to exit. True if it exited (or none was running); false if it was left detached (it
    /// exits by itself once its blocked network call returns).
    fn shutdown(&mut self, wait: Duration) -> bool {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        let Some(worker) = state.worker.take() else {
            return true;
        };
        retire(&worker);
        let Worker {
            requests,
            replies,
            handle,
            ..
        } = worker;
        drop(requests); // wakes the thread if idle
        let deadline = Instant::now() + wait;
        while !handle.is_finished() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        drop(replies);
        if handle.is_finished() {
            let _ = handle.join();
            true
        } else {
            false
        }
    }
}

impl Drop for RemoteSink {
    /// Tell the thread to stop, cancel its in-flight statement, join it (waiting at most
    /// [`STOP_WAIT`]; a thread blocked in network I/O is detached and exits on its own).
    fn drop(&mut self) {
        self.shutdown(STOP_WAIT);
    }
}

/// True if the worker's in-flight request was abandoned more than [`STUCK_AFTER`] ago.
fn is_stuck(shared: &Shared) -> bool {
    let ctl = lock(&shared.ctl);
    ctl.inflight.is_some_and(|s| s <= ctl.abandoned)
        && ctl
            .abandoned_at
            .is_some_and(|at| at.elapsed() >= STUCK_AFTER)
}

/// Tell a sink thread to exit after its current request, cancelling that request.
fn retire(worker: &Worker) {
    worker.shared.stop.store(true, Ordering::SeqCst);
    let mut ctl = lock(&worker.shared.ctl);
    if let Some(seq) = ctl.inflight {
        ctl.abandoned = ctl.abandoned.max(seq);
        if let Some(canceller) = ctl.cancel.clone() {
            ctl.cancel_fired = true;
            spawn_cancel(canceller);
        }
    }
}

/// Wait for the reply to `seq`, discarding stale replies; on timeout, abandon the request.
fn wait_for_reply(worker: &Worker, seq: u64, timeout: Duration) -> Result<Vec<Rows>, RemoteError> {
    if let Some(reply) = receive(worker, seq, timeout) {
        return reply;
    }
    let mut ctl = lock(&worker.shared.ctl);
    // The reply may have been sent just before we took the lock.
    if let Some(reply) = receive(worker, seq, Duration::ZERO) {
        return reply;
    }
    if ctl.inflight == Some(seq) && ctl.committing {
        // COMMIT is on its way: abandoning now would not undo it. Wait for the outcome.
        drop(ctl);
        if let Some(reply) = receive(worker, seq, timeout) {
            return reply;
        }
        let mut ctl = lock(&worker.shared.ctl);
        if let Some(reply) = receive(worker, seq, Duration::ZERO) {
            return reply;
        }
        abandon(&mut ctl, seq);
        return Err(RemoteError::transient(format!(
            "the remote did not confirm COMMIT within {}; the outcome of the transaction is unknown",
            fmt_duration(timeout.saturating_mul(2))
        )));
    }
    abandon(&mut ctl, seq);
    Err(RemoteError::transient(format!(
        "the remote did not answer within {}",
        fmt_duration(timeout)
    )))
}

/// Give up on request `seq` (lock held): the sink thread will skip it if not started, roll
/// it back and drop the connection if running; its statement is cancelled.
fn abandon(ctl: &mut Control, seq: u64) {
    ctl.abandoned = ctl.abandoned.max(seq);
    if ctl.inflight == Some(seq) {
        ctl.abandoned_at = Some(Instant::now());
        if let Some(canceller) = ctl.cancel.clone() {
            ctl.cancel_fired = true;
            spawn_cancel(canceller);
        }
    }
}

/// Wait up to `wait` for the reply to `seq`; `None` on timeout. A vanished sink thread
/// yields an error reply. The wait is cut into [`WAIT_SLICE`]s with the [`WaitCheck`] between
/// them, which may end it (and the transaction, or the process) with an interrupt; a zero `wait`
/// (called with the control lock held) never reaches the check.
fn receive(worker: &Worker, seq: u64, wait: Duration) -> Option<Result<Vec<Rows>, RemoteError>> {
    let deadline = Instant::now().checked_add(wait);
    loop {
        let slice = deadline.map_or(WAIT_SLICE, |d| {
            d.saturating_duration_since(Instant::now()).min(WAIT_SLICE)
        });
        match worker.replies.recv_timeout(slice) {
            Ok(reply) if reply.seq == seq => return Some(reply.result),
            Ok(_) => continue, // a late reply to an abandoned request
            Err(RecvTimeoutError::Timeout) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return None;
                }
                if let Some(check) = WAIT_CHECK.get() {
                    check(&mut || abandon(&mut lock(&worker.shared.ctl), seq));
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Some(Err(RemoteError::transient(
                    "the remote sink thread stopped unexpectedly",
                )))
            }
        }
    }
}

/// A duration for messages: "1.5 s", "250 ms".
fn fmt_duration(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

// ---------------------------------------------------------------------------------------------
// The sink thread
// ---------------------------------------------------------------------------------------------

/// Block every signal in the calling thread (Linux), so that PostgreSQL's signal handlers
/// (SIGTERM, SIGUSR1, SIGALRM, ...) run on the backend's main thread only. Threads created
/// by this one (the client's DNS helper threads) inherit the mask.
#[cfg(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "x86",
        target_arch = "arm",
        target_arch = "riscv64"
    )
))]
fn block_signals() {
    /// glibc's and musl's `sigset_t` (1024 bits).
    #[repr(C)]
    struct SigSet([u64; 16]);
    extern "C" {
        fn sigfillset(set: *mut SigSet) -> i32;
        fn pthread_sigmask(how: i32, set: *const SigSet, old: *mut SigSet) -> i32;
    }
    /// `SIG_BLOCK` on these architectures.
    const SIG_BLOCK: i32 = 0;
    let mut set = SigSet([0; 16]);
    // SAFETY: `set` is a valid, writable sigset_t-sized buffer; a null `old` is allowed.
    unsafe {
        sigfillset(&mut set);
        pthread_sigmask(SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Elsewhere signals are left as they are.
#[cfg(not(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "x86",
        target_arch = "arm",
        target_arch = "riscv64"
    )
)))]
fn block_signals() {}

/// The sink thread's connection and the statements prepared on it.
struct Conn {
    /// The client.
    client: Client,
    /// Prepared statements by (parameter count, SQL).
    statements: HashMap<(usize, String), Statement>,
}

impl Conn {
    /// False if the client already knows the connection is closed. (A connection the server
    /// closed while idle is only noticed on the next round trip: the request prelude, which
    /// is retried once on a fresh connection. Polling the socket here would need a reactor
    /// turn, which costs about 1 ms per request with this client.)
    fn alive(&self) -> bool {
        !self.client.is_closed()
    }

    /// The prepared statement for `sql` with `n` text parameters.
    fn prepare(&mut self, sql: &str, n: usize) -> Result<Statement, postgres::Error> {
        let key = (n, sql.to_string());
        if let Some(statement) = self.statements.get(&key) {
            return Ok(statement.clone());
        }
        let types = vec![Type::TEXT; n];
        let statement = self.client.prepare_typed(sql, &types)?;
        if self.statements.len() >= STATEMENT_CACHE_MAX {
            self.statements.clear();
        }
        self.statements.insert(key, statement.clone());
        Ok(statement)
    }
}

/// A statement failure, and whether the connection is still usable after it.
struct StatementError {
    /// The error.
    error: RemoteError,
    /// False if the connection must be dropped.
    connection_ok: bool,
}

/// Run one statement on `conn` and read its rows.
fn run_statement(conn: &mut Conn, stmt: &RemoteStatement) -> Result<Rows, StatementError> {
    let pg_error = |e: postgres::Error| StatementError {
        connection_ok: e.as_db_error().is_some(),
        error: RemoteError::from_pg(&e),
    };
    let statement = conn
        .prepare(&stmt.sql, stmt.params.len())
        .map_err(pg_error)?;
    check_columns(&statement).map_err(|error| StatementError {
        error,
        connection_ok: true,
    })?;
    let values: Vec<Option<&str>> = stmt.params.iter().map(Option::as_deref).collect();
    let params: Vec<&(dyn ToSql + Sync)> =
        values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
    let rows = conn.client.query(&statement, &params).map_err(pg_error)?;
    rows_as_text(&rows).map_err(|error| StatementError {
        error,
        connection_ok: true,
    })
}

/// Drop the connection (if any) and record that there is none.
fn discard(conn: &mut Option<Conn>, shared: &Shared) {
    if conn.take().is_some() {
        lock(&shared.ctl).cancel = None;
        shared.connected.store(false, Ordering::SeqCst);
    }
}

/// Roll back the open transaction; drop the connection if that fails or is unsafe.
fn roll_back(conn: &mut Option<Conn>, shared: &Shared, connection_ok: bool) {
    let ok = connection_ok
        && conn.as_mut().is_some_and(|c| {
            c.statements.clear();
            c.client.batch_execute("ROLLBACK").is_ok()
        });
    if !ok {
        discard(conn, shared);
    }
}

/// The error of a failed connection attempt: a certificate that did not verify, another TLS
/// failure, or the client's or server's error.
fn connect_error(
    e: &postgres::Error,
    target: &Target,
    failure: &Mutex<Option<VerifyFailure>>,
) -> RemoteError {
    if e.as_db_error().is_none() && e.to_string().starts_with("error performing TLS handshake") {
        if let Some(f) = lock(failure).take() {
            return f.error(&target.tls);
        }
        return tls::handshake_error(e, &target.tls);
    }
    let mut error = RemoteError::from_pg(e);
    if let Some(cause) = error.message.strip_prefix("error connecting to server: ") {
        error.message = cause.to_string();
    }
    error.context("could not connect to the remote server")
}

/// Open a connection as the TLS options say. `allow` tries clear text first and TLS when the
/// server refuses that (libpq's order); the other modes make one attempt, with the client's
/// `sslmode` (`prefer` falls back to clear text only if the server does not support TLS).
/// Returns the client and the TLS connector it used, if any (for cancel requests).
fn connect(target: &Target) -> Result<(Client, Option<MakeTlsConnector>), RemoteError> {
    let failure = Arc::new(Mutex::new(None));
    let attempt = |config: &Config, tls: Option<&MakeTlsConnector>| match tls {
        Some(tls) => config.connect(tls.clone()),
        None => config.connect(NoTls),
    };
    match target.tls.mode {
        tls::SslMode::Disable => attempt(&target.config, None)
            .map(|c| (c, None))
            .map_err(|e| connect_error(&e, target, &failure)),
        tls::SslMode::Allow => match attempt(&target.config, None) {
            Ok(client) => Ok((client, None)),
            Err(e) if e.as_db_error().is_some() => {
                let connector = target.tls.connector(&failure)?;
                let mut config = target.config.clone();
                config.ssl_mode(SslMode::Require);
                attempt(&config, Some(&connector))
                    .map(|c| (c, Some(connector)))
                    .map_err(|e| connect_error(&e, target, &failure))
            }
            Err(e) => Err(connect_error(&e, target, &failure)),
        },
        _ => {
            let connector = target.tls.connector(&failure)?;
            attempt(&target.config, Some(&connector))
                .map(|c| (c, Some(connector)))
                .map_err(|e| connect_error(&e, target, &failure))
        }
    }
}

/// Make sure `conn` holds a live connection; true if it was just opened.
fn ensure_connected(
    target: &Target,
    conn: &mut Option<Conn>,
    shared: &Shared,
) -> Result<bool, RemoteError> {
    if let Some(c) = conn.as_ref() {
        if c.alive() {
            return Ok(false);
        }
        discard(conn, shared);
    }
    let (client, tls) = connect(target)?;
    lock(&shared.ctl).cancel = Some(Canceller {
        token: client.cancel_token(),
        tls,
    });
    shared.connected.store(true, Ordering::SeqCst);
    *conn = Some(Conn {
        client,
        statements: HashMap::new(),
    });
    Ok(true)
}

/// True if the main thread has given up on request `seq`.
fn is_abandoned(shared: &Shared, seq: u64) -> bool {
    lock(&shared.ctl).abandoned >= seq
}

/// The error a request abandoned mid-way returns (the main thread discards it).
fn abandoned_error() -> RemoteError {
    RemoteError::transient("request abandoned after the caller's timeout")
}

/// Execute one request. `sent` is set once anything was sent on the connection.
fn run_request(
    target: &Target,
    conn: &mut Option<Conn>,
    request: &Request,
    shared: &Shared,
    sent: &mut bool,
) -> Result<Vec<Rows>, RemoteError> {
    let timeout_ms = request.timeout.as_millis().clamp(1, i32::MAX as u128);
    let prelude = match request.work {
        Work::Transaction(_) => format!("BEGIN; SET LOCAL statement_timeout = {timeout_ms}"),
        Work::Query(_) => format!("SET statement_timeout = {timeout_ms}"),
    };
    // Connect (or reuse), then run the prelude. A reused connection that turns out to be
    // dead on this first round trip has executed nothing: retry once on a fresh one.
    let mut retried = false;
    loop {
        let fresh = ensure_connected(target, conn, shared)?;
        if is_abandoned(shared, request.seq) {
            return Err(abandoned_error());
        }
        let Some(c) = conn.as_mut() else {
            return Err(RemoteError::transient("no remote connection")); // unreachable
        };
        *sent = true;
        match c.client.batch_execute(&prelude) {
            Ok(()) => break,
            Err(e) => {
                discard(conn, shared);
                if !retried && !fresh && connection_lost(&e) {
                    retried = true;
                    continue;
                }
                return Err(RemoteError::from_pg(&e));
            }
        }
    }
    let Some(c) = conn.as_mut() else {
        return Err(RemoteError::transient("no remote connection")); // unreachable
    };
    match &request.work {
        Work::Query(stmt) => match run_statement(c, stmt) {
            Ok(rows) => Ok(vec![rows]),
            Err(StatementError {
                error,
                connection_ok,
            }) => {
                c.statements.clear();
                if !connection_ok {
                    discard(conn, shared);
                }
                Err(error)
            }
        },
        Work::Transaction(stmts) => {
            let mut results = Vec::with_capacity(stmts.len());
            for stmt in stmts {
                if is_abandoned(shared, request.seq) {
                    discard(conn, shared); // rolls back; a cancel may be on its way
                    return Err(abandoned_error());
                }
                let Some(c) = conn.as_mut() else {
                    return Err(RemoteError::transient("no remote connection")); // unreachable
                };
                match run_statement(c, stmt) {
                    Ok(rows) => results.push(rows),
                    Err(StatementError {
                        error,
                        connection_ok,
                    }) => {
                        roll_back(conn, shared, connection_ok);
                        return Err(error);
                    }
                }
            }
            {
                let mut ctl = lock(&shared.ctl);
                if ctl.abandoned >= request.seq {
                    drop(ctl);
                    discard(conn, shared);
                    return Err(abandoned_error());
                }
                ctl.committing = true;
            }
            let Some(c) = conn.as_mut() else {
                return Err(RemoteError::transient("no remote connection")); // unreachable
            };
            match c.client.batch_execute("COMMIT") {
                Ok(()) => Ok(results),
                Err(e) if e.as_db_error().is_some() => {
                    // The server refused the commit (deferred constraint, serialization
                    // failure...) and rolled back; the session is usable.
                    c.statements.clear();
                    Err(RemoteError::from_pg(&e))
                }
                Err(e) => {
                    discard(conn, shared);
                    Err(RemoteError::from_pg(&e).context(
                        "connection lost during COMMIT; the outcome of the remote transaction is unknown",
                    ))
                }
            }
        }
    }
}

/// Text of a panic payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// The sink thread: serve requests until the request channel closes or `stop` is set.
fn sink_thread(
    conninfo: &str,
    application_name: &str,
    requests: Receiver<Request>,
    replies: Sender<Reply>,
    shared: &Shared,
) {
    block_signals();
    let target = catch_unwind(AssertUnwindSafe(|| {
        build_config(conninfo, application_name)
    }))
    .unwrap_or_else(|p| {
        Err(RemoteError::permanent(format!(
            "internal error parsing the remote connection string: {}",
            panic_text(p.as_ref())
        )))
    });
    let mut conn: Option<Conn> = None;
    while let Ok(request) = requests.recv() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        {
            let mut ctl = lock(&shared.ctl);
            if request.seq <= ctl.abandoned {
                continue; // timed out while queued
            }
            ctl.inflight = Some(request.seq);
            ctl.committing = false;
            ctl.cancel_fired = false;
            ctl.abandoned_at = None;
        }
        let mut sent = false;
        let result = match &target {
            Err(e) => Err(e.clone()),
            Ok(target) => catch_unwind(AssertUnwindSafe(|| {
                run_request(target, &mut conn, &request, shared, &mut sent)
            }))
            .unwrap_or_else(|p| {
                let _ = catch_unwind(AssertUnwindSafe(|| discard(&mut conn, shared)));
                Err(RemoteError::permanent(format!(
                    "internal error in the remote sink: {}",
                    panic_text(p.as_ref())
                )))
            }),
        };
        let doomed = {
            let mut ctl = lock(&shared.ctl);
            let abandoned = ctl.abandoned >= request.seq;
            let doomed = if ctl.cancel_fired || (abandoned && sent) {
                ctl.cancel = None;
                shared.connected.store(false, Ordering::SeqCst);
                conn.take()
            } else {
                None
            };
            ctl.inflight = None;
            ctl.committing = false;
            ctl.cancel_fired = false;
            ctl.abandoned_at = None;
            let _ = replies.send(Reply {
                seq: request.seq,
                result,
            });
            doomed
        };
        // Close outside the lock (sends Terminate; may wait for the network).
        let _ = catch_unwind(AssertUnwindSafe(|| drop(doomed)));
    }
    let _ = catch_unwind(AssertUnwindSafe(|| discard(&mut conn, shared)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn conninfo_quotes_values() {
        let s = conninfo_from_options(&opts(&[
            ("host", "db.example.com"),
            ("port", "5433"),
            ("password", r"it's a \secret"),
            ("dbname", ""),
            ("user", "a b"),
        ]));
        assert_eq!(
            s,
            r"host='db.example.com' port='5433' password='it\'s a \\secret' dbname='' user='a b'"
        );
        let parsed = parse_conninfo(&s).unwrap();
        assert_eq!(
            parsed,
            opts(&[
                ("host", "db.example.com"),
                ("port", "5433"),
                ("password", r"it's a \secret"),
                ("dbname", ""),
                ("user", "a b"),
            ])
        );
        // The client's own parser reads the same values.
        let config = Config::from_str(&s).unwrap();
        assert_eq!(config.get_password(), Some(r"it's a \secret".as_bytes()));
        assert_eq!(config.get_user(), Some("a b"));
        assert_eq!(config.get_dbname(), Some(""));
    }

    #[test]
    fn conninfo_drops_fdw_only_options_and_dedupes() {
        let s = conninfo_from_options(&opts(&[
            ("host", "h1"),
            ("use_remote_estimate", "true"),
            ("fetch_size", "1000"),
            ("updatable", "false"),
            ("truncatable", "false"),
            ("extensions", "hstore"),
            ("async_capable", "true"),
            ("batch_size", "10"),
            ("keep_connections", "on"),
            ("parallel_commit", "on"),
            ("password_required", "false"),
            ("user", "server_user"),
            ("sslmode", "disable"),
            ("user", "mapped_user"),
            ("password", "pw"),
        ]));
        assert_eq!(
            s,
            "host='h1' user='mapped_user' sslmode='disable' password='pw'"
        );
        assert_eq!(conninfo_from_options(&[]), "");
    }

    #[test]
    fn parse_conninfo_accepts_libpq_syntax() {
        assert_eq!(
            parse_conninfo("  host = h  port=5432 password='a\\'b c' x=\\ y ").unwrap(),
            opts(&[
                ("host", "h"),
                ("port", "5432"),
                ("password", "a'b c"),
                ("x", " y")
            ])
        );
        assert!(parse_conninfo("host").is_err());
        assert!(parse_conninfo("host=").is_err());
        assert!(parse_conninfo("password='abc").is_err());
        assert_eq!(parse_conninfo("").unwrap(), vec![]);
    }

    #[test]
    fn build_config_applies_defaults_and_takes_tls_options() {
        let t = build_config(
            "host=h dbname=d user=u keepalives_count=7 sslmode=prefer",
            "app",
        )
        .unwrap();
        let c = &t.config;
        assert_eq!(c.get_connect_timeout(), Some(&DEFAULT_CONNECT_TIMEOUT));
        assert!(c.get_keepalives());
        assert_eq!(c.get_keepalives_idle(), DEFAULT_KEEPALIVES_IDLE);
        assert_eq!(c.get_keepalives_retries(), Some(7));
        assert_eq!(c.get_tcp_user_timeout(), Some(&DEFAULT_TCP_USER_TIMEOUT));
        assert_eq!(c.get_application_name(), Some("app"));
        assert_eq!(c.get_ssl_mode(), SslMode::Prefer);
        assert_eq!(t.tls.mode, tls::SslMode::Prefer);

        let t = build_config(
            "host=h connect_timeout=9 keepalives_idle=11 application_name=mine sslrootcert=/x \
             client_encoding=UTF8 host=h2",
            "",
        )
        .unwrap();
        let c = &t.config;
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(9)));
        assert_eq!(c.get_keepalives_idle(), Duration::from_secs(11));
        assert_eq!(c.get_application_name(), Some("mine"));
        assert_eq!(c.get_hosts().len(), 1, "last host wins");
        assert_eq!(t.tls.mode, tls::SslMode::Prefer, "libpq's default sslmode");

        // Every sslmode, and the client's mode for the first attempt.
        for (conninfo, mode, client) in [
            (
                "host=h sslmode=disable",
                tls::SslMode::Disable,
                SslMode::Disable,
            ),
            (
                "host=h sslmode=allow",
                tls::SslMode::Allow,
                SslMode::Disable,
            ),
            (
                "host=h sslmode=require",
                tls::SslMode::Require,
                SslMode::Require,
            ),
            (
                "host=h sslmode=verify-ca sslrootcert=/ca.crt",
                tls::SslMode::VerifyCa,
                SslMode::Require,
            ),
            (
                "host=h sslmode=verify-full sslcert=/c sslkey=/k",
                tls::SslMode::VerifyFull,
                SslMode::Require,
            ),
            (
                "host=h sslrootcert=system",
                tls::SslMode::VerifyFull,
                SslMode::Require,
            ),
            (
                "postgresql://h/db?sslmode=require",
                tls::SslMode::Require,
                SslMode::Require,
            ),
            // Unix-domain sockets never use TLS.
            (
                "host=/var/run/postgresql sslmode=verify-full",
                tls::SslMode::Disable,
                SslMode::Disable,
            ),
        ] {
            let t = build_config(conninfo, "a").unwrap_or_else(|e| panic!("{conninfo}: {e:?}"));
            assert_eq!(t.tls.mode, mode, "{conninfo}");
            assert_eq!(t.config.get_ssl_mode(), client, "{conninfo}");
        }
        // hostaddr alone: its address is the name for the handshake; verify-full refuses it.
        let t = build_config("hostaddr=127.0.0.1 sslmode=require", "a").unwrap();
        assert_eq!(t.config.get_hosts().len(), 1);
        let e = build_config("hostaddr=127.0.0.1 sslmode=verify-full", "a").unwrap_err();
        assert!(!e.transient && e.hint.is_some(), "{e:?}");

        for bad in [
            "host=h sslmode=bogus",
            "host=h sslmode=require sslrootcert=system",
            "host=h sslcertmode=require",
            "host=h ssl_min_protocol_version=TLSv9",
            "host=h service=foo",
            "host=h no_such_option=1",
            "host=h port=notanumber",
            "postgresql://h/db?sslmode=verify-full",
            "host='unterminated",
        ] {
            let e = build_config(bad, "app").unwrap_err();
            assert!(!e.transient, "{bad}: {e:?}");
        }
        let e = build_config("host=h sslmode=bogus", "a").unwrap_err();
        assert!(e.hint.is_some());
        assert!(build_config("postgresql://u@h:5433/db", "a").is_ok());
    }

    #[test]
    fn transient_classification() {
        for code in [
            None,
            Some("08000"),
            Some("08006"),
            Some("08001"),
            Some("57P01"),
            Some("57P02"),
            Some("57P03"),
            Some("40001"),
            Some("40P01"),
            Some("53300"),
            Some("57014"),
        ] {
            assert!(is_transient(code), "{code:?}");
        }
        for code in [
            "42P01", "23505", "42501", "28P01", "3D000", "22P02", "0A000", "42601",
        ] {
            assert!(!is_transient(Some(code)), "{code}");
        }
        assert!(is_stale_plan(
            "0A000",
            "cached plan must not change result type"
        ));
        assert!(!is_stale_plan("0A000", "something else"));
        assert!(is_client_side_permanent("invalid configuration"));
        assert!(is_client_side_permanent("error serializing parameter 0"));
        assert!(!is_client_side_permanent("error connecting to server"));
        assert!(!is_client_side_permanent("connection closed"));
        assert!(!is_client_side_permanent(
            "error communicating with the server"
        ));
    }

    #[test]
    fn binary_values_render_as_postgres_text() {
        let uuid = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(
            text_of(&Type::UUID, &uuid).unwrap(),
            "12345678-9abc-def0-0123-456789abcdef"
        );
        assert_eq!(
            text_of(&Type::BYTEA, &[0xde, 0xad, 0x01]).unwrap(),
            "\\xdead01"
        );
        assert_eq!(
            text_of(&Type::JSONB, b"\x01{\"a\": 1}").unwrap(),
            "{\"a\": 1}"
        );
        assert_eq!(text_of(&Type::JSON, b"[1]").unwrap(), "[1]");
        assert_eq!(text_of(&Type::BOOL, &[1]).unwrap(), "t");
        assert_eq!(text_of(&Type::BOOL, &[0]).unwrap(), "f");
        assert_eq!(text_of(&Type::INT8, &(-5i64).to_be_bytes()).unwrap(), "-5");
        assert_eq!(text_of(&Type::INT2, &7i16.to_be_bytes()).unwrap(), "7");
        assert_eq!(
            text_of(&Type::PG_LSN, &0x0000_0001_0000_00A0u64.to_be_bytes()).unwrap(),
            "1/A0"
        );
        assert_eq!(text_of(&Type::TEXT, b"hi").unwrap(), "hi");
        assert!(readable(&Type::VARCHAR) && readable(&Type::NAME) && readable(&Type::OID));
        assert!(!readable(&Type::NUMERIC) && !readable(&Type::TIMESTAMPTZ));
    }

    #[test]
    fn closed_port_fails_fast_and_transient() {
        let mut sink = RemoteSink::start(
            "host=127.0.0.1 port=1 user=nobody dbname=nothing connect_timeout=3".into(),
            "tide-test",
        );
        let started = Instant::now();
        let e = sink
            .query("SELECT 1", vec![], Duration::from_secs(10))
            .unwrap_err();
        assert!(e.transient, "{e:?}");
        assert!(e.sqlstate.is_none());
        assert!(e.message.contains("could not connect"), "{}", e.message);
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        let e = sink
            .transaction(
                vec![RemoteStatement {
                    sql: "SELECT 1".into(),
                    params: vec![],
                }],
                Duration::from_secs(10),
            )
            .unwrap_err();
        assert!(e.transient);
        assert!(!sink.connected());
        let started = Instant::now();
        assert!(sink.shutdown(STOP_WAIT), "the sink thread did not exit");
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn bad_conninfo_is_reported_by_the_first_request() {
        let sink = RemoteSink::start("host=h sslmode=verify-fully".into(), "tide-test");
        let e = sink
            .query("SELECT 1", vec![], Duration::from_secs(5))
            .unwrap_err();
        assert!(!e.transient);
        assert!(e.message.contains("sslmode"), "{}", e.message);
    }

    #[test]
    fn unreadable_tls_file_is_reported_before_connecting() {
        // Port 1: nothing listens; the root certificate is read first and fails.
        let sink = RemoteSink::start(
            "host=127.0.0.1 port=1 sslmode=verify-ca sslrootcert=/nonexistent/ca.crt".into(),
            "tide-test",
        );
        let e = sink
            .query("SELECT 1", vec![], Duration::from_secs(5))
            .unwrap_err();
        assert!(!e.transient, "{e:?}");
        assert!(e.message.contains("/nonexistent/ca.crt"), "{}", e.message);
        assert!(
            e.hint
                .as_deref()
                .is_some_and(|h| h.contains("operating system user")),
            "{e:?}"
        );
    }

    #[test]
    fn unresponsive_server_times_out_without_blocking_the_caller() {
        // A listener that accepts TCP connections but never speaks the protocol.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let sink = RemoteSink::start(
            format!("host=127.0.0.1 port={port} user=u dbname=d sslmode=disable"),
            "tide-test",
        );
        let started = Instant::now();
        let e = sink
            .query("SELECT 1", vec![], Duration::from_millis(300))
            .unwrap_err();
        assert!(e.transient && e.message.contains("did not answer"), "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(1));
        // The thread is stuck in the startup handshake: the next request is queued and times
        // out, the one after fails at once as busy; nothing blocks the caller.
        let e = sink
            .query("SELECT 1", vec![], Duration::from_millis(100))
            .unwrap_err();
        assert!(e.transient, "{e:?}");
        let started = Instant::now();
        let e = sink
            .query("SELECT 1", vec![], Duration::from_millis(100))
            .unwrap_err();
        assert!(e.transient && e.message.contains("busy"), "{e:?}");
        assert!(started.elapsed() < Duration::from_millis(50));
        // Closing the listener breaks the hung connection; the thread then exits on drop.
        drop(listener);
        let started = Instant::now();
        drop(sink);
        assert!(started.elapsed() <= STOP_WAIT + Duration::from_millis(500));
    }

    /// The conninfo of a scratch server for the integration tests (`scripts/test.sh pgrx` starts
    /// one and sets it; without it these tests fail, they are not skipped).
    fn test_conninfo() -> String {
        match std::env::var("TIDE_REMOTE_TEST_CONNINFO") {
            Ok(s) if !s.is_empty() => s,
            _ => panic!(
                "cannot run: TIDE_REMOTE_TEST_CONNINFO is not set; scripts/test.sh pgrx sets it (e.g. \
                 'host=127.0.0.1 port=55999 user=postgres dbname=postgres sslmode=disable') \
                 to run the remote sink integration tests"
            ),
        }
    }

    fn stmt(sql: &str, params: &[Option<&str>]) -> RemoteStatement {
        RemoteStatement {
            sql: sql.to_string(),
            params: params.iter().map(|p| p.map(str::to_string)).collect(),
        }
    }

    const T: Duration = Duration::from_secs(10);

    #[test]
    fn remote_transactions_commit_and_roll_back() {
        let ci = test_conninfo();
        let sink = RemoteSink::start(ci, "tide-test-tx");
        sink.query("DROP TABLE IF EXISTS tide_sink_t", vec![], T)
            .unwrap();
        sink.query(
            "CREATE TABLE tide_sink_t (id int PRIMARY KEY, doc jsonb, note text)",
            vec![],
            T,
        )
        .unwrap();
        assert!(sink.connected());
        // Commit, with array parameters and RETURNING.
        let out = sink
            .transaction(
                vec![
                    stmt(
                        "INSERT INTO tide_sink_t SELECT * FROM unnest($1::int[], $2::jsonb[], \
                         $3::text[]) RETURNING id::text, doc, note",
                        &[
                            Some("{1,2}"),
                            Some(r#"{"{\"a\": 1}","{\"b\": \"x y\"}"}"#),
                            Some("{NULL,it's}"),
                        ],
                    ),
                    stmt(
                        "SELECT count(*), bool_and(id > 0), $1 FROM tide_sink_t",
                        &[None],
                    ),
                ],
                T,
            )
            .unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[0],
            vec![
                vec![Some("1".into()), Some(r#"{"a": 1}"#.into()), None],
                vec![
                    Some("2".into()),
                    Some(r#"{"b": "x y"}"#.into()),
                    Some("it's".into())
                ],
            ]
        );
        assert_eq!(out[1], vec![vec![Some("2".into()), Some("t".into()), None]]);
        // Rollback: the second statement fails, the first leaves nothing.
        let e = sink
            .transaction(
                vec![
                    stmt("INSERT INTO tide_sink_t VALUES (3, NULL, 'x')", &[]),
                    stmt("INSERT INTO tide_sink_t VALUES ($1::int)", &[Some("1")]),
                ],
                T,
            )
            .unwrap_err();
        assert!(!e.transient, "{e:?}");
        assert_eq!(e.sqlstate.as_deref(), Some("23505"));
        assert!(e.message.contains("detail"), "{}", e.message);
        let e = sink
            .transaction(
                vec![
                    stmt("INSERT INTO tide_sink_t VALUES (4)", &[]),
                    stmt("SELECT * FROM no_such_table", &[]),
                ],
                T,
            )
            .unwrap_err();
        assert_eq!(e.sqlstate.as_deref(), Some("42P01"));
        let rows = sink
            .query(
                "SELECT string_agg(id::text, ',' ORDER BY id) FROM tide_sink_t",
                vec![],
                T,
            )
            .unwrap();
        assert_eq!(rows, vec![vec![Some("1,2".into())]]);
        // Non-text columns are refused before running, without breaking the connection.
        let e = sink.query("SELECT 1.5::numeric", vec![], T).unwrap_err();
        assert!(!e.transient && e.hint.is_some(), "{e:?}");
        let rows = sink
            .query(
                "SELECT 1.5::numeric::text, '0/16B3748'::pg_lsn, 42::oid, NULL::int",
                vec![],
                T,
            )
            .unwrap();
        assert_eq!(
            rows,
            vec![vec![
                Some("1.5".into()),
                Some("0/16B3748".into()),
                Some("42".into()),
                None
            ]]
        );
        // A parameter typed by context must be cast.
        let e = sink
            .query("SELECT 1 WHERE 1 = $1", vec![Some("1".into())], T)
            .unwrap_err();
        assert_eq!(e.sqlstate.as_deref(), Some("42883"));
        sink.query("DROP TABLE tide_sink_t", vec![], T).unwrap();
    }

    #[test]
    fn remote_reconnects_after_terminate_backend() {
        let ci = test_conninfo();
        let sink = RemoteSink::start(ci.clone(), "tide-test-term");
        let pid = sink
            .query("SELECT pg_backend_pid()::text", vec![], T)
            .unwrap();
        let admin = RemoteSink::start(ci, "tide-test-admin");
        let killed = admin
            .query(
                "SELECT pg_terminate_backend($1::int)",
                vec![pid[0][0].clone()],
                T,
            )
            .unwrap();
        assert_eq!(killed, vec![vec![Some("t".into())]]);
        thread::sleep(Duration::from_millis(200));
        // The dead connection is noticed before use and replaced: no error at all.
        let pid2 = sink
            .query("SELECT pg_backend_pid()::text", vec![], T)
            .unwrap();
        assert_ne!(pid, pid2);
        let out = sink
            .transaction(vec![stmt("SELECT $1", &[Some("ok")])], T)
            .unwrap();
        assert_eq!(out, vec![vec![vec![Some("ok".into())]]]);
        // Terminated in the middle of a transaction: transient error, then success.
        let pid3 = pid2[0][0].clone();
        let killer = thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            admin.query("SELECT pg_terminate_backend($1::int)", vec![pid3], T)
        });
        let e = sink
            .transaction(vec![stmt("SELECT pg_sleep(2)::text", &[])], T)
            .unwrap_err();
        assert!(e.transient, "{e:?}");
        killer.join().unwrap().unwrap();
        assert!(!sink.connected());
        assert!(sink.query("SELECT 1::text", vec![], T).is_ok());
    }

    #[test]
    fn remote_timeouts_abandon_and_roll_back() {
        let ci = test_conninfo();
        let sink = RemoteSink::start(ci, "tide-test-timeout");
        sink.query("DROP TABLE IF EXISTS tide_sink_to", vec![], T)
            .unwrap();
        sink.query("CREATE TABLE tide_sink_to (id int)", vec![], T)
            .unwrap();
        // A slow query: the caller gets a transient error on time.
        let started = Instant::now();
        let e = sink
            .query(
                "SELECT pg_sleep(5)::text",
                vec![],
                Duration::from_millis(300),
            )
            .unwrap_err();
        assert!(e.transient, "{e:?}");
        assert!(
            started.elapsed() < Duration::from_millis(800),
            "{:?}",
            started.elapsed()
        );
        // The next request gets its own answer, not the stale one.
        let rows = sink.query("SELECT 'fresh'", vec![], T).unwrap();
        assert_eq!(rows, vec![vec![Some("fresh".into())]]);
        // A transaction abandoned after its insert is rolled back.
        let e = sink
            .transaction(
                vec![
                    stmt("INSERT INTO tide_sink_to VALUES (1)", &[]),
                    stmt("SELECT pg_sleep(5)::text", &[]),
                ],
                Duration::from_millis(300),
            )
            .unwrap_err();
        assert!(e.transient, "{e:?}");
        let rows = sink
            .query("SELECT count(*) FROM tide_sink_to", vec![], T)
            .unwrap();
        assert_eq!(rows, vec![vec![Some("0".into())]]);
        // The statement_timeout is the caller's timeout.
        let rows = sink
            .query(
                "SHOW statement_timeout",
                vec![],
                Duration::from_millis(1500),
            )
            .unwrap();
        assert_eq!(rows, vec![vec![Some("1500ms".into())]]);
        sink.query("DROP TABLE tide_sink_to", vec![], T).unwrap();
    }
}
