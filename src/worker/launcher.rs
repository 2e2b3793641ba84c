//! The supervisor and the database launchers: who starts a worker per pipeline, in every
//! database that has pipelines.
//!
//! A backend connects to one database for its life, so no one process can read the catalogs of
//! every database. As PostgreSQL's logical replication launcher does, pg_tide splits the job:
//! a static supervisor connected to no database, which reads the shared catalog `pg_database`,
//! and one dynamic launcher per database, connected to it, which runs that database's pipelines.
//!
//! Lifecycle of the supervisor (`backend_type = 'pg_tide supervisor'`; who sets what):
//! - registered in `_PG_init` only when pg_tide is preloaded; the postmaster restarts it 5 s after
//!   it exits with a non-zero code; it connects to no database;
//! - every tick (2 s, or sooner when woken) it scans `pg_database`; a database may have a
//!   launcher when it accepts connections, is not a template and is listed by `tide.database`
//!   (empty: every database). Such a database gets one only while it has pipelines (issue 44:
//!   `CREATE DATABASE` from a template with the extension must not take a background worker
//!   slot), that is when: it holds a logical slot of pg_tide's output plugin (read from the
//!   server's slot array: every pipeline has one; so at the supervisor's start, and when a
//!   database is listed again or opens again); a `create_pipeline` (or `alter_pipeline`) there
//!   asked for one (`quota::want_launcher`, at its commit or abort, which sets the
//!   supervisor's latch: the first pipeline's worker starts within about a second); or, once
//!   after the supervisor starts, one database per tick in turn that has no slot of pg_tide's
//!   (a probe: a pipeline whose slot was lost while the server was down still runs). So at
//!   most one launcher runs in a database without pipelines, for less than a second, except
//!   where a slot of pg_tide's lives;
//! - a database launcher tells why it left (`shmem::DbExit`): with no pipelines (and no slot
//!   of pg_tide's), without the extension, or when not listed, it is not started again until
//!   one is asked for there; after it yielded the database (below) it is started again 5 s
//!   later; after it died it is started again with back-off (0.5 s doubling up to about 2 min
//!   while it keeps dying young);
//! - it forgets the per-role counts (`crate::quota`) of databases that are gone;
//! - a name in `tide.database` that no database has is logged once (again if it comes back and
//!   goes again);
//! - handles SIGTERM (exit), SIGHUP (reload) and postmaster death (exit).
//!
//! Lifecycle of a database launcher (`backend_type = 'pg_tide launcher'`, one per database):
//! - started by the supervisor (never restarted by the postmaster), connects to its database by
//!   OID and fills its slot in shared memory;
//! - exits when its database has no pipelines and no slot of pg_tide's (after a round that
//!   dropped the orphans it may; while the SQL objects are of another version, when it has no
//!   slot of pg_tide's), forgetting its database's per-role counts;
//! - every round publishes its database's pipelines and their owners in `crate::quota` (the
//!   per-role limits are counted server-wide from there);
//! - exits, stopping the pipeline workers of its database first, when: the extension is not
//!   installed (or was dropped); `tide.database` does not list its database (checked at start and
//!   on every reload); another session asks for the database to itself. That last one is seen
//!   through the lock manager: `DROP DATABASE`, `ALTER DATABASE ... RENAME / SET TABLESPACE` and
//!   `CREATE DATABASE ... TEMPLATE` lock the database in a mode that conflicts with a writer's
//!   (what every session takes to connect), then wait 5 s at most for the other sessions of that
//!   database to leave. Every tick the launcher asks for a writer's lock without waiting; when it
//!   cannot have it, and a session that holds or waits for such a lock may run the command (a
//!   superuser, a member of the database's owner, or a `CREATEDB` role copying a template: the
//!   commands lock before they check rights, so a role without them must not make the
//!   pipelines stop, issue 44), it stops its workers (SIGTERM) and leaves, so these commands
//!   succeed;
//! - handles SIGTERM (exit), SIGHUP (reload) and postmaster death (exit);
//! - every tick reads the version of the extension's SQL objects: while it differs from the
//!   library's (a new `pg_tide.so` loaded, `ALTER EXTENSION pg_tide UPDATE` not run yet, or the
//!   reverse), it stops the workers of its database and starts none, logging the reason and the
//!   remedy once; the tick after the versions match again starts them, and each resumes from its
//!   slot;
//! - every tick (1 s, or sooner when woken): starts a dynamic worker for every pipeline of its
//!   database that has none, with a per-pipeline back-off when a worker keeps dying, and drops
//!   replication slots of its database named `tide_*` that no pipeline owns (a slot left by a
//!   `create_pipeline` whose transaction rolled back), skipping slots whose creating transaction
//!   is still open;
//! - every tick, before starting workers, releases the replication origins (and slots) pg_tide
//!   made for a database that no longer exists (`worker::leaks`, logged; one launcher of the
//!   server at a time);
//! - after that, every tick runs the outbox retention of its database (`worker::retention`:
//!   batches of deletes, at most 0.5 s per tick; the next tick comes after 50 ms instead of 1 s
//!   while work is left).

use crate::gucs;
use crate::quota;
use crate::shmem;
use crate::worker::tx;
use pgrx::bgworkers::*;
use pgrx::prelude::*;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Name and type of the supervisor process, as shown in `pg_stat_activity.backend_type`.
pub const SUPERVISOR_TYPE: &str = "pg_tide supervisor";
/// `backend_type` of a database launcher.
pub const LAUNCHER_TYPE: &str = "pg_tide launcher";
/// `backend_type` of pipeline workers.
pub const WORKER_TYPE: &str = "pg_tide worker";

/// Register the supervisor with the postmaster. Called from `_PG_init` when preloaded.
pub fn register() {
    BackgroundWorkerBuilder::new(SUPERVISOR_TYPE)
        .set_type(SUPERVISOR_TYPE)
        .set_library("pg_tide")
        .set_function("tide_launcher_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

struct Running {
    handle: DynamicBackgroundWorker,
    started: Instant,
}

/// How soon a pipeline's worker may start again after dying young. Kept per pipeline: a
/// pipeline dropped and created again under the same name starts afresh.
struct Backoff {
    /// `tide.pipeline.created_at` of the pipeline it is about.
    created: String,
    failures: u32,
    not_before: Instant,
}

/// What the supervisor knows of one database.
enum DbState {
    /// Its launcher runs (or is being started).
    Running {
        handle: DynamicBackgroundWorker,
        started: Instant,
    },
    /// Its launcher found no pipelines (or no extension, or a `tide.database` that does not list
    /// it): started again when one is asked for there (`quota::want_launcher`).
    Idle,
    /// Start its launcher again at `not_before`.
    Waiting { not_before: Instant },
}

/// One row of `pg_database`.
struct Database {
    oid: u32,
    name: String,
    /// Accepts connections (`datallowconn`), is no template and is valid (not half dropped).
    connectable: bool,
}

/// Whether a database launcher may run in `d`.
fn wanted(d: &Database, listed: &[String]) -> bool {
    d.connectable && (listed.is_empty() || listed.contains(&d.name))
}

/// The supervisor's memory between ticks.
#[derive(Default)]
struct Supervisor {
    dbs: HashMap<u32, DbState>,
    /// Databases whose launcher died young, how many times in a row.
    failures: HashMap<u32, u32>,
    missing_logged: HashSet<String>,
    no_slot_logged: HashSet<u32>,
    /// Databases seen at the first scan, without a slot of pg_tide's, not looked into yet: each
    /// gets one launcher in turn, one per tick, which stays only if it finds pipelines (those
    /// of a pipeline whose slot was lost while the server was down).
    probes: std::collections::VecDeque<u32>,
    scanned: bool,
}

/// Main function of the supervisor (see the module comment).
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn tide_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // No database: the supervisor reads only the shared catalog pg_database, and must not keep
    // any database busy (DROP DATABASE waits for every session of the database to leave).
    BackgroundWorker::connect_worker_to_spi(None, None);
    // SAFETY: reads a process global set at process start; main thread.
    shmem::REGISTRY.exclusive().supervisor_pid = unsafe { pg_sys::MyProcPid };
    log!("pg_tide supervisor started");

    let mut sup = Supervisor::default();
    let mut wait = Duration::ZERO;
    while BackgroundWorker::wait_latch(Some(wait)) {
        wait = Duration::from_secs(2);
        if BackgroundWorker::sighup_received() {
            // SAFETY: rereads the configuration files at a SIGHUP, as PostgreSQL's own processes
            // do, outside any transaction; main thread.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        sup.tick();
    }
    log!("pg_tide supervisor exiting");
}

impl Supervisor {
    /// One round: see the module comment.
    fn tick(&mut self) {
        let listed = gucs::databases();
        // Taken before the scan: a request made after it is seen next tick (it wakes us).
        let requested = quota::take_requests();
        let all = databases();
        let slots = quota::databases_with_slots();
        quota::forget_databases_except(&all.iter().map(|d| d.oid).collect::<Vec<_>>());
        for name in &listed {
            if !all.iter().any(|d| d.name == *name) && self.missing_logged.insert(name.clone()) {
                log!("pg_tide supervisor: database \"{name}\" named in tide.database does not exist; its pipelines start once it is created and has them");
            }
        }
        self.missing_logged
            .retain(|n| listed.contains(n) && !all.iter().any(|d| d.name == *n));
        self.reap(&slots);
        // Forget databases that are gone or not wanted (the launcher of one no longer listed
        // leaves by itself at the reload).
        self.dbs.retain(|oid, st| {
            matches!(st, DbState::Running { .. })
                || all.iter().any(|d| d.oid == *oid && wanted(d, &listed))
        });
        let dbs = &self.dbs;
        self.failures.retain(|oid, _| dbs.contains_key(oid));
        if !self.scanned {
            self.scanned = true;
            self.probes = all
                .iter()
                .filter(|d| wanted(d, &listed) && !slots.contains(&d.oid))
                .map(|d| d.oid)
                .collect();
        }
        let mut probe = self.probes.pop_front();
        for d in all.iter().filter(|d| wanted(d, &listed)) {
            let asked = requested.contains(&d.oid);
            let start = match self.dbs.get(&d.oid) {
                None => asked || slots.contains(&d.oid) || probe == Some(d.oid),
                Some(DbState::Running { .. }) => false,
                Some(DbState::Idle) => asked,
                Some(DbState::Waiting { not_before }) => Instant::now() >= *not_before,
            };
            if probe == Some(d.oid) {
                probe = None;
            }
            if start {
                self.start(d);
            }
        }
    }

    /// Launchers that stopped: why, and when to start them again.
    fn reap(&mut self, slots: &[u32]) {
        for (oid, st) in self.dbs.iter_mut() {
            let DbState::Running { handle, started } = st else {
                continue;
            };
            match handle.pid() {
                Ok(_) | Err(BackgroundWorkerStatus::NotYetStarted) => continue,
                Err(_) => {}
            }
            let now = Instant::now();
            *st = match shmem::take_db_exit(*oid) {
                shmem::DbExit::NotInstalled | shmem::DbExit::NotListed => {
                    self.failures.remove(oid);
                    DbState::Idle
                }
                // A create_pipeline made its slot after the launcher looked: at once again.
                shmem::DbExit::NoPipelines if slots.contains(oid) => {
                    DbState::Waiting { not_before: now }
                }
                shmem::DbExit::NoPipelines => {
                    self.failures.remove(oid);
                    DbState::Idle
                }
                shmem::DbExit::Yielded => {
                    self.failures.remove(oid);
                    DbState::Waiting {
                        not_before: now + Duration::from_secs(5),
                    }
                }
                shmem::DbExit::Unknown => {
                    let f = self.failures.entry(*oid).or_insert(0);
                    *f = if started.elapsed() < Duration::from_secs(30) {
                        (*f + 1).min(8)
                    } else {
                        0
                    };
                    DbState::Waiting {
                        not_before: now + Duration::from_millis(500u64 << *f),
                    }
                }
            };
        }
    }

    /// Start the launcher of `d`.
    fn start(&mut self, d: &Database) {
        match start_db_launcher(d) {
            Ok(handle) => {
                self.no_slot_logged.remove(&d.oid);
                self.dbs.insert(
                    d.oid,
                    DbState::Running {
                        handle,
                        started: Instant::now(),
                    },
                );
            }
            Err(()) => {
                if self.no_slot_logged.insert(d.oid) {
                    log!("pg_tide supervisor: could not start the launcher of database \"{}\": no background worker slot free (raise max_worker_processes)", d.name);
                }
                self.dbs.insert(
                    d.oid,
                    DbState::Waiting {
                        not_before: Instant::now() + Duration::from_secs(10),
                    },
                );
            }
        }
    }
}

fn start_db_launcher(d: &Database) -> Result<DynamicBackgroundWorker, ()> {
    // bgw_name holds 96 bytes; a database name at most 63.
    BackgroundWorkerBuilder::new(&format!("{LAUNCHER_TYPE} {}", d.name))
        .set_type(LAUNCHER_TYPE)
        .set_library("pg_tide")
        .set_function("tide_database_launcher_main")
        .set_argument(pg_sys::Oid::from(d.oid).into_datum())
        .enable_spi_access()
        .set_restart_time(None)
        // SAFETY: reads a process global set at process start; main thread.
        .set_notify_pid(unsafe { pg_sys::MyProcPid })
        .load_dynamic()
        .map_err(|_| ())
}

/// Leave, telling the supervisor why.
fn leave(why: shmem::DbExit) -> ! {
    shmem::db_launcher_exiting(why);
    crate::pgver::exit_process(0)
}

/// Ask every pipeline worker of this database to stop (SIGTERM: it ends at its next
/// interrupt check, rolling back what it was doing; its slot keeps its place). Only processes
/// of this cluster connected to this database are signalled.
fn stop_workers(why: &str) {
    for w in shmem::snapshot().iter().filter(|w| w.pid > 0) {
        // SAFETY: BackendPidGetProc takes ProcArrayLock and returns a PGPROC or NULL; its
        // databaseId is read once, as CountOtherDBBackends reads it.
        let ours = unsafe {
            let proc = pg_sys::BackendPidGetProc(w.pid);
            !proc.is_null() && (*proc).databaseId == pg_sys::MyDatabaseId
        };
        if ours {
            log!(
                "pg_tide launcher: stopping the worker of pipeline \"{}\" (pid {}): {why}",
                w.name(),
                w.pid
            );
            // SAFETY: the pid is a live backend of this database (BackendPidGetProc above) recorded
            // as this pipeline's worker; should it exit in between, kill fails with ESRCH, which is
            // ignored (the same window pg_terminate_backend has).
            unsafe { libc::kill(w.pid, libc::SIGTERM) };
        }
    }
}

/// What [`database_wanted`] found.
#[derive(PartialEq, Eq)]
enum Wanted {
    Free,
    /// Another session waits to have the database to itself.
    ByAnother,
    /// The database accepts no connections any more.
    Closed,
}

/// Whether another session waits to have this database to itself (`DROP DATABASE`,
/// `ALTER DATABASE ... RENAME / SET TABLESPACE`, `CREATE DATABASE ... TEMPLATE`): the lock a
/// session takes on its database to connect (RowExclusiveLock on the database object), asked
/// for without waiting, is refused. It conflicts with those commands' lock whether they hold it
/// or wait for it; released at once (end of the transaction).
/// Also reports a database closed to connections (`ALTER DATABASE ... ALLOW_CONNECTIONS false`,
/// the step before a `DROP DATABASE`, which refuses while a slot of the database is active).
fn database_wanted() -> Wanted {
    let tag = pg_sys::LOCKTAG {
        // A shared object: no database.
        locktag_field1: 0,
        locktag_field2: pg_sys::DatabaseRelationId.to_u32(),
        // SAFETY: reads a process global set at connection, read-only afterwards; main thread.
        locktag_field3: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field4: 0,
        locktag_type: pg_sys::LockTagType::LOCKTAG_OBJECT as u8,
        locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
    };
    let wanted = tx::run(|| {
        // SAFETY: a transaction-scoped lock that never waits, released by the commit.
        let got = unsafe {
            pg_sys::LockAcquire(
                &tag,
                pg_sys::RowExclusiveLock as pg_sys::LOCKMODE,
                false,
                true,
            )
        };
        if got == pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL {
            // Yield only to a session that may have the database: those commands lock it
            // before they check the caller's rights, so any role could hold or queue for the
            // lock, fail, and try again (issue 44: a role with no rights stopped every pipeline
            // of a database that way).
            return Ok(if wanted_by_one_who_may()? {
                Wanted::ByAnother
            } else {
                Wanted::Free
            });
        }
        let open = crate::sql::one::<bool>(
            "SELECT datallowconn FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()",
            &[],
        )?;
        Ok(if open == Some(false) {
            Wanted::Closed
        } else {
            Wanted::Free
        })
    });
    match wanted {
        Ok(w) => w,
        Err(e) => {
            log!("pg_tide launcher: could not look at the database's lock: {e}");
            Wanted::Free
        }
    }
}

/// Whether a session that holds or waits for a lock on this database that keeps others out
/// (what `DROP DATABASE`, `ALTER DATABASE ... RENAME / SET TABLESPACE` take, and the share lock
/// of `CREATE DATABASE ... TEMPLATE`) may run that command: a superuser, a member of the
/// database's owner, or for the share lock a role with `CREATEDB` copying a template. A
/// session that cannot be identified counts as one that may (the launcher yields, as before).
fn wanted_by_one_who_may() -> crate::error::TideResult<bool> {
    Ok(crate::sql::one::<bool>(
        "SELECT EXISTS (
           SELECT 1 FROM pg_catalog.pg_locks l
             JOIN pg_catalog.pg_database d ON d.oid = l.objid
             LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
             LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.usesysid
            WHERE l.locktype = 'object' AND l.database = 0
              AND l.classid = 'pg_catalog.pg_database'::pg_catalog.regclass
              AND l.objid = (SELECT oid FROM pg_catalog.pg_database
                              WHERE datname = pg_catalog.current_database())
              AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
              AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
              AND (r.oid IS NULL OR r.rolsuper
                   OR pg_catalog.pg_has_role(r.oid, d.datdba, 'MEMBER')
                   OR (l.mode = 'ShareLock' AND d.datistemplate AND r.rolcreatedb)))",
        &[],
    )?
    .unwrap_or(true))
}

/// Main function of a database launcher (see the module comment). The database's OID is the
/// argument.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn tide_database_launcher_main(arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // SAFETY: the launcher's argument is a by-value Oid Datum (set_argument above, at
    // registration).
    let dboid = unsafe { pg_sys::Oid::from_datum(arg, false) }.unwrap_or(pg_sys::InvalidOid);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(dboid), None);
    // SAFETY: reads a process global set at process start; main thread.
    if !shmem::db_launcher_started(unsafe { pg_sys::MyProcPid }) {
        log!(
            "pg_tide launcher: not running: launchers of {} databases run already, the most pg_tide supports",
            shmem::MAX_DATABASES
        );
        return;
    }
    if let Err(e) = tx::run(crate::security::pin_search_path) {
        log!("pg_tide launcher: could not pin its search_path ({e}); exiting to start again");
        crate::pgver::exit_process(1);
    }
    let db = match tx::run(|| {
        crate::sql::one::<String>("SELECT pg_catalog.current_database()::text", &[])
    }) {
        Ok(d) => d.unwrap_or_default(),
        Err(e) => {
            log!("pg_tide launcher: could not read its database's name ({e}); exiting to start again");
            crate::pgver::exit_process(1)
        }
    };
    if !gucs::database_allowed(&db) {
        leave(shmem::DbExit::NotListed);
    }

    // SAFETY: reads a process global set at connection, read-only afterwards; main thread.
    let dboid = unsafe { pg_sys::MyDatabaseId };
    let mut workers = Workers::default();
    let mut announced = false;
    let mut warned_version: Option<String> = None;
    let mut leaks = crate::worker::leaks::Sweeper::default();

    // The next wait: none before the first tick; then a tick, or sooner while the outbox
    // retention has work left.
    let mut wait = Duration::ZERO;
    while BackgroundWorker::wait_latch(Some(wait)) {
        wait = Duration::from_secs(1);
        leave_if_unwanted(&db);
        let pipelines = match tx::run(list_pipelines_and_collect_slots) {
            Ok(p) => p,
            Err(e) => {
                log!("pg_tide launcher: could not read pipelines: {e}");
                continue;
            }
        };
        let pipelines = match pipelines {
            Listing::Pipelines(p) => p,
            Listing::NotInstalled => {
                if announced {
                    log!("pg_tide launcher: extension pg_tide was dropped from database \"{db}\"; the launcher leaves (CREATE EXTENSION pg_tide starts it again)");
                } else {
                    debug1!("pg_tide launcher: extension pg_tide is not installed in database \"{db}\"; leaving");
                }
                stop_workers("the extension was dropped");
                leave(shmem::DbExit::NotInstalled);
            }
            Listing::OtherVersion(e) => {
                // Without a slot of pg_tide's here, no pipeline of this database runs: no
                // launcher waits for the versions to match.
                leave_if_no_pipelines(&db, dboid);
                // Workers of this library must not run against another version's catalog:
                // stop those that run (they resume from their slot later) and start none.
                workers.running.clear();
                stop_workers("until the versions match");
                if warned_version.as_deref() != Some(e.message.as_str()) {
                    log!(
                        "pg_tide launcher: {}; pipelines wait. {}",
                        e.message,
                        e.hint.as_deref().unwrap_or("")
                    );
                    warned_version = Some(e.message.clone());
                }
                continue;
            }
        };
        if pipelines.is_empty() {
            leave_if_no_pipelines(&db, dboid);
        }
        if !announced {
            log!("pg_tide launcher started in database \"{db}\"");
            announced = true;
        }
        if warned_version.take().is_some() {
            log!("pg_tide launcher: the SQL objects in database \"{db}\" are at the library's version {} now; starting the pipelines", crate::catalog::LIBRARY_VERSION);
        }

        // Origins (and slots) of dropped databases first: each holds a state a new worker's
        // origin may need.
        leaks.sweep();
        workers.reap(&pipelines);
        workers.start_missing(pipelines, dboid);

        if crate::worker::retention::prune() {
            wait = Duration::from_millis(50);
        }
        crate::worker::definitions::save();
    }
    log!("pg_tide launcher exiting");
}

/// The pipeline workers a database launcher started, and the back-off of those that died young.
#[derive(Default)]
struct Workers {
    running: HashMap<String, Running>,
    backoff: HashMap<String, Backoff>,
}

impl Workers {
    /// Forget workers that have stopped; remember how fast they died. `pipelines`: (name,
    /// `created_at`) of the database's pipelines now.
    fn reap(&mut self, pipelines: &[(String, String)]) {
        // Forget workers that have stopped; remember how fast they died.
        self.running.retain(|name, r| match r.handle.pid() {
            Ok(_) => true,
            Err(BackgroundWorkerStatus::NotYetStarted) => true,
            Err(_) => {
                let created = pipelines
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, c)| c.clone())
                    .unwrap_or_default();
                let b = self.backoff.entry(name.clone()).or_insert(Backoff {
                    created: created.clone(),
                    failures: 0,
                    not_before: Instant::now(),
                });
                if b.created != created {
                    b.created = created;
                    b.failures = 0;
                }
                if r.started.elapsed() < Duration::from_secs(30) {
                    b.failures = (b.failures + 1).min(8);
                } else {
                    b.failures = 0;
                }
                b.not_before = Instant::now() + Duration::from_millis(500u64 << b.failures);
                false
            }
        });
        self.backoff
            .retain(|name, b| pipelines.iter().any(|(n, c)| n == name && *c == b.created));
    }

    /// Start a worker for every pipeline that has none (and is not backing off).
    fn start_missing(&mut self, pipelines: Vec<(String, String)>, dboid: pg_sys::Oid) {
        for (name, created) in pipelines {
            if self.running.contains_key(&name) {
                continue;
            }
            if shmem::worker_pid(&name).is_some() {
                // Started by someone else (an earlier launcher incarnation): leave it alone.
                continue;
            }
            if let Some(b) = self.backoff.get(&name) {
                if Instant::now() < b.not_before {
                    continue;
                }
            }
            match start_worker(&name, dboid) {
                Ok(handle) => {
                    self.running.insert(
                        name,
                        Running {
                            handle,
                            started: Instant::now(),
                        },
                    );
                }
                Err(()) => {
                    log!("pg_tide launcher: could not start the worker of pipeline \"{name}\": no background worker slot free (raise max_worker_processes)");
                    self.backoff.insert(
                        name,
                        Backoff {
                            created,
                            failures: 4,
                            not_before: Instant::now() + Duration::from_secs(10),
                        },
                    );
                }
            }
        }
    }
}

/// Leave when the database has no pipelines and no slot of pg_tide's (one whose creating
/// transaction is still open, or an orphan not dropped yet): a database has a launcher only
/// while it has pipelines (issue 44: every database copied from a template with the extension
/// took a background worker slot). A `create_pipeline` asks the supervisor for it again.
fn leave_if_no_pipelines(db: &str, dboid: pg_sys::Oid) {
    if quota::databases_with_slots().contains(&dboid.to_u32()) {
        return;
    }
    log!("pg_tide launcher: database \"{db}\" has no pipelines (and no slot of pg_tide's); the launcher leaves (tide.create_pipeline starts it again)");
    quota::forget_my_database();
    leave(shmem::DbExit::NoPipelines);
}

/// Leave (stopping this database's workers) when the database is no longer this launcher's:
/// `tide.database` stops listing it (checked after a reload), it stops allowing connections,
/// or another session wants it to itself (DROP DATABASE, ALTER DATABASE, a template copy).
fn leave_if_unwanted(db: &str) {
    if BackgroundWorker::sighup_received() {
        // SAFETY: rereads the configuration files at a SIGHUP, as PostgreSQL's own processes do,
        // outside any transaction; main thread.
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        if !gucs::database_allowed(db) {
            log!("pg_tide launcher: tide.database does not list database \"{db}\" any more; its pipelines stop");
            stop_workers("tide.database does not list its database");
            leave(shmem::DbExit::NotListed);
        }
    }
    let wanted = database_wanted();
    if wanted == Wanted::Closed {
        log!("pg_tide launcher: database \"{db}\" does not allow connections any more; its pipelines stop (ALTER DATABASE ... ALLOW_CONNECTIONS true starts them again)");
        stop_workers("its database does not allow connections any more");
        leave(shmem::DbExit::NotListed);
    }
    if wanted == Wanted::ByAnother {
        log!("pg_tide launcher: another session needs database \"{db}\" to itself (DROP DATABASE, ALTER DATABASE, or CREATE DATABASE from it as a template); its pipelines stop and the launcher leaves, to start again once the database is free");
        stop_workers("its database is wanted by another session");
        leave(shmem::DbExit::Yielded);
    }
}

fn start_worker(name: &str, dboid: pg_sys::Oid) -> Result<DynamicBackgroundWorker, ()> {
    BackgroundWorkerBuilder::new(&format!("{WORKER_TYPE} {name}"))
        .set_type(WORKER_TYPE)
        .set_library("pg_tide")
        .set_function("tide_pipeline_worker_main")
        .set_argument(dboid.into_datum())
        .set_extra(name)
        .enable_spi_access()
        .set_restart_time(None)
        // SAFETY: reads a process global set at process start; main thread.
        .set_notify_pid(unsafe { pg_sys::MyProcPid })
        .load_dynamic()
        .map_err(|_| ())
}

/// What the launcher found in the database at one tick.
enum Listing {
    /// `CREATE EXTENSION pg_tide` has not run (or the extension was dropped).
    NotInstalled,
    /// The SQL objects are of another version than the library (an upgrade half done).
    OtherVersion(crate::error::TideError),
    /// Every pipeline: (name, creation time).
    Pipelines(Vec<(String, String)>),
}

/// The pipelines to run, when the extension is installed at the library's version. Also drops
/// orphaned `tide_*` slots (see the module comment).
fn list_pipelines_and_collect_slots() -> Result<Listing, crate::error::TideError> {
    match crate::catalog::installed_version()? {
        None => return Ok(Listing::NotInstalled),
        Some(v) if v != crate::catalog::LIBRARY_VERSION => {
            return Ok(Listing::OtherVersion(crate::catalog::version_mismatch(&v)))
        }
        Some(_) => {}
    }
    let names = Spi::connect(crate::catalog::pipelines::list)?;
    publish_pipelines()?;
    crate::catalog::slots::drop_orphan_slots()?;
    Ok(Listing::Pipelines(names))
}

/// Publish this database's pipelines and their owners for the per-role, server-wide counts
/// (`crate::quota`). In the launcher's transaction.
fn publish_pipelines() -> Result<(), crate::error::TideError> {
    let out: Vec<quota::Published> = crate::catalog::pipelines::owners_for_quota()?
        .into_iter()
        .map(|(name, owner, superuser)| quota::Published {
            name,
            owner,
            superuser,
        })
        .collect();
    let unlisted = quota::publish(&out);
    if unlisted > 0 {
        log!("pg_tide launcher: {unlisted} pipelines not counted against their owners: pg_tide counts at most {} on the server", quota::MAX_OWNED);
    }
    Ok(())
}

/// Every database in `pg_database` (a shared catalog), read straight from the heap: without a
/// database connection the syscache and index scans are not available, so this scans the heap,
/// as the autovacuum launcher does.
fn databases() -> Vec<Database> {
    let mut out = Vec::new();
    // SAFETY: a catalog heap scan in a transaction of its own; the tuples are copied out before
    // the scan ends.
    unsafe {
        pg_sys::StartTransactionCommand();
        let _ = pg_sys::GetTransactionSnapshot();
        let rel = pg_sys::table_open(
            pg_sys::DatabaseRelationId,
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
        );
        let scan = pg_sys::table_beginscan_catalog(rel, 0, std::ptr::null_mut());
        loop {
            let tup = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tup.is_null() {
                break;
            }
            let form = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(tup);
            let name = std::ffi::CStr::from_ptr(form.datname.data.as_ptr());
            out.push(Database {
                oid: form.oid.to_u32(),
                name: name.to_string_lossy().into_owned(),
                // datconnlimit -2: a DROP DATABASE was interrupted (the database is invalid).
                connectable: form.datallowconn && !form.datistemplate && form.datconnlimit != -2,
            });
        }
        pg_sys::table_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        pg_sys::CommitTransactionCommand();
    }
    out
}
