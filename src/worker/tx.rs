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

/// Run `body` in its own transaction with a fresh snapshot. Commits on `Ok`, aborts on `Err`,
/// on a PostgreSQL ERROR or on a panic.
pub fn run<R>(body: impl FnOnce() -> Result<R, TideError>) -> Result<R, TideError> {
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let outcome = PgTryBuilder::new(std::panic::AssertUnwindSafe(body))
        .catch_others(|caught| Err(from_caught(caught)))
        .catch_rust_panic(|caught| Err(from_caught(caught)))
        .execute();
    unsafe {
        match outcome {
            Ok(v) => {
                pg_sys::PopActiveSnapshot();
                pg_sys::CommitTransactionCommand();
                Ok(v)
            }
            Err(e) => {
                pg_sys::MemoryContextSwitchTo(pg_sys::TopMemoryContext);
                pg_sys::FlushErrorState();
                pg_sys::AbortCurrentTransaction();
                Err(e)
            }
        }
    }
}

fn from_caught(caught: CaughtError) -> TideError {
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
