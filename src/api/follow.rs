//! Followed schemas (`FOR TABLES IN SCHEMA`): `tide.add_tables_in_schema(..., follow => true)`
//! records the follow (in `tables`), `tide.stop_following_schema` ends it, and the event trigger
//! `tide_followed_schemas` (`tide._follow_tables`, the C function here) captures the tables a
//! CREATE TABLE, CREATE TABLE AS, SELECT INTO or ALTER TABLE makes in a followed schema.
//!
//! Guarantees of the event trigger:
//! - a table is captured in the DDL's own transaction, by `tables::add_table_impl` (the same
//!   checks, target and add marker as `tide.add_table`), so every change committed with or after
//!   the DDL reaches the target, and the backfill (when the follow asked for one) reads what the
//!   table held before;
//! - it runs as the pipeline's **owner**, in a security-restricted operation with pg_tide's pinned
//!   `search_path` (never as the role doing the DDL, never as pg_tide), and only for a table whose
//!   owner and column types (with the types they are built from) belong to the pipeline's owner,
//!   a role whose privileges it has, or a superuser: nothing another role created (an index
//!   predicate, a domain's CHECK, a policy) is ever planned or run as the owner because of a
//!   follow. Any other table is for `tide.add_table`, called by the owner;
//! - a table it cannot capture is skipped with a WARNING and a row in `tide.skipped_tables`;
//!   its failure is rolled back in a subtransaction and never fails the DDL (a query cancel
//!   still cancels it);
//! - DDL that pg_tide itself runs, while capturing (creating the target table) or in its
//!   workers (a table target's schema changes), is not followed; nor is DDL of an extension
//!   script (`CREATE EXTENSION`, `ALTER EXTENSION ... UPDATE`: pg_tide's own included, whose
//!   tables may be half made then).

use super::*;
use crate::catalog::follows::{self, Candidate, Skip};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgLogLevel;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set while this backend captures a followed table (its target table's CREATE TABLE fires the
/// event trigger again).
static CAPTURING: AtomicBool = AtomicBool::new(false);

/// `tide.stop_following_schema(pipeline, schema)`: tables created in `schema` later are no
/// longer captured by `pipeline`; the tables it captures stay (remove them with
/// `tide.remove_table`). A NOTICE when it was not followed.
#[pg_extern]
fn stop_following_schema(pipeline: Option<&str>, schema: Option<&str>) {
    (|| {
        let pipeline = required(pipeline, "pipeline")?;
        let schema = required(schema, "schema")?;
        check_server()?;
        require_pipeline(pipeline)?;
        let nsp = tables::schema_oid(schema)?;
        if !follows::unfollow(pipeline, nsp)? {
            pgrx::notice!(
                "pipeline \"{}\" does not follow schema \"{}\": nothing to stop",
                shown(pipeline),
                shown(schema)
            );
        }
        Ok(())
    })()
    .or_raise()
}

#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_tide_follow_tables() -> &'static pg_sys::Pg_finfo_record {
    const V1_API: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1_API
}

/// `tide._follow_tables()`: the event trigger function of `tide_followed_schemas` (see the
/// module doc). Refuses to run as anything but an event trigger.
///
/// # Safety
/// Called by PostgreSQL's function manager with a valid `fcinfo`.
#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn tide_follow_tables(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: fcinfo comes from the function manager; its context, when set, is a Node.
    let as_event_trigger = unsafe {
        !fcinfo.is_null()
            && !(*fcinfo).context.is_null()
            && (*(*fcinfo).context).type_ == pg_sys::NodeTag::T_EventTriggerData
    };
    if !as_event_trigger {
        TideError::new(
            pg_sys::errcodes::PgSqlErrorCode::ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
            "tide._follow_tables() can only run as an event trigger",
        )
        .hint("It runs by itself at the end of CREATE TABLE and ALTER TABLE; follow a schema with tide.add_tables_in_schema(..., follow => true).")
        .raise();
    }
    // SAFETY: a backend-local flag of PostgreSQL's, set while an extension script runs.
    let in_extension_script = unsafe { pg_sys::creating_extension };
    if !CAPTURING.load(Ordering::Relaxed) && !in_tide_worker() && !in_extension_script {
        // The DDL's own catalog changes are not visible to the statement's snapshot, which
        // pg_tide's read-only statements use: make them visible, as a new statement would see
        // them (in any isolation level), for the duration of the trigger.
        // SAFETY: in a transaction (the DDL's); the snapshot pushed here is popped below, or by
        // the abort of an ERROR that escapes (a cancel).
        unsafe {
            pg_sys::CommandCounterIncrement();
            if pg_sys::ActiveSnapshotSet() {
                pg_sys::PushCopiedSnapshot(pg_sys::GetActiveSnapshot());
            } else {
                pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
            }
            pg_sys::UpdateActiveSnapshotCommandId();
        }
        follow_new_tables();
        // SAFETY: the snapshot pushed above.
        unsafe { pg_sys::PopActiveSnapshot() };
    }
    pg_sys::Datum::from(0)
}

/// Whether this process is one of pg_tide's background workers, whose DDL (a table target's
/// schema changes) is pg_tide's own and never followed.
fn in_tide_worker() -> bool {
    // SAFETY: MyBgworkerEntry is set once at a background worker's start (NULL elsewhere); its
    // library name is a NUL-terminated array inside it.
    unsafe {
        let entry = pg_sys::MyBgworkerEntry;
        !entry.is_null()
            && std::ffi::CStr::from_ptr((*entry).bgw_library_name.as_ptr()).to_bytes() == b"pg_tide"
    }
}

/// The tables of the current DDL command that left a schema through whose follow a pipeline
/// captures them leave that pipeline (`follows::leavers`), in the DDL's transaction. A failure
/// here fails the DDL (as `tide._drop_marker` does for a DROP): a table must not stay captured
/// once it left, nor leave half-way.
fn leave_moved_tables() {
    let result = (|| -> TideResult<()> {
        if !follows::installed()? || !follows::tracked()? {
            return Ok(());
        }
        for l in follows::leavers()? {
            follows::leave(&l)?;
            if !l.still_followed {
                pgrx::log!(
                    "pg_tide: {} left the schema pipeline \"{}\" follows, and leaves the pipeline",
                    l.relation,
                    l.pipeline
                );
                wake_on_commit(shmem::worker_pid(&l.pipeline));
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        e.raise();
    }
}

/// Capture every candidate of the current DDL command (see `follows::candidates`).
fn follow_new_tables() {
    leave_moved_tables();
    let found = in_subtransaction(|| {
        // (DROP EXTENSION pg_tide ... or an upgrade in progress: pg_tide's tables are not there.)
        if !follows::installed()? {
            return Ok(Vec::new());
        }
        follows::candidates()
    });
    let candidates = match found {
        Ok(c) => c,
        Err(e) => {
            reraise_cancel(&e);
            warn(
                &e,
                "pg_tide could not look for tables of followed schemas".into(),
            );
            return;
        }
    };
    if candidates.is_empty() {
        return;
    }
    let by = security::caller_name().unwrap_or_else(|_| "?".into());
    for c in &candidates {
        capture(c, &by);
    }
}

/// Capture one table for its pipeline (as the pipeline's owner), or skip it with a WARNING and
/// a record.
fn capture(c: &Candidate, by: &str) {
    CAPTURING.store(true, Ordering::Relaxed);
    let outcome = in_subtransaction(|| {
        let owner_oid = security::owner_oid(&c.owner, &format!("pipeline \"{}\"", c.pipeline))?;
        security::as_owner_pinned(owner_oid, || {
            if let Some(e) = trust_problem(c, owner_oid)? {
                return Err(e);
            }
            tables::add_table_impl(
                &c.pipeline,
                c.relid,
                c.backfill,
                None,
                false,
                &tables::Shaping::default(),
            )?;
            follows::mark_followed(&c.pipeline, c.relid)
        })
    });
    CAPTURING.store(false, Ordering::Relaxed);
    let e = match outcome {
        Ok(()) => {
            pgrx::log!(
                "pg_tide: pipeline \"{}\" captures {} (its schema is followed)",
                c.pipeline,
                c.relation
            );
            return;
        }
        Err(e) => e,
    };
    reraise_cancel(&e);
    warn(
        &e,
        format!(
            "pipeline \"{}\" follows the schema of {} but does not capture it",
            c.pipeline, c.relation
        ),
    );
    let recorded = in_subtransaction(|| {
        let sqlstate = e.sqlstate();
        follows::record_skip(&Skip {
            pipeline: &c.pipeline,
            relid: c.relid,
            removed: false,
            reason: &e.message,
            hint: e.hint.as_deref(),
            sqlstate: Some(&sqlstate),
            by,
        })
    });
    if let Err(e2) = recorded {
        reraise_cancel(&e2);
        warn(
            &e2,
            format!("pg_tide could not record why it skipped {}", c.relation),
        );
    }
}

/// Why the pipeline's owner should not capture `c` because another role created what it is
/// made of: the table, or a type of its columns (or one they are built from: a domain's base
/// type, an array's element, a composite's columns, a range's subtype), belongs to a role
/// whose privileges the owner does not have and that is not a superuser. Such a role's code
/// (an index predicate the planner folds, a domain CHECK evaluated at a table target) would run
/// as the owner. Catalog reads only.
fn trust_problem(c: &Candidate, owner_oid: pg_sys::Oid) -> TideResult<Option<TideError>> {
    let owner = &c.owner;
    let refuse = |what: String, role: &str| {
        TideError::privilege(format!(
            "{what} belongs to role \"{role}\", whose privileges the pipeline's owner \"{owner}\" does not have"
        ))
        .hint(format!(
            "A followed schema captures only what the pipeline's owner, a role whose privileges it has, or a superuser created. If you trust {}, its owner may GRANT SELECT ON it TO {}, who then runs SELECT tide.add_table('{}', '{}').",
            c.relation,
            pgrx::spi::quote_identifier(owner),
            c.pipeline.replace('\'', "''"),
            c.relation.replace('\'', "''")
        ))
    };
    let (relowner, name) = follows::table_owner(c.relid)?;
    if !(security::has_privs_of(owner_oid, relowner) || security::is_superuser(relowner)) {
        return Ok(Some(refuse(format!("table {}", c.relation), &name)));
    }
    Ok(follows::foreign_type(c.relid, owner_oid)?
        .map(|(ty, role)| refuse(format!("type {ty} of a column of {}", c.relation), &role)))
}

/// A cancel, a termination or a shutdown (class 57) is not a reason to skip a table: it ends
/// the DDL as it would have without pg_tide.
fn reraise_cancel(e: &TideError) {
    if e.sqlstate().starts_with("57") {
        e.clone().raise();
    }
}

fn warn(e: &TideError, context: String) {
    let mut report = ErrorReport::new(e.code, format!("{context}: {}", e.message), "pg_tide");
    if let Some(h) = &e.hint {
        report = report.set_hint(h.clone());
    }
    report.report(PgLogLevel::WARNING);
}

/// Run `f` in a subtransaction: rolled back (with whatever it did) when it returns `Err`, raises
/// an ERROR or panics, whose error is returned; released (its work kept) on `Ok`.
pub(crate) fn in_subtransaction<R>(f: impl FnOnce() -> TideResult<R>) -> TideResult<R> {
    // SAFETY: the subtransaction is begun and ended here, on this backend's transaction, with
    // the memory context and resource owner of the caller restored afterwards (as PL/pgSQL's
    // exception blocks do); a caught ERROR's state is flushed before the rollback.
    unsafe {
        let cxt = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(cxt);
        let outcome = pgrx::PgTryBuilder::new(std::panic::AssertUnwindSafe(f))
            .catch_others(|caught| Err(crate::worker::tx::from_caught(caught)))
            .catch_rust_panic(|caught| Err(crate::worker::tx::from_caught(caught)))
            .execute();
        if outcome.is_ok() {
            pg_sys::ReleaseCurrentSubTransaction();
        } else {
            pg_sys::MemoryContextSwitchTo(cxt);
            pg_sys::FlushErrorState();
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        pg_sys::MemoryContextSwitchTo(cxt);
        pg_sys::CurrentResourceOwner = owner;
        outcome
    }
}
