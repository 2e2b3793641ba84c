//! The one way a pg_tide background worker runs a transaction.
//!
//! pgrx's `BackgroundWorker::transaction` neither aborts nor recovers when the body raises an
//! ERROR: the error unwinds out of the worker and kills it. [`run`] instead catches every ERROR
//! and Rust panic raised by the body, aborts the transaction (which also releases SPI, snapshots,
//! locks and a replication slot acquired by a decoding call), flushes the error state and returns
//! the failure as a [`TideError`] that keeps the original SQLSTATE, message, detail and hint.

use crate::error::TideError;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::PgTryBuilder;

// utils/timeout.h, which pgrx does not bind. `STATEMENT_TIMEOUT` is the fourth member of
// PostgreSQL 15's `TimeoutId` (StatementTimeoutHandler, registered for every backend by
// InitPostgres, cancels the running statement: SIGINT is StatementCancelHandler in a worker
// connected to a database).
const STATEMENT_TIMEOUT: std::ffi::c_int = 3;
unsafe extern "C-unwind" {
    fn enable_timeout_after(id: std::ffi::c_int, delay_ms: std::ffi::c_int);
    fn disable_timeout(id: std::ffi::c_int, keep_indicator: bool);
}

/// Cancel the current statement if it runs longer than `ms` (a statement timeout: SPI in a
/// background worker gets none from `statement_timeout`). Pair with [`disarm_timeout`].
pub fn arm_timeout(ms: i32) {
    // SAFETY: utils/timeout.h's enable_timeout_after (declared above) with STATEMENT_TIMEOUT,
    // registered by InitPostgres for every connected backend; main thread.
    unsafe { enable_timeout_after(STATEMENT_TIMEOUT, ms) }
}

/// Disarm [`arm_timeout`] (harmless when it is not armed).
pub fn disarm_timeout() {
    // SAFETY: utils/timeout.h's disable_timeout with the same timeout id; harmless when it is not
    // armed; main thread.
    unsafe { disable_timeout(STATEMENT_TIMEOUT, false) }
}

/// Run `body` in its own transaction with a fresh snapshot. Commits on `Ok`, aborts on `Err`,
/// on a PostgreSQL ERROR or on a panic.
pub fn run<R>(body: impl FnOnce() -> Result<R, TideError>) -> Result<R, TideError> {
    // SAFETY: a background worker's main thread, outside a transaction (run's contract): a
    // transaction and its snapshot are started here and `finish` ends both on every path.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    finish(body)
}

/// Run `body` outside a transaction (with no snapshot), turning a PostgreSQL ERROR or a panic
/// it raises into a [`TideError`] instead of letting it end the process. For calls that must
/// not be tied to a transaction's memory or resource owner (shared memory mapped for the
/// session, a queue's handle) and that can still fail: no space for a DSM segment, a message
/// too large to receive. Whatever `body` allocated before the error stays allocated (in the
/// memory context it was current in); the error state is flushed and the memory context
/// restored.
pub fn guard<R>(body: impl FnOnce() -> Result<R, TideError>) -> Result<R, TideError> {
    // SAFETY: reading and restoring the current memory context; flushing the error state that
    // a caught ERROR left (as the error recovery of a backend's main loop does).
    let cxt = unsafe { pg_sys::CurrentMemoryContext };
    let outcome = PgTryBuilder::new(std::panic::AssertUnwindSafe(body))
        .catch_others(|caught| Err(from_caught(caught)))
        .catch_rust_panic(|caught| Err(from_caught(caught)))
        .execute();
    if outcome.is_err() {
        // SAFETY: restores the memory context current before `body` and clears the caught ERROR's
        // state, as a backend's error recovery does; main thread.
        unsafe {
            pg_sys::MemoryContextSwitchTo(cxt);
            pg_sys::FlushErrorState();
        }
    }
    outcome
}

/// What [`run_locked`] did.
pub enum Locked<R> {
    /// The lock was taken before the snapshot, and `body` ran (and committed).
    Ran(R),
    /// Another transaction holds or waits for a conflicting lock (typically a table-rewriting
    /// `ALTER TABLE`, `TRUNCATE`, `VACUUM FULL` or `CLUSTER`); nothing ran.
    Busy,
}

/// Like [`run`], but the transaction takes `AccessShareLock` on `relid` **before** its
/// snapshot exists, and holds it to the end.
///
/// PostgreSQL's "MVCC caveat": after TRUNCATE or a table-rewriting DDL, the table looks empty to
/// a snapshot taken before the rewrite committed. A snapshot taken while the lock is held is
/// safe: a rewrite either committed before the lock was granted (locks are released after the
/// commit becomes visible, so the snapshot sees it) or waits for this transaction to end. The
/// lock is only tried (`ConditionalLockRelationOid`): when a rewrite holds or waits for ACCESS
/// EXCLUSIVE the worker does not wait behind it (the stream keeps flowing); the caller tries
/// again later.
pub fn run_locked<R>(
    relid: pg_sys::Oid,
    body: impl FnOnce() -> Result<R, TideError>,
) -> Result<Locked<R>, TideError> {
    // SAFETY: a background worker's main thread, outside a transaction: the transaction is aborted
    // here when the lock is not granted, else it and its snapshot are ended by `finish` on every
    // path.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        // Taking a lock needs no snapshot; acquiring it also processes the invalidations of a
        // rewrite that committed meanwhile, so the relcache sees the new relation file.
        if !pg_sys::ConditionalLockRelationOid(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) {
            pg_sys::AbortCurrentTransaction();
            return Ok(Locked::Busy);
        }
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    finish(body).map(Locked::Ran)
}

fn finish<R>(body: impl FnOnce() -> Result<R, TideError>) -> Result<R, TideError> {
    // Deferred trigger events an owner's writes queued fire as that owner before the commit,
    // never as the worker (see `security::as_owner_writing`).
    let body = || {
        let v = body()?;
        crate::security::fire_deferred()?;
        Ok(v)
    };
    let outcome = PgTryBuilder::new(std::panic::AssertUnwindSafe(body))
        .catch_others(|caught| Err(from_caught(caught)))
        .catch_rust_panic(|caught| Err(from_caught(caught)))
        .execute();
    // SAFETY: ends the transaction and snapshot run/run_locked started: commit after popping the
    // snapshot, or flush the caught ERROR and abort (from TopMemoryContext, as a backend's error
    // recovery does); main thread.
    unsafe {
        match outcome {
            Ok(v) => {
                pg_sys::PopActiveSnapshot();
                // A pipeline worker commits with its replication origin (worker::origin), and
                // PostgreSQL then records the origin's timestamp as the commit timestamp: make
                // it the real commit time, not 2000-01-01.
                if pg_sys::replorigin_session_origin
                    != pg_sys::InvalidRepOriginId as pg_sys::RepOriginId
                {
                    pg_sys::replorigin_session_origin_timestamp = pg_sys::GetCurrentTimestamp();
                }
                pg_sys::CommitTransactionCommand();
                Ok(v)
            }
            Err(e) => {
                crate::security::forget_deferred();
                // A chunk's statement timeout must not outlive the statement it guarded.
                disarm_timeout();
                pg_sys::MemoryContextSwitchTo(pg_sys::TopMemoryContext);
                pg_sys::FlushErrorState();
                pg_sys::AbortCurrentTransaction();
                Err(e)
            }
        }
    }
}

pub(crate) fn from_caught(caught: CaughtError) -> TideError {
    match caught {
        CaughtError::PostgresError(r)
        | CaughtError::ErrorReport(r)
        | CaughtError::RustPanic { ereport: r, .. } => {
            let mut e = TideError::new(r.sql_error_code(), r.message().to_string());
            e.detail = r.detail().map(str::to_string);
            e.hint = r.hint().map(str::to_string);
            e
        }
    }
}

/// Deterministic text output for every value a worker renders (stream and backfill alike, in the
/// worker and its reader), whatever the server's defaults, and the pinned `search_path` of a
/// session that runs as pg_tide. Also READ COMMITTED, whatever `default_transaction_isolation`
/// says: an iteration's statements that follow a decoded marker must see the catalog rows its
/// transaction committed after the iteration began. For this session; in a transaction.
pub(crate) fn output_settings() -> crate::error::TideResult<()> {
    crate::security::pin_search_path()?;
    crate::sql::text_rows(
        "SELECT pg_catalog.set_config('DateStyle', 'ISO, YMD', false), pg_catalog.set_config('IntervalStyle', 'postgres', false),
                pg_catalog.set_config('extra_float_digits', '1', false), pg_catalog.set_config('bytea_output', 'hex', false),
                pg_catalog.set_config('TimeZone', 'UTC', false),
                pg_catalog.set_config('default_transaction_isolation', 'read committed', false)",
        &[],
        1,
        false,
    )?;
    Ok(())
}
