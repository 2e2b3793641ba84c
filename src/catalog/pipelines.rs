//! `tide.pipeline`: one row per pipeline. Written by the SQL API (create, drop, pause, resume)
//! and by the worker (the applied position in the same transaction as the events it applies; the
//! error columns when an iteration fails, cleared when one succeeds).

use super::corrupt;
use crate::error::{TideError, TideResult};
use crate::sql_as_tide;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::JsonB;
use tide_core::model::TargetKind;

/// A pipeline row, as the worker needs it at the start of an iteration.
#[derive(Debug, Clone)]
pub struct PipelineRow {
    pub name: String,
    pub target: TargetKind,
    pub options: serde_json::Value,
    /// The role that created the pipeline (remote targets use its user mapping).
    pub owner: String,
    pub slot_name: String,
    pub enabled: bool,
    /// End LSN of the last source transaction applied, as text (`X/Y`), if any.
    pub applied_lsn: Option<String>,
    /// The slot's confirmed flush LSN, if the slot exists.
    pub confirmed_lsn: Option<String>,
    pub has_error: bool,
    /// What is wrong with the pipeline's slot (`None`: it is a usable pg_tide slot): see
    /// [`SlotProblem`].
    pub slot_problem: Option<SlotProblem>,
    /// `tide.pipeline.resync`: a lost slot being recovered (see [`crate::catalog::slots`]).
    pub resync: Option<Resync>,
    /// `tide.pipeline.paused_lsn` is set (see [`super::slots::note_paused`]).
    pub paused_lsn_set: bool,
}

/// What is wrong with a pipeline's slot, as [`lock_pipeline`] reads it
/// from `pg_replication_slots` (see `catalog::slots`). Set by that query; not persisted (the
/// reason is, in `tide.pipeline.slot_lost_reason`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotProblem {
    /// No slot of that name on this server.
    Missing,
    /// `wal_status = 'lost'` (or no restart position): its WAL is gone.
    Invalidated,
    /// A slot of that name that pg_tide did not create: what it is.
    Foreign(String),
    /// A slot whose confirmed position moved while the pipeline was paused (from, to): someone
    /// consumed or advanced it, or re-created it, so what it skipped is lost.
    Moved(String),
}

impl SlotProblem {
    /// From the query's text: `missing`, `invalidated`, `foreign:<what it is>`.
    pub fn parse(text: &str) -> SlotProblem {
        match text {
            "missing" => SlotProblem::Missing,
            "invalidated" => SlotProblem::Invalidated,
            other => match other.strip_prefix("moved:") {
                Some(m) => SlotProblem::Moved(m.to_string()),
                None => SlotProblem::Foreign(other.trim_start_matches("foreign:").to_string()),
            },
        }
    }

    /// The reason, for `tide.pipeline.slot_lost_reason` and the log.
    pub fn reason(&self, slot: &str) -> String {
        match self {
            SlotProblem::Missing => format!("replication slot \"{slot}\" does not exist (dropped by hand or by tide.max_paused_wal_size, or never on this server: a restore from a base backup, a failover to a standby without it, a major upgrade)"),
            SlotProblem::Invalidated => format!("replication slot \"{slot}\" was invalidated (wal_status lost: the WAL it needed was removed past max_slot_wal_keep_size)"),
            SlotProblem::Foreign(what) => format!("replication slot \"{slot}\" is not pg_tide's ({what}): it was re-created by someone else"),
            SlotProblem::Moved(how) => format!("replication slot \"{slot}\" moved while the pipeline was paused ({how}): someone consumed, advanced or re-created it, and the changes it skipped are lost to the pipeline"),
        }
    }
}

/// `tide.pipeline.resync`: a lost slot being recovered. Set by the worker only: `SlotLost` by
/// [`super::slots::mark_lost`], `Resyncing` by [`super::slots::queue_resync`], cleared by
/// [`super::slots::finish_resync`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resync {
    /// The slot is lost; no new one has been created and queued for since.
    SlotLost,
    /// A new slot exists; every table is being read again.
    Resyncing,
}

impl Resync {
    pub fn parse(text: &str) -> Option<Resync> {
        match text {
            "slot lost" => Some(Resync::SlotLost),
            "resyncing" => Some(Resync::Resyncing),
            _ => None,
        }
    }
}

/// A pipeline's `tide.pipeline.target` as its kind. An unknown (or missing) kind is an error,
/// never a default: this build would write the wrong target.
pub(crate) fn target_kind(text: Option<String>, pipeline: &str) -> TideResult<TargetKind> {
    let text = text.unwrap_or_default();
    TargetKind::parse(&text).ok_or_else(|| {
        TideError::unsupported(format!(
            "pipeline \"{pipeline}\" has target \"{text}\", which this version of pg_tide cannot write"
        ))
        .hint("Install the pg_tide version that created the pipeline, or drop and re-create the pipeline.")
    })
}

/// `tide.pipeline.options` (jsonb, as text) as a value: always valid JSON, so anything else is
/// [`corrupt`].
fn options(text: Option<String>, pipeline: &str) -> TideResult<serde_json::Value> {
    text.and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| corrupt("options", pipeline))
}

// --- the worker --------------------------------------------------------------------------------

/// Take the pipeline's lock ([`crate::locks::Lock::Pipeline`]) in shared mode (so `drop_pipeline`, which takes it
/// exclusively, waits for this iteration, and this iteration waits for a drop in progress), then
/// read the pipeline row. Neither assigns a transaction id: an idle worker
/// writes no WAL. Called by the worker, in its iteration's transaction.
pub(crate) fn lock_pipeline(c: &mut SpiClient<'_>, name: &str) -> TideResult<Option<PipelineRow>> {
    crate::locks::lock(
        crate::locks::Lock::Pipeline(name),
        crate::locks::Mode::Shared,
    )?;
    let rows = crate::sql::select(
        c,
        "SELECT p.name, p.target, p.slot_name::text, p.enabled, p.applied_lsn::text,
                (SELECT s.confirmed_flush_lsn::text FROM pg_catalog.pg_replication_slots s WHERE s.slot_name = p.slot_name),
                p.last_error IS NOT NULL, p.options::text, p.owner::text,
                (SELECT CASE WHEN s.slot_name IS NULL THEN 'missing'
                             WHEN s.wal_status = 'lost' OR s.restart_lsn IS NULL THEN 'invalidated'
                             WHEN s.slot_type <> 'logical' OR s.plugin IS DISTINCT FROM 'pg_tide' OR s.temporary
                                  OR s.database IS DISTINCT FROM current_database()
                             THEN pg_catalog.format('foreign:a %s slot with plugin %s in database %s%s', s.slot_type,
                                         coalesce(s.plugin, 'none'), coalesce(s.database::text, 'none'),
                                         CASE WHEN s.temporary THEN ', temporary' ELSE '' END)
                             WHEN p.enabled AND s.confirmed_flush_lsn > p.paused_lsn
                             THEN pg_catalog.format('moved:from %s to %s', p.paused_lsn, s.confirmed_flush_lsn) END
                   FROM (SELECT 1) x LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = p.slot_name),
                p.resync, p.paused_lsn IS NOT NULL
           FROM tide.pipeline p WHERE p.name = $1",
        None,
        &[name.into()],
    )?;
    let Some(r) = rows.into_iter().next() else {
        return Ok(None);
    };
    Ok(Some(PipelineRow {
        name: r.get::<String>(1)?.ok_or_else(|| corrupt("name", name))?,
        target: target_kind(r.get::<String>(2)?, name)?,
        slot_name: r
            .get::<String>(3)?
            .ok_or_else(|| corrupt("slot_name", name))?,
        enabled: r.get::<bool>(4)?.ok_or_else(|| corrupt("enabled", name))?,
        applied_lsn: r.get::<String>(5)?,
        confirmed_lsn: r.get::<String>(6)?,
        has_error: r
            .get::<bool>(7)?
            .ok_or_else(|| corrupt("last_error", name))?,
        options: options(r.get::<String>(8)?, name)?,
        owner: r.get::<String>(9)?.ok_or_else(|| corrupt("owner", name))?,
        slot_problem: r.get::<String>(10)?.as_deref().map(SlotProblem::parse),
        resync: match r.get::<String>(11)? {
            None => None,
            Some(t) => Some(Resync::parse(&t).ok_or_else(|| corrupt("resync", name))?),
        },
        paused_lsn_set: r.get::<bool>(12)?.unwrap_or(false),
    }))
}

/// Every pipeline, as (name, creation time as text), by name: a pipeline dropped and created
/// again under the same name is another pipeline (the launcher's back-off starts afresh).
/// Called by the launcher, in its transaction (a read).
pub(crate) fn list(c: &SpiClient<'_>) -> TideResult<Vec<(String, String)>> {
    let mut out = Vec::new();
    for row in crate::sql::select(
        c,
        "SELECT name, created_at::text FROM tide.pipeline ORDER BY name",
        None,
        &[],
    )? {
        let name = row.get::<String>(1)?.ok_or_else(|| corrupt("name", "?"))?;
        let created = row
            .get::<String>(2)?
            .ok_or_else(|| corrupt("created_at", &name))?;
        out.push((name, created));
    }
    Ok(out)
}

/// Record the applied position in the same transaction as the events: the heart of
/// exactly-once. Also clears a previous error. Called by the worker, in its iteration's
/// transaction.
pub(crate) fn record_applied(
    c: &mut SpiClient<'_>,
    pipeline: &str,
    end_lsn: &str,
    commit_time_us: Option<i64>,
) -> TideResult<()> {
    crate::sql::update(
        c,
        "UPDATE tide.pipeline
            SET applied_lsn = $2::pg_lsn,
                applied_commit_time = coalesce('2000-01-01 00:00:00+00'::timestamptz + make_interval(secs => $3::float8 / 1000000), applied_commit_time),
                last_error = NULL, last_error_sqlstate = NULL, last_error_at = NULL, remedy = NULL, attempts = 0
          WHERE name = $1",
        None,
        &[pipeline.into(), end_lsn.into(), commit_time_us.map(|t| t as f64).into()],
    )?;
    Ok(())
}

/// Clear the error columns after a successful iteration that applied nothing. Called by the
/// worker, in its iteration's transaction.
pub(crate) fn clear_error(c: &mut SpiClient<'_>, pipeline: &str) -> TideResult<()> {
    crate::sql::update(
        c,
        "UPDATE tide.pipeline SET last_error = NULL, last_error_sqlstate = NULL, last_error_at = NULL, remedy = NULL, attempts = 0
          WHERE name = $1 AND (last_error IS NOT NULL OR attempts <> 0)",
        None,
        &[pipeline.into()],
    )?;
    Ok(())
}

/// Pause a pipeline because of an error only the user can fix (the error is recorded next).
/// Called by the worker, in a transaction of its own.
pub(crate) fn pause_for(pipeline: &str) -> TideResult<()> {
    crate::sql::exec(
        "UPDATE tide.pipeline SET enabled = false WHERE name = $1",
        &[pipeline.into()],
    )
}

/// Record a failed iteration (in its own transaction, after the failed one was aborted): the
/// message (with its detail), SQLSTATE, time, remedy (the hint, else a default one) and the
/// iterations failed in a row (`attempts`, counted here; a success sets it to 0). Called by the
/// worker.
pub(crate) fn record_error(pipeline: &str, e: &TideError) -> TideResult<()> {
    let remedy = e.hint.clone().unwrap_or_else(|| default_remedy(e));
    let message = match &e.detail {
        Some(d) => format!("{} ({d})", e.message),
        None => e.message.clone(),
    };
    Spi::run_with_args(
        "UPDATE tide.pipeline SET last_error = $2, last_error_sqlstate = $3, last_error_at = now(), remedy = $4, attempts = attempts + 1
          WHERE name = $1",
        &[pipeline.into(), message.into(), e.sqlstate().into(), remedy.into()],
    )?;
    Ok(())
}

fn default_remedy(e: &TideError) -> String {
    format!(
        "The worker retries with back-off. If the error persists, fix its cause (see the server log around the time in last_error_at, SQLSTATE {}) or drop and re-create the pipeline.",
        e.sqlstate()
    )
}

// --- the SQL API ---------------------------------------------------------------------------------

/// `DROP EXTENSION pg_tide` (the `ProcessUtility_hook` in `lib.rs`, before anything is dropped)
/// is refused while a pipeline exists, or a pg_tide slot of this database: each holds WAL until
/// its slot is dropped, which `tide.drop_pipeline` does (with its replication origin), and
/// nothing of pg_tide would be left to do it after the extension is gone. Runs as pg_tide; a
/// database without the extension passes (`DROP EXTENSION IF EXISTS`).
pub(crate) fn refuse_drop_extension() -> TideResult<()> {
    let installed = sql_as_tide::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_tide')
            AND pg_catalog.to_regclass('tide.pipeline') IS NOT NULL",
        &[],
    )?
    .unwrap_or(false);
    let pipelines = if installed {
        sql_as_tide::one::<String>(
            "SELECT pg_catalog.string_agg(pg_catalog.quote_literal(name), ', ' ORDER BY name) FROM tide.pipeline",
            &[],
        )?
    } else {
        None
    };
    let slots = sql_as_tide::one::<String>(
        "SELECT pg_catalog.string_agg(pg_catalog.quote_ident(slot_name), ', ' ORDER BY slot_name)
           FROM pg_catalog.pg_replication_slots
          WHERE plugin OPERATOR(pg_catalog.=) 'pg_tide' AND database OPERATOR(pg_catalog.=) pg_catalog.current_database()",
        &[],
    )?;
    if let Some(names) = pipelines {
        return Err(TideError::new(
            PgSqlErrorCode::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
            format!("cannot drop extension pg_tide while pipelines exist: {names}"),
        )
        .detail("Each pipeline's replication slot holds WAL until it is dropped, and nothing would drop it once the extension is gone.")
        .hint("Drop the pipelines first (each with its slot and replication origin): SELECT tide.drop_pipeline(name) FROM tide.pipeline; then DROP EXTENSION pg_tide."));
    }
    if let Some(slots) = slots {
        return Err(TideError::new(
            PgSqlErrorCode::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
            format!("cannot drop extension pg_tide while its replication slots exist in this database: {slots}"),
        )
        .detail("No pipeline owns them (a pipeline whose creation did not finish, or a dropped pipeline whose slot was in use); they hold WAL until they are dropped.")
        .hint("The pg_tide launcher drops such slots within seconds; or drop them with SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE plugin = 'pg_tide' AND database = current_database(); then DROP EXTENSION pg_tide."));
    }
    Ok(())
}

/// Whether a pipeline of that name exists. Called by the SQL API; runs as pg_tide.
pub(crate) fn exists(name: &str) -> TideResult<bool> {
    Ok(sql_as_tide::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM tide.pipeline WHERE name = $1)",
        &[name.into()],
    )?
    .unwrap_or(false))
}

/// The pipeline's owner, `None` when there is no such pipeline. Called by the SQL API (the
/// ownership check, a remote target's user mapping); runs as pg_tide.
pub(crate) fn owner(name: &str) -> TideResult<Option<String>> {
    sql_as_tide::one::<String>(
        "SELECT owner::text FROM tide.pipeline WHERE name = $1",
        &[name.into()],
    )
}

/// The pipeline's slot name (`tide.pipeline.slot_name`: given when its slot was made, see
/// `catalog::slots`). Called by the SQL API; runs as pg_tide.
pub(crate) fn slot_name(name: &str) -> TideResult<Option<String>> {
    sql_as_tide::one::<String>(
        "SELECT slot_name::text FROM tide.pipeline WHERE name = $1",
        &[name.into()],
    )
}

/// Every pipeline with its owner: (name, owner). Called by the SQL API (`tide._owned_pipelines`,
/// the outbox's row security); runs as pg_tide.
pub(crate) fn owners() -> TideResult<Vec<(String, String)>> {
    let rows =
        sql_as_tide::text_rows("SELECT name, owner::text FROM tide.pipeline", &[], 0, false)?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let mut r = r.into_iter();
        let name = r.next().flatten().ok_or_else(|| corrupt("name", "?"))?;
        let owner = r.next().flatten().ok_or_else(|| corrupt("owner", &name))?;
        out.push((name, owner));
    }
    Ok(out)
}

/// The number of pipelines `role` owns in this database. Called by the SQL API (the per-role
/// limit); runs as pg_tide.
pub(crate) fn count_owned_by(role: &str) -> TideResult<i64> {
    Ok(sql_as_tide::one::<i64>(
        "SELECT count(*) FROM tide.pipeline WHERE owner = $1::name",
        &[role.into()],
    )?
    .unwrap_or(0))
}

/// Whether the pipeline's resync after a lost slot is not over (`resync` set), in a snapshot
/// taken now (the caller polls while the worker commits). Called by the SQL API; runs as
/// pg_tide.
pub(crate) fn resync_pending(name: &str) -> TideResult<bool> {
    let rows = sql_as_tide::text_rows(
        "SELECT (resync IS NOT NULL)::text FROM tide.pipeline WHERE name = $1",
        &[Some(name)],
        0,
        true,
    )?;
    Ok(rows
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next().flatten())
        .is_some_and(|v| v == "true"))
}

/// Every pipeline with its owner's OID (0: no such role) and whether that role is a superuser,
/// for the per-role counts (`crate::quota`). Called by the launcher, in its transaction.
pub(crate) fn owners_for_quota() -> TideResult<Vec<(String, u32, bool)>> {
    let rows = crate::sql::text_rows(
        "SELECT p.name::text, coalesce(r.oid, 0)::text, coalesce(r.rolsuper, false)::text
           FROM tide.pipeline p LEFT JOIN pg_catalog.pg_roles r ON r.rolname = p.owner",
        &[],
        0,
        false,
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let mut r = r.into_iter().map(Option::unwrap_or_default);
        let (name, owner, sup) = (r.next(), r.next(), r.next());
        out.push((
            name.unwrap_or_default(),
            owner.and_then(|o| o.parse().ok()).unwrap_or(0),
            sup.as_deref() == Some("true"),
        ));
    }
    Ok(out)
}

/// The pipelines' slots on a server with failover slots (17 and later): (slots that exist,
/// failover slots, slots synchronised from a primary), over every pipeline. Called by the SQL
/// API (`tide.check`); runs as pg_tide. (to_jsonb: the columns exist from 17 on; the caller
/// runs it only there.)
pub(crate) fn slot_failover_counts() -> TideResult<(i64, i64, i64)> {
    let counts = sql_as_tide::one::<String>(
        "SELECT format('%s/%s/%s', count(s.slot_name),
                       count(*) FILTER (WHERE (to_jsonb(s) ->> 'failover')::boolean),
                       count(*) FILTER (WHERE (to_jsonb(s) ->> 'synced')::boolean))
           FROM tide.pipeline p LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = p.slot_name",
        &[],
    )?
    .unwrap_or_default();
    let n: Vec<i64> = counts.split('/').map(|x| x.parse().unwrap_or(0)).collect();
    Ok((
        n.first().copied().unwrap_or(0),
        n.get(1).copied().unwrap_or(0),
        n.get(2).copied().unwrap_or(0),
    ))
}

/// The number of pipelines. Called by the SQL API; runs as pg_tide.
pub(crate) fn count() -> TideResult<i64> {
    Ok(sql_as_tide::one::<i64>("SELECT count(*) FROM tide.pipeline", &[])?.unwrap_or(0))
}

/// The pipeline's target kind and options. A missing pipeline, like an unknown kind, is
/// [`target_kind`]'s error. Called by the SQL API; runs as pg_tide.
pub(crate) fn target(name: &str) -> TideResult<(TargetKind, serde_json::Value)> {
    let (kind, opts) = sql_as_tide::two::<String, String>(
        "SELECT target, options::text FROM tide.pipeline WHERE name = $1",
        &[name.into()],
    )?;
    let kind = target_kind(kind, name)?;
    Ok((kind, options(opts, name)?))
}

/// Whether the pipeline is enabled (not paused); `None` when there is no such pipeline. Called by
/// the SQL API; runs as pg_tide.
pub(crate) fn enabled(name: &str) -> TideResult<Option<bool>> {
    sql_as_tide::one::<bool>(
        "SELECT enabled FROM tide.pipeline WHERE name = $1",
        &[name.into()],
    )
}

/// Insert a pipeline's row (its slot exists by now). Called by `tide.create_pipeline` inside
/// its `as_tide` block (so it runs as pg_tide), after the slot was created in the same
/// transaction.
pub(crate) fn insert(
    name: &str,
    target: TargetKind,
    options: JsonB,
    slot: &str,
    owner: &str,
) -> TideResult<()> {
    crate::sql::exec(
        "INSERT INTO tide.pipeline (name, target, options, slot_name, owner) VALUES ($1, $2, $3, $4::name, $5::name)",
        &[name.into(), target.as_str().into(), options.into(), slot.into(), owner.into()],
    )
}

/// Delete a pipeline's row (its tables, backfills and verifications go with it: `ON DELETE
/// CASCADE`), its definition (`tide.pipeline_definition`) and its watermark row in
/// `tide.signal`. Called by
/// `tide.drop_pipeline` once the worker is stopped; runs as pg_tide.
pub(crate) fn delete(name: &str) -> TideResult<()> {
    // (tide.follow_skip has no foreign key: see its definition.)
    sql_as_tide::exec(
        "DELETE FROM tide.follow_skip WHERE pipeline = $1",
        &[name.into()],
    )?;
    sql_as_tide::exec("DELETE FROM tide.pipeline WHERE name = $1", &[name.into()])?;
    // Its definition for pg_dump goes with it (a restored definition of the name included:
    // dropping the pipeline restored from it means it is not wanted).
    sql_as_tide::exec(
        "DELETE FROM tide.pipeline_definition WHERE name = $1",
        &[name.into()],
    )?;
    sql_as_tide::exec(
        "DELETE FROM tide.signal WHERE pipeline = $1",
        &[name.into()],
    )
}

/// Replace a pipeline's options (already checked). Called by `tide.alter_pipeline` inside its
/// `as_tide` block, holding the pipeline's lock.
pub(crate) fn set_options(name: &str, options: JsonB) -> TideResult<()> {
    sql_as_tide::exec(
        "UPDATE tide.pipeline SET options = $2 WHERE name = $1",
        &[name.into(), options.into()],
    )
}

/// Pause (`false`) or resume (`true`) a pipeline; false when it already was. Called by the SQL
/// API; runs as pg_tide.
pub(crate) fn set_enabled(name: &str, enabled: bool) -> TideResult<bool> {
    // (The row lock makes a concurrent pause wait and then see the value this one wrote.)
    Ok(sql_as_tide::exec_count(
        "UPDATE tide.pipeline SET enabled = $2 WHERE name = $1 AND enabled IS DISTINCT FROM $2",
        &[name.into(), enabled.into()],
    )? > 0)
}
