//! pg_tide's own heavyweight locks: the ones that serialise a pipeline's worker against
//! `drop_pipeline`, a slot's creation against the launcher's orphan sweep, a pipeline's outbox
//! retention against its consumers, and concurrent backfill starts of one table.
//!
//! Owns: the lock tags and the only way pg_tide takes them.
//!
//! Guarantees: no other role can take, hold or wait in line for one of these locks. They used to
//! be advisory locks on `hashtext(<key>)`, and any role can call `pg_advisory_lock` with the same
//! number (pipeline names are public in `pg_replication_slots`), stalling another owner's
//! pipeline. These are object locks (`LOCKTAG_OBJECT`) whose class is the OID of pg_tide's own
//! table `tide.pipeline`: PostgreSQL takes object locks only for objects of its system catalogs
//! (classes below `FirstNormalObjectId`), and no SQL function takes an object lock by number, so
//! only pg_tide's code ever takes a lock with this class. Every lock is held until the end of the
//! current transaction (or subtransaction abort), like `pg_advisory_xact_lock`; `pg_locks` shows
//! them as `locktype = 'object'` with `classid = 'tide.pipeline'::regclass`.

use crate::error::{TideError, TideResult};
use pgrx::pg_sys;

/// What a lock serialises; its number is the lock tag's `objsubid`, so the same name never
/// collides across kinds.
#[derive(Clone, Copy, Debug)]
pub enum Lock<'a> {
    /// A pipeline: shared by each worker iteration, exclusive by `drop_pipeline`.
    Pipeline(&'a str),
    /// A slot being created: held by the creating transaction, tried by the launcher.
    Slot(&'a str),
    /// A pipeline's outbox retention: consumers' create/seek against the pruning launcher.
    Retention(&'a str),
    /// Backfill starts of one table for one pipeline.
    Backfill(&'a str, pg_sys::Oid),
}

impl Lock<'_> {
    fn tag_parts(&self) -> (u32, u16) {
        match self {
            Lock::Pipeline(p) => (fnv1a(&[p.as_bytes()]), 1),
            Lock::Slot(s) => (fnv1a(&[s.as_bytes()]), 2),
            Lock::Retention(p) => (fnv1a(&[p.as_bytes()]), 3),
            Lock::Backfill(p, relid) => (
                fnv1a(&[p.as_bytes(), b"\0", &relid.to_u32().to_le_bytes()]),
                4,
            ),
        }
    }
}

/// The mode: `Shared` (ShareLock) conflicts only with `Exclusive` (ExclusiveLock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Shared,
    Exclusive,
}

/// 32-bit FNV-1a over the parts (a collision only makes two unrelated keys wait for each other).
fn fnv1a(parts: &[&[u8]]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for p in parts {
        for b in *p {
            h ^= u32::from(*b);
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    h
}

/// The OID of `tide.pipeline`: the lock tags' class. In a transaction.
fn class_oid() -> TideResult<pg_sys::Oid> {
    // SAFETY: catalog lookups by name, in a transaction; both return InvalidOid when missing.
    let oid = unsafe {
        let nsp = pg_sys::get_namespace_oid(c"tide".as_ptr(), true);
        if nsp == pg_sys::InvalidOid {
            pg_sys::InvalidOid
        } else {
            pg_sys::get_relname_relid(c"pipeline".as_ptr(), nsp)
        }
    };
    if oid == pg_sys::InvalidOid {
        return Err(
            TideError::prerequisite("pg_tide's table tide.pipeline does not exist")
                .hint("CREATE EXTENSION pg_tide in this database."),
        );
    }
    Ok(oid)
}

fn acquire(lock: Lock<'_>, mode: Mode, wait: bool) -> TideResult<bool> {
    let class = class_oid()?;
    let (objid, subid) = lock.tag_parts();
    let tag = pg_sys::LOCKTAG {
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: class.to_u32(),
        locktag_field3: objid,
        locktag_field4: subid,
        locktag_type: pg_sys::LockTagType::LOCKTAG_OBJECT as u8,
        locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
    };
    let lockmode = match mode {
        Mode::Shared => pg_sys::ShareLock,
        Mode::Exclusive => pg_sys::ExclusiveLock,
    } as pg_sys::LOCKMODE;
    // SAFETY: a transaction-scoped lock (sessionLock = false), released by commit or abort; a
    // wait is interruptible and takes part in deadlock detection like any lock wait.
    let got = unsafe { pg_sys::LockAcquire(&tag, lockmode, false, !wait) };
    Ok(got != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL)
}

/// Take `lock` in `mode` until the end of the transaction, waiting for it.
pub fn lock(lock: Lock<'_>, mode: Mode) -> TideResult<()> {
    acquire(lock, mode, true).map(|_| ())
}

/// Take `lock` in `mode` until the end of the transaction if it is free now; false otherwise.
pub fn try_lock(lock: Lock<'_>, mode: Mode) -> TideResult<bool> {
    acquire(lock, mode, false)
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;

    #[pgrx::pg_test]
    fn kinds_do_not_collide() {
        let a = Lock::Pipeline("x").tag_parts();
        let b = Lock::Slot("x").tag_parts();
        assert_eq!(a.0, b.0);
        assert_ne!(a.1, b.1);
        assert_ne!(
            Lock::Backfill("p", pg_sys::Oid::from(1)).tag_parts(),
            Lock::Backfill("p", pg_sys::Oid::from(2)).tag_parts()
        );
    }
}
