//! Streamed (in-progress) transactions, with the option `streaming 'on'`: the stream callbacks.
//!
//! Guarantees: a block is written only once it has a change to send (`StreamStart` lazily, then
//! `StreamChange`s and `StreamStop`); `StreamAbort` of the transaction or of a subtransaction,
//! `StreamCommit` at its end; after it ends, the relations it described are described again
//! before their next change outside it (`forget_stream`). What to write is decided by
//! `tide_core::stream_blocks`.

use super::change::emit_change;
use super::invalidation::{SENT, STREAM_SENT};
use super::session::skipped_commit;
use super::truncate::emit_truncate;
use super::{flush, state};
use pgrx::pg_sys;
use pgrx::prelude::*;
use tide_core::lsn::Lsn;
use tide_core::wire;

/// The transaction id of `txn` (0 when it has none).
unsafe fn xid_of(txn: *mut pg_sys::ReorderBufferTXN) -> u32 {
    // SAFETY: callers pass a (sub)transaction decoding handed to their callback, never NULL
    // (`toptxn` and `change->txn` are NULL-checked before).
    unsafe { u32::from((*txn).xid) }
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn stream_start(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
) {
    // SAFETY: `ctx` and `txn` are what decoding passed to stream_start_cb, valid for this call;
    // startup has run.
    unsafe {
        let st = state(ctx);
        // A block is written only once it has a change to send (`ensure_begun`).
        st.stream.start(xid_of(txn));
        st.sub = xid_of(txn);
    }
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn stream_stop(
    ctx: *mut pg_sys::LogicalDecodingContext,
    _txn: *mut pg_sys::ReorderBufferTXN,
) {
    // SAFETY: `ctx` is what decoding passed to stream_stop_cb, valid for this call; it may write
    // (see flush).
    unsafe {
        let st = state(ctx);
        if st.stream.stop() {
            wire::put_stream_stop(&mut st.buf);
            flush(ctx, st, true);
        }
    }
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn stream_change(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    rel: pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    // SAFETY: the arguments are what decoding passed to stream_change_cb, valid for this call, as
    // emit_change requires; `(*change).txn` is NULL-checked before xid_of reads it.
    unsafe {
        // The subtransaction that made the change: an abort of it drops the change.
        let sub = (*change).txn;
        state(ctx).sub = if sub.is_null() {
            xid_of(txn)
        } else {
            xid_of(sub)
        };
        emit_change(ctx, txn, rel, change)
    }
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn stream_truncate(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    nrelations: std::ffi::c_int,
    relations: *mut pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    // SAFETY: the arguments are what decoding passed to stream_truncate_cb, valid for this call, as
    // emit_truncate requires; `(*change).txn` is NULL-checked before xid_of reads it.
    unsafe {
        let sub = (*change).txn;
        state(ctx).sub = if sub.is_null() {
            xid_of(txn)
        } else {
            xid_of(sub)
        };
        emit_truncate(ctx, txn, nrelations, relations, change)
    }
}

/// A streamed transaction ended: the relations it described are described again before their
/// next change elsewhere (the reader's description may now be the one it carried).
fn forget_stream(top: u32) {
    if let Some(rels) = STREAM_SENT.with(|s| s.borrow_mut().remove(&top)) {
        SENT.with(|s| {
            let mut s = s.borrow_mut();
            for r in rels {
                s.remove(&r);
            }
        });
    }
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn stream_abort(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    _abort_lsn: pg_sys::XLogRecPtr,
) {
    // SAFETY: `ctx` and `txn` are what decoding passed to stream_abort_cb, valid for this call;
    // `(*txn).toptxn` is NULL-checked before it is read.
    unsafe {
        let st = state(ctx);
        let toptxn = (*txn).toptxn;
        let top = if toptxn.is_null() {
            xid_of(txn)
        } else {
            xid_of(toptxn)
        };
        let sub = xid_of(txn);
        if st.stream.abort(top, sub) {
            wire::put_stream_abort(&mut st.buf, top, sub);
            flush(ctx, st, true);
        }
        if top == sub {
            forget_stream(top);
        }
    }
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn stream_commit(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    commit_lsn: pg_sys::XLogRecPtr,
) {
    // SAFETY: `ctx` and `txn` are what decoding passed to stream_commit_cb, valid for this call; it
    // may write (see flush).
    unsafe {
        let st = state(ctx);
        let xid = xid_of(txn);
        let end = (*txn).end_lsn;
        let written = st.stream.commit(xid);
        forget_stream(xid);
        if !written {
            skipped_commit(ctx, st, end);
            return;
        }
        st.skipped = 0;
        st.reported_end = end;
        wire::put_stream_commit(
            &mut st.buf,
            xid,
            Lsn(commit_lsn),
            Lsn(end),
            (*txn).xact_time.commit_time,
        );
        flush(ctx, st, true);
    }
}
