//! pg_tide's logical decoding output plugin.
//!
//! Owns: turning decoded heap changes into the versioned binary wire format of
//! `docs/wire-format.md` (encoded by `tide_core::wire`, the same code the worker decodes with).
//!
//! Guarantees:
//! - Only the relations listed in the `tables` option are emitted, and no logical message (any
//!   role may emit one; pg_tide's markers are rows of `tide.marker`). Without a `tables` option every user table outside
//!   the `tide` schema is emitted, which is handy for `pg_logical_slot_peek_binary_changes` by hand.
//!   pg_tide's own catalog and outbox tables are never emitted, so its writes cannot feed back.
//! - Transactions that emit nothing are not emitted at all (Begin is written lazily).
//! - A `Relation` message precedes the first change of a relation in a decoding session and
//!   follows every relcache invalidation of it, so every change is read with the shape it was
//!   written with (DDL does not stop the stream).
//! - An unchanged TOAST value is sent as "unchanged", never as a placeholder or a stale value.
//! - A transaction that rewrites an emitted relation's heap (table-rewriting `ALTER TABLE`) sends
//!   one `Rewrite` message for it, at the position of its first rewritten row: the rows of a
//!   rewrite are not decoded as changes of the table, yet may all have new values.
//! - Changes committed with a `pg_tide_*` replication origin (a pipeline worker's own writes to
//!   table targets, see `worker::origin`) are not emitted: no pipeline ever captures what
//!   pg_tide wrote. Once such an origin is known, its transactions are not even decoded
//!   (`filter_by_origin`). A worker writes its watermarks outside those transactions.
//! - A partitioned table named in `tables` is emitted whole: a change of any of its partitions
//!   (any depth, attached now or later, as the catalog says at the change's position) is sent as
//!   a change of the partitioned table, with its Relation and its columns (matched by name:
//!   partitions may have another column order or dropped columns), as pgoutput's
//!   `publish_via_partition_root` does. (An UPDATE that moves a row to another partition changes
//!   its key, which always includes the partition key: it is the partition's delete and the other
//!   partition's insert, like any key change.) A TRUNCATE
//!   of every partition is a Truncate of the table; of some partitions only, a
//!   TruncatePartition per partition with its constraint (what was removed). See
//!   `docs/wire-format.md`, "Partitioned tables".
//! - A relation with a `row_filter.<relid>` option is filtered as PostgreSQL 15's publication
//!   row filters do (see `filter`): only the changes whose rows pass
//!   are sent, an update moving a row in or out becomes an insert or a delete. Relations without
//!   one take the unfiltered path unchanged.
//! - A relation with a `masks.<relid>` option has those columns masked in every tuple it sends
//!   (new rows, old rows, old keys; see `tide_core::mask`): the clear value never enters the
//!   stream. A `hash` or `truncate` column is described as `text` in its Relation message.
//! - Values are the type's text output, produced under a per-change memory context that is reset
//!   after each change, so memory does not grow with transaction size.
//! - With the option `streaming 'on'` (and a server that can stream: the context allows it), a
//!   transaction larger than `logical_decoding_work_mem` is sent while it runs, in blocks
//!   (`StreamStart`, `StreamChange`s, `StreamStop`), then `StreamCommit` or `StreamAbort`
//!   (also for an aborted subtransaction of it, whose changes are marked with its xid), as
//!   `docs/wire-format.md` describes. A streamed transaction's Relation messages are its own
//!   (sent in it whatever was sent before, and the transaction's first block of each session
//!   carries `first`); after it ends, the relations it described are described again before
//!   their next change elsewhere. Without the option nothing is streamed.
//!
//! Layout, by what each part does: `session` (startup, shutdown, a transaction's Begin/Commit
//! and keepalives), `options` (the decoding options), `origins` (pg_tide's own transactions),
//! `change` (inserts, updates, deletes, rewrites), `truncate`, `tuple` (Relation messages and
//! rows as text), `filter` (row filters), `partitions` (routing a partition to its table),
//! `streaming` (the stream callbacks), `invalidation` (the session's caches and what clears
//! them). This file holds the session state every callback shares and the output primitives.

mod change;
mod filter;
mod invalidation;
mod options;
mod origins;
mod partitions;
mod session;
mod streaming;
mod truncate;
mod tuple;

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::{HashMap, HashSet};
use tide_core::stream_blocks::StreamBlocks;
use tide_core::wire;

/// Per-decoding-session state, owned by `ctx->output_plugin_private`.
struct PluginState {
    /// The slot is being created (`pg_create_logical_replication_slot`: startup's `is_init`).
    /// Decoding then looks for its starting point and replays the transactions that begin and
    /// commit while it waits for older ones to end, with no writer to write to (the callbacks
    /// may not write, and no catalog lookup of theirs may run there: a lookup of a worker's
    /// replication origin failed with "snapshot reference ... is not owned by resource owner
    /// TopTransaction"). Every callback does nothing meanwhile, and `filter_by_origin` drops
    /// every change: nothing before the slot's consistent point is ever delivered anyway.
    creating: bool,
    /// `None`: emit every user table outside the `tide` schema.
    tables: Option<HashSet<pg_sys::Oid>>,
    /// Whether the current transaction's Begin has been written.
    begun: bool,
    /// Scratch buffer for one message.
    buf: Vec<u8>,
    /// Type output function per type OID.
    out_funcs: HashMap<pg_sys::Oid, pg_sys::Oid>,
    /// Short-lived context reset after every change.
    change_cx: pg_sys::MemoryContext,
    /// OID of the `tide` schema, when it exists.
    tide_namespace: Option<pg_sys::Oid>,
    /// Transactions skipped (nothing emitted) since the last message, and the end LSN of the last
    /// transaction reported (emitted or keepalive).
    skipped: u32,
    reported_end: u64,
    /// Relations whose rewrite the current transaction has reported (or found not wanted).
    rewritten: HashSet<pg_sys::Oid>,
    /// Replication origin → whether it is a pg_tide worker's (`pg_tide_*`), as looked up.
    origins: HashMap<pg_sys::RepOriginId, bool>,
    /// Streamed transactions: the block being decoded, whether its StreamStart was written
    /// (lazily, like Begin), which transactions wrote a block, their rewrites reported.
    stream: StreamBlocks,
    /// The (sub)transaction of the change being written in a block.
    sub: u32,
    /// Row filters by emitted relation (`row_filter.<relid>` options), and the role whose right
    /// to execute their functions is checked (`row_filter_owner`).
    row_filters: HashMap<pg_sys::Oid, String>,
    filter_owner: Option<pg_sys::Oid>,
    /// The row filters compiled for the relations as they are now (dropped at a relcache
    /// invalidation of the relation, see `STALE_FILTERS`).
    compiled: HashMap<pg_sys::Oid, crate::row_filter::Compiled>,
    /// Memory the compiled filters live under (the decoding context's).
    filter_parent: pg_sys::MemoryContext,
    /// Column lists by emitted relation (`columns.<relid>` options): whether each attribute
    /// (by number - 1) is sent.
    column_lists: HashMap<pg_sys::Oid, std::rc::Rc<Vec<bool>>>,
    /// The column list of the relation whose change is being written, if it has one.
    listed: Option<std::rc::Rc<Vec<bool>>>,
    /// Column masks by emitted relation (`masks.<relid>` options): each attribute's (by number
    /// - 1) mask, if it has one; and the pipeline's salt (`mask_salt`, hex).
    masks: HashMap<pg_sys::Oid, std::rc::Rc<Masked>>,
    salt: Vec<u8>,
    /// The masks of the relation whose change is being written, if it has any.
    masked: Option<std::rc::Rc<Masked>>,
}

/// One relation's masks, by attribute number - 1.
type Masked = Vec<Option<tide_core::mask::Mask>>;

/// Entry point PostgreSQL looks up when a slot uses the plugin `pg_tide`.
#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn _PG_output_plugin_init(cb: *mut pg_sys::OutputPluginCallbacks) {
    // SAFETY: PostgreSQL (LoadOutputPlugin) calls this once with a valid, zeroed
    // OutputPluginCallbacks to fill; only functions of the matching signatures, each #[pg_guard]ed,
    // are stored.
    unsafe {
        (*cb).startup_cb = Some(session::startup);
        (*cb).begin_cb = Some(session::begin);
        (*cb).change_cb = Some(change::change);
        (*cb).truncate_cb = Some(truncate::truncate);
        (*cb).commit_cb = Some(session::commit);
        // No message_cb: logical messages are not pg_tide's (any role can emit one with
        // pg_logical_emit_message), so none reaches a worker.
        (*cb).filter_by_origin_cb = Some(origins::filter_by_origin);
        // In-progress transactions, when the reader asks for them (option `streaming`). No
        // stream_message_cb (no message_cb either), and no two-phase callbacks: decoding calls
        // stream_prepare only for a slot with two_phase, which pg_tide never creates.
        (*cb).stream_start_cb = Some(streaming::stream_start);
        (*cb).stream_stop_cb = Some(streaming::stream_stop);
        (*cb).stream_abort_cb = Some(streaming::stream_abort);
        (*cb).stream_commit_cb = Some(streaming::stream_commit);
        (*cb).stream_change_cb = Some(streaming::stream_change);
        (*cb).stream_truncate_cb = Some(streaming::stream_truncate);
        (*cb).shutdown_cb = Some(session::shutdown);
    }
}

/// The plugin's state, at the entry of a callback (every callback but startup and shutdown
/// calls this first, before it writes anything).
///
/// Discards what an interrupted callback left in the scratch buffer: every callback flushes each
/// message it starts before it returns, so bytes found here are part of a message an ERROR cut
/// short. Decoding goes on after one such ERROR: a streamed transaction that aborts while its
/// block is decoded makes the next catalog lookup (a type's output function, an enum label)
/// fail with ERRCODE_TRANSACTION_ROLLBACK, which `ReorderBufferProcessTXN` catches, and then
/// calls `stream_stop`. Kept, the half-written change and the StreamStop went out as one
/// message, which the reader could not decode ("expected a value kind ... found byte 0x45",
/// issue 42).
unsafe fn state<'a>(ctx: *mut pg_sys::LogicalDecodingContext) -> &'a mut PluginState {
    // SAFETY: startup stores a leaked Box<PluginState> here before any other callback runs, and
    // shutdown is the only place that frees it.
    let st = unsafe { &mut *((*ctx).output_plugin_private as *mut PluginState) };
    st.buf.clear();
    st
}

/// Hand the scratch buffer to PostgreSQL as one output message.
unsafe fn flush(ctx: *mut pg_sys::LogicalDecodingContext, st: &mut PluginState, last: bool) {
    // SAFETY: `ctx` is the context of a running callback that may write (nothing is written while
    // the slot is created: filter_by_origin drops every change then, begin and commit return early
    // and decoding streams nothing); OutputPluginPrepareWrite resets `(*ctx).out`, and the pointer
    // and length describe `st.buf`'s initialized bytes (one message, far below 1 GB: the i32 holds
    // it).
    unsafe {
        pg_sys::OutputPluginPrepareWrite(ctx, last);
        pg_sys::appendBinaryStringInfo(
            (*ctx).out,
            st.buf.as_ptr() as *const _,
            st.buf.len() as i32,
        );
        pg_sys::OutputPluginWrite(ctx, last);
    }
    st.buf.clear();
}

/// In a stream block, the header that makes the next message a StreamChange of `xid`.
fn lead(st: &mut PluginState, xid: u32) {
    if st.stream.block().is_some() {
        wire::put_stream_change_header(&mut st.buf, xid);
    }
}

/// The top-level transaction of the current stream block, or 0 outside one.
fn block_top(st: &PluginState) -> u32 {
    st.stream.block().unwrap_or(0)
}

fn wanted(st: &PluginState, rel: pg_sys::Relation) -> bool {
    // SAFETY: private, called only with a relation decoding opened for the current callback (or one
    // opened with RelationIdGetRelation and not closed yet): `rel` and its rd_rel are valid.
    unsafe {
        let relid = (*rel).rd_id;
        match &st.tables {
            Some(set) => set.contains(&relid),
            None => {
                let ns = (*(*rel).rd_rel).relnamespace;
                Some(ns) != st.tide_namespace
                    && ns != pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE)
            }
        }
    }
}
