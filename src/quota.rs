//! A role's share of the server, counted server-wide (issue 44): its pipelines in every database
//! (each a replication slot, an origin and a worker) and the processes pg_tide runs for them
//! (pipeline workers and backfill readers); and the supervisor's inbox of databases that want
//! a launcher now (a `create_pipeline` committed there).
//!
//! Owns: the shared-memory table [`QUOTA`] and the only functions that read or write it.
//!
//! Why shared memory: roles are server-wide, catalogs per database, and a backend reads only its
//! own database's `tide.pipeline`. So every database publishes its pipelines here:
//! - its launcher, every round, replaces its database's settled entries with the pipelines of
//!   its catalog (name, owner) and clears them when it leaves for want of pipelines; the
//!   supervisor forgets the entries of a database that is gone;
//! - `create_pipeline` adds a *pending* entry (its pid) under the role's server-wide lock
//!   (`locks::Lock::Role`): it settles at commit, is removed at abort; `drop_pipeline` removes
//!   its entry at commit;
//! - a pipeline worker sets its pid in its entry at start and clears it when it exits, and
//!   counts there the readers it runs ([`reserve_reader`], [`reader_gone`]).
//!
//! Guarantees: two `create_pipeline`s of one role, in any two databases, count each other (the
//! second waits for the role's lock, then sees the first's entry, pending or settled); a
//! reader is started only when the role's processes (its live workers and readers, server-wide)
//! stay within `tide.max_workers_per_role`. A count may be high until a database's launcher
//! runs its next round (a `create_pipeline` rolled back to a savepoint settles at the commit),
//! and is never low once the launchers of the databases with pipelines have run a round (within
//! seconds of a server start: each such database holds a slot of pg_tide's and gets its
//! launcher at once). The pipelines of a database pg_tide does not run in (`tide.database`
//! leaves it out, or it accepts no connections) count only as its launcher last published them
//! since the server started. Nothing here is persisted.

use pgrx::{pg_sys, PGRXSharedMemory, PgLwLock};

/// How many pipelines the table holds, in all databases together.
pub const MAX_OWNED: usize = 256;
/// How many databases can wait for a launcher at once (`crate::shmem::MAX_DATABASES`).
const MAX_REQUESTS: usize = crate::shmem::MAX_DATABASES;
const NAME_LEN: usize = 64;

/// One pipeline of some database.
#[derive(Copy, Clone)]
pub struct Owned {
    /// Its database; 0: entry free.
    dboid: u32,
    name: [u8; NAME_LEN],
    /// The owner's OID (0: unknown, a role that no longer exists).
    owner: u32,
    /// The pid of the backend whose open transaction creates it; 0 once settled.
    pending: i32,
    /// The pid of its live worker; 0 when none.
    worker: i32,
    /// Readers its worker runs.
    readers: u16,
    /// Its owner is a superuser: not limited (as the launcher last saw).
    unlimited: bool,
}

impl Default for Owned {
    fn default() -> Self {
        Owned {
            dboid: 0,
            name: [0; NAME_LEN],
            owner: 0,
            pending: 0,
            worker: 0,
            readers: 0,
            unlimited: false,
        }
    }
}

impl Owned {
    fn name(&self) -> &[u8] {
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
        &self.name[..end]
    }
    fn is(&self, dboid: u32, name: &str) -> bool {
        self.dboid == dboid && dboid != 0 && self.name() == name.as_bytes()
    }
    fn new(dboid: u32, name: &str, owner: u32, pending: i32) -> Owned {
        let mut o = Owned {
            dboid,
            owner,
            pending,
            ..Owned::default()
        };
        let n = name.len().min(NAME_LEN - 1);
        o.name[..n].copy_from_slice(&name.as_bytes()[..n]);
        o
    }
    /// The processes it runs now: its worker (if alive) and that worker's readers.
    fn processes(&self) -> i64 {
        if self.worker > 0 && crate::shmem::alive(self.worker) {
            1 + i64::from(self.readers)
        } else {
            0
        }
    }
}

/// The table (see the module comment).
#[derive(Copy, Clone)]
pub struct Quota {
    owned: [Owned; MAX_OWNED],
    /// Databases (OIDs) whose launcher is asked for; 0: free.
    requests: [u32; MAX_REQUESTS],
}

impl Default for Quota {
    fn default() -> Self {
        Quota {
            owned: [Owned::default(); MAX_OWNED],
            requests: [0; MAX_REQUESTS],
        }
    }
}

// SAFETY: Quota is fixed-size plain data (integers, booleans, byte arrays: no pointer, no heap
// allocation), valid at any address in any process, read and written only under the PgLwLock.
unsafe impl PGRXSharedMemory for Quota {}

// SAFETY: a named lock of shared memory, registered once by `_PG_init` (pg_shmem_init!) before
// any process reads it, as pgrx requires of a `PgLwLock` static.
pub static QUOTA: PgLwLock<Quota> = unsafe { PgLwLock::new(c"pg_tide_quota") };

fn my_db() -> u32 {
    // SAFETY: set once at connection, read-only afterwards.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

fn my_pid() -> i32 {
    // SAFETY: set once when the process starts, read-only afterwards.
    unsafe { pg_sys::MyProcPid }
}

/// The pipelines `owner` owns in databases other than the calling backend's, pending ones
/// included.
pub fn pipelines_elsewhere(owner: pg_sys::Oid) -> i64 {
    if !crate::shmem::preloaded() {
        return 0;
    }
    let (db, owner) = (my_db(), owner.to_u32());
    QUOTA
        .share()
        .owned
        .iter()
        .filter(|o| o.dboid != 0 && o.dboid != db && o.owner == owner)
        .count() as i64
}

/// The processes (live workers and their readers) pg_tide runs for `owner`'s pipelines now, in
/// every database; and of those, the readers.
pub fn processes_of(owner: pg_sys::Oid) -> (i64, i64) {
    if !crate::shmem::preloaded() {
        return (0, 0);
    }
    let owner = owner.to_u32();
    let q = QUOTA.share();
    let mine = q.owned.iter().filter(|o| o.dboid != 0 && o.owner == owner);
    mine.fold((0, 0), |(p, r), o| {
        let n = o.processes();
        (p + n, r + (n - 1).max(0))
    })
}

/// The calling backend's transaction creates pipeline `name` for `owner` (under the role's
/// lock): add its pending entry, settled at commit, removed at abort. False when the table is
/// full.
pub fn creating(name: &str, owner: pg_sys::Oid) -> bool {
    if !crate::shmem::preloaded() {
        return true;
    }
    let (db, pid) = (my_db(), my_pid());
    {
        let mut q = QUOTA.exclusive();
        let Some(free) = q.owned.iter().position(|o| o.dboid == 0) else {
            return false;
        };
        q.owned[free] = Owned::new(db, name, owner.to_u32(), pid);
    }
    let settle = name.to_string();
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, move || {
        let mut q = QUOTA.exclusive();
        // The launcher may have published it settled meanwhile: keep one entry.
        let settled = q.owned.iter().any(|o| o.is(db, &settle) && o.pending == 0);
        for o in q
            .owned
            .iter_mut()
            .filter(|o| o.is(db, &settle) && o.pending == pid)
        {
            if settled {
                *o = Owned::default();
            } else {
                o.pending = 0;
            }
        }
    });
    let forget = name.to_string();
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Abort, move || {
        let mut q = QUOTA.exclusive();
        for o in q
            .owned
            .iter_mut()
            .filter(|o| o.is(db, &forget) && o.pending == pid)
        {
            *o = Owned::default();
        }
    });
    true
}

/// Pipeline `name` of the calling backend's database is dropped once this transaction commits.
pub fn dropping(name: &str) {
    if !crate::shmem::preloaded() {
        return;
    }
    let (db, name) = (my_db(), name.to_string());
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, move || {
        let mut q = QUOTA.exclusive();
        for o in q
            .owned
            .iter_mut()
            .filter(|o| o.is(db, &name) && o.pending == 0)
        {
            *o = Owned::default();
        }
    });
}

/// One pipeline as its database's launcher publishes it.
pub struct Published {
    pub name: String,
    /// The owner's OID (0: a role that no longer exists).
    pub owner: u32,
    pub superuser: bool,
}

/// The launcher of the calling database publishes its pipelines. Settled
/// entries of the database not in the list go (keeping what a worker counted in those that
/// stay); pending ones stay while their creator lives. Pipelines that do not fit are not
/// counted (logged by the caller).
pub fn publish(pipelines: &[Published]) -> usize {
    let db = my_db();
    // Before the table's lock: the registry has a lock of its own.
    let workers: Vec<i32> = pipelines
        .iter()
        .map(|p| crate::shmem::worker_pid(&p.name).unwrap_or(0))
        .collect();
    let mut q = QUOTA.exclusive();
    for o in q.owned.iter_mut().filter(|o| o.dboid == db) {
        let listed = pipelines.iter().any(|p| o.is(db, &p.name));
        let stale_pending = o.pending != 0 && !crate::shmem::alive(o.pending);
        if (o.pending == 0 && !listed) || stale_pending {
            *o = Owned::default();
        }
    }
    let mut unlisted = 0;
    for (p, &worker) in pipelines.iter().zip(&workers) {
        // Settled, or committed now: a pending entry of it settles here.
        let at = q
            .owned
            .iter()
            .position(|o| o.is(db, &p.name) && o.pending == 0)
            .or_else(|| q.owned.iter().position(|o| o.is(db, &p.name)));
        let at = match at.or_else(|| q.owned.iter().position(|o| o.dboid == 0)) {
            Some(i) => i,
            None => {
                unlisted += 1;
                continue;
            }
        };
        let o = &mut q.owned[at];
        if o.dboid == 0 {
            *o = Owned::new(db, &p.name, p.owner, 0);
        }
        o.pending = 0;
        o.owner = p.owner;
        o.unlimited = p.superuser;
        if o.worker == 0 || !crate::shmem::alive(o.worker) {
            o.worker = worker;
            o.readers = 0;
        }
    }
    unlisted
}

/// The calling launcher leaves its database for want of pipelines: forget its entries.
pub fn forget_my_database() {
    let db = my_db();
    let mut q = QUOTA.exclusive();
    for o in q
        .owned
        .iter_mut()
        .filter(|o| o.dboid == db && o.pending == 0)
    {
        *o = Owned::default();
    }
}

/// Forget the entries of database `dboid`, which a `DROP DATABASE` of this backend has just
/// dropped (its pipelines went with it: they stop counting at once, as a dropped pipeline does
/// at its commit, not only at the supervisor's next scan).
pub fn forget_database(dboid: u32) {
    if dboid == 0 {
        return;
    }
    let mut q = QUOTA.exclusive();
    for o in q.owned.iter_mut().filter(|o| o.dboid == dboid) {
        *o = Owned::default();
    }
}

/// Forget the entries of every database not in `alive` (the supervisor, after a scan of
/// `pg_database`: those databases were dropped).
pub fn forget_databases_except(alive: &[u32]) {
    let mut q = QUOTA.exclusive();
    for o in q.owned.iter_mut() {
        if o.dboid != 0 && !alive.contains(&o.dboid) {
            *o = Owned::default();
        }
    }
}

/// The calling worker (of pipeline `name` of its database) runs: note its pid. Cleared by
/// [`worker_exits`].
pub fn worker_starts(name: &str) {
    let (db, pid) = (my_db(), my_pid());
    let mut q = QUOTA.exclusive();
    if let Some(o) = q.owned.iter_mut().find(|o| o.is(db, name)) {
        o.worker = pid;
        o.readers = 0;
    }
}

/// The calling worker exits (a `before_shmem_exit` callback): its entry counts no process.
pub fn worker_exits() {
    if !crate::shmem::preloaded() {
        return;
    }
    let pid = my_pid();
    let mut q = QUOTA.exclusive();
    for o in q.owned.iter_mut().filter(|o| o.worker == pid) {
        o.worker = 0;
        o.readers = 0;
    }
}

/// Why [`reserve_reader`] counted no reader.
pub enum NoReader {
    /// The owner's processes, server-wide, are `now`: one more would pass `limit`.
    AtLimit { now: i64, limit: i64 },
    /// The pipeline is not in the table (its launcher has not published it, or the table is
    /// full): nothing to count it against.
    NotCounted,
}

/// The calling worker (of pipeline `name`) wants one more reader: counted when its owner's
/// processes, server-wide, stay within `limit`.
pub fn reserve_reader(name: &str, limit: i64) -> Result<(), NoReader> {
    let (db, pid) = (my_db(), my_pid());
    let mut q = QUOTA.exclusive();
    let Some(i) = q.owned.iter().position(|o| o.is(db, name)) else {
        return Err(NoReader::NotCounted);
    };
    if q.owned[i].worker != pid {
        q.owned[i].worker = pid;
        q.owned[i].readers = 0;
    }
    if q.owned[i].unlimited {
        q.owned[i].readers += 1;
        return Ok(());
    }
    let owner = q.owned[i].owner;
    let now: i64 = q
        .owned
        .iter()
        .filter(|o| o.dboid != 0 && o.owner == owner)
        .map(Owned::processes)
        .sum();
    if now + 1 > limit {
        return Err(NoReader::AtLimit { now, limit });
    }
    q.owned[i].readers += 1;
    Ok(())
}

/// A reader counted by [`reserve_reader`] is gone.
pub fn reader_gone(name: &str) {
    let (db, pid) = (my_db(), my_pid());
    let mut q = QUOTA.exclusive();
    if let Some(o) = q
        .owned
        .iter_mut()
        .find(|o| o.is(db, name) && o.worker == pid)
    {
        o.readers = o.readers.saturating_sub(1);
    }
}

/// Ask the supervisor for a launcher in the calling backend's database (once this transaction
/// commits, or aborts: a slot made before the abort is the launcher's to drop). A launcher that
/// runs already is woken instead.
pub fn want_launcher_at_end() {
    if !crate::shmem::preloaded() {
        return;
    }
    let db = my_db();
    for event in [
        pgrx::PgXactCallbackEvent::Commit,
        pgrx::PgXactCallbackEvent::Abort,
    ] {
        pgrx::register_xact_callback(event, move || want_launcher(db));
    }
}

/// Ask the supervisor for a launcher in database `db` now (see [`want_launcher_at_end`]).
pub fn want_launcher(db: u32) {
    if let Some(pid) = crate::shmem::launcher_pid() {
        crate::shmem::wake(pid);
        return;
    }
    {
        let mut q = QUOTA.exclusive();
        if !q.requests.contains(&db) {
            if let Some(free) = q.requests.iter().position(|&r| r == 0) {
                q.requests[free] = db;
            }
        }
    }
    if let Some(pid) = crate::shmem::supervisor_pid() {
        crate::shmem::wake(pid);
    }
}

/// The databases whose launcher was asked for since the last call (the supervisor's inbox).
pub fn take_requests() -> Vec<u32> {
    let mut q = QUOTA.exclusive();
    let out = q.requests.iter().copied().filter(|&r| r != 0).collect();
    q.requests = [0; MAX_REQUESTS];
    out
}

/// The databases that hold a logical replication slot of pg_tide's output plugin, read from the
/// server's slot array (the supervisor is connected to no database).
pub fn databases_with_slots() -> Vec<u32> {
    let mut out = Vec::new();
    // SAFETY: ReplicationSlotCtl and its array of max_replication_slots slots live in shared
    // memory for the server's life; in_use, database and plugin change only under
    // ReplicationSlotControlLock held exclusively (slot creation and drop), taken here shared
    // (MainLWLockArray[37] in PostgreSQL 15's lwlocknames.h).
    unsafe {
        let ctl = pg_sys::ReplicationSlotCtl;
        if ctl.is_null() {
            return out;
        }
        let lock = &raw mut (*pg_sys::MainLWLockArray.add(37)).lock;
        pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_SHARED);
        let slots = (&raw mut (*ctl).replication_slots) as *mut pg_sys::ReplicationSlot;
        for i in 0..pg_sys::max_replication_slots.max(0) as usize {
            let s = &*slots.add(i);
            if !s.in_use || s.data.database == pg_sys::InvalidOid {
                continue;
            }
            let plugin = std::ffi::CStr::from_ptr(s.data.plugin.data.as_ptr());
            if plugin.to_bytes() == b"pg_tide" && !out.contains(&s.data.database.to_u32()) {
                out.push(s.data.database.to_u32());
            }
        }
        pg_sys::LWLockRelease(lock);
    }
    out
}
