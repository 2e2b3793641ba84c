//! The worker's reads and writes of pg_tide's catalog tables (`tide.pipeline`,
//! `tide.pipeline_table`) and of its replication slots, and the version gate. Every statement
//! uses `$n` parameters; every SPI error is returned to the caller; a NULL or malformed value in
//! a column pg_tide always fills is an error naming the column, never a default. (Not yet all
//! SQL on pg_tide's tables is here: the SQL API (`src/api`), the backfill and the launcher
//! still run their own statements; see issue 12.)

use crate::error::{TideError, TideResult};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
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
}

/// A captured table of a pipeline.
#[derive(Debug, Clone)]
pub struct TableRow {
    pub relid: u32,
    /// True once the worker has passed the add_table marker in the stream.
    pub capturing: bool,
}

/// The version of this build of the library; the SQL objects of the database it runs in must be
/// of the same version (see [`version_gate`]).
pub const LIBRARY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The version of pg_tide's SQL objects in this database (`pg_extension.extversion`), or `None`
/// when the extension is not installed.
pub fn installed_version() -> TideResult<Option<String>> {
    Ok(crate::sql::one::<String>(
        "SELECT extversion::text FROM pg_catalog.pg_extension WHERE extname = 'pg_tide'",
        &[],
    )?)
}

/// `Ok` when the SQL objects of this database are of the library's version (or not installed),
/// else the error that says which step of an upgrade is missing. The library only knows the
/// catalog of its own version, so neither the worker nor the SQL API runs against another: after
/// a new `pg_tide.so` is installed and the server restarted, pipelines wait (and API calls fail
/// with this error) until `ALTER EXTENSION pg_tide UPDATE` has run; after an `ALTER EXTENSION`
/// to a version newer than the library loaded at server start, until the server is restarted.
pub fn version_gate() -> TideResult<()> {
    match installed_version()? {
        Some(v) if v != LIBRARY_VERSION => Err(version_mismatch(&v)),
        _ => Ok(()),
    }
}

/// The error for SQL objects of version `installed` under this library.
pub fn version_mismatch(installed: &str) -> TideError {
    let e = TideError::prerequisite(format!(
        "pg_tide's library is version {LIBRARY_VERSION} but its SQL objects in this database are version {installed}"
    ))
    .detail("Pipelines do not run and the pg_tide functions refuse to act while the two differ; nothing is lost meanwhile (each pipeline's slot keeps the WAL it has not applied).");
    if version_key(installed) < version_key(LIBRARY_VERSION) {
        e.hint("Run ALTER EXTENSION pg_tide UPDATE in this database: the pipelines resume by themselves once it commits.")
    } else {
        e.hint(format!(
            "The server loaded an older pg_tide.so ({LIBRARY_VERSION}) at start: restart the server so it loads the installed library of version {installed}."
        ))
    }
}

/// `"1.20.3"` as `[1, 20, 3]`, for comparing versions (non-numeric parts count as 0).
fn version_key(v: &str) -> Vec<u64> {
    v.split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0))
        .collect()
}

/// A pipeline's `tide.pipeline.target` as its kind. An unknown (or missing) kind is an error,
/// never a default: this build would write the wrong target.
pub fn target_kind(text: Option<String>, pipeline: &str) -> TideResult<TargetKind> {
    let text = text.unwrap_or_default();
    TargetKind::parse(&text).ok_or_else(|| {
        TideError::unsupported(format!(
            "pipeline \"{pipeline}\" has target \"{text}\", which this version of pg_tide cannot write"
        ))
        .hint("Install the pg_tide version that created the pipeline, or drop and re-create the pipeline.")
    })
}

/// The slot name of a pipeline.
pub fn slot_name(pipeline: &str) -> String {
    format!("tide_{pipeline}")
}

/// The key used with `pg_advisory_xact_lock(hashtext(...))` while a transaction creates a slot.
pub fn slot_lock_key(slot: &str) -> String {
    format!("pg_tide slot {slot}")
}

/// The advisory lock key that serialises `drop_pipeline` against the worker's iterations.
pub fn pipeline_lock_key(pipeline: &str) -> String {
    format!("pg_tide pipeline {pipeline}")
}

/// Take the pipeline's advisory lock in shared mode (so `drop_pipeline`, which takes it
/// exclusively, waits for this iteration, and this iteration waits for a drop in progress), then
/// read the pipeline row. Neither assigns a transaction id: an idle worker writes no WAL.
pub fn lock_pipeline(c: &mut SpiClient<'_>, name: &str) -> TideResult<Option<PipelineRow>> {
    c.select(
        "SELECT true FROM pg_advisory_xact_lock_shared(hashtext($1))",
        None,
        &[pipeline_lock_key(name).into()],
    )?;
    let rows = c.select(
        "SELECT p.name, p.target, p.slot_name::text, p.enabled, p.applied_lsn::text,
                (SELECT s.confirmed_flush_lsn::text FROM pg_catalog.pg_replication_slots s WHERE s.slot_name = p.slot_name),
                p.last_error IS NOT NULL, p.options::text, p.owner::text
           FROM tide.pipeline p WHERE p.name = $1",
        None,
        &[name.into()],
    )?;
    let Some(r) = rows.into_iter().next() else {
        return Ok(None);
    };
    Ok(Some(PipelineRow {
        name: r.get::<String>(1)?.unwrap_or_default(),
        target: target_kind(r.get::<String>(2)?, name)?,
        slot_name: r.get::<String>(3)?.unwrap_or_default(),
        enabled: r.get::<bool>(4)?.unwrap_or(false),
        applied_lsn: r.get::<String>(5)?,
        confirmed_lsn: r.get::<String>(6)?,
        has_error: r.get::<bool>(7)?.unwrap_or(false),
        options: serde_json::from_str(&r.get::<String>(8)?.unwrap_or_default())
            .unwrap_or(serde_json::Value::Null),
        owner: r.get::<String>(9)?.unwrap_or_default(),
    }))
}

/// A catalog value that must be there: a NULL or malformed value in pg_tide's own tables is an
/// error naming the column, never a default (an empty key would plan `ON CONFLICT ()`, relid 0
/// would match no table).
fn corrupt(what: &str, pipeline: &str) -> TideError {
    TideError::new(
        pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        format!("pg_tide's catalog has no valid {what} for pipeline \"{pipeline}\""),
    )
    .hint("The row was changed by hand. Remove the table from the pipeline (tide.remove_table) and add it again.")
}

/// The target table of each captured table of a table pipeline (`relid` → schema, name, key
/// columns in key order).
pub fn target_tables(
    c: &mut SpiClient<'_>,
    pipeline: &str,
) -> TideResult<Vec<(u32, tide_core::plan::TableRef)>> {
    let rows = c.select(
        "SELECT relid::int8, target_schema, target_name, key_columns
           FROM tide.pipeline_table WHERE pipeline = $1 AND target_name IS NOT NULL",
        None,
        &[pipeline.into()],
    )?;
    let mut out = Vec::new();
    for r in rows {
        let relid = r
            .get::<i64>(1)?
            .and_then(|v| u32::try_from(v).ok())
            .filter(|v| *v != 0)
            .ok_or_else(|| corrupt("relid", pipeline))?;
        let schema = r
            .get::<String>(2)?
            .ok_or_else(|| corrupt("target_schema", pipeline))?;
        let name = r
            .get::<String>(3)?
            .ok_or_else(|| corrupt("target_name", pipeline))?;
        let key = r
            .get::<Vec<String>>(4)?
            .filter(|k| !k.is_empty())
            .ok_or_else(|| corrupt("key_columns", pipeline))?;
        out.push((relid, tide_core::plan::TableRef { schema, name, key }));
    }
    Ok(out)
}

/// Every pipeline, as (name, creation time as text), by name: a pipeline dropped and created
/// again under the same name is another pipeline (the launcher's back-off starts afresh).
pub fn pipeline_list(c: &SpiClient<'_>) -> TideResult<Vec<(String, String)>> {
    let mut out = Vec::new();
    for row in c.select(
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

/// The tables a pipeline captures.
pub fn tables(c: &mut SpiClient<'_>, pipeline: &str) -> TideResult<Vec<TableRow>> {
    let rows = c.select(
        "SELECT relid::int8, added_lsn IS NOT NULL FROM tide.pipeline_table WHERE pipeline = $1 ORDER BY relid",
        None,
        &[pipeline.into()],
    )?;
    let mut out = Vec::new();
    for r in rows {
        out.push(TableRow {
            relid: r
                .get::<i64>(1)?
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| corrupt("relid", pipeline))?,
            capturing: r.get::<bool>(2)?.unwrap_or(false),
        });
    }
    Ok(out)
}

/// Record that the worker reached a table's add_table marker at commit LSN `lsn`.
pub fn mark_capturing(
    c: &mut SpiClient<'_>,
    pipeline: &str,
    relid: u32,
    lsn: &str,
) -> TideResult<()> {
    c.update(
        "UPDATE tide.pipeline_table SET added_lsn = $3::pg_lsn WHERE pipeline = $1 AND relid = $2::int8::oid AND added_lsn IS NULL",
        None,
        &[pipeline.into(), (relid as i64).into(), lsn.into()],
    )?;
    Ok(())
}

/// The worker reached a transaction that rewrote a captured table's heap (table-rewriting
/// `ALTER TABLE`), committed at `lsn`. Such a rewrite can change every row's values without a
/// row event, so the rows the target already has may be stale: the table is read again.
/// - An active backfill (queued, running or paused) starts over from the first key: chunks
///   emitted before the rewrite are read again.
/// - Otherwise, if the table was backfilled before (its last whole-table backfill is done), a new
///   backfill is queued with the same owner, chunk size and throttle.
/// - A table that was never backfilled only streams: nothing is read.
/// Returns a line for the server log saying which.
pub fn reread_after_rewrite(
    c: &mut SpiClient<'_>,
    pipeline: &str,
    relid: u32,
    lsn: &str,
) -> TideResult<String> {
    let note = format!(
        "the table was rewritten at {lsn} (ALTER TABLE with a rewrite): reading it again from the start"
    );
    let restarted = c.update(
        "UPDATE tide.backfill
            SET last_key = NULL, read_complete = false, error = $3, remedy = NULL
          WHERE pipeline = $1 AND relid = $2::int8::oid AND state IN ('queued', 'running', 'paused')
          RETURNING id",
        None,
        &[pipeline.into(), (relid as i64).into(), note.clone().into()],
    )?;
    if let Some(id) = crate::sql::first::<i64>(restarted)? {
        return Ok(format!("backfill {id}: {note}"));
    }
    let queued = c.update(
        "INSERT INTO tide.backfill (pipeline, relid, relation, key_columns, owner, generation, chunk_size,
                                   rows_per_second, estimated_rows, error)
         SELECT b.pipeline, b.relid, b.relation, t.key_columns, b.owner,
                (SELECT max(generation) FROM tide.backfill WHERE pipeline = $1 AND relid = b.relid) + 1,
                b.chunk_size, b.rows_per_second,
                -- (the worker refreshes it at the first chunk; tide._estimate_rows here would
                -- lock the table in the stream's transaction)
                (SELECT CASE WHEN reltuples >= 0 THEN reltuples::int8 END FROM pg_class WHERE oid = b.relid), $3
           FROM tide.backfill b
           JOIN tide.pipeline_table t ON t.pipeline = b.pipeline AND t.relid = b.relid
          WHERE b.pipeline = $1 AND b.relid = $2::int8::oid AND b.state = 'done'
            AND b.condition IS NULL AND b.repair_deletes IS NULL
          ORDER BY b.id DESC LIMIT 1
         RETURNING id",
        None,
        &[pipeline.into(), (relid as i64).into(), note.clone().into()],
    )?;
    Ok(match crate::sql::first::<i64>(queued)? {
        Some(id) => format!("backfill {id} queued: {note}"),
        None => format!(
            "table {relid} was rewritten at {lsn}; it was never backfilled, so rows already at the target keep the values they had (start a backfill to read them again)"
        ),
    })
}

/// The worker reached a table's remove marker: forget the table (unless it was re-added since).
pub fn forget_removed(c: &mut SpiClient<'_>, pipeline: &str, relid: u32) -> TideResult<()> {
    c.update(
        "DELETE FROM tide.pipeline_table WHERE pipeline = $1 AND relid = $2::int8::oid AND removing",
        None,
        &[pipeline.into(), (relid as i64).into()],
    )?;
    Ok(())
}

/// Record the applied position in the same transaction as the events: the heart of
/// exactly-once. Also clears a previous error.
pub fn record_applied(
    c: &mut SpiClient<'_>,
    pipeline: &str,
    end_lsn: &str,
    commit_time_us: Option<i64>,
) -> TideResult<()> {
    c.update(
        "UPDATE tide.pipeline
            SET applied_lsn = $2::pg_lsn,
                applied_commit_time = coalesce('2000-01-01 00:00:00+00'::timestamptz + make_interval(secs => $3::float8 / 1000000), applied_commit_time),
                last_error = NULL, last_error_sqlstate = NULL, last_error_at = NULL, remedy = NULL
          WHERE name = $1",
        None,
        &[pipeline.into(), end_lsn.into(), commit_time_us.map(|t| t as f64).into()],
    )?;
    Ok(())
}

/// Clear the error columns after a successful iteration that applied nothing.
pub fn clear_error(c: &mut SpiClient<'_>, pipeline: &str) -> TideResult<()> {
    c.update(
        "UPDATE tide.pipeline SET last_error = NULL, last_error_sqlstate = NULL, last_error_at = NULL, remedy = NULL
          WHERE name = $1 AND last_error IS NOT NULL",
        None,
        &[pipeline.into()],
    )?;
    Ok(())
}

/// Pause a pipeline because of an error only the user can fix (the error is recorded next).
pub fn pause_for(pipeline: &str) -> TideResult<()> {
    crate::sql::exec(
        "UPDATE tide.pipeline SET enabled = false WHERE name = $1",
        &[pipeline.into()],
    )
}

/// Record a failed iteration (in its own transaction, after the failed one was aborted).
pub fn record_error(pipeline: &str, e: &TideError) -> TideResult<()> {
    let remedy = e.hint.clone().unwrap_or_else(|| default_remedy(e));
    let message = match &e.detail {
        Some(d) => format!("{} ({d})", e.message),
        None => e.message.clone(),
    };
    Spi::run_with_args(
        "UPDATE tide.pipeline SET last_error = $2, last_error_sqlstate = $3, last_error_at = now(), remedy = $4 WHERE name = $1",
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

/// Drop `tide_*` slots of this database that no pipeline owns and whose creating transaction
/// is not in progress (it holds the slot's advisory lock until it ends).
pub fn drop_orphan_slots() -> TideResult<()> {
    Spi::connect_mut(|c| -> TideResult<()> {
        let rows = c.select(
            "SELECT s.slot_name::text FROM pg_catalog.pg_replication_slots s
              WHERE s.plugin = 'pg_tide' AND s.database = current_database() AND NOT s.active
                AND s.slot_name LIKE 'tide\\_%'
                AND NOT EXISTS (SELECT 1 FROM tide.pipeline p WHERE p.slot_name = s.slot_name)",
            None,
            &[],
        )?;
        let mut orphans = Vec::new();
        for r in rows {
            if let Some(s) = r.get::<String>(1)? {
                orphans.push(s);
            }
        }
        for slot in orphans {
            let locked = c
                .select(
                    "SELECT pg_catalog.pg_try_advisory_xact_lock(hashtext($1))",
                    None,
                    &[slot_lock_key(&slot).into()],
                )?
                .first()
                .get_one::<bool>()?
                .unwrap_or(false);
            if !locked {
                continue;
            }
            // Re-check with a snapshot taken after the lock: the creator may have just committed.
            let still_orphan = c
                .update(
                    "SELECT NOT EXISTS (SELECT 1 FROM tide.pipeline WHERE slot_name = $1::name)
                        AND EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = $1::name AND NOT active)",
                    None,
                    &[slot.clone().into()],
                )?
                .first()
                .get_one::<bool>()?
                .unwrap_or(false);
            if still_orphan {
                c.update(
                    "SELECT pg_catalog.pg_drop_replication_slot($1::name)",
                    None,
                    &[slot.clone().into()],
                )?;
                log!(
                    "pg_tide launcher: dropped replication slot \"{slot}\", which no pipeline owns"
                );
            }
        }
        Ok(())
    })
}

/// Newer PostgreSQL minor releases only let slots use output plugins listed in
/// `output_plugin_libraries` (a superuser-settable list). A superuser creating a pipeline has
/// evidently chosen pg_tide, so the list is extended for this transaction only; anyone else gets
/// the exact setting to ask for.
pub fn allow_output_plugin() -> TideResult<()> {
    let exists = crate::sql::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_settings WHERE name = 'output_plugin_libraries')",
        &[],
    )?
    .unwrap_or(false);
    if !exists {
        return Ok(());
    }
    let current =
        crate::sql::one::<String>("SELECT current_setting('output_plugin_libraries')", &[])?
            .unwrap_or_default();
    if current
        .split(',')
        .any(|l| l.trim().trim_matches('"') == "pg_tide")
    {
        return Ok(());
    }
    let superuser = crate::sql::one::<bool>(
        "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
        &[],
    )?
    .unwrap_or(false);
    if !superuser {
        return Err(TideError::prerequisite("pg_tide is not in output_plugin_libraries")
            .hint(format!("Ask a superuser to run ALTER SYSTEM SET output_plugin_libraries = '{}pg_tide' and SELECT pg_reload_conf().", if current.trim().is_empty() { String::new() } else { format!("{current}, ") })));
    }
    let list = if current.trim().is_empty() {
        "pg_tide".to_string()
    } else {
        format!("{current}, pg_tide")
    };
    crate::sql::one::<String>(
        "SELECT set_config('output_plugin_libraries', $1, true)",
        &[list.into()],
    )?;
    Ok(())
}
