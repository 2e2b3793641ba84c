//! The replication origin of a pipeline worker.
//!
//! Owns: marking every transaction a pipeline worker commits with the replication origin
//! `pg_tide_<pipeline>`, as PostgreSQL's apply worker marks its writes with its subscription's
//! origin. The output plugin drops changes carrying a `pg_tide_` origin (except to pg_tide's own
//! signal and marker tables), so what a table target writes is never decoded as a change by any
//! pipeline: loops between pipelines are impossible, and no slot spends time on pg_tide's own
//! writes.
//!
//! Commit timestamps (`track_commit_timestamp`) of the worker's transactions stay the real
//! commit times: `tx` sets the session's origin timestamp right before each commit (PostgreSQL
//! records that timestamp for transactions with an origin).
//!
//! Guarantees: the worker holds the origin only inside an iteration, after it has taken the
//! pipeline's lock and found the pipeline ([`acquire`] in the iteration's transaction,
//! [`release`] once it has ended, committed or not); if the process exits meanwhile, PostgreSQL
//! releases it. A worker waiting for the lock, sleeping or reading a chunk never holds it, so
//! `tide.drop_pipeline`, which holds the lock exclusively and waits for every worker it stopped
//! to exit, always finds the origin free to drop. The origin is created there too, so a worker
//! started for a pipeline being dropped never re-creates it.

use crate::error::{TideError, TideResult};
use pgrx::pg_sys;
use std::ffi::CString;

/// Every pg_tide origin's name starts with this.
pub const PREFIX: &str = "pg_tide_";

/// The origin of pipeline `pipeline`.
pub fn name(pipeline: &str) -> String {
    format!("{PREFIX}{pipeline}")
}

/// Create the pipeline's origin if needed and make it this session's: every transaction the
/// worker commits until [`release`] carries it. Run in a transaction, holding the pipeline's
/// lock.
pub fn acquire(pipeline: &str) -> TideResult<()> {
    let n = CString::new(name(pipeline))
        .map_err(|_| TideError::internal("pipeline name contains a NUL byte"))?;
    unsafe {
        if pg_sys::replorigin_session_origin != pg_sys::InvalidRepOriginId as pg_sys::RepOriginId {
            return Ok(());
        }
        let mut id = pg_sys::replorigin_by_name(n.as_ptr(), true);
        if id == pg_sys::InvalidRepOriginId as pg_sys::RepOriginId {
            id = pg_sys::replorigin_create(n.as_ptr());
        }
        crate::pgver::replorigin_session_setup(id);
        pg_sys::replorigin_session_origin = id;
    }
    Ok(())
}

/// Give the origin up (after the iteration's transaction has ended); a no-op when not held.
pub fn release() {
    unsafe {
        if pg_sys::replorigin_session_origin == pg_sys::InvalidRepOriginId as pg_sys::RepOriginId {
            return;
        }
        pg_sys::replorigin_session_reset();
        pg_sys::replorigin_session_origin = pg_sys::InvalidRepOriginId as pg_sys::RepOriginId;
    }
}

/// `Ok` unless this session holds a pg_tide origin: a watermark written with it would never be
/// decoded (the output plugin drops every change of a transaction that carries one), so the
/// backfill writes its watermarks only outside iterations, and checks.
pub fn ensure_not_held(what: &str) -> TideResult<()> {
    // SAFETY: reads a session variable of this backend.
    let held = unsafe {
        pg_sys::replorigin_session_origin != pg_sys::InvalidRepOriginId as pg_sys::RepOriginId
    };
    if held {
        return Err(TideError::internal(format!(
            "{what} while holding the pipeline's replication origin"
        )));
    }
    Ok(())
}
