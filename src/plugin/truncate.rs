//! A decoded TRUNCATE (of a committed transaction, or of a streamed one inside a block).
//!
//! Guarantees: one `Truncate` of the emitted relations it names (a partitioned table whose every
//! leaf partition was truncated among them), and one `TruncatePartition`, with the partition's
//! constraint, per partition truncated alone; nothing for pg_tide's own transactions.

use super::origins::{from_tide_origin, origin_of};
use super::partitions::{leaf_partitions, partition_predicate, route};
use super::session::ensure_begun;
use super::tuple::send_relation_if_needed;
use super::{flush, lead, state, wanted};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::HashSet;
use tide_core::wire;

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn truncate(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    nrelations: std::ffi::c_int,
    relations: *mut pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    // SAFETY: the arguments are what decoding passed to truncate_cb, valid for this call, as
    // emit_truncate requires.
    unsafe { emit_truncate(ctx, txn, nrelations, relations, change) }
}

/// A TRUNCATE of a committed transaction, or of a streamed one inside a block.
pub(super) unsafe fn emit_truncate(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    nrelations: std::ffi::c_int,
    relations: *mut pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    // SAFETY: `relations` is decoding's array of `nrelations` open relations and `change` a
    // TRUNCATE change (`data.truncate` is the active union member), valid for the calling callback;
    // each relation opened here is NULL-checked and closed; allocations after the switch go to
    // `change_cx`, switched back and reset at the end (the early returns come before the switch).
    unsafe {
        let st = state(ctx);
        if from_tide_origin(st, origin_of(txn, change)) {
            return;
        }
        let sub = st.sub;
        let all: Vec<pg_sys::Relation> = (0..nrelations as usize)
            .map(|i| *relations.add(i))
            .collect();
        let mut rels: Vec<pg_sys::Relation> = Vec::new();
        // Partitions of emitted partitioned tables, by table.
        let mut parts: Vec<(pg_sys::Oid, Vec<pg_sys::Relation>)> = Vec::new();
        for &r in &all {
            if let Some(root) = route(st, r) {
                match parts.iter_mut().find(|(p, _)| *p == root) {
                    Some((_, v)) => v.push(r),
                    None => parts.push((root, vec![r])),
                }
            } else if wanted(st, r) {
                rels.push(r);
            }
        }
        if rels.is_empty() && parts.is_empty() {
            return;
        }
        let old_cx = pg_sys::MemoryContextSwitchTo(st.change_cx);
        ensure_begun(ctx, st, txn);
        let mut relids: Vec<u32> = Vec::new();
        for &r in &rels {
            send_relation_if_needed(ctx, st, r);
            relids.push((*r).rd_id.to_u32());
        }
        // (partitioned table, partition name, predicate) of partitions truncated alone.
        let mut partial: Vec<(u32, String, String)> = Vec::new();
        for (root, leaves) in &parts {
            let root_rel = pg_sys::RelationIdGetRelation(*root);
            if root_rel.is_null() {
                continue;
            }
            send_relation_if_needed(ctx, st, root_rel);
            pg_sys::RelationClose(root_rel);
            let truncated: HashSet<pg_sys::Oid> = leaves.iter().map(|&l| (*l).rd_id).collect();
            if leaf_partitions(*root).iter().all(|l| truncated.contains(l)) {
                relids.push(root.to_u32());
            } else {
                for &l in leaves {
                    let (name, predicate) = partition_predicate(l);
                    partial.push((root.to_u32(), name, predicate));
                }
            }
        }
        if !relids.is_empty() {
            let t = (*change).data.truncate;
            let flags = (t.cascade as u8) | ((t.restart_seqs as u8) << 1);
            lead(st, sub);
            wire::put_truncate(&mut st.buf, flags, &relids);
            flush(ctx, st, partial.is_empty());
        }
        let n = partial.len();
        for (i, (root, name, predicate)) in partial.into_iter().enumerate() {
            lead(st, sub);
            wire::put_truncate_partition(&mut st.buf, root, &name, &predicate);
            flush(ctx, st, i + 1 == n);
        }
        pg_sys::MemoryContextSwitchTo(old_cx);
        pg_sys::MemoryContextReset(st.change_cx);
    }
}
