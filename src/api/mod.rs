//! The SQL surface: validate arguments, call into `catalog`, map failures to ERRORs with a
//! specific SQLSTATE and a hint. Nothing here runs in a worker.
//!
//! [`server`]: readiness checks; [`pipelines`]: the pipeline functions; [`alter`]: alter_pipeline; [`restore`]: pipelines re-created from a restored dump; [`tables`]: add and
//! remove tables, add a schema's; [`alter_table`]: a captured table's row filter and column list; [`follow`]: followed schemas and their event trigger; [`consumers`]: outbox consumers; [`backfill`], [`verify`]: those functions; [`targets`]: table targets' checks; [`kafka`]: the kafka target's checks and its wrapper's validator;
//! [`args`]: argument types. This file holds what they share.

use crate::catalog;
use crate::error::{OrRaise, TideError, TideResult};
use crate::security;
use crate::shmem;
use crate::sql;
use crate::worker::launcher::{LAUNCHER_TYPE, SUPERVISOR_TYPE, WORKER_TYPE};
use args::{json_arg, relation, required, JsonbArg, Regclass};
use pgrx::prelude::*;
use pgrx::JsonB;
use tide_core::model::TargetKind;

mod alter;
mod alter_table;
pub mod args;
pub mod backfill;
mod claim;
mod consumers;
mod follow;
pub mod kafka;
pub mod masks;
mod pipelines;
mod restore;
mod server;
mod tables;
pub mod targets;
pub mod verify;
pub use server::check_server;
use server::*;

/// Target kinds this version can write.
/// Longest pipeline name (the slot name `tide_<database oid>_<name>` must fit in 63 bytes, with
/// an OID of up to 10 digits).
const MAX_NAME: usize = 47;

/// pg_tide's version: the loaded library's, which a library upgrade changes without a change
/// to the catalog (so STABLE, not IMMUTABLE: no plan or index may keep an old value).
#[pg_extern(stable, parallel_safe)]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Check that the server can run pipelines; ERROR with the fix in the hint otherwise.
#[pg_extern]
fn check() -> String {
    (|| -> TideResult<String> { Ok(check_server()? + &server::failover_report()?) })().or_raise()
}

/// A name as shown back in a message: at most 64 characters.
pub(crate) fn shown(name: &str) -> String {
    const MAX: usize = 64;
    match name.char_indices().nth(MAX) {
        None => name.to_string(),
        Some((i, _)) => format!("{}...", &name[..i]),
    }
}

fn validate_name(name: &str) -> TideResult<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(TideError::invalid(format!("invalid pipeline name \"{}\"", shown(name)))
            .hint(format!("Use 1 to {MAX_NAME} lower-case letters, digits and underscores, starting with a letter or underscore (the slot is named tide_<database oid>_<name>).")))
    }
}

/// Wake a process once the calling transaction commits (never before: it must see the change).
pub(crate) fn wake_on_commit(pid: Option<i32>) {
    if let Some(pid) = pid {
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, move || shmem::wake(pid));
    }
}

pub(crate) fn sleep_ms(ms: u64) {
    // SAFETY: MyLatch is this backend's latch, set at process start; a timed wait with
    // WL_EXIT_ON_PM_DEATH, then the interrupts processed as at any of PostgreSQL's waits; main
    // thread.
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            ms as _,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
        pg_sys::check_for_interrupts!();
    }
}

/// The instant `micros` from now, clamped to a century (an `Instant` cannot hold more).
pub(crate) fn deadline_after(micros: i64) -> std::time::Instant {
    const CENTURY_US: u64 = 100 * 365 * 86_400_000_000;
    let now = std::time::Instant::now();
    let d = std::time::Duration::from_micros((micros.max(0) as u64).min(CENTURY_US));
    now.checked_add(d).unwrap_or(now)
}

/// An interval in microseconds, saturating (a timeout of '300000 years' waits "forever", it does
/// not overflow into the past); never negative.
pub(crate) fn interval_micros(i: &pgrx::datum::Interval) -> i64 {
    i.micros()
        .saturating_add((i.days() as i64).saturating_mul(86_400_000_000))
        .saturating_add((i.months() as i64).saturating_mul(30 * 86_400_000_000))
        .max(0)
}

/// The pipeline must exist (42704) and the caller must be its owner, a member of the owning
/// role, or a superuser (42501). Returns the owner's name.
pub(crate) fn require_pipeline(pipeline: &str) -> TideResult<String> {
    let owner = crate::catalog::pipelines::owner(pipeline)?;
    let Some(owner) = owner else {
        return Err(TideError::undefined(format!(
            "pipeline \"{}\" does not exist",
            shown(pipeline)
        ))
        .hint("SELECT name FROM tide.pipelines lists the pipelines you own; tide.create_pipeline creates one."));
    };
    let me = security::caller();
    let ok = match security::role_oid(&owner) {
        Some(o) => security::has_privs_of(me, o),
        None => security::is_superuser(me),
    };
    if !ok {
        // Names only what the caller gave: not the owner, which the caller may not see
        // (tide.pipelines shows each role its own pipelines).
        return Err(TideError::privilege(format!(
            "must be the owner of pipeline \"{}\"",
            shown(pipeline)
        ))
        .hint("Ask its owner to run this, or to grant you membership in the role that owns it."));
    }
    Ok(owner)
}
