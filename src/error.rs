//! One error type for pg_tide and its single mapping to SQLSTATE, hint and remedy.
//!
//! Every user-facing failure is a [`TideError`]: the SQL API raises it as an `ERROR` with a
//! specific SQLSTATE and a hint ([`TideError::raise`]); the worker records it, with the same
//! message and the hint as the remedy, in `tide.pipelines` and in the server log. Errors raised by
//! PostgreSQL itself inside a worker transaction are caught by the transaction helper and turned
//! into [`TideError::Postgres`], keeping their SQLSTATE.

use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgLogLevel;
use std::fmt;

/// A pg_tide failure: what happened, in words a DBA can act on.
#[derive(Debug, Clone)]
pub struct TideError {
    /// SQLSTATE reported to the client.
    pub code: PgSqlErrorCode,
    /// Primary message, lower case, no trailing period (PostgreSQL style).
    pub message: String,
    /// Optional detail.
    pub detail: Option<String>,
    /// What to do about it. Shown as the HINT and as the remedy in the views.
    pub hint: Option<String>,
    /// Set by the worker's target code: retrying cannot help until the user acts, so the
    /// pipeline is paused (disabled) with this error as its reason.
    pub pause_pipeline: bool,
    /// With `pause_pipeline`: source tables (relids) whose rows must be read again once the
    /// pipeline is resumed (the worker queues a backfill of each with the pause), because the
    /// user's fix cannot bring what the stream never carries (see `ShapePlan::adds_existing_values`).
    pub reread_after_resume: Vec<u32>,
    /// A transient condition: try the same thing again shortly (not a failure to record).
    pub retry: bool,
    /// Set by the worker's target code: the pipeline's slot can no longer be trusted (a remote
    /// target applied WAL this server never had, `target::table::fence`): the worker records it
    /// as lost, with the error's detail as the reason, and the pipeline resyncs (README,
    /// Concepts > Lost slots).
    pub slot_lost: bool,
}

pub type TideResult<T> = Result<T, TideError>;

impl TideError {
    pub fn new(code: PgSqlErrorCode, message: impl Into<String>) -> Self {
        TideError {
            code,
            message: message.into(),
            detail: None,
            hint: None,
            pause_pipeline: false,
            reread_after_resume: Vec::new(),
            retry: false,
            slot_lost: false,
        }
    }
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
    pub fn retry_later(mut self) -> Self {
        self.retry = true;
        self
    }
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Invalid argument value (22023).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, message)
    }
    /// Unknown object (42704).
    pub fn undefined(message: impl Into<String>) -> Self {
        Self::new(PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT, message)
    }
    /// Object already exists (42710).
    pub fn duplicate(message: impl Into<String>) -> Self {
        Self::new(PgSqlErrorCode::ERRCODE_DUPLICATE_OBJECT, message)
    }
    /// The server or object is not in the state this needs (55000).
    pub fn prerequisite(message: impl Into<String>) -> Self {
        Self::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            message,
        )
    }
    /// Wrong kind of object (42809).
    pub fn wrong_object(message: impl Into<String>) -> Self {
        Self::new(PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE, message)
    }
    /// Feature not supported (0A000).
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED, message)
    }
    /// Insufficient privilege (42501).
    pub fn privilege(message: impl Into<String>) -> Self {
        Self::new(PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE, message)
    }
    /// A configured limit is reached (53400).
    pub fn limit(message: impl Into<String>) -> Self {
        Self::new(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            message,
        )
    }
    /// pg_tide's own invariant broke (XX000). Never a user mistake.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, message)
    }

    /// The library is not in `shared_preload_libraries`.
    pub fn not_preloaded() -> Self {
        Self::prerequisite("pg_tide is not loaded through shared_preload_libraries")
            .detail("pg_tide runs a background worker, which PostgreSQL only starts for preloaded libraries.")
            .hint("Add pg_tide to shared_preload_libraries in postgresql.conf (ALTER SYSTEM SET shared_preload_libraries = 'pg_tide') and restart the server.")
    }

    /// The SQLSTATE as its five-character text, e.g. `55000`.
    pub fn sqlstate(&self) -> String {
        sqlstate_text(self.code)
    }

    /// Raise as an ERROR in the calling backend. Never returns.
    pub fn raise(self) -> ! {
        let mut report = ErrorReport::new(self.code, self.message, "pg_tide");
        if let Some(d) = self.detail {
            report = report.set_detail(d);
        }
        if let Some(h) = self.hint {
            report = report.set_hint(h);
        }
        report.report(PgLogLevel::ERROR);
        unreachable!("ereport(ERROR) returns control to PostgreSQL's error handler");
    }
}

impl fmt::Display for TideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(d) = &self.detail {
            write!(f, " ({d})")?;
        }
        Ok(())
    }
}

impl From<pgrx::spi::SpiError> for TideError {
    fn from(e: pgrx::spi::SpiError) -> Self {
        TideError::internal(format!("SPI failed: {e}"))
    }
}

/// Decode PostgreSQL's packed SQLSTATE into its five characters.
pub fn sqlstate_text(code: PgSqlErrorCode) -> String {
    let mut v = code as i32;
    let mut s = String::with_capacity(5);
    for _ in 0..5 {
        s.push((((v & 0x3F) as u8) + b'0') as char);
        v >>= 6;
    }
    s
}

/// Unwrap a result in a SQL-callable function: errors become ERRORs with their SQLSTATE.
pub trait OrRaise<T> {
    fn or_raise(self) -> T;
}

impl<T> OrRaise<T> for TideResult<T> {
    fn or_raise(self) -> T {
        match self {
            Ok(v) => v,
            Err(e) => e.raise(),
        }
    }
}
