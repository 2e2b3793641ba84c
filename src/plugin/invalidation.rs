//! What a decoding session remembers about relations (described, routed to a partitioned table,
//! row filter compiled) and the relcache/syscache callbacks that make it forget.
//!
//! Guarantees: a relcache invalidation of a relation (at its position in the stream: DDL,
//! ATTACH/DETACH PARTITION) makes its next change carry a new Relation message, looks its
//! partition route up again and recompiles its row filter; a change of any function's catalog row
//! recompiles every row filter. The callbacks only record what is stale: nothing is freed there.
//! The state is thread-local: decoding runs on the backend's only thread.

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
thread_local! {
    /// Relations whose description was sent in this decoding session and not invalidated since.
    pub(super) static SENT: RefCell<HashSet<pg_sys::Oid>> = RefCell::new(HashSet::new());
    pub(super) static CALLBACK_REGISTERED: RefCell<bool> = const { RefCell::new(false) };
    /// Streamed transaction → relations described in it and not invalidated since.
    pub(super) static STREAM_SENT: RefCell<HashMap<u32, HashSet<pg_sys::Oid>>> = RefCell::new(HashMap::new());
    /// Partition → the emitted partitioned table it is sent as (`None`: not one of an emitted
    /// table's partitions), as looked up; dropped at a relcache invalidation of either.
    pub(super) static ROUTES: RefCell<HashMap<pg_sys::Oid, Option<pg_sys::Oid>>> = RefCell::new(HashMap::new());
    /// Relations invalidated since their row filter was compiled (`None`: all), dropped by the
    /// next change (not in the callback, which must not free what a caller may be using).
    pub(super) static STALE_FILTERS: RefCell<Option<HashSet<pg_sys::Oid>>> = RefCell::new(Some(HashSet::new()));
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn relcache_invalidated(
    _arg: pg_sys::Datum,
    relid: pg_sys::Oid,
) {
    SENT.with(|s| {
        let mut s = s.borrow_mut();
        if relid == pg_sys::InvalidOid {
            s.clear();
        } else {
            s.remove(&relid);
        }
    });
    STREAM_SENT.with(|s| {
        for set in s.borrow_mut().values_mut() {
            if relid == pg_sys::InvalidOid {
                set.clear();
            } else {
                set.remove(&relid);
            }
        }
    });
    ROUTES.with(|r| {
        let mut r = r.borrow_mut();
        if relid == pg_sys::InvalidOid {
            r.clear();
        } else {
            r.remove(&relid);
            r.retain(|_, root| *root != Some(relid));
        }
    });
    STALE_FILTERS.with(|f| {
        let mut f = f.borrow_mut();
        match (relid == pg_sys::InvalidOid, f.as_mut()) {
            (true, _) => *f = None,
            (false, Some(set)) => {
                set.insert(relid);
            }
            (false, None) => {}
        }
    });
}

/// A function's catalog row changed (its privileges among them, at the position of the GRANT or
/// REVOKE in the stream): every row filter is compiled again, checking the owner's right to
/// execute its functions as the catalog says from there on.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn function_invalidated(
    _arg: pg_sys::Datum,
    _cacheid: i32,
    _hash: u32,
) {
    STALE_FILTERS.with(|f| *f.borrow_mut() = None);
}
