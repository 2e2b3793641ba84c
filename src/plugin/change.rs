//! One decoded INSERT, UPDATE or DELETE (of a committed transaction, or of a streamed one inside
//! a block) and the rows of a table rewrite.
//!
//! Guarantees: only emitted relations' changes are sent, a partition's as its emitted partitioned
//! table's (`partitions::route`); pg_tide's own changes never are (`origins`); a filtered
//! relation's changes go through `filter`; a heap rewrite of an emitted relation is one `Rewrite`
//! message per transaction; everything a change allocates is freed with the per-change memory
//! context before the callback returns.

use super::filter::filtered_change;
use super::origins::{from_tide_origin, origin_of};
use super::partitions::route;
use super::session::ensure_begun;
use super::tuple::{put_tuple, send_relation_if_needed, use_columns_of};
use super::{block_top, flush, lead, state, wanted, PluginState};
use pgrx::pg_sys;
use pgrx::prelude::*;
use tide_core::wire;

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn change(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    rel: pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    // SAFETY: the arguments are the ones decoding passed to change_cb: `ctx` is the session's
    // context (startup ran), `txn`, `rel` and `change` are valid until this callback returns, as
    // `emit_change` requires.
    unsafe { emit_change(ctx, txn, rel, change) }
}

/// A change of a committed transaction, or of a streamed one inside a block.
pub(super) unsafe fn emit_change(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    rel: pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    // SAFETY: callers (`change`, `stream_change`) pass the pointers decoding handed to their
    // callback, valid until it returns: `rel` is open, `change` an INSERT, UPDATE or DELETE (so
    // `data.tp` is the active union member) whose tuples the reorder buffer owns. The root opened
    // here is NULL-checked and closed; from the switch to `change_cx` on, every path switches back
    // and resets it.
    unsafe {
        let st = state(ctx);
        let tide = from_tide_origin(st, origin_of(txn, change));
        let rewrite_of = (*(*rel).rd_rel).relrewrite;
        if rewrite_of != pg_sys::InvalidOid {
            if !tide {
                report_rewrite(ctx, st, txn, rewrite_of);
            }
            return;
        }
        if tide {
            return;
        }
        let sub = st.sub;
        let old_cx = pg_sys::MemoryContextSwitchTo(st.change_cx);
        // The relation the change is sent as: the emitted partitioned table `rel` is a partition
        // of (which wins over `rel` itself: a table captured alone and attached later belongs to
        // the table from then on), or `rel`.
        let root = match route(st, rel).map(|r| pg_sys::RelationIdGetRelation(r)) {
            Some(r) if !r.is_null() => Some(r),
            None if wanted(st, rel) => None,
            _ => {
                pg_sys::MemoryContextSwitchTo(old_cx);
                pg_sys::MemoryContextReset(st.change_cx);
                return;
            }
        };
        let out_rel = root.unwrap_or(rel);
        let desc = (*out_rel).rd_att;
        // Columns by name: NULL when the partition has the table's layout.
        let map = match root {
            Some(_) => pg_sys::convert_tuples_by_name((*rel).rd_att, desc),
            None => std::ptr::null_mut(),
        };
        let conv = |t: crate::pgver::ChangeTuple| -> pg_sys::HeapTuple {
            let h = crate::pgver::change_heap_tuple(t);
            if map.is_null() {
                h
            } else {
                pg_sys::execute_attr_map_tuple(h, map)
            }
        };
        let relid = (*out_rel).rd_id;
        let tp = (*change).data.tp;
        use pg_sys::ReorderBufferChangeType::*;
        let mut emitted = true;
        let filtered = !st.row_filters.is_empty() && st.row_filters.contains_key(&relid);
        use_columns_of(st, relid);
        let tuple = |t: crate::pgver::ChangeTuple| (!t.is_null()).then(|| conv(t));
        match (*change).action {
            REORDER_BUFFER_CHANGE_INSERT
            | REORDER_BUFFER_CHANGE_UPDATE
            | REORDER_BUFFER_CHANGE_DELETE
                if filtered =>
            {
                let (old, new) = (tuple(tp.oldtuple), tuple(tp.newtuple));
                emitted = filtered_change(ctx, st, txn, out_rel, (*change).action, old, new);
            }
            REORDER_BUFFER_CHANGE_INSERT if !tp.newtuple.is_null() => {
                ensure_begun(ctx, st, txn);
                send_relation_if_needed(ctx, st, out_rel);
                lead(st, sub);
                wire::put_insert_header(&mut st.buf, relid.to_u32());
                put_tuple(st, desc, conv(tp.newtuple));
            }
            REORDER_BUFFER_CHANGE_UPDATE if !tp.newtuple.is_null() => {
                ensure_begun(ctx, st, txn);
                send_relation_if_needed(ctx, st, out_rel);
                let has_old = !tp.oldtuple.is_null();
                lead(st, sub);
                wire::put_update_header(&mut st.buf, relid.to_u32(), has_old);
                if has_old {
                    put_tuple(st, desc, conv(tp.oldtuple));
                }
                put_tuple(st, desc, conv(tp.newtuple));
            }
            REORDER_BUFFER_CHANGE_DELETE if !tp.oldtuple.is_null() => {
                ensure_begun(ctx, st, txn);
                send_relation_if_needed(ctx, st, out_rel);
                lead(st, sub);
                wire::put_delete_header(&mut st.buf, relid.to_u32());
                put_tuple(st, desc, conv(tp.oldtuple));
            }
            REORDER_BUFFER_CHANGE_DELETE => {
                // REPLICA IDENTITY NOTHING: the key of the deleted row is not in the WAL.
                pgrx::warning!(
                    "pg_tide: a DELETE on relation {} carries no key (REPLICA IDENTITY NOTHING) and cannot be captured",
                    (*rel).rd_id.to_u32()
                );
                emitted = false;
            }
            _ => emitted = false,
        }
        if emitted {
            flush(ctx, st, true);
        } else {
            st.buf.clear();
        }
        if let Some(r) = root {
            pg_sys::RelationClose(r);
        }
        pg_sys::MemoryContextSwitchTo(old_cx);
        pg_sys::MemoryContextReset(st.change_cx);
    }
}

/// A row written by a heap rewrite of `relid`: send one `Rewrite` message per transaction if the
/// relation is emitted (a partition's as one of its partitioned table).
unsafe fn report_rewrite(
    ctx: *mut pg_sys::LogicalDecodingContext,
    st: &mut PluginState,
    txn: *mut pg_sys::ReorderBufferTXN,
    relid: pg_sys::Oid,
) {
    // SAFETY: `ctx` and `txn` come from the calling change callback (valid during it); the relation
    // opened with RelationIdGetRelation is NULL-checked and closed before its pointer is dropped.
    unsafe {
        if !rewrite_first(st, relid) {
            return;
        }
        // Opened under the decoding's historic snapshot, like `rel` itself.
        let orig = pg_sys::RelationIdGetRelation(relid);
        if orig.is_null() {
            return;
        }
        let emitted_as = route(st, orig).or(wanted(st, orig).then_some(relid));
        pg_sys::RelationClose(orig);
        let Some(as_relid) = emitted_as else {
            return;
        };
        if as_relid != relid && !rewrite_first(st, as_relid) {
            return;
        }
        ensure_begun(ctx, st, txn);
        lead(st, block_top(st));
        wire::put_rewrite(&mut st.buf, as_relid.to_u32());
        flush(ctx, st, true);
    }
}

/// Whether this is the first rewrite of `relid` the current transaction reports (recording it).
fn rewrite_first(st: &mut PluginState, relid: pg_sys::Oid) -> bool {
    match st.stream.rewrite_first(relid.to_u32()) {
        Some(first) => first,
        None => st.rewritten.insert(relid),
    }
}
