//! Shared memory: the supervisor's identity, one slot per database launcher, and one slot of live
//! statistics per pipeline worker.
//!
//! Nothing here is persisted: it is rebuilt from scratch at every server start (and after a
//! crash restart). Durable pipeline state lives in each database's `tide.pipeline` table.
//! Pipeline names are unique per database only, so a worker's slot is keyed by (database OID,
//! pipeline name), and every lookup by name ([`worker_pid`], [`caught_up_lsn`], [`snapshot`],
//! [`launcher_pid`]) is of the calling backend's database (`MyDatabaseId`).
//! Writers: the supervisor sets `supervisor_pid`; a database launcher fills its database's slot
//! in `launchers` at start and says why it leaves ([`db_launcher_exiting`]), and the supervisor
//! frees the slot once it has read that ([`take_db_exit`]); a pipeline worker claims one slot at
//! start, updates it after every iteration and clears it when it exits. Readers: the SQL API (to
//! wake or stop workers) and the `tide.pipelines` view (through `tide._worker_status()`).
//! Every backend's commit callback also reports here when a transaction that changed the system
//! catalogs commits ([`catalog_changed_after`]), so a worker knows when the catalog caches it
//! shares with its decoder must be reset (see `worker::decoder`).

use pgrx::{pg_sys, PGRXSharedMemory, PgAtomic, PgLwLock};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

/// How many pipelines can run at once (in all databases together).
pub const MAX_PIPELINES: usize = 64;
/// How many databases can have a launcher at once.
pub const MAX_DATABASES: usize = 64;
const NAME_LEN: usize = 64;

/// Worker state as the worker reports it. Set only by the pipeline worker; not persisted (the
/// catalog keeps the last error; "stopped" is what the view shows when no worker is alive).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum WorkerState {
    /// Slot free or worker not yet running.
    #[default]
    None = 0,
    /// Worker started, first iteration not finished.
    Starting = 1,
    /// Worker applied (or found nothing to apply) in its last iteration.
    Streaming = 2,
    /// The pipeline is disabled by `tide.pause_pipeline`.
    Paused = 3,
    /// The last iteration failed; the worker is backing off before retrying.
    Error = 4,
    /// The last iteration delivered nothing new: the standbys of `synchronized_standby_slots`
    /// have not confirmed the WAL it is to hand to a target outside the source database
    /// (`worker::decoder`, failover slots).
    WaitingForStandby = 5,
}

impl WorkerState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::None => "stopped",
            WorkerState::Starting => "starting",
            WorkerState::Streaming => "streaming",
            WorkerState::Paused => "paused",
            WorkerState::Error => "error",
            WorkerState::WaitingForStandby => "waiting for standby",
        }
    }
}

/// Live statistics of one pipeline worker.
#[derive(Copy, Clone, Debug)]
pub struct WorkerSlot {
    pub in_use: bool,
    /// OID of the worker's database: with `name`, the slot's key.
    pub dboid: u32,
    pub name: [u8; NAME_LEN],
    pub pid: i32,
    pub state: WorkerState,
    /// Worker start time (TimestampTz, µs since 2000-01-01).
    pub started_at: i64,
    pub events: u64,
    pub txns: u64,
    /// Commit time of the last source transaction applied (TimestampTz), 0 if none.
    pub last_commit_time: i64,
    /// True when the last iteration consumed everything the slot had: no backlog.
    pub drained: bool,
    /// Time of the last finished iteration (TimestampTz).
    pub last_poll: i64,
    /// Every source transaction that committed before this LSN has been applied (set after an
    /// iteration that drained the slot: the WAL flush position read when it started).
    pub caught_up_lsn: u64,
    /// A time (TimestampTz) before which every source transaction that committed has been
    /// applied: when the worker read the flush position it then found it had drained (0: not
    /// known yet). The target reflects the source as of at least this time.
    pub caught_up_at: i64,
}

impl Default for WorkerSlot {
    fn default() -> Self {
        WorkerSlot {
            in_use: false,
            dboid: 0,
            name: [0; NAME_LEN],
            pid: 0,
            state: WorkerState::None,
            started_at: 0,
            events: 0,
            txns: 0,
            last_commit_time: 0,
            drained: false,
            last_poll: 0,
            caught_up_lsn: 0,
            caught_up_at: 0,
        }
    }
}

impl WorkerSlot {
    pub fn name(&self) -> &str {
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
        std::str::from_utf8(&self.name[..end]).unwrap_or("")
    }
    fn set_name(&mut self, name: &str) {
        self.name = [0; NAME_LEN];
        let n = name.len().min(NAME_LEN - 1);
        self.name[..n].copy_from_slice(&name.as_bytes()[..n]);
    }
}

/// Why a database launcher left, as it says before it exits (`Unknown`: it did not say: it
/// died, or failed to connect).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum DbExit {
    #[default]
    Unknown = 0,
    /// The extension is not installed in the database (or was dropped): start it again only when
    /// a launcher is asked for there (`crate::quota::want_launcher`).
    NotInstalled = 1,
    /// Another session wanted the database to itself (`DROP DATABASE`, `ALTER DATABASE ...
    /// RENAME` or `SET TABLESPACE`, `CREATE DATABASE ... TEMPLATE` it): it stopped its workers
    /// and left, to be started again a little later.
    Yielded = 2,
    /// `tide.database` does not list the database (any more), or it does not allow connections
    /// any more.
    NotListed = 3,
    /// The database has no pipelines (and no slot of pg_tide's): start it again when a
    /// `create_pipeline` there asks for it (`crate::quota::want_launcher`), issue 44.
    NoPipelines = 4,
}

/// The launcher of one database.
#[derive(Copy, Clone, Debug, Default)]
pub struct DbLauncher {
    /// The database's OID; 0: slot free.
    pub dboid: u32,
    /// The launcher's pid while it runs, 0 once it has left.
    pub pid: i32,
    pub exit: DbExit,
}

/// Everything pg_tide keeps in shared memory.
#[derive(Copy, Clone)]
pub struct Registry {
    /// The supervisor (`backend_type = 'pg_tide supervisor'`), connected to no database.
    pub supervisor_pid: i32,
    pub launchers: [DbLauncher; MAX_DATABASES],
    pub workers: [WorkerSlot; MAX_PIPELINES],
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            supervisor_pid: 0,
            launchers: [DbLauncher::default(); MAX_DATABASES],
            workers: [WorkerSlot::default(); MAX_PIPELINES],
        }
    }
}

// SAFETY: Registry is fixed-size plain data (integers, booleans, `repr(u8)` enums only ever written
// by this code, byte arrays: no pointer, no heap allocation), valid at any address in any process,
// read and written only under the PgLwLock.
unsafe impl PGRXSharedMemory for Registry {}

// SAFETY: a named lock of shared memory, initialized once by `_PG_init` (pg_shmem_init!) in the
// postmaster before any process uses it, as pgrx requires of a PgLwLock static; every reader checks
// `preloaded()` first.
pub static REGISTRY: PgLwLock<Registry> = unsafe { PgLwLock::new(c"pg_tide_registry") };

/// Lock-free wake-ups: a backend that commits a transaction that wrote WAL wakes the pipeline
/// workers that are waiting for WAL, instead of letting them find it at their next poll.
/// Writers: a worker sets its pid and PGPROC number, and its bit in `sleeping`, right before it
/// waits for WAL (clearing the bit when it wakes); a committing backend clears the bits it finds
/// and sets those workers' latches. A worker that leaves (normally, or by FATAL or SIGTERM in the
/// middle of its wait) clears its bit and pid in a `before_shmem_exit` callback
/// ([`forget_sleeper`]), and a wake-up only ever sets the latch of a PGPROC whose pid is still the
/// worker's ([`set_latch_of`]): no signal is ever sent to a pid, so a pid reused by another
/// process (PostgreSQL's or not) is never signalled. Not persisted.
pub struct Wakeups {
    /// Bit i: the worker of registry slot i waits for WAL (`tide.poll_interval` at most).
    sleeping: AtomicU64,
    /// Pid of the worker of registry slot i (0: none).
    pids: [AtomicI32; MAX_PIPELINES],
    /// PGPROC number (`MyProc->pgprocno`) of the worker of registry slot i.
    procnos: [AtomicI32; MAX_PIPELINES],
    /// End LSN of the commit record of the latest transaction that changed the system catalogs
    /// (it had invalidation messages), as every backend's commit callback reports it; 0 until
    /// the first look ([`catalog_changed_after`] then starts it at the WAL insert position, a
    /// bound for every change made before this server started).
    catalog_commit_end: AtomicU64,
    /// Transactions that changed the catalogs and are between their pre-commit callback and
    /// their commit or abort (visible to others, perhaps, with their end LSN not yet reported).
    catalog_committing: AtomicU32,
}

impl Default for Wakeups {
    fn default() -> Self {
        Wakeups {
            sleeping: AtomicU64::new(0),
            pids: std::array::from_fn(|_| AtomicI32::new(0)),
            procnos: std::array::from_fn(|_| AtomicI32::new(-1)),
            catalog_commit_end: AtomicU64::new(0),
            catalog_committing: AtomicU32::new(0),
        }
    }
}

// SAFETY: Wakeups holds only atomics (fixed-size, no pointer, no heap allocation), valid at any
// address in any process and shared without a lock.
unsafe impl PGRXSharedMemory for Wakeups {}

// SAFETY: named shared memory, initialized once by `_PG_init` (pg_shmem_init!) in the postmaster
// before any process uses it, as pgrx requires of a PgAtomic static; every reader checks
// `preloaded()` first.
pub static WAKEUPS: PgAtomic<Wakeups> = unsafe { PgAtomic::new(c"pg_tide_wakeups") };

/// The worker of registry slot `slot` (pid `pid`, the calling process) is about to wait for WAL.
pub fn sleeping(slot: usize, pid: i32) {
    if slot >= MAX_PIPELINES {
        return;
    }
    let procno = crate::pgver::my_procno();
    let w = WAKEUPS.get();
    w.procnos[slot].store(procno, Ordering::SeqCst);
    w.pids[slot].store(pid, Ordering::SeqCst);
    w.sleeping.fetch_or(1u64 << slot, Ordering::SeqCst);
}

/// The worker of registry slot `slot` (pid `pid`) leaves: forget its wake-up state, if it is
/// still its own (called from its `before_shmem_exit` callback and at a normal exit).
pub fn forget_sleeper(slot: usize, pid: i32) {
    if slot >= MAX_PIPELINES || !preloaded() {
        return;
    }
    let w = WAKEUPS.get();
    if w.pids[slot]
        .compare_exchange(pid, 0, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        w.sleeping.fetch_and(!(1u64 << slot), Ordering::SeqCst);
        w.procnos[slot].store(-1, Ordering::SeqCst);
    }
}

/// The worker of registry slot `slot` stopped waiting.
pub fn awake(slot: usize) {
    if slot < MAX_PIPELINES {
        WAKEUPS
            .get()
            .sleeping
            .fetch_and(!(1u64 << slot), Ordering::SeqCst);
    }
}

/// Wake every worker that waits for WAL (called after a commit that wrote WAL). Costs one
/// atomic load when none waits: under load the workers are busy, not waiting.
pub fn wake_sleepers() {
    let w = WAKEUPS.get();
    if w.sleeping.load(Ordering::Relaxed) == 0 {
        return;
    }
    let taken = w.sleeping.swap(0, Ordering::SeqCst);
    for slot in 0..MAX_PIPELINES {
        if taken & (1u64 << slot) != 0 {
            set_latch_of(
                w.procnos[slot].load(Ordering::SeqCst),
                w.pids[slot].load(Ordering::SeqCst),
            );
        }
    }
}

/// Set the latch of PGPROC number `procno` if that PGPROC still belongs to `pid` (a live backend
/// or worker of this cluster); otherwise do nothing. Never sends a signal itself: `SetLatch`
/// signals the latch's owner, a PostgreSQL process of this cluster, and only while it waits.
fn set_latch_of(procno: i32, pid: i32) {
    if pid <= 0 || procno < 0 {
        return;
    }
    // SAFETY: ProcGlobal and its allProcs array are created at server start and never freed;
    // `procno` came from a PGPROC's own pgprocno, so it indexes that array. A PGPROC's pid is
    // read without its lock: at worst a backend that just took over the PGPROC gets a spurious
    // latch set, which every latch user tolerates.
    unsafe {
        let Some(global) = pg_sys::ProcGlobal.as_ref() else {
            return;
        };
        if procno as u32 >= global.allProcCount {
            return;
        }
        let proc = global.allProcs.add(procno as usize);
        if (*proc).pid == pid {
            pg_sys::SetLatch(&mut (*proc).procLatch);
        }
    }
}

/// A transaction that changed the catalogs is about to commit (its pre-commit callback).
pub fn catalog_commit_begins() {
    if preloaded() {
        WAKEUPS
            .get()
            .catalog_committing
            .fetch_add(1, Ordering::SeqCst);
    }
}

/// That transaction committed with its commit record ending at `end` (`None`: it aborted).
pub fn catalog_commit_ends(end: Option<u64>) {
    if !preloaded() {
        return;
    }
    let w = WAKEUPS.get();
    if let Some(end) = end {
        w.catalog_commit_end.fetch_max(end, Ordering::SeqCst);
    }
    w.catalog_committing.fetch_sub(1, Ordering::SeqCst);
}

/// A transaction that changed the catalogs committed at `end`, noticed only at its commit
/// (changes made after the pre-commit callback, such as `ON COMMIT DROP`).
pub fn catalog_committed(end: u64) {
    if preloaded() {
        WAKEUPS
            .get()
            .catalog_commit_end
            .fetch_max(end, Ordering::SeqCst);
    }
}

/// Whether a change of the system catalogs may have committed after WAL position `lsn`: one
/// is committing now, or the latest one reported ended after `lsn`. Conservative: `true`
/// without shared memory.
pub fn catalog_changed_after(lsn: u64) -> bool {
    if !preloaded() {
        return true;
    }
    let w = WAKEUPS.get();
    if w.catalog_committing.load(Ordering::SeqCst) > 0 {
        return true;
    }
    let mut end = w.catalog_commit_end.load(Ordering::SeqCst);
    if end == 0 {
        // First look since startup: every change made before it lies before the WAL insert
        // position (a later change's commit ends after it).
        // SAFETY: reads the WAL insert position under its own spinlock.
        let now = unsafe { pg_sys::GetXLogInsertRecPtr() };
        end = w
            .catalog_commit_end
            .fetch_max(now, Ordering::SeqCst)
            .max(now);
    }
    end > lsn
}

/// Whether `_PG_init` ran in the postmaster (library preloaded), so the registry exists.
pub fn preloaded() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

/// Called by `_PG_init` when the library is preloaded (in the postmaster, before any backend
/// forks: every backend inherits the value).
pub(crate) fn set_preloaded() {
    PRELOADED.store(true, Ordering::Relaxed);
}

/// Set once in the postmaster, before any fork, and read-only afterwards: relaxed order suffices.
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// The calling backend's database (0 when connected to none).
fn my_db() -> u32 {
    // SAFETY: set once at connection, read-only afterwards.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

impl WorkerSlot {
    /// Whether this slot is the one of pipeline `name` of database `dboid`.
    fn is(&self, dboid: u32, name: &str) -> bool {
        self.in_use && self.dboid == dboid && self.name() == name
    }
}

/// Claim (or re-claim) the slot of a pipeline of the calling worker's database for it.
pub fn claim(name: &str, pid: i32, now: i64) -> Option<usize> {
    let db = my_db();
    let mut reg = REGISTRY.exclusive();
    let idx = reg
        .workers
        .iter()
        .position(|w| w.is(db, name))
        .or_else(|| reg.workers.iter().position(|w| !w.in_use))?;
    let w = &mut reg.workers[idx];
    *w = WorkerSlot::default();
    w.in_use = true;
    w.dboid = db;
    w.set_name(name);
    w.pid = pid;
    w.state = WorkerState::Starting;
    w.started_at = now;
    Some(idx)
}

/// Release a slot if it still belongs to `pid`, with its wake-up state.
pub fn release(idx: usize, pid: i32) {
    forget_sleeper(idx, pid);
    let mut reg = REGISTRY.exclusive();
    if let Some(w) = reg.workers.get_mut(idx) {
        if w.in_use && w.pid == pid {
            *w = WorkerSlot::default();
        }
    }
}

/// Update a worker's slot.
pub fn update(idx: usize, f: impl FnOnce(&mut WorkerSlot)) {
    let mut reg = REGISTRY.exclusive();
    if let Some(w) = reg.workers.get_mut(idx) {
        f(w)
    }
}

/// The pid of the live worker of a pipeline of the calling backend's database, if any.
pub fn worker_pid(name: &str) -> Option<i32> {
    if !preloaded() {
        return None;
    }
    let db = my_db();
    let reg = REGISTRY.share();
    reg.workers
        .iter()
        .find(|w| w.is(db, name))
        .map(|w| w.pid)
        .filter(|&p| p > 0 && alive(p))
}

/// Ask a backend or worker of this cluster to end (SIGTERM, as `pg_terminate_backend`), found
/// by its pid among the PGPROCs; a pid that is no such process any more (the worker exited since
/// its slot was read) is left alone, silently: `pg_terminate_backend` would warn "PID n is not a
/// PostgreSQL backend process" to the caller of `tide.drop_pipeline`. Whether it was signalled.
pub fn terminate(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: BackendPidGetProc takes ProcArrayLock and returns a PGPROC of shared memory, or
    // NULL when no process of the cluster has that pid; only the pointer's nullness is used.
    let found = unsafe { !pg_sys::BackendPidGetProc(pid).is_null() };
    if !found {
        return false;
    }
    // SAFETY: kill(2) with a pid just found among the cluster's processes and a valid signal
    // number; a process that exited in between makes it fail with ESRCH, which is ignored (the
    // same window PostgreSQL's own pg_terminate_backend has).
    unsafe { libc::kill(pid, libc::SIGTERM) == 0 }
}

/// Whether a process exists (the slot of a worker killed with SIGKILL is only cleared by the
/// crash restart that follows).
pub fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the pid exists; no signal is sent.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// How far the worker of a pipeline of the calling backend's database is known to have caught
/// up (see [`WorkerSlot::caught_up_lsn`]).
pub fn caught_up_lsn(name: &str) -> Option<u64> {
    if !preloaded() {
        return None;
    }
    let db = my_db();
    let reg = REGISTRY.share();
    reg.workers
        .iter()
        .find(|w| w.is(db, name))
        .map(|w| w.caught_up_lsn)
}

/// The pid of the launcher of the calling backend's database, if it is running.
pub fn launcher_pid() -> Option<i32> {
    if !preloaded() {
        return None;
    }
    let db = my_db();
    REGISTRY
        .share()
        .launchers
        .iter()
        .find(|l| l.dboid == db && db != 0)
        .map(|l| l.pid)
        .filter(|&p| p > 0 && alive(p))
}

/// The supervisor's pid, if it is running.
pub fn supervisor_pid() -> Option<i32> {
    if !preloaded() {
        return None;
    }
    let p = REGISTRY.share().supervisor_pid;
    (p > 0).then_some(p)
}

/// A copy of the worker slots in use of the calling backend's database.
pub fn snapshot() -> Vec<WorkerSlot> {
    if !preloaded() {
        return Vec::new();
    }
    let db = my_db();
    REGISTRY
        .share()
        .workers
        .iter()
        .filter(|w| w.in_use && w.dboid == db)
        .copied()
        .collect()
}

/// The calling database launcher (pid `pid`) runs: fill its database's slot. False when every
/// slot is taken by other databases ([`MAX_DATABASES`]).
pub fn db_launcher_started(pid: i32) -> bool {
    let db = my_db();
    let mut reg = REGISTRY.exclusive();
    let Some(l) = reg
        .launchers
        .iter()
        .position(|l| l.dboid == db)
        .or_else(|| reg.launchers.iter().position(|l| l.dboid == 0))
    else {
        return false;
    };
    reg.launchers[l] = DbLauncher {
        dboid: db,
        pid,
        exit: DbExit::Unknown,
    };
    true
}

/// The calling database launcher leaves, for `why`.
pub fn db_launcher_exiting(why: DbExit) {
    let db = my_db();
    let mut reg = REGISTRY.exclusive();
    if let Some(l) = reg.launchers.iter_mut().find(|l| l.dboid == db) {
        l.pid = 0;
        l.exit = why;
    }
}

/// Why the launcher of database `dboid` left (called by the supervisor once the process has
/// stopped); frees its slot.
pub fn take_db_exit(dboid: u32) -> DbExit {
    let mut reg = REGISTRY.exclusive();
    match reg.launchers.iter_mut().find(|l| l.dboid == dboid) {
        Some(l) => {
            let why = l.exit;
            *l = DbLauncher::default();
            why
        }
        None => DbExit::Unknown,
    }
}

/// Set the latch of a live backend or worker of this cluster, found by its pid among the
/// PGPROCs (`BackendPidGetProc`); a pid that is no such process (one that exited, its number
/// reused by another program) is not signalled.
pub fn wake(pid: i32) {
    if pid <= 0 {
        return;
    }
    // SAFETY: BackendPidGetProc takes ProcArrayLock and returns a PGPROC of shared memory or
    // NULL; setting its latch is safe even if it is being reused meanwhile.
    unsafe {
        let proc = pg_sys::BackendPidGetProc(pid);
        if !proc.is_null() {
            pg_sys::SetLatch(&mut (*proc).procLatch);
        }
    }
}
