//! [`RemoteError`]: what can go wrong talking to a remote target, whether retrying can help,
//! and how client and server errors are told apart.

use super::*;

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
    /// An error this module raises itself with a SQLSTATE of its own ([`PASSWORD_REQUIRED`]);
    /// `sqlstate` is the server's. (Boxed: the error travels in every statement's result.)
    pub own: Option<Box<OwnCode>>,
}

/// The SQLSTATE and DETAIL of an error the remote sink raises itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnCode {
    /// Its SQLSTATE.
    pub sqlstate: &'static str,
    /// Its DETAIL (a server's DETAIL is in `message`).
    pub detail: String,
}

/// SQLSTATE of "password is required" (postgres_fdw's: `2F003`,
/// prohibited_sql_statement_attempted), raised when the remote let a connection that must use
/// its password in without asking for it.
pub const PASSWORD_REQUIRED: &str = "2F003";

/// SQLSTATE of "the target belongs to another writer" (object_in_use, `55006`), raised when a
/// [`RemoteStep::Fence`] statement found no row: the transaction was rolled back.
pub const FENCED: &str = "55006";

impl RemoteError {
    /// An error raised by this module that a retry may cure.
    pub(super) fn transient(message: impl Into<String>) -> Self {
        RemoteError {
            message: message.into(),
            sqlstate: None,
            hint: None,
            transient: true,
            own: None,
        }
    }

    /// An error raised by this module that needs a configuration or SQL change.
    pub(super) fn permanent(message: impl Into<String>) -> Self {
        RemoteError {
            message: message.into(),
            sqlstate: None,
            hint: None,
            transient: false,
            own: None,
        }
    }

    /// A [`RemoteStep::Fence`] that found no row (see [`FENCED`]).
    pub(super) fn fenced() -> Self {
        RemoteError {
            message: "the target's owner changed: this writer no longer owns it".to_string(),
            sqlstate: None,
            hint: None,
            transient: false,
            own: Some(Box::new(OwnCode {
                sqlstate: FENCED,
                detail: "the fencing check found another owner or epoch; the remote transaction was rolled back".to_string(),
            })),
        }
    }

    /// Whether this is [`RemoteError::fenced`].
    pub fn is_fenced(&self) -> bool {
        self.own.as_ref().is_some_and(|o| o.sqlstate == FENCED)
    }

    /// Attach a hint.
    pub(super) fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Translate a `postgres` client error, classifying it (see [`is_transient`]).
    pub(super) fn from_pg(e: &postgres::Error) -> Self {
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
                own: None,
            }
        } else {
            RemoteError {
                message: error_chain(e),
                sqlstate: None,
                hint: None,
                transient: !is_client_side_permanent(&e.to_string()),
                own: None,
            }
        }
    }

    /// Prefix the message with context.
    pub(super) fn context(mut self, what: &str) -> Self {
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
pub(super) fn is_stale_plan(code: &str, message: &str) -> bool {
    code == "0A000" && message.contains("cached plan must not change result type")
}

/// Client-side errors (no SQLSTATE) that a retry cannot cure, recognised by the `postgres`
/// crate's fixed description of the error kind (the `Display` of the top-level error).
pub(super) fn is_client_side_permanent(kind: &str) -> bool {
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
pub(super) fn connection_lost(e: &postgres::Error) -> bool {
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
pub(super) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
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
