//! Rendering a relation and its rows on the wire: the `Relation` message (sent once per session
//! and after every invalidation, see `invalidation`) and tuples as the types' text output.
//!
//! Guarantees: dropped and generated columns, and columns outside a `columns.<relid>` list, are
//! never sent; a masked column's clear value never enters the stream (a `hash` or `truncate`
//! mask is described as `text`); an unchanged TOASTed value is sent as "unchanged", never as a
//! placeholder or a stale value. Values are produced in the caller's memory context (the
//! per-change one, reset after each change).

use super::invalidation::{SENT, STREAM_SENT};
use super::{block_top, flush, lead, PluginState};
use pgrx::pg_sys;
use std::ffi::CStr;
use tide_core::wire;

/// Attribute numbers (1-based) of the relation's key: the replica identity index, else the
/// primary key.
unsafe fn key_bitmap(rel: pg_sys::Relation) -> *mut pg_sys::Bitmapset {
    // SAFETY: `rel` is an open relation (the callback's, or one opened with RelationIdGetRelation
    // and not closed yet); the bitmaps RelationGetIndexAttrBitmap returns are copies in the current
    // (per-change) memory context.
    unsafe {
        let ident = pg_sys::RelationGetIndexAttrBitmap(
            rel,
            pg_sys::IndexAttrBitmapKind::INDEX_ATTR_BITMAP_IDENTITY_KEY,
        );
        if !ident.is_null() {
            return ident;
        }
        pg_sys::RelationGetIndexAttrBitmap(
            rel,
            pg_sys::IndexAttrBitmapKind::INDEX_ATTR_BITMAP_PRIMARY_KEY,
        )
    }
}

pub(super) unsafe fn attr(desc: pg_sys::TupleDesc, i: usize) -> *mut pg_sys::FormData_pg_attribute {
    // SAFETY: the caller's: `desc` is a relation's descriptor and `i` below its natts.
    unsafe { crate::pgver::tupdesc_attr(desc, i) }
}

/// Whether a column is sent at all: dropped and generated columns are not.
unsafe fn sent_column(a: *mut pg_sys::FormData_pg_attribute) -> bool {
    // SAFETY: `a` is an attribute of an open relation's descriptor, from `attr` below its natts.
    unsafe { !(*a).attisdropped && (*a).attgenerated == 0 }
}

/// Whether a column is sent under column list `listed` (`None`: every column is).
unsafe fn listed_column(
    a: *mut pg_sys::FormData_pg_attribute,
    listed: Option<&std::rc::Rc<Vec<bool>>>,
) -> bool {
    // SAFETY: `a` is an attribute of an open relation's descriptor, from `attr` below its natts; a
    // sent column is a user column, so `attnum - 1` does not underflow.
    unsafe {
        sent_column(a)
            && listed.is_none_or(|l| l.get((*a).attnum as usize - 1).copied().unwrap_or(false))
    }
}

pub(super) unsafe fn send_relation_if_needed(
    ctx: *mut pg_sys::LogicalDecodingContext,
    st: &mut PluginState,
    rel: pg_sys::Relation,
) {
    // SAFETY: `rel` is an open relation (see key_bitmap) whose attributes are read below its natts;
    // its name and attribute names are NUL-terminated NameData, and the namespace name is NULL-
    // checked, all read before the per-change memory context is reset.
    unsafe {
        let relid = (*rel).rd_id;
        let top = st.stream.block();
        let sent = match top {
            Some(x) => STREAM_SENT.with(|s| s.borrow().get(&x).is_some_and(|r| r.contains(&relid))),
            None => SENT.with(|s| s.borrow().contains(&relid)),
        };
        if sent {
            return;
        }
        let desc = (*rel).rd_att;
        let natts = (*desc).natts as usize;
        let keys = key_bitmap(rel);
        let nsname_ptr = pg_sys::get_namespace_name((*(*rel).rd_rel).relnamespace);
        let nsname = if nsname_ptr.is_null() {
            ""
        } else {
            CStr::from_ptr(nsname_ptr).to_str().unwrap_or("")
        };
        let relname = CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr())
            .to_str()
            .unwrap_or("");
        let listed = st.column_lists.get(&relid).cloned();
        let masked = st.masks.get(&relid).cloned();
        let ncols = (0..natts)
            .filter(|&i| listed_column(attr(desc, i), listed.as_ref()))
            .count();
        lead(st, block_top(st));
        wire::put_relation_header(&mut st.buf, relid.to_u32(), nsname, relname, ncols as u16);
        for i in 0..natts {
            let a = attr(desc, i);
            if !listed_column(a, listed.as_ref()) {
                continue;
            }
            let name = CStr::from_ptr((*a).attname.data.as_ptr())
                .to_str()
                .unwrap_or("");
            let is_key = pg_sys::bms_is_member(
                (*a).attnum as i32 - pg_sys::FirstLowInvalidHeapAttributeNumber,
                keys,
            );
            let flags = if is_key { wire::COLUMN_KEY } else { 0 };
            // A hash or truncate mask delivers text.
            let retyped = masked
                .as_ref()
                .and_then(|m| m.get((*a).attnum as usize - 1))
                .is_some_and(|m| m.as_ref().is_some_and(|m| m.retypes()));
            let (ty, typmod) = if retyped {
                (pg_sys::TEXTOID.to_u32(), -1)
            } else {
                ((*a).atttypid.to_u32(), (*a).atttypmod)
            };
            wire::put_column(&mut st.buf, name, ty, typmod, flags);
        }
        flush(ctx, st, false);
        match top {
            Some(x) => STREAM_SENT.with(|s| {
                s.borrow_mut().entry(x).or_default().insert(relid);
            }),
            None => SENT.with(|s| {
                s.borrow_mut().insert(relid);
            }),
        }
    }
}

/// Make the column list and the masks of emitted relation `relid` (if it has them) those that
/// `put_values` applies to the change being written.
pub(super) fn use_columns_of(st: &mut PluginState, relid: pg_sys::Oid) {
    st.listed = if st.column_lists.is_empty() {
        None
    } else {
        st.column_lists.get(&relid).cloned()
    };
    st.masked = if st.masks.is_empty() {
        None
    } else {
        st.masks.get(&relid).cloned()
    };
}

/// `VARATT_IS_EXTERNAL_ONDISK`: a TOAST pointer to a value stored out of line. In a decoded
/// tuple this is only ever an unchanged value of an UPDATE (changed ones are reassembled).
pub(super) unsafe fn is_external_ondisk(ptr: *const pg_sys::varlena) -> bool {
    // SAFETY: `ptr` is a non-NULL datum of a varlena column (callers check `attlen == -1` and not
    // null), so its first byte is a varlena header.
    unsafe {
        pgrx::varlena::varatt_is_1b_e(ptr)
            && pgrx::varlena::vartag_external(ptr) as pg_sys::vartag_external::Type
                == pg_sys::vartag_external::VARTAG_ONDISK
    }
}

/// The type output function of `typid`, cached.
unsafe fn out_func(st: &mut PluginState, typid: pg_sys::Oid) -> pg_sys::Oid {
    *st.out_funcs.entry(typid).or_insert_with(|| {
        let mut f = pg_sys::InvalidOid;
        let mut varlena = false;
        // SAFETY: getTypeOutputInfo writes both out-parameters (an unknown type is an ERROR, which
        // the callback's #[pg_guard] re-raises); main thread, inside a callback.
        unsafe { pg_sys::getTypeOutputInfo(typid, &mut f, &mut varlena) };
        f
    })
}

/// Deform `tuple` (laid out as `desc`) into values and nulls.
pub(super) unsafe fn deform(
    desc: pg_sys::TupleDesc,
    tuple: pg_sys::HeapTuple,
) -> (Vec<pg_sys::Datum>, Vec<bool>) {
    // SAFETY: `tuple` is laid out as `desc` (the relation's own descriptor, or converted to it with
    // execute_attr_map_tuple), and `values`/`nulls` have desc's natts slots, as heap_deform_tuple
    // requires.
    unsafe {
        let natts = (*desc).natts as usize;
        let mut values = vec![pg_sys::Datum::from(0); natts];
        let mut nulls = vec![false; natts];
        pg_sys::heap_deform_tuple(tuple, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        (values, nulls)
    }
}

pub(super) unsafe fn put_tuple(
    st: &mut PluginState,
    desc: pg_sys::TupleDesc,
    tuple: pg_sys::HeapTuple,
) {
    // SAFETY: `tuple` is laid out as `desc` (see deform).
    unsafe {
        let (values, nulls) = deform(desc, tuple);
        put_values(st, desc, &values, &nulls);
    }
}

/// A deformed tuple, laid out as `desc`, as the wire's tuple.
pub(super) unsafe fn put_values(
    st: &mut PluginState,
    desc: pg_sys::TupleDesc,
    values: &[pg_sys::Datum],
    nulls: &[bool],
) {
    // SAFETY: `values`/`nulls` come from deforming a tuple laid out as `desc` (natts entries each);
    // a varlena value is checked for a TOAST pointer before its output function reads it; the
    // output text is allocated in the per-change context and copied into `st.buf` before that is
    // reset.
    unsafe {
        let natts = (*desc).natts as usize;
        let listed = st.listed.clone();
        let masked = st.masked.clone();
        let ncols = (0..natts)
            .filter(|&i| listed_column(attr(desc, i), listed.as_ref()))
            .count();
        wire::put_tuple_header(&mut st.buf, ncols as u16);
        for i in 0..natts {
            let a = attr(desc, i);
            if !listed_column(a, listed.as_ref()) {
                continue;
            }
            let mask = masked
                .as_ref()
                .and_then(|m| m.get(i))
                .and_then(Option::as_ref);
            if nulls[i] {
                match mask.and_then(|m| m.apply(&st.salt, None)) {
                    Some(v) => wire::put_text(&mut st.buf, v.as_bytes()),
                    None => wire::put_null(&mut st.buf),
                }
                continue;
            }
            let datum = values[i];
            if (*a).attlen == -1 && is_external_ondisk(datum.cast_mut_ptr()) {
                // The target keeps the (masked) value it has.
                wire::put_unchanged(&mut st.buf);
                continue;
            }
            let text = match mask {
                // Neither needs the value: it is not even turned into text.
                Some(m @ (tide_core::mask::Mask::Null | tide_core::mask::Mask::Constant(_))) => {
                    match m.apply(&st.salt, None) {
                        Some(v) => wire::put_text(&mut st.buf, v.as_bytes()),
                        None => wire::put_null(&mut st.buf),
                    }
                    continue;
                }
                _ => {
                    let func = out_func(st, (*a).atttypid);
                    CStr::from_ptr(pg_sys::OidOutputFunctionCall(func, datum))
                }
            };
            match mask {
                Some(m) => match m.apply(&st.salt, Some(&text.to_string_lossy())) {
                    Some(v) => wire::put_text(&mut st.buf, v.as_bytes()),
                    None => wire::put_null(&mut st.buf),
                },
                None => wire::put_text(&mut st.buf, text.to_bytes()),
            }
        }
    }
}
