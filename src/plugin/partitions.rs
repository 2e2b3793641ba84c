//! Partitioned tables: which emitted partitioned table a partition's change is sent as, its leaf
//! partitions, and a partition's constraint as SQL (for a TRUNCATE of some partitions only).
//!
//! Guarantees: a partition at any depth, attached before or after the pipeline started, is routed
//! to its topmost ancestor named in `tables`, as the catalog says at the change's position (the
//! route is looked up again after a relcache invalidation of either).

use super::invalidation::ROUTES;
use super::PluginState;
use pgrx::pg_sys;
use std::ffi::CStr;

/// PostgreSQL functions pgrx does not bind (`catalog/partition.h`, `catalog/pg_inherits.h`,
/// `utils/partcache.h`), called through pgrx's FFI guard (an ERROR becomes a Rust panic that
/// the callback's `#[pg_guard]` turns back into the ERROR).
mod c {
    use pgrx::pg_sys;
    mod raw {
        use pgrx::pg_sys;
        unsafe extern "C-unwind" {
            pub fn get_partition_ancestors(relid: pg_sys::Oid) -> *mut pg_sys::List;
            pub fn find_all_inheritors(
                parent: pg_sys::Oid,
                lockmode: pg_sys::LOCKMODE,
                numparents: *mut *mut pg_sys::List,
            ) -> *mut pg_sys::List;
            pub fn get_partition_qual_relid(relid: pg_sys::Oid) -> *mut pg_sys::Expr;
        }
    }
    pub unsafe fn get_partition_ancestors(relid: pg_sys::Oid) -> *mut pg_sys::List {
        // SAFETY: the declaration matches catalog/partition.h's `List
        // *get_partition_ancestors(Oid)`; an ERROR becomes a Rust panic in pg_guard_ffi_boundary,
        // re-raised by the calling callback's #[pg_guard]; called only from plugin callbacks, on
        // the backend's main thread.
        unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| raw::get_partition_ancestors(relid)) }
    }
    pub unsafe fn find_all_inheritors(parent: pg_sys::Oid) -> *mut pg_sys::List {
        // SAFETY: the declaration matches catalog/pg_inherits.h's `List *find_all_inheritors(Oid,
        // LOCKMODE, List **)`, which accepts a NULL `numparents`; NoLock, as decoding reads the
        // catalog under its historic snapshot without locks; ERRORs and thread as in
        // get_partition_ancestors above.
        unsafe {
            pg_sys::ffi::pg_guard_ffi_boundary(|| {
                raw::find_all_inheritors(
                    parent,
                    pg_sys::NoLock as pg_sys::LOCKMODE,
                    std::ptr::null_mut(),
                )
            })
        }
    }
    pub unsafe fn get_partition_qual_relid(relid: pg_sys::Oid) -> *mut pg_sys::Expr {
        // SAFETY: the declaration matches utils/partcache.h's `Expr
        // *get_partition_qual_relid(Oid)`; ERRORs and thread as in get_partition_ancestors above.
        unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| raw::get_partition_qual_relid(relid)) }
    }
}

/// The emitted partitioned table `rel` (a partition) is sent as, if any: its topmost ancestor
/// named in the `tables` option, as the catalog says now (decoding reads it at the change's
/// position). Looked up once per partition and decoding session, until a relcache invalidation.
pub(super) unsafe fn route(st: &PluginState, rel: pg_sys::Relation) -> Option<pg_sys::Oid> {
    // SAFETY: `rel` is the open relation of the change being decoded; the OID list
    // get_partition_ancestors returns is read below its `length` and freed once, here.
    unsafe {
        let set = st.tables.as_ref()?;
        if !(*(*rel).rd_rel).relispartition {
            return None;
        }
        let relid = (*rel).rd_id;
        if let Some(r) = ROUTES.with(|m| m.borrow().get(&relid).copied()) {
            return r;
        }
        let ancestors = c::get_partition_ancestors(relid);
        let mut found = None;
        if !ancestors.is_null() {
            // Nearest first: the last one named is the topmost.
            for i in 0..(*ancestors).length {
                let a = pg_sys::list_nth_oid(ancestors, i);
                if set.contains(&a) {
                    found = Some(a);
                }
            }
            pg_sys::list_free(ancestors);
        }
        ROUTES.with(|m| m.borrow_mut().insert(relid, found));
        found
    }
}

/// The partitions of `root` that hold rows (tables, at any depth).
pub(super) unsafe fn leaf_partitions(root: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    // SAFETY: called from the truncate callbacks, where the catalog may be read under decoding's
    // historic snapshot; the OID list find_all_inheritors returns is read below its `length` and
    // freed once.
    unsafe {
        let all = c::find_all_inheritors(root);
        let mut out = Vec::new();
        if !all.is_null() {
            for i in 0..(*all).length {
                let r = pg_sys::list_nth_oid(all, i);
                if r != root
                    && pg_sys::get_rel_relkind(r) == pg_sys::RELKIND_RELATION as std::ffi::c_char
                {
                    out.push(r);
                }
            }
            pg_sys::list_free(all);
        }
        out
    }
}

/// The partition constraint of `leaf` as SQL (`pg_get_partition_constraintdef`), and its name.
pub(super) unsafe fn partition_predicate(leaf: pg_sys::Relation) -> (String, String) {
    // SAFETY: `leaf` is one of the open relations decoding passed to the truncate callback; the
    // namespace name and the deparsed expression are NUL-terminated (NULL-checked where PostgreSQL
    // may return NULL) and copied into Strings before the per-change memory context is reset.
    unsafe {
        let relid = (*leaf).rd_id;
        let relname = CStr::from_ptr((*(*leaf).rd_rel).relname.data.as_ptr());
        let ns = pg_sys::get_namespace_name((*(*leaf).rd_rel).relnamespace);
        let nsname = if ns.is_null() {
            String::new()
        } else {
            CStr::from_ptr(ns).to_string_lossy().into_owned()
        };
        let name = format!(
            "{}.{}",
            pgrx::spi::quote_identifier(nsname),
            pgrx::spi::quote_identifier(relname.to_string_lossy().as_ref())
        );
        let expr = c::get_partition_qual_relid(relid);
        let predicate = if expr.is_null() {
            // No constraint (the only partition, a default one): it held every row.
            "true".to_string()
        } else {
            let dp = pg_sys::deparse_context_for(relname.as_ptr(), relid);
            let text = pg_sys::deparse_expression(expr as *mut pg_sys::Node, dp, false, false);
            CStr::from_ptr(text).to_string_lossy().into_owned()
        };
        (name, predicate)
    }
}
