//! pg_tide's own heavyweight locks: the ones that serialise a pipeline's worker against
//! `drop_pipeline`, a slot's creation against the launcher's orphan sweep, a pipeline's outbox
//! retention against its consumers, concurrent backfill starts of one table, one role's
//! concurrent `create_pipeline`s in every database (its pipeline count, server-wide), and the
//! launchers' release of what dropped databases left.
//!
//! Owns: the lock tags and the only way pg_tide takes them.
//!
//! Guarantees: no other role can take, hold or wait in line for one of these locks. They used to
//! be advisory locks on `hashtext(<key>)`, and any role can call `pg_advisory_lock` with the same
//! number (pipeline names are public in `pg_replication_slots`), stalling another owner's
//! pipeline. These are advisory lock tags too, but with a fourth field (`objsubid` in
//! `pg_locks`) of `0x7401`.. (`0x74` for pg_tide, then the kind): PostgreSQL's SQL functions only
//! ever make tags with 1 (a `bigint` key) or 2 (two `int4` keys) there, so no SQL statement can
//! name one of ours. The key is a 64-bit SipHash of the name (fields two and three): a role
//! that picks a name of its own (a pipeline, say) to collide with another's would need about
//! 2^64 tries, where the 32-bit hash of the first version of this module took minutes. Every
//! lock is held until the end of the current transaction (or subtransaction abort), like
//! `pg_advisory_xact_lock`; `pg_locks` shows them as `locktype = 'advisory'`. Each is the
//! current database's (its OID in the first field), except [`Lock::Leaks`], the server's (0).

use crate::error::TideResult;
use pgrx::pg_sys;

/// What a lock serialises; its number goes into the tag's fourth field, so the same name never
/// collides across kinds.
#[derive(Clone, Copy, Debug)]
pub enum Lock<'a> {
    /// A pipeline: shared by each worker iteration, exclusive by `drop_pipeline`.
    Pipeline(&'a str),
    /// A slot being created: held by the creating transaction, tried by the launcher.
    Slot(&'a str),
    /// A pipeline's outbox retention: consumers' create/seek, `trim_outbox` and
    /// `drop_pipeline` (before its deletes) hold it, the launcher's prune batch only tries it.
    Retention(&'a str),
    /// Backfill starts of one table for one pipeline.
    Backfill(&'a str, pg_sys::Oid),
    /// A role's `create_pipeline`s (the per-role limits count its pipelines under it). A lock of
    /// no database: roles are server-wide, so creates in two databases wait for each
    /// other (`crate::quota`).
    Role(pg_sys::Oid),
    /// The launchers' release of what dropped databases left (`worker::leaks`): one launcher
    /// of the server at a time. Server-wide too (no database in its tag).
    Leaks,
}

/// The fourth field of pg_tide's tags: `0x74` (pg_tide), then the kind. Never 1 or 2.
const TAG_BASE: u16 = 0x7400;

impl Lock<'_> {
    fn tag_parts(&self) -> (u64, u16) {
        use std::hash::Hasher;
        // SipHash-1-3 with fixed keys: the same in every process of this build.
        let mut h = std::hash::DefaultHasher::new();
        let kind = match self {
            Lock::Pipeline(p) => {
                h.write(p.as_bytes());
                1
            }
            Lock::Slot(s) => {
                h.write(s.as_bytes());
                2
            }
            Lock::Retention(p) => {
                h.write(p.as_bytes());
                3
            }
            Lock::Backfill(p, relid) => {
                h.write(p.as_bytes());
                h.write_u8(0);
                h.write_u32(relid.to_u32());
                4
            }
            Lock::Role(oid) => {
                h.write_u32(oid.to_u32());
                5
            }
            Lock::Leaks => 6,
        };
        (h.finish(), TAG_BASE + kind)
    }
}

/// The mode: `Shared` (ShareLock) conflicts only with `Exclusive` (ExclusiveLock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Shared,
    Exclusive,
}

fn acquire(lock: Lock<'_>, mode: Mode, wait: bool) -> TideResult<bool> {
    let (key, kind) = lock.tag_parts();
    let db = match lock {
        Lock::Role(_) | Lock::Leaks => 0,
        // SAFETY: set once at connection, read-only afterwards.
        _ => unsafe { pg_sys::MyDatabaseId }.to_u32(),
    };
    let tag = pg_sys::LOCKTAG {
        locktag_field1: db,
        locktag_field2: (key >> 32) as u32,
        locktag_field3: key as u32,
        locktag_field4: kind,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
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
    fn kinds_do_not_collide_and_sql_cannot_name_them() {
        let a = Lock::Pipeline("x").tag_parts();
        let b = Lock::Slot("x").tag_parts();
        assert_eq!(a.0, b.0);
        assert_ne!(a.1, b.1);
        assert_ne!(
            Lock::Backfill("p", pg_sys::Oid::from(1)).tag_parts(),
            Lock::Backfill("p", pg_sys::Oid::from(2)).tag_parts()
        );
        for l in [
            Lock::Pipeline("x"),
            Lock::Slot("x"),
            Lock::Retention("x"),
            Lock::Backfill("x", pg_sys::Oid::from(1)),
            Lock::Role(pg_sys::Oid::from(10)),
            Lock::Leaks,
        ] {
            // pg_advisory_lock(bigint) makes 1, pg_advisory_lock(int4, int4) makes 2.
            assert!(l.tag_parts().1 > 2);
        }
    }
}
