//! The replication origin of a pipeline worker.
//!
//! Owns: marking every transaction a pipeline worker commits with the replication origin
//! `pg_tide_<database oid>_<pipeline>` ([`name`]), as PostgreSQL's apply worker marks its writes
//! with its subscription's origin. The output plugin drops changes carrying a `pg_tide_` origin (except to pg_tide's own
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
//!
//! Names: origins are the server's, so an origin carries its database's OID, as the slot does:
//! no pipeline of another database shares it, and the launchers release the origins of a
//! database that no longer exists (`worker::leaks`). A pipeline made before 0.3.0 keeps the
//! origin of that time, `pg_tide_<pipeline>`, as long as it keeps the slot of that time
//! (`catalog::slots::legacy_slot_name`); once its slot is made anew, it takes the new name.
//! Only C code can make an origin whose name starts with `pg_` (PostgreSQL reserves the prefix
//! for SQL callers), so a name of either form is pg_tide's.

use crate::error::{TideError, TideResult};
use pgrx::pg_sys;
use std::ffi::CString;

/// Every pg_tide origin's name starts with this.
pub const PREFIX: &str = "pg_tide_";

/// The origin of pipeline `pipeline` of this database, whose slot is `slot` (its
/// `tide.pipeline.slot_name`).
pub fn name(pipeline: &str, slot: &str) -> String {
    if slot == crate::catalog::slots::legacy_slot_name(pipeline) {
        legacy_name(pipeline)
    } else {
        format!(
            "{PREFIX}{}_{pipeline}",
            // SAFETY: reads a process global set at connection, read-only afterwards; main
            // thread.
            unsafe { pg_sys::MyDatabaseId }.to_u32()
        )
    }
}

/// The origin a pipeline made before 0.3.0 had (with no database).
pub fn legacy_name(pipeline: &str) -> String {
    format!("{PREFIX}{pipeline}")
}

/// Create the pipeline's origin if needed and make it this session's: every transaction the
/// worker commits until [`release`] carries it. `slot`: the pipeline's slot name (see
/// [`name`]). Run in a transaction, holding the pipeline's lock.
pub fn acquire(pipeline: &str, slot: &str) -> TideResult<()> {
    let n = CString::new(name(pipeline, slot))
        .map_err(|_| TideError::internal("pipeline name contains a NUL byte"))?;
    // SAFETY: main thread, in a transaction (as documented): `n` is NUL-terminated and alive for
    // the calls; replorigin_session_setup takes the origin for this session only once (checked
    // first), and replorigin_session_origin is this backend's global.
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
    // SAFETY: this backend's session origin is reset only if it holds one (checked first); main
    // thread.
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
