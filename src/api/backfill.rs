//! The backfill SQL surface: start (or re-seed), pause, resume, cancel, alter, wait.
//!
//! A backfill row is created here in state `queued`; the pipeline worker runs it (see
//! `worker::backfill`). States and who sets them:
//! - `queued`: set here by start/resume; the worker picks the oldest queued backfill of its
//!   pipeline once the table is capturing and no other backfill of the pipeline is running;
//! - `running`: set by the worker when it reads the first chunk;
//! - `paused`: set here; the worker reads no new chunk (one already read is still emitted);
//! - `done`: set by the worker in the transaction that emits the last chunk;
//! - `cancelled`: set here;
//! - `failed`: set by the worker when the table cannot be read as it was added (key changed,
//!   table dropped), or when the target refused a chunk's rows (a constraint only the target
//!   has, say), with an error, its SQLSTATE and a remedy; `tide.resume_backfill` queues the
//!   table's latest backfill again when it failed (from the chunk that failed), and
//!   `tide.cancel_backfill` gives it up (`cancelled`).
//!
//! All states are persisted in `tide.backfill`.

use super::args::{relation, required, Regclass};
use super::{check_server, require_pipeline, sleep_ms};
use crate::catalog::{backfills, tables};
use crate::error::{OrRaise, TideError, TideResult};
use crate::shmem;
use crate::sql;
use pgrx::prelude::*;
use tide_core::model::BackfillState;

/// Default rows per chunk.
pub const DEFAULT_CHUNK_SIZE: i32 = tide_core::model::DEFAULT_CHUNK_SIZE;
/// Most rows per chunk: a chunk is held in the worker's memory until its high watermark, and
/// read in one transaction, so it must stay a chunk.
pub const MAX_CHUNK_SIZE: i64 = 1_000_000;
/// Highest throttle (rows per second); 0 is unlimited.
pub const MAX_ROWS_PER_SECOND: i64 = 100_000_000;

/// A `bigint` argument that must lie in `lo..=hi`: beyond `integer` 22003 (the catalog holds
/// an `integer`), outside the bounds 22023; both with the bounds in the hint. The argument is a
/// `bigint` so that a value beyond `integer` reaches this check instead of failing to resolve
/// the function (42883).
pub(crate) fn bounded(name: &str, v: i64, lo: i64, hi: i64, what: &str) -> TideResult<i32> {
    let hint = || format!("{name} is {what}: from {lo} to {hi}.");
    let Ok(i) = i32::try_from(v) else {
        return Err(TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            format!("{name} {v} is out of range"),
        )
        .hint(hint()));
    };
    if v < lo || v > hi {
        return Err(
            TideError::invalid(format!("{name} must be from {lo} to {hi}, not {v}")).hint(hint()),
        );
    }
    Ok(i)
}

/// A chunk size argument (`None`: not given).
fn chunk_size_arg(v: Option<i64>) -> TideResult<Option<i32>> {
    v.map(|v| {
        bounded(
            "chunk_size",
            v,
            1,
            MAX_CHUNK_SIZE,
            &format!("rows per chunk (the default is {DEFAULT_CHUNK_SIZE}; a chunk is held in memory and read in one transaction)"),
        )
    })
    .transpose()
}

/// A throttle argument (`None`: not given; 0: unlimited).
fn rows_per_second_arg(v: Option<i64>) -> TideResult<Option<i32>> {
    v.map(|v| {
        bounded(
            "rows_per_second",
            v,
            0,
            MAX_ROWS_PER_SECOND,
            "the backfill's throttle in rows per second (0 removes it)",
        )
    })
    .transpose()
}

/// Resolve which pipeline a call means: the named one, or the only one capturing the table.
pub(crate) fn resolve_pipeline(relid: pg_sys::Oid, pipeline: Option<&str>) -> TideResult<String> {
    let qualified = relation_name(relid)?;
    match pipeline {
        Some(p) => {
            require_pipeline(p)?;
            if !tables::captures(p, relid)? {
                return Err(TideError::prerequisite(format!(
                    "pipeline \"{p}\" does not capture {qualified}"
                ))
                .hint(format!(
                    "Add it first: SELECT tide.add_table('{p}', {}).",
                    tide_core::plan::quote_literal(&qualified)
                )));
            }
            Ok(p.to_string())
        }
        None => {
            // Only the caller's own pipelines (those tide.pipelines shows it): an error never
            // names another owner's pipeline, nor says whether one captures the table.
            let names: Vec<String> = tables::pipelines_capturing(relid)?
                .into_iter()
                .filter(|n| require_pipeline(n).is_ok())
                .collect();
            match names.len() {
                0 => Err(TideError::prerequisite(format!("no pipeline of yours captures {qualified}"))
                    .hint(format!("Add it to a pipeline first: SELECT tide.add_table('<pipeline>', '{qualified}'), or name the pipeline: pipeline => '<name>'."))),
                1 => Ok(names.into_iter().next().unwrap_or_default()),
                _ => Err(TideError::new(
                    pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_AMBIGUOUS_PARAMETER,
                    format!("{qualified} is captured by several pipelines ({})", names.join(", ")),
                )
                .hint("Name the pipeline: pass pipeline => '<name>'.")),
            }
        }
    }
}

pub(crate) fn relation_name(relid: pg_sys::Oid) -> TideResult<String> {
    sql::one::<String>("SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1", &[relid.into()])?
        .ok_or_else(|| {
            TideError::new(
                pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                format!("relation with OID {} does not exist", relid.to_u32()),
            )
            .hint("Pass an existing table, e.g. 'public.orders'.")
        })
}

/// Check a backfill condition now, rather than later in the worker. Called as the pipeline's
/// owner (the role the chunks will run as).
fn validate_condition(
    qualified: &str,
    scan: &str,
    condition: &str,
    trusted: bool,
) -> TideResult<()> {
    if !trusted {
        one_expression(condition)?;
    }
    // EXPLAIN parses and analyses (unknown columns, wrong type, syntax) without reading rows. It
    // needs read-write SPI (EXPLAIN is refused in read-only mode), hence `fresh`.
    let probe = format!("EXPLAIN (COSTS OFF) SELECT 1 FROM {scan} WHERE (\n{condition}\n)");
    let outcome = pgrx::PgTryBuilder::new(|| sql::text_rows(&probe, &[], 0, true).map(|_| ()))
        .catch_others(|e| {
            let (code, msg) = match &e {
                pgrx::pg_sys::panic::CaughtError::PostgresError(r) | pgrx::pg_sys::panic::CaughtError::ErrorReport(r) => {
                    (r.sql_error_code(), r.message().to_string())
                }
                pgrx::pg_sys::panic::CaughtError::RustPanic { ereport, .. } => (ereport.sql_error_code(), ereport.message().to_string()),
            };
            Err(TideError::new(code, format!("invalid backfill condition: {msg}"))
                .hint(format!("The condition must be a boolean SQL expression on the columns of {qualified}, as in SELECT ... FROM {qualified} WHERE <condition>.")))
        })
        .execute();
    outcome
}

/// A condition must be exactly one SQL expression, as PostgreSQL's own parser sees it: it is
/// parsed alone (`raw_parser` in PL/pgSQL-expression mode, which accepts `<targets> [FROM ...]
/// [WHERE ...] ...`) and the parse tree must be a single unnamed target and nothing else. Such a
/// text cannot leave the parentheses it is put in: the chunk query places it between `(\n` and
/// `\n)`, so even a trailing `--` comment ends before the closing parenthesis, and unterminated
/// quotes or comments do not parse alone.
pub(crate) fn one_expression(cond: &str) -> TideResult<()> {
    let bad = |why: &str| {
        TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_SYNTAX_ERROR,
            format!("invalid backfill condition: {why}"),
        )
        .hint("Write one boolean expression on the table's columns, as after WHERE, e.g. 'created_at >= ''2024-01-01''' (no ';', no clauses around it).")
    };
    // The parser's own ERROR on a syntax error becomes ours (42601, the parser's message).
    let parsed = pgrx::PgTryBuilder::new(|| Ok(crate::row_filter::raw_expression(cond)))
        .catch_others(|e| {
            let msg = match &e {
                pgrx::pg_sys::panic::CaughtError::PostgresError(r)
                | pgrx::pg_sys::panic::CaughtError::ErrorReport(r) => r.message().to_string(),
                pgrx::pg_sys::panic::CaughtError::RustPanic { ereport, .. } => {
                    ereport.message().to_string()
                }
            };
            Err(bad(&msg))
        })
        .execute();
    parsed?.map_err(bad)?;
    Ok(())
}

/// Start (or re-seed) the backfill of one table for one pipeline; returns its id.
#[pg_extern]
fn start_backfill(
    source: Option<Regclass>,
    pipeline: default!(Option<&str>, "NULL"),
    chunk_size: default!(Option<i64>, "NULL"),
    condition: default!(Option<&str>, "NULL"),
) -> i64 {
    relation(source, "source")
        .and_then(|relid| start_backfill_impl(relid, pipeline, chunk_size, condition))
        .or_raise()
}

pub(crate) fn start_backfill_impl(
    relid: pg_sys::Oid,
    pipeline: Option<&str>,
    chunk_size: Option<i64>,
    condition: Option<&str>,
) -> TideResult<i64> {
    start_backfill_core(relid, pipeline, chunk_size, condition, false, None)
}

/// A repair: re-seed the rows matching `condition` (built by `tide.repair` from key ranges) and
/// delete `repair_deletes` (a JSON array of key value arrays) at the high watermark of the chunk
/// that shows they no longer exist.
pub(crate) fn start_backfill_internal(
    relid: pg_sys::Oid,
    pipeline: &str,
    condition: &str,
    repair_deletes: &str,
) -> TideResult<i64> {
    start_backfill_core(
        relid,
        Some(pipeline),
        None,
        Some(condition),
        true,
        Some(repair_deletes),
    )
}

/// Called by the worker as it pauses pipeline `pipeline` on a shape change (with the pause, in
/// one transaction): queue a backfill of every row of `relid`, which runs once the pipeline is
/// resumed (see `TideError::reread_after_resume`). One already queued or running is left to do
/// it (logged).
pub(crate) fn reread_after_resume(pipeline: &str, relid: u32) -> TideResult<()> {
    match start_backfill_core(
        pg_sys::Oid::from(relid),
        Some(pipeline),
        None,
        None,
        false,
        None,
    ) {
        Ok(id) => {
            log!("pg_tide worker \"{pipeline}\": backfill {id} of relation {relid} queued; it runs once the pipeline is resumed");
            Ok(())
        }
        Err(e) if e.code == pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_OBJECT_IN_USE => {
            log!("pg_tide worker \"{pipeline}\": relation {relid} is read again by its backfill already queued or running: {e}");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

fn start_backfill_core(
    relid: pg_sys::Oid,
    pipeline: Option<&str>,
    chunk_size: Option<i64>,
    condition: Option<&str>,
    trusted_condition: bool,
    repair_deletes: Option<&str>,
) -> TideResult<i64> {
    check_server()?;
    let pipeline = resolve_pipeline(relid, pipeline)?;
    let qualified = relation_name(relid)?;
    // The backfill's owner is the pipeline's, whoever starts it (a superuser included): the
    // condition is checked, and the chunk reads run, as that role.
    let owner = crate::catalog::pipelines::owner(&pipeline)?
        .ok_or_else(|| TideError::undefined(format!("pipeline \"{pipeline}\" does not exist")))?;
    let owner_oid = crate::security::owner_oid(&owner, &format!("pipeline \"{pipeline}\""))?;
    let chunk_size = chunk_size_arg(chunk_size)?.unwrap_or(DEFAULT_CHUNK_SIZE);
    // An empty condition is a mistake (a lost variable, say), not "every row": refused.
    let condition = condition.map(str::trim);
    if condition.is_some_and(str::is_empty) {
        return Err(TideError::invalid("the backfill condition is empty").hint(
            "Pass a boolean expression on the table's columns, or omit condition (NULL) to backfill every row.",
        ));
    }
    if let Some(c) = condition {
        let scan = tables::scan(relid, &qualified)?;
        crate::security::as_owner(owner_oid, || {
            validate_condition(&qualified, &scan, c, trusted_condition)
        })?;
    }
    // The key must still be the one recorded when the table was added.
    let (stored, now) = tables::recorded_and_current_key(&pipeline, relid)?.unwrap_or_default();
    if stored != now {
        return Err(TideError::prerequisite(format!(
            "the key of {qualified} changed since it was added to pipeline \"{pipeline}\" (was ({}), now ({}))",
            stored.join(", "),
            now.join(", ")
        ))
        .hint(format!("Remove and re-add the table so pg_tide learns the new key: SELECT tide.remove_table('{pipeline}', {q}); SELECT tide.add_table('{pipeline}', {q}).", q = tide_core::plan::quote_literal(&qualified))));
    }
    // A table without a key is copied whole at one point of the stream (worker::backfill::keyless): a
    // condition (part of the table) or a repair's listed keys cannot be. After the copy, the
    // stream skips the table's changes in every transaction the copy's snapshot saw; a copy of
    // some rows would lose those transactions' changes of the others (and a change that moves a
    // row into or out of the condition would have to be split).
    if stored.is_empty() && (condition.is_some() || repair_deletes.is_some()) {
        return Err(TideError::unsupported(format!(
            "{qualified} has no key (it is captured by REPLICA IDENTITY FULL): its backfill is one copy of the whole table, after which the stream skips the table's changes the copy already holds, so a condition cannot restrict it"
        ))
        .hint(format!("Start the backfill without a condition: SELECT tide.start_backfill('{}', '{}');", qualified.replace('\'', "''"), pipeline.replace('\'', "''"))));
    }
    // Serialise concurrent starts for one table, then look with a snapshot taken after the lock.
    crate::locks::lock(
        crate::locks::Lock::Backfill(&pipeline, relid),
        crate::locks::Mode::Exclusive,
    )?;
    if let Some(state) = backfills::active_state_after_lock(&pipeline, relid)? {
        return Err(TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
            format!("a backfill of {qualified} for pipeline \"{pipeline}\" is already {state}"),
        )
        .hint(
            "Watch it in tide.backfills; cancel it with tide.cancel_backfill first to start over.",
        ));
    }
    let id = backfills::insert(&pipeline, relid, chunk_size, condition, &owner)?;
    if let Some(d) = repair_deletes {
        backfills::set_repair_deletes(id, d)?;
    }
    super::wake_on_commit(shmem::worker_pid(&pipeline));
    Ok(id)
}

/// Move the table's active backfill from one of `from` to `to`. One that is already `to` (a
/// second pause, a resume of one that is not paused) is left as it is, with a NOTICE: pausing
/// what is paused, or resuming what runs, is a no-op, as for pipelines.
fn set_state(
    source: Option<Regclass>,
    pipeline: Option<&str>,
    from: &[BackfillState],
    to: BackfillState,
    verb: &str,
) -> TideResult<()> {
    let relid = relation(source, "source")?;
    let pipeline = resolve_pipeline(relid, pipeline)?;
    let qualified = relation_name(relid)?;
    let Some((id, state)) = backfills::active(&pipeline, relid)? else {
        // A backfill that failed (a chunk the target refused) is resumed from the chunk that
        // failed, or given up.
        if let (Some(id), BackfillState::Queued | BackfillState::Cancelled) =
            (backfills::failed_latest(&pipeline, relid)?, to)
        {
            backfills::set_state(id, to)?;
            super::wake_on_commit(shmem::worker_pid(&pipeline));
            return Ok(());
        }
        return Err(TideError::prerequisite(format!(
            "no backfill of {qualified} is active for pipeline \"{pipeline}\", nothing to {verb}"
        ))
        .hint("tide.backfills lists the backfills; tide.start_backfill starts one."));
    };
    let already = match to {
        BackfillState::Queued => matches!(state, BackfillState::Queued | BackfillState::Running),
        other => state == other,
    };
    if already {
        pgrx::notice!(
            "the backfill of {qualified} for pipeline \"{pipeline}\" is {}{state}: nothing to {verb}",
            if to == state { "already " } else { "" }
        );
        return Ok(());
    }
    if !from.contains(&state) {
        let from: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
        return Err(TideError::prerequisite(format!("the backfill of {qualified} for pipeline \"{pipeline}\" is {state}, so it cannot {verb}"))
            .hint(format!("Only a backfill that is {} can {verb}.", from.join(" or "))));
    }
    backfills::set_state(id, to)?;
    super::wake_on_commit(shmem::worker_pid(&pipeline));
    Ok(())
}

/// Pause a queued or running backfill; the stream keeps running.
#[pg_extern]
fn pause_backfill(source: Option<Regclass>, pipeline: default!(Option<&str>, "NULL")) {
    use BackfillState::*;
    set_state(source, pipeline, &[Queued, Running], Paused, "pause").or_raise()
}

/// Resume a paused backfill, or a failed one (the table's latest), from the chunk after the last
/// one emitted.
#[pg_extern]
fn resume_backfill(source: Option<Regclass>, pipeline: default!(Option<&str>, "NULL")) {
    use BackfillState::*;
    set_state(source, pipeline, &[Paused], Queued, "resume").or_raise()
}

/// Cancel a queued, running or paused backfill, or give up a failed one (the table's latest).
/// Rows already emitted stay at the target.
#[pg_extern]
fn cancel_backfill(source: Option<Regclass>, pipeline: default!(Option<&str>, "NULL")) {
    use BackfillState::*;
    set_state(
        source,
        pipeline,
        &[Queued, Running, Paused],
        Cancelled,
        "cancel",
    )
    .or_raise()
}

/// Change a backfill's chunk size and/or throttle (rows per second, 0 = unlimited) while it
/// runs; the next chunk uses them.
#[pg_extern]
fn alter_backfill(
    source: Option<Regclass>,
    pipeline: default!(Option<&str>, "NULL"),
    chunk_size: default!(Option<i64>, "NULL"),
    rows_per_second: default!(Option<i64>, "NULL"),
) {
    alter_backfill_impl(source, pipeline, chunk_size, rows_per_second).or_raise()
}

fn alter_backfill_impl(
    source: Option<Regclass>,
    pipeline: Option<&str>,
    chunk_size: Option<i64>,
    rows_per_second: Option<i64>,
) -> TideResult<()> {
    let relid = relation(source, "source")?;
    let pipeline = resolve_pipeline(relid, pipeline)?;
    let qualified = relation_name(relid)?;
    let chunk_size = chunk_size_arg(chunk_size)?;
    let rows_per_second = rows_per_second_arg(rows_per_second)?;
    let Some((id, _)) = backfills::active(&pipeline, relid)? else {
        return Err(TideError::prerequisite(format!(
            "no backfill of {qualified} is active for pipeline \"{pipeline}\""
        ))
        .hint("tide.backfills lists the backfills; tide.start_backfill starts one."));
    };
    backfills::alter(id, chunk_size, rows_per_second)?;
    super::wake_on_commit(shmem::worker_pid(&pipeline));
    Ok(())
}

/// Wait until the pipeline has decoded everything committed before the call (so a rewrite
/// among it has queued its backfill), the table's latest backfill is done, and the pipeline has
/// applied everything up to where it finished. False on timeout; an ERROR if the backfill
/// failed or was cancelled.
#[pg_extern]
fn wait_for_backfill(
    source: Option<Regclass>,
    pipeline: default!(Option<&str>, "NULL"),
    timeout: default!(Option<pgrx::datum::Interval>, "'1 hour'"),
) -> bool {
    (|| {
        wait_for_backfill_impl(
            relation(source, "source")?,
            pipeline,
            required(timeout, "timeout")?,
        )
    })()
    .or_raise()
}

fn wait_for_backfill_impl(
    relid: pg_sys::Oid,
    pipeline: Option<&str>,
    timeout: pgrx::datum::Interval,
) -> TideResult<bool> {
    check_server()?;
    let pipeline = resolve_pipeline(relid, pipeline)?;
    let qualified = relation_name(relid)?;
    // Everything committed before the call must have been decoded first: a table rewrite among
    // it queues a new backfill (the latest then), which the one done now does not cover.
    let target = sql::one::<String>("SELECT pg_current_wal_lsn()::text", &[])?
        .and_then(|s| s.parse::<tide_core::lsn::Lsn>().ok())
        .ok_or_else(|| TideError::internal("cannot read the current WAL position"))?;
    let deadline = super::deadline_after(super::interval_micros(&timeout));
    if let Some(pid) = shmem::worker_pid(&pipeline) {
        shmem::wake(pid);
    }
    loop {
        let decoded = shmem::caught_up_lsn(&pipeline).is_some_and(|l| l >= target.0);
        // A fresh snapshot each time: the worker commits the progress.
        let Some(latest) = backfills::latest(&pipeline, relid)? else {
            return Err(TideError::prerequisite(format!(
                "{qualified} has no backfill for pipeline \"{pipeline}\""
            ))
            .hint("Start one with tide.start_backfill."));
        };
        match latest.state {
            BackfillState::Done => {
                // (`latest` makes sure a done backfill has its finished_lsn.)
                let finished = latest.finished_lsn.unwrap_or_default();
                if decoded && shmem::caught_up_lsn(&pipeline).is_some_and(|l| l >= finished.0) {
                    return Ok(true);
                }
            }
            BackfillState::Failed => {
                return Err(TideError::prerequisite(format!(
                    "the backfill of {qualified} for pipeline \"{pipeline}\" failed: {}",
                    latest.error.unwrap_or_default()
                ))
                .hint(
                    "See tide.backfills for the error and its remedy (after a chunk the target refused: fix the row, then tide.resume_backfill); or start a new one with tide.start_backfill.",
                ))
            }
            BackfillState::Cancelled => {
                return Err(TideError::prerequisite(format!(
                    "the backfill of {qualified} for pipeline \"{pipeline}\" was cancelled"
                ))
                .hint("Start a new one with tide.start_backfill."))
            }
            BackfillState::Queued | BackfillState::Running | BackfillState::Paused => {}
        }
        if std::time::Instant::now() >= deadline {
            return Ok(false);
        }
        sleep_ms(50);
    }
}
