//! Server checks: is pg_tide ready (preloaded, wal_level, launcher), who may create
//! pipelines, and the workers' status for the views.

use super::*;

/// The pipelines whose owner's privileges the current user has (its own, those of roles it is
/// a member of, all for a superuser): what the outbox's row security lets it read and trim.
#[pg_extern(stable)]
pub(super) fn _owned_pipelines() -> SetOfIterator<'static, String> {
    SetOfIterator::new(owned_pipelines().or_raise())
}

pub(super) fn owned_pipelines() -> TideResult<Vec<String>> {
    let me = crate::security::caller();
    let names: Vec<String> = catalog::pipelines::owners()?
        .into_iter()
        .filter_map(|(name, owner)| {
            let ok = match crate::security::role_oid(&owner) {
                Some(o) => crate::security::has_privs_of(me, o),
                None => crate::security::is_superuser(me),
            };
            ok.then_some(name)
        })
        .collect();
    Ok(names)
}

pub(super) fn setting(name: &str) -> TideResult<String> {
    Ok(sql::one::<String>("SELECT current_setting($1)", &[name.into()])?.unwrap_or_default())
}

/// The prerequisites of every function that needs the worker.
pub fn check_server() -> TideResult<String> {
    if !shmem::preloaded() {
        return Err(TideError::not_preloaded());
    }
    catalog::version_gate()?;
    let wal_level = setting("wal_level")?;
    if wal_level != "logical" {
        return Err(TideError::prerequisite(format!("wal_level is \"{wal_level}\"; pg_tide needs \"logical\""))
            .detail("pg_tide reads changes through logical decoding, which needs wal_level = logical.")
            .hint("Set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart the server."));
    }
    let here = sql::one::<String>("SELECT current_database()::text", &[])?.unwrap_or_default();
    if !crate::gucs::database_allowed(&here) {
        let list = crate::gucs::database().replace('\'', "''");
        let quoted = format!("\"{}\"", here.replace('"', "\"\"")).replace('\'', "''");
        return Err(TideError::prerequisite(format!("pg_tide does not run pipelines in database \"{here}\": tide.database = '{list}' does not list it"))
            .hint(format!("Add it to the list (ALTER SYSTEM SET tide.database = '{list}, {quoted}'), or set tide.database = '' for every database, and reload the configuration (SELECT pg_reload_conf()).")));
    }
    let db = here;
    let encoding = sql::one::<String>("SELECT pg_encoding_to_char(encoding)::text FROM pg_database WHERE datname = current_database()", &[])?
        .unwrap_or_default();
    if encoding != "UTF8" {
        return Err(TideError::unsupported(format!(
            "database encoding is {encoding}; pg_tide needs UTF8"
        ))
        .hint("Create the database with ENCODING 'UTF8'."));
    }
    // A database has a launcher only while it has pipelines (worker::launcher).
    let launcher = match shmem::launcher_pid() {
        Some(pid) => format!("launcher running (pid {pid})"),
        None if catalog::pipelines::count()? == 0 => {
            "no launcher: no pipelines yet (tide.create_pipeline starts one)".to_string()
        }
        None => "launcher not running yet".to_string(),
    };
    Ok(format!(
        "pg_tide {} ready: preloaded, wal_level = logical, database \"{db}\", {launcher}",
        env!("CARGO_PKG_VERSION")
    ))
}

/// What a failover does to this database's pipelines (docs/high-availability.md), for
/// `tide.check()` (after [`check_server`]'s report; its queries run as pg_tide): nothing when there is no pipeline and the server is a primary; on a standby,
/// that it is one and how many slots it has synchronised; on a primary, whether the slots are
/// failover slots and whether `synchronized_standby_slots` keeps targets outside the database
/// from getting WAL a standby lacks.
pub(crate) fn failover_report() -> TideResult<String> {
    let recovery = sql::one::<bool>("SELECT pg_catalog.pg_is_in_recovery()", &[])?.unwrap_or(false);
    let pipelines = catalog::pipelines::count()?;
    if !recovery && pipelines == 0 {
        return Ok(String::new());
    }
    let version = sql::one::<String>("SELECT current_setting('server_version_num')", &[])?
        .unwrap_or_default();
    if !crate::pgver::HAS_FAILOVER_SLOTS {
        let major = version.get(..2).unwrap_or("");
        return Ok(if recovery {
            format!("; this server is a standby (in recovery): no pipeline runs here, and PostgreSQL {major} synchronises no logical slot to it, so a promotion resyncs every pipeline")
        } else {
            format!("; failover: PostgreSQL {major} has no failover slots (tide.failover_slots has no effect), so a failover to a standby resyncs every pipeline")
        });
    }
    // (to_jsonb: the columns exist from 17 on; this code runs only there)
    let (slots, failover, synced) = crate::catalog::pipelines::slot_failover_counts()?;
    if recovery {
        return Ok(format!(
            "; this server is a standby (in recovery): no pipeline runs here; {synced} of {pipelines} pipeline slot(s) are synchronised from the primary (tide.pipelines: slot_synced, confirmed_lsn): a promotion resumes those from their slot and resyncs the others"
        ));
    }
    let standbys = crate::pgver::synchronized_standby_slots();
    let mut out = format!(
        "; failover: {failover} of {slots} pipeline slot(s) are failover slots (tide.failover_slots = {})",
        if crate::gucs::FAILOVER_SLOTS.get() { "on" } else { "off" }
    );
    if failover < slots {
        out.push_str(", the others were created without failover and stay so until re-created (a lost slot's resync, or the pipeline dropped and created again): a failover resyncs them");
    }
    if failover > 0 {
        if standbys.trim().is_empty() {
            out.push_str(", synchronized_standby_slots is empty: a remote or kafka target may get WAL a standby has not received, and after a failover such a pipeline resyncs (set it to the standbys' physical slots)");
        } else {
            out.push_str(&format!(", synchronized_standby_slots = '{standbys}'"));
        }
    }
    Ok(out)
}

/// Live state of the pipeline workers (used by the `tide.pipelines` view).
#[pg_extern]
#[allow(clippy::type_complexity)]
pub(super) fn _worker_status() -> TableIterator<
    'static,
    (
        name!(pipeline, String),
        name!(pid, i32),
        name!(state, String),
        name!(started_at, Option<pgrx::datum::TimestampWithTimeZone>),
        name!(events, i64),
        name!(txns, i64),
        name!(drained, bool),
        name!(last_poll, Option<pgrx::datum::TimestampWithTimeZone>),
        name!(caught_up_lsn, String),
        name!(caught_up_at, Option<pgrx::datum::TimestampWithTimeZone>),
    ),
> {
    let ts = |us: i64| -> Option<pgrx::datum::TimestampWithTimeZone> {
        if us == 0 {
            None
        } else {
            // SAFETY: the conversion reads the Datum as a TimestampTz, an i64 of microseconds: any
            // value is valid.
            unsafe {
                pgrx::datum::TimestampWithTimeZone::from_datum(pg_sys::Datum::from(us), false)
            }
        }
    };
    // Only the workers of pipelines the caller may see (as in every view).
    let visible: std::collections::HashSet<String> =
        owned_pipelines().or_raise().into_iter().collect();
    let rows: Vec<_> = shmem::snapshot()
        .into_iter()
        .filter(|w| visible.contains(w.name()))
        .map(|w| {
            (
                w.name().to_string(),
                w.pid,
                w.state.as_str().to_string(),
                ts(w.started_at),
                w.events as i64,
                w.txns as i64,
                w.drained,
                ts(w.last_poll),
                tide_core::lsn::Lsn(w.caught_up_lsn).to_string(),
                ts(w.caught_up_at),
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// Who may create pipelines: superusers, roles with the REPLICATION attribute, and members of
/// the predefined role `tide_admin` (see README "Security").
pub(super) fn require_may_create() -> TideResult<()> {
    let ok = sql::one::<bool>(
        // (CASE fixes the order: pg_has_role errors if tide_admin was dropped.)
        "SELECT CASE WHEN rolsuper OR rolreplication THEN true
                     WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tide_admin')
                          THEN pg_has_role(current_user, 'tide_admin', 'USAGE')
                     ELSE false END
           FROM pg_roles WHERE rolname = current_user",
        &[],
    )?
    .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err(
            TideError::privilege("permission denied to create a pg_tide pipeline")
                .hint("A superuser grants it with: GRANT tide_admin TO <role>;"),
        )
    }
}
