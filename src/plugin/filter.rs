//! Row filters (`row_filter.<relid>` options), applied as PostgreSQL 15's publications apply
//! theirs (pgoutput_row_filter).
//!
//! Guarantees: only the changes whose rows pass are sent; an update moving a row into or out of
//! the filter becomes an insert or a delete; a filter is compiled (with its owner's right to
//! execute its functions checked) once per relation and again after any invalidation of the
//! relation or of a function's catalog row.

use super::invalidation::STALE_FILTERS;
use super::session::ensure_begun;
use super::tuple::{attr, deform, is_external_ondisk, put_values, send_relation_if_needed};
use super::{lead, PluginState};
use pgrx::pg_sys;
use std::collections::HashSet;
use tide_core::wire;

/// The compiled row filter of emitted relation `rel`, compiled now if it is not (or its
/// relation changed since).
unsafe fn row_filter(
    st: &mut PluginState,
    rel: pg_sys::Relation,
) -> Option<&crate::row_filter::Compiled> {
    // SAFETY: `rel` is the open relation of the change being decoded (valid for the callback); the
    // filter is compiled in `filter_parent`, the decoding context's memory, which outlives
    // `st.compiled` (dropped with the state in shutdown, before PostgreSQL frees the context).
    unsafe {
        let stale = STALE_FILTERS.with(|f| f.replace(Some(HashSet::new())));
        match stale {
            None => st.compiled.clear(),
            Some(set) => st.compiled.retain(|relid, _| !set.contains(relid)),
        }
        let relid = (*rel).rd_id;
        let text = st.row_filters.get(&relid)?;
        if !st.compiled.contains_key(&relid) {
            let c = crate::row_filter::Compiled::new(rel, text, st.filter_owner, st.filter_parent);
            if !c.covered {
                pgrx::warning!(
                    "pg_tide: the row filter of \"{}\" reads columns outside its replica identity (changed since tide.add_table): its updates are decided on the new row and its deletes are all delivered",
                    c.name
                );
            }
            st.compiled.insert(relid, c);
        }
        st.compiled.get(&relid)
    }
}

/// What a change of a filtered relation becomes, as PostgreSQL 15's publications decide
/// (pgoutput_row_filter): an insert is sent if its new row passes, a delete if its old row
/// does; an update whose old and new rows both pass stays an update, one whose new row only
/// passes becomes an insert, one whose old row only passes becomes a delete (of the old key),
/// one with neither is not sent. An update without an old row (its key unchanged under
/// REPLICA IDENTITY DEFAULT/INDEX: the filter's columns, all in the identity, are unchanged) is
/// decided on the new row. An unchanged TOASTed value of the new row is taken from the old row
/// when that has it (REPLICA IDENTITY FULL), for the filter and in what is sent. Writes the
/// message into the buffer (after Begin and the Relation if needed); returns whether it did.
pub(super) unsafe fn filtered_change(
    ctx: *mut pg_sys::LogicalDecodingContext,
    st: &mut PluginState,
    txn: *mut pg_sys::ReorderBufferTXN,
    rel: pg_sys::Relation,
    action: pg_sys::ReorderBufferChangeType::Type,
    old: Option<pg_sys::HeapTuple>,
    new: Option<pg_sys::HeapTuple>,
) -> bool {
    use pg_sys::ReorderBufferChangeType::*;
    // SAFETY: `rel` is an open relation and `old`/`new` are tuples laid out as its descriptor
    // (emit_change converted a partition's to it), so deforming them by `desc` and indexing below
    // natts is in bounds; a datum copied from the old row points into the old tuple, which the
    // reorder buffer keeps until this change is written.
    unsafe {
        let desc = (*rel).rd_att;
        let relid = (*rel).rd_id.to_u32();
        let old = old.map(|t| deform(desc, t));
        let mut new = new.map(|t| deform(desc, t));
        if let (Some((ov, on)), Some((nv, nn))) = (&old, &mut new) {
            for i in 0..(*desc).natts as usize {
                let a = attr(desc, i);
                if (*a).attlen == -1
                    && !nn[i]
                    && is_external_ondisk(nv[i].cast_mut_ptr())
                    && !on[i]
                    && !is_external_ondisk(ov[i].cast_mut_ptr())
                {
                    nv[i] = ov[i];
                }
            }
        }
        let Some(f) = row_filter(st, rel) else {
            return false;
        };
        let covered = f.covered;
        let pass =
            |t: &Option<(Vec<pg_sys::Datum>, Vec<bool>)>| t.as_ref().map(|(v, n)| f.matches(v, n));
        let new_in = pass(&new);
        let old_in = if covered { pass(&old).or(new_in) } else { None };
        // What to send: Insert(new) / Update(old?, new) / Delete(old or new's key).
        enum Send {
            Insert,
            Update,
            Delete,
        }
        let send = match action {
            REORDER_BUFFER_CHANGE_INSERT => (new_in == Some(true)).then_some(Send::Insert),
            REORDER_BUFFER_CHANGE_DELETE if old.is_none() => None,
            REORDER_BUFFER_CHANGE_DELETE => {
                (!covered || pass(&old) == Some(true)).then_some(Send::Delete)
            }
            REORDER_BUFFER_CHANGE_UPDATE if new.is_some() => match (old_in, new_in) {
                (Some(true), Some(true)) | (None, Some(true)) => Some(Send::Update),
                (Some(false), Some(true)) => Some(Send::Insert),
                (Some(true), Some(false)) | (None, Some(false)) => Some(Send::Delete),
                _ => None,
            },
            _ => None,
        };
        let Some(send) = send else {
            return false;
        };
        ensure_begun(ctx, st, txn);
        send_relation_if_needed(ctx, st, rel);
        // Inside a stream block, the change's header names its (sub)transaction first.
        let sub = st.sub;
        lead(st, sub);
        match send {
            Send::Insert => {
                let Some((v, n)) = &new else { return false };
                wire::put_insert_header(&mut st.buf, relid);
                put_values(st, desc, v, n);
            }
            Send::Update => {
                let Some((v, n)) = &new else { return false };
                wire::put_update_header(&mut st.buf, relid, old.is_some());
                if let Some((ov, on)) = &old {
                    put_values(st, desc, ov, on);
                }
                put_values(st, desc, v, n);
            }
            Send::Delete => {
                let Some((v, n)) = old.as_ref().or(new.as_ref()) else {
                    return false;
                };
                wire::put_delete_header(&mut st.buf, relid);
                put_values(st, desc, v, n);
            }
        }
        true
    }
}
