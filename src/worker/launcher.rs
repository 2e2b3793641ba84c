//! The launcher: one static background worker that starts a worker per pipeline.
//!
//! Lifecycle (who sets what):
//! - registered in `_PG_init` only when pg_tide is preloaded; the postmaster restarts it 5 s after
//!   it exits with a non-zero code;
//! - connects to `tide.database`. If that database does not exist, the launcher instead runs
//!   without a database connection, logs one clear message, checks again with exponential
//!   back-off (2 s up to 1 min) and exits for a restart once the database is there. The
//!   `db_ok` flag in shared memory carries that across restarts, so a missing database costs one
//!   log line per back-off step, never a restart loop;
//! - handles SIGTERM (exit), SIGHUP (reload; exits for a restart when `tide.database` changed)
//!   and postmaster death (exit);
//! - every tick reads the version of the extension's SQL objects: while it differs from the
//!   library's (a new `pg_tide.so` loaded, `ALTER EXTENSION pg_tide UPDATE` not run yet, or the
//!   reverse), it stops the workers it started and starts none, logging the reason and the remedy
//!   once; the tick after the versions match again starts them, and each resumes from its slot;
//! - every tick (1 s, or sooner when woken): starts a dynamic worker for every pipeline that
//!   has none, with a per-pipeline back-off when a worker keeps dying, and drops replication
//!   slots named `tide_*` that no pipeline owns (a slot left by a `create_pipeline` whose
//!   transaction rolled back), skipping slots whose creating transaction is still open;
//! - after that, every tick runs the outbox retention (`worker::retention`: batches of deletes,
//!   at most 0.5 s per tick; the next tick comes after 50 ms instead of 1 s while work is left).

use crate::gucs;
use crate::shmem;
use crate::worker::tx;
use pgrx::bgworkers::*;
use pgrx::prelude::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Name and type of the launcher process, as shown in `pg_stat_activity.backend_type`.
pub const LAUNCHER_TYPE: &str = "pg_tide launcher";
/// `backend_type` of pipeline workers.
pub const WORKER_TYPE: &str = "pg_tide worker";

/// Register the launcher with the postmaster. Called from `_PG_init` when preloaded.
pub fn register() {
    BackgroundWorkerBuilder::new(LAUNCHER_TYPE)
        .set_type(LAUNCHER_TYPE)
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

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn tide_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let db = gucs::database();

    let db_ok = shmem::REGISTRY.share().db_ok;
    if !db_ok {
        wait_for_database(db);
        return;
    }
    // Pessimistic until the connection succeeds: if it fails (FATAL), the next start checks the
    // database without connecting instead of failing again.
    shmem::REGISTRY.exclusive().db_ok = false;
    BackgroundWorker::connect_worker_to_spi(Some(&db), None);
    {
        let mut reg = shmem::REGISTRY.exclusive();
        reg.db_ok = true;
        reg.launcher_pid = unsafe { pg_sys::MyProcPid };
    }
    log!("pg_tide launcher started in database \"{db}\"");
    if let Err(e) = tx::run(crate::security::pin_search_path) {
        log!("pg_tide launcher: could not pin its search_path ({e}); exiting to start again");
        unsafe { pg_sys::proc_exit(1) };
    }

    let dboid = unsafe { pg_sys::MyDatabaseId };
    let mut running: HashMap<String, Running> = HashMap::new();
    let mut backoff: HashMap<String, Backoff> = HashMap::new();
    let mut warned_no_extension = false;
    let mut warned_version: Option<String> = None;

    // The next wait: a tick, or sooner while the outbox retention has work left.
    let mut wait = Duration::from_secs(1);
    while BackgroundWorker::wait_latch(Some(wait)) {
        wait = Duration::from_secs(1);
        if BackgroundWorker::sighup_received() {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            let now_db = gucs::database();
            if now_db != db {
                log!("pg_tide launcher: tide.database changed from \"{db}\" to \"{now_db}\"; restarting");
                unsafe { pg_sys::proc_exit(1) };
            }
        }
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
                if !warned_no_extension {
                    log!("pg_tide launcher: extension pg_tide is not installed in database \"{db}\"; waiting for CREATE EXTENSION pg_tide");
                    warned_no_extension = true;
                }
                continue;
            }
            Listing::OtherVersion(e) => {
                // Workers of this library must not run against another version's catalog:
                // stop those that run (they resume from their slot later) and start none.
                running.clear();
                for w in shmem::snapshot().iter().filter(|w| w.pid > 0) {
                    log!(
                        "pg_tide launcher: stopping the worker of pipeline \"{}\" until the versions match",
                        w.name()
                    );
                    let pid = w.pid;
                    if let Err(e) = tx::run(|| {
                        crate::sql::exec("SELECT pg_terminate_backend($1)", &[pid.into()])
                    }) {
                        log!("pg_tide launcher: could not stop worker {pid}: {e}");
                    }
                }
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
        if warned_version.take().is_some() {
            log!("pg_tide launcher: the SQL objects in database \"{db}\" are at the library's version {} now; starting the pipelines", crate::catalog::LIBRARY_VERSION);
        }
        warned_no_extension = false;

        // Forget workers that have stopped; remember how fast they died.
        running.retain(|name, r| match r.handle.pid() {
            Ok(_) => true,
            Err(BackgroundWorkerStatus::NotYetStarted) => true,
            Err(_) => {
                let created = pipelines
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, c)| c.clone())
                    .unwrap_or_default();
                let b = backoff.entry(name.clone()).or_insert(Backoff {
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
        backoff.retain(|name, b| pipelines.iter().any(|(n, c)| n == name && *c == b.created));

        for (name, created) in pipelines {
            if running.contains_key(&name) {
                continue;
            }
            if shmem::worker_pid(&name).is_some() {
                // Started by someone else (an earlier launcher incarnation): leave it alone.
                continue;
            }
            if let Some(b) = backoff.get(&name) {
                if Instant::now() < b.not_before {
                    continue;
                }
            }
            match start_worker(&name, dboid) {
                Ok(handle) => {
                    running.insert(
                        name,
                        Running {
                            handle,
                            started: Instant::now(),
                        },
                    );
                }
                Err(()) => {
                    log!("pg_tide launcher: could not start the worker of pipeline \"{name}\": no background worker slot free (raise max_worker_processes)");
                    backoff.insert(
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

        if crate::worker::retention::prune() {
            wait = Duration::from_millis(50);
        }
    }
    log!("pg_tide launcher exiting");
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
    crate::catalog::slots::drop_orphan_slots()?;
    Ok(Listing::Pipelines(names))
}

/// Run without a database connection until the configured database exists.
fn wait_for_database(mut db: String) {
    BackgroundWorker::connect_worker_to_spi(None, None);
    {
        let mut reg = shmem::REGISTRY.exclusive();
        reg.launcher_pid = unsafe { pg_sys::MyProcPid };
    }
    let mut delay = Duration::from_secs(2);
    let mut logged_for: Option<String> = None;
    loop {
        if exists(&db) {
            log!("pg_tide launcher: database \"{db}\" exists now; connecting");
            shmem::REGISTRY.exclusive().db_ok = true;
            unsafe { pg_sys::proc_exit(1) };
        }
        if logged_for.as_deref() != Some(db.as_str()) {
            log!(
                "pg_tide launcher: database \"{db}\" does not exist; pipelines cannot run. Create it or set tide.database; checking again with back-off up to 1 minute"
            );
            logged_for = Some(db.clone());
        }
        if !BackgroundWorker::wait_latch(Some(delay)) {
            return;
        }
        if BackgroundWorker::sighup_received() {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            db = gucs::database();
            delay = Duration::from_secs(5);
            continue;
        }
        delay = (delay * 2).min(Duration::from_secs(60));
    }
}

/// Whether a database of that name exists, read straight from `pg_database` (a shared catalog):
/// without a database connection the syscache and index scans are not available, so this scans
/// the heap, as the autovacuum launcher does.
fn exists(db: &str) -> bool {
    unsafe {
        pg_sys::StartTransactionCommand();
        let _ = pg_sys::GetTransactionSnapshot();
        let rel = pg_sys::table_open(
            pg_sys::DatabaseRelationId,
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
        );
        let scan = pg_sys::table_beginscan_catalog(rel, 0, std::ptr::null_mut());
        let mut found = false;
        loop {
            let tup = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tup.is_null() {
                break;
            }
            let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(tup);
            let name = std::ffi::CStr::from_ptr((*form).datname.data.as_ptr());
            if name.to_bytes() == db.as_bytes() {
                found = true;
                break;
            }
        }
        pg_sys::table_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        pg_sys::CommitTransactionCommand();
        found
    }
}
