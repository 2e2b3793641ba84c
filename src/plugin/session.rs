//! The decoding session and its transactions' frame: `startup` (options, the per-change memory
//! context, the invalidation callbacks), `shutdown`, and the messages around a transaction's
//! changes (Begin, written lazily by `ensure_begun` before the first change, or a stream block's
//! StreamStart; Commit; a Keepalive after skipped transactions).
//!
//! Guarantees: a transaction that emits nothing writes nothing but, now and then (every
//! `KEEPALIVE_TXNS` transactions or `KEEPALIVE_BYTES` of WAL), a Keepalive, so an idle pipeline on
//! a busy server does not retain WAL; while the slot is being created every callback does nothing.

use super::invalidation::{
    function_invalidated, relcache_invalidated, CALLBACK_REGISTERED, ROUTES, SENT, STALE_FILTERS,
    STREAM_SENT,
};
use super::options::{parse_options, Options};
use super::origins::from_tide;
use super::{flush, state, PluginState};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::{HashMap, HashSet};
use tide_core::lsn::Lsn;
use tide_core::stream_blocks::StreamBlocks;
use tide_core::wire;

/// A Keepalive is written after this many skipped transactions...
const KEEPALIVE_TXNS: u32 = 64;
/// ...or this much WAL, whichever comes first.
const KEEPALIVE_BYTES: u64 = 1 << 20;

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn startup(
    ctx: *mut pg_sys::LogicalDecodingContext,
    opt: *mut pg_sys::OutputPluginOptions,
    is_init: bool,
) {
    // SAFETY: PostgreSQL calls startup once per decoding context, before any other callback, with
    // valid `ctx` and `opt`; the state is leaked into `output_plugin_private` and freed only by
    // shutdown; `change_cx` is a child of the decoding context, so it lives exactly as long as the
    // state that points to it. The invalidation callbacks (which PostgreSQL cannot unregister) are
    // registered once per backend and touch only this thread's state; decoding runs on the
    // backend's only thread.
    unsafe {
        (*opt).output_type = pg_sys::OutputPluginOutputType::OUTPUT_PLUGIN_BINARY_OUTPUT;
        // The rows a table-rewriting ALTER TABLE writes into the new heap come to `change` on a
        // transient relation whose `relrewrite` names the table; `change` reports each rewrite
        // once as a `Rewrite` message.
        (*opt).receive_rewrites = true;

        let Options {
            tables,
            streaming,
            row_filters,
            filter_owner,
            column_lists,
            masks,
            salt,
        } = parse_options((*ctx).output_plugin_options);
        // Decoding set `streaming` when the plugin has the stream callbacks and the context can
        // stream (not while creating the slot, for instance); stream only if asked to, as
        // pgoutput does.
        (*ctx).streaming = (*ctx).streaming && streaming;

        let change_cx = pg_sys::AllocSetContextCreateInternal(
            (*ctx).context,
            c"pg_tide change".as_ptr(),
            pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
        );
        let ns = pg_sys::get_namespace_oid(c"tide".as_ptr(), true);
        let tide_namespace = if ns == pg_sys::InvalidOid {
            None
        } else {
            Some(ns)
        };

        let state = Box::new(PluginState {
            creating: is_init,
            tables,
            begun: false,
            buf: Vec::with_capacity(8192),
            out_funcs: HashMap::new(),
            change_cx,
            tide_namespace,
            skipped: 0,
            reported_end: 0,
            rewritten: HashSet::new(),
            origins: HashMap::new(),
            stream: StreamBlocks::default(),
            sub: 0,
            row_filters,
            filter_owner,
            compiled: HashMap::new(),
            filter_parent: (*ctx).context,
            column_lists,
            listed: None,
            masks,
            salt,
            masked: None,
        });
        (*ctx).output_plugin_private = Box::into_raw(state) as *mut std::ffi::c_void;

        SENT.with(|s| s.borrow_mut().clear());
        STREAM_SENT.with(|s| s.borrow_mut().clear());
        ROUTES.with(|r| r.borrow_mut().clear());
        STALE_FILTERS.with(|f| *f.borrow_mut() = Some(HashSet::new()));
        CALLBACK_REGISTERED.with(|r| {
            if !*r.borrow() {
                pg_sys::CacheRegisterRelcacheCallback(
                    Some(relcache_invalidated),
                    pg_sys::Datum::from(0),
                );
                pg_sys::CacheRegisterSyscacheCallback(
                    pg_sys::SysCacheIdentifier::PROCOID as i32,
                    Some(function_invalidated),
                    pg_sys::Datum::from(0),
                );
                *r.borrow_mut() = true;
            }
        });
    }
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn shutdown(ctx: *mut pg_sys::LogicalDecodingContext) {
    // SAFETY: `output_plugin_private` is NULL or the Box startup leaked; it is taken back once and
    // the pointer cleared, so no later call sees a freed state.
    unsafe {
        let p = (*ctx).output_plugin_private as *mut PluginState;
        if !p.is_null() {
            drop(Box::from_raw(p));
            (*ctx).output_plugin_private = std::ptr::null_mut();
        }
    }
}

pub(super) unsafe fn ensure_begun(
    ctx: *mut pg_sys::LogicalDecodingContext,
    st: &mut PluginState,
    txn: *mut pg_sys::ReorderBufferTXN,
) {
    if st.stream.block().is_some() {
        if let Some((top, first)) = st.stream.open() {
            wire::put_stream_start(&mut st.buf, top, first);
            // SAFETY: `ctx` is the context of the running callback, which may write (see flush).
            unsafe { flush(ctx, st, false) };
            STREAM_SENT.with(|s| {
                s.borrow_mut().entry(top).or_default();
            });
        }
        return;
    }
    if st.begun {
        return;
    }
    // SAFETY: `txn` is the transaction decoding passed to the calling callback, valid for its
    // duration; `ctx` may write (see flush).
    unsafe {
        wire::put_begin(
            &mut st.buf,
            u32::from((*txn).xid),
            Lsn((*txn).final_lsn),
            (*txn).xact_time.commit_time,
        );
        flush(ctx, st, false);
    }
    st.begun = true;
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn begin(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
) {
    // SAFETY: `ctx` and `txn` are what decoding passed to begin_cb, valid for this call; startup
    // has run, so `state` finds the session's state.
    unsafe {
        let st = state(ctx);
        if st.creating {
            return;
        }
        st.begun = false;
        st.rewritten.clear();
        // Learn the transaction's origin here, where the catalog can be read: from then on
        // `filter_by_origin` drops that origin's transactions before they are decoded.
        from_tide(st, txn);
    }
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn commit(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    commit_lsn: pg_sys::XLogRecPtr,
) {
    // SAFETY: `ctx` and `txn` are what decoding passed to commit_cb, valid for this call; startup
    // has run, so `state` finds the session's state.
    unsafe {
        let st = state(ctx);
        if st.creating {
            return;
        }
        let end = (*txn).end_lsn;
        if !st.begun {
            skipped_commit(ctx, st, end);
            return;
        }
        st.skipped = 0;
        st.reported_end = end;
        wire::put_commit(
            &mut st.buf,
            u32::from((*txn).xid),
            Lsn(commit_lsn),
            Lsn((*txn).end_lsn),
            (*txn).xact_time.commit_time,
        );
        flush(ctx, st, true);
        st.begun = false;
    }
}

/// A transaction that emitted nothing committed (ending at `end`): let the reader advance past
/// skipped transactions now and then, so an idle pipeline on a busy server does not retain WAL
/// or re-decode it forever.
pub(super) unsafe fn skipped_commit(
    ctx: *mut pg_sys::LogicalDecodingContext,
    st: &mut PluginState,
    end: pg_sys::XLogRecPtr,
) {
    st.skipped += 1;
    if st.skipped >= KEEPALIVE_TXNS || end.saturating_sub(st.reported_end) >= KEEPALIVE_BYTES {
        wire::put_keepalive(&mut st.buf, Lsn(end));
        // SAFETY: `ctx` is the context of the running commit callback, which may write (see flush).
        unsafe { flush(ctx, st, true) };
        st.skipped = 0;
        st.reported_end = end;
    }
}
