//! Which transactions are pg_tide's own: those committed with a `pg_tide_*` replication origin
//! (a pipeline worker's writes to its table targets, see `worker::origin`).
//!
//! Guarantees: their changes are never emitted; once an origin is known to be a worker's, its
//! transactions are dropped before decoding (`filter_by_origin`). An origin is looked up in the
//! catalog only where decoding may read it (in `begin` and the change callbacks).

use super::{state, PluginState};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CStr;

/// The origin a change was made with: the transaction's (known at its commit), else the
/// change's own (a streamed transaction has not committed yet).
pub(super) unsafe fn origin_of(
    txn: *mut pg_sys::ReorderBufferTXN,
    change: *mut pg_sys::ReorderBufferChange,
) -> pg_sys::RepOriginId {
    // SAFETY: `txn` is the calling callback's transaction (valid for its duration); `change` is
    // checked for NULL before it is read.
    unsafe {
        let o = (*txn).origin_id;
        if o != pg_sys::InvalidRepOriginId as pg_sys::RepOriginId || change.is_null() {
            o
        } else {
            (*change).origin_id
        }
    }
}

/// Whether `txn` was committed by a pg_tide worker (its replication origin is `pg_tide_*`).
pub(super) unsafe fn from_tide(st: &mut PluginState, txn: *mut pg_sys::ReorderBufferTXN) -> bool {
    // SAFETY: `txn` is the transaction decoding passed to the calling callback, valid for its
    // duration.
    unsafe { from_tide_origin(st, (*txn).origin_id) }
}

/// Whether `origin` is a pg_tide worker's (`pg_tide_*`). Looked up once per origin and decoding
/// session (inside the replay transaction, where the catalogs may be read).
pub(super) unsafe fn from_tide_origin(st: &mut PluginState, origin: pg_sys::RepOriginId) -> bool {
    // SAFETY: replorigin_by_oid reads the catalog: the callers (begin and the change and truncate
    // callbacks) run inside decoding's replay transaction, where it may (filter_by_origin only
    // reads the cache). `name` is NULL-checked and read as the NUL-terminated string PostgreSQL
    // allocated for it.
    unsafe {
        if origin == pg_sys::InvalidRepOriginId as pg_sys::RepOriginId {
            return false;
        }
        *st.origins.entry(origin).or_insert_with(|| {
            let mut name: *mut std::ffi::c_char = std::ptr::null_mut();
            pg_sys::replorigin_by_oid(origin, true, &mut name)
                && !name.is_null()
                && CStr::from_ptr(name)
                    .to_bytes()
                    .starts_with(crate::worker::origin::PREFIX.as_bytes())
        })
    }
}

/// Called by decoding for every change record before it is queued: true drops it, and the
/// whole transaction at its commit, unread. True for every change while the slot is created
/// (`PluginState::creating`), and otherwise only for an origin already known to be a pg_tide
/// worker's (`begin` looked it up for an earlier transaction), so from a pipeline's second
/// iteration on, its own writes to its table targets (a backfill chunk's rows among them) are not
/// even queued for decoding. The lookup itself needs the catalog, which decoding may not read
/// here: an origin not seen yet is let through, and `change`/`truncate` drop its changes.
/// Dropping a whole transaction is what `change` would do with its changes too: a pg_tide
/// worker commits watermarks and markers outside the transactions that carry its origin (see
/// `worker::origin`), so no signal or marker row is lost.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn filter_by_origin(
    ctx: *mut pg_sys::LogicalDecodingContext,
    origin_id: pg_sys::RepOriginId,
) -> bool {
    // SAFETY: called by decoding with the context startup prepared.
    let st = unsafe { state(ctx) };
    st.creating || st.origins.get(&origin_id).copied().unwrap_or(false)
}
