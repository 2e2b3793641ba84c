//! `tide.backfill` (one row per backfill of a table for a pipeline). Written by the SQL API
//! (start, pause, resume, cancel, alter) and by the worker (done, failed; the re-read after a
//! table rewrite). Each chunk's watermarks and progress are [`super::chunks`]'.
//!
//! States are bound from [`BackfillState`]: a set of states is a `text[]` parameter (`state =
//! ANY($n)`), or for `text_rows`, whose parameters are `text`, `state =
//! ANY(string_to_array($n, ','))` (immutable, so the planner sees the list as it would a literal
//! one, as it does a bound `text[]`, and can prove the partial index `backfill_one_active`).
//! Watermark kinds ([`super::chunks`]) are bound from `WatermarkKind`.

use super::corrupt;
use crate::error::{TideError, TideResult};
use crate::sql;
use crate::sql_as_tide;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use tide_core::lsn::Lsn;
use tide_core::model::BackfillState;

/// The text of each of `states`, for a `text[]` parameter.
fn texts(states: &[BackfillState]) -> Vec<&'static str> {
    states.iter().map(|s| s.as_str()).collect()
}

/// The active states (queued, running, paused: at most one such backfill per pipeline and
/// table), as [`BackfillState::is_active`] says.
pub(super) fn active_states() -> Vec<&'static str> {
    BackfillState::ALL
        .iter()
        .copied()
        .filter(|s| s.is_active())
        .map(BackfillState::as_str)
        .collect()
}

/// A state list as one `text` parameter: `string_to_array($n, ',')` in SQL.
fn comma_list(states: &[&str]) -> String {
    debug_assert!(states.iter().all(|s| !s.contains(',')));
    states.join(",")
}

/// A `tide.backfill.state` as its state: NULL or unknown text is [`corrupt`].
fn state(text: Option<&str>, pipeline: &str) -> TideResult<BackfillState> {
    text.and_then(BackfillState::parse)
        .ok_or_else(|| corrupt("backfill state", pipeline))
}

// --- the worker: one chunk -----------------------------------------------------------------------

/// A backfill as the chunk reader needs it (the read-ahead protocol carries it).
pub use tide_core::read_ahead::Due;

/// The backfills of the pipeline that may progress now, in the order their chunks are read: the
/// first `parallel` (`tide.max_parallel_backfills`) of those running, then of those queued,
/// oldest first, whose table the worker already captures, while the pipeline is enabled (paused
/// backfills are not read and take no place). The worker reads a chunk of the first one that
/// has none in memory and is not throttled. Their chunks run as the pipeline's owner, whoever
/// started them (a backfill a superuser started, or a row written by an older version with
/// another owner, runs with the owner's rights all the same). Backfills of tables without a key
/// are not among them (copied whole: [`keyless_due`]). Called by the worker, in the chunk's
/// first transaction (a read).
pub(crate) fn due(pipeline: &str, parallel: i32) -> TideResult<Vec<Due>> {
    let picked = comma_list(&texts(&[BackfillState::Queued, BackfillState::Running]));
    let parallel = parallel.max(1).to_string();
    let rows = sql::text_rows(
        "SELECT b.id, b.relid::int8, b.chunk_size, b.rows_per_second, b.condition, p.owner::text,
                to_json(b.key_columns)::text, to_json(b.last_key)::text, b.chunks_done + 1, b.repair_deletes::text,
                CASE WHEN b.resync AND p.target = 'table' AND t.target_name IS NOT NULL
                     THEN pg_catalog.format('%I.%I', t.target_schema, t.target_name) END,
                b.resync::text
           FROM tide.backfill b
           JOIN tide.pipeline p ON p.name = b.pipeline AND p.enabled
           JOIN tide.pipeline_table t ON t.pipeline = b.pipeline AND t.relid = b.relid AND t.added_lsn IS NOT NULL
          WHERE b.pipeline = $1 AND b.state = ANY(string_to_array($2, ',')) AND cardinality(b.key_columns) > 0
          ORDER BY b.state = $3 DESC, b.id
          LIMIT $4::int4",
        &[
            Some(pipeline),
            Some(&picked),
            Some(BackfillState::Running.as_str()),
            Some(&parallel),
        ],
        0,
        false,
    )?;
    rows.into_iter().map(|r| due_row(pipeline, r)).collect()
}

/// Fail the queued or running backfills of tables captured without a key (`REPLICA IDENTITY
/// FULL`) that the copy of such a table cannot do ([`keyless_due`] takes the others, a resync
/// after a lost slot included: the copy replaces the target's rows, which is what a resync
/// needs): a keyed repair (its deletes are listed by key) and one with a condition (the copy
/// replaces the whole table), left by a table whose key was dropped after they were queued (the
/// SQL API refuses to start them for a keyless table; `tide.repair` of one starts a copy). They
/// fail at once, visibly, with what to do.
///
/// Called on every iteration of a pipeline that captures a keyless table: it looks first
/// (read-only) and updates only when there is such a backfill, since an UPDATE gives the
/// transaction an xid and a commit record even when it changes no row. An idle pipeline must
/// write no WAL: every other worker of the database would wake for it, and `pg_upgrade` refuses
/// a slot with any transaction after its confirmed position.
fn fail_keyless(pipeline: &str) -> TideResult<()> {
    let active = texts(&[BackfillState::Queued, BackfillState::Running]);
    let any = sql::one::<bool>(
        "SELECT EXISTS (SELECT FROM tide.backfill
                         WHERE pipeline = $1 AND state = ANY($2) AND cardinality(key_columns) = 0
                           AND (repair_deletes IS NOT NULL OR condition IS NOT NULL))",
        &[pipeline.into(), active.clone().into()],
    )?
    .unwrap_or(false);
    if !any {
        return Ok(());
    }
    sql::exec(
        "UPDATE tide.backfill SET state = $2, error_at = now(), finished_at = now(), error_sqlstate = '0A000',
                error = relation || ' has no key (it is captured by REPLICA IDENTITY FULL), and pg_tide copies such a table whole, which a repair by key or a condition cannot use: ' || coalesce(error, 'a re-read was needed'),
                remedy = 'Compare the target with the source and copy what differs yourself (README, Tables without a key), or start a backfill of the whole table: SELECT tide.start_backfill(' || pg_catalog.quote_literal(relation) || ', ' || pg_catalog.quote_literal(pipeline) || ');'
          WHERE pipeline = $1 AND state = ANY($3) AND cardinality(key_columns) = 0
            AND (repair_deletes IS NOT NULL OR condition IS NOT NULL)",
        &[
            pipeline.into(),
            BackfillState::Failed.as_str().into(),
            active.into(),
        ],
    )
}

/// A backfill of a table without a key, due now: copied whole by the worker at an iteration's
/// start (`worker::backfill::keyless`).
pub(crate) struct KeylessDue {
    pub id: i64,
    pub relid: u32,
    /// The pipeline's owner: the copy is read as this role.
    pub owner: String,
}

/// The oldest queued or running backfill of a table without a key whose add marker the worker
/// has passed, while the pipeline is enabled (those the copy cannot do fail first:
/// [`fail_keyless`]). Called by the worker inside its iteration.
pub(crate) fn keyless_due(pipeline: &str) -> TideResult<Option<KeylessDue>> {
    fail_keyless(pipeline)?;
    let rows = sql::text_rows(
        "SELECT b.id, b.relid::int8, p.owner::text
           FROM tide.backfill b
           JOIN tide.pipeline p ON p.name = b.pipeline AND p.enabled
           JOIN tide.pipeline_table t ON t.pipeline = b.pipeline AND t.relid = b.relid AND t.added_lsn IS NOT NULL
          WHERE b.pipeline = $1 AND b.state = ANY(string_to_array($2, ',')) AND cardinality(b.key_columns) = 0
          ORDER BY b.id LIMIT 1",
        &[
            Some(pipeline),
            Some(&comma_list(&texts(&[BackfillState::Queued, BackfillState::Running]))),
        ],
        0,
        false,
    )?;
    let Some(r) = rows.into_iter().next() else {
        return Ok(None);
    };
    let int = |v: &Option<String>, what: &str| -> TideResult<i64> {
        v.as_deref()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| corrupt(what, pipeline))
    };
    Ok(Some(KeylessDue {
        id: int(&r[0], "backfill id")?,
        relid: super::relid(Some(int(&r[1], "relid")?), "relid", pipeline)?,
        owner: r[2].clone().ok_or_else(|| corrupt("owner", pipeline))?,
    }))
}

/// The copy of backfill `id` (a table without a key) is written in this transaction: the
/// backfill is done, with its snapshot and the WAL position after it (see
/// `tide_core::snapshot::KeylessCopy`), `rows` rows, at stream position `at`. `false` when the
/// backfill is no longer queued or running (cancelled or paused meanwhile): then nothing of the
/// copy may be written.
pub(crate) fn keyless_copied(
    id: i64,
    rows: i64,
    snapshot: &str,
    until: Lsn,
    at: Lsn,
) -> TideResult<bool> {
    let done = sql::write_one::<i64>(
        "UPDATE tide.backfill SET state = $2, started_at = coalesce(started_at, now()), finished_at = now(),
                chunks_done = 1, rows_read = $3, rows_emitted = $3, rows_dropped = 0, read_complete = true,
                estimated_rows = $3, finished_lsn = $6::pg_lsn, copy_snapshot = $4, copy_until = $5::pg_lsn,
                error = NULL, remedy = NULL, error_sqlstate = NULL, error_at = NULL, attempts = 0
          WHERE id = $1 AND state = ANY($7) RETURNING id",
        &[
            id.into(),
            BackfillState::Done.as_str().into(),
            rows.into(),
            snapshot.into(),
            until.to_string().into(),
            at.to_string().into(),
            texts(&[BackfillState::Queued, BackfillState::Running]).into(),
        ],
    )?;
    Ok(done.is_some())
}

/// The copies of the pipeline's tables without a key whose snapshot may still hold
/// transactions the stream has not passed (`copy_until` after `applied`): the latest per table.
/// The stream skips those tables' changes in the transactions each holds.
pub(crate) fn keyless_copies(
    pipeline: &str,
    applied: Lsn,
) -> TideResult<Vec<(u32, tide_core::snapshot::KeylessCopy)>> {
    let rows = sql::text_rows(
        "SELECT DISTINCT ON (relid) relid::int8, copy_snapshot, copy_until::text
           FROM tide.backfill
          WHERE pipeline = $1 AND copy_snapshot IS NOT NULL AND copy_until > $2::pg_lsn
          ORDER BY relid, id DESC",
        &[Some(pipeline), Some(&applied.to_string())],
        0,
        false,
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let bad = || corrupt("keyless copy", pipeline);
        let relid: i64 = r[0]
            .as_deref()
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)?;
        let snapshot = r[1]
            .as_deref()
            .and_then(tide_core::snapshot::InvisibleXids::parse)
            .ok_or_else(bad)?;
        let until: Lsn = r[2]
            .as_deref()
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)?;
        out.push((
            super::relid(Some(relid), "relid", pipeline)?,
            tide_core::snapshot::KeylessCopy { snapshot, until },
        ));
    }
    Ok(out)
}

/// One row of [`due`]'s query as a [`Due`].
fn due_row(pipeline: &str, mut r: Vec<Option<String>>) -> TideResult<Due> {
    let bad = |what: &str| corrupt(what, pipeline);
    let int = |v: &Option<String>, what: &str| -> TideResult<i64> {
        v.as_deref()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(what))
    };
    let strings = |v: &str, what: &str| -> TideResult<Vec<String>> {
        serde_json::from_str::<Vec<String>>(v).map_err(|_| bad(what))
    };
    if r.len() < 12 {
        return Err(bad("backfill row"));
    }
    let id = int(&r[0], "backfill id")?;
    let relid = super::relid(Some(int(&r[1], "relid")?), "relid", pipeline)?;
    let rows_per_second = match &r[3] {
        Some(_) => Some(int(&r[3], "rows_per_second")?),
        None => None,
    };
    let key_columns = strings(r[6].as_deref().unwrap_or(""), "key_columns")?;
    if key_columns.is_empty() {
        return Err(bad("key_columns"));
    }
    let last_key = match r[7].as_deref() {
        Some(k) => Some(strings(k, "last_key")?),
        None => None,
    };
    Ok(Due {
        id,
        relid,
        chunk_size: int(&r[2], "chunk_size")?,
        rows_per_second,
        condition: r[4].take(),
        owner: r[5].take().ok_or_else(|| bad("owner"))?,
        key_columns,
        last_key,
        chunk_no: int(&r[8], "chunks_done")?,
        repair_deletes: r[9].take(),
        sweep: r[10].take(),
        resync: r[11].as_deref() == Some("true"),
        to_key: None,
        chunk_cap: None,
    })
}

/// The chunk size and throttle a backfill has now (`alter_backfill` may change them while it
/// runs). Called by a worker's reader, in the chunk's first transaction.
pub(crate) fn settings(backfill_id: i64) -> TideResult<Option<(i64, Option<i64>)>> {
    let (size, rps) = sql::two::<i32, i32>(
        "SELECT chunk_size, rows_per_second FROM tide.backfill WHERE id = $1",
        &[backfill_id.into()],
    )?;
    Ok(size.map(|s| (i64::from(s), rps.map(i64::from))))
}

/// Say why no chunk of the backfill can be read now (`error`, `remedy`; the next emitted chunk
/// clears them). Called by the worker, in a transaction of its own.
pub(crate) fn note_waiting(id: i64, error: &str, remedy: &str) -> TideResult<()> {
    sql::exec(
        "UPDATE tide.backfill SET error = $2, remedy = $3, error_sqlstate = NULL, error_at = now() WHERE id = $1",
        &[id.into(), error.into(), remedy.into()],
    )
}

/// Fail a queued or running backfill, with the error, its SQLSTATE and its remedy. Called by the
/// worker, in a transaction of its own.
pub(crate) fn fail(id: i64, error: &str, sqlstate: &str, remedy: &str) -> TideResult<()> {
    sql::exec(
        "UPDATE tide.backfill SET state = $4, error = $2, remedy = $3, error_sqlstate = $6, error_at = now(),
                finished_at = now()
          WHERE id = $1 AND state = ANY($5)",
        &[
            id.into(),
            error.into(),
            remedy.into(),
            BackfillState::Failed.as_str().into(),
            texts(&[BackfillState::Queued, BackfillState::Running]).into(),
            sqlstate.into(),
        ],
    )
}

/// A write of the backfill's next chunk failed (the iteration that wrote it was rolled back):
/// count the attempt and record the error, its SQLSTATE and the remedy; with `fail` (the target
/// refused the chunk) the backfill fails, unless it is no longer queued or running. Returns the
/// attempts so far (`None`: the backfill is gone). Called by the worker, in a transaction of its
/// own.
pub(crate) fn chunk_failed(
    id: i64,
    error: &str,
    sqlstate: &str,
    remedy: &str,
    fail: bool,
) -> TideResult<Option<i32>> {
    sql::write_one::<i32>(
        "UPDATE tide.backfill
            SET attempts = attempts + 1, error = $2, error_sqlstate = $3, remedy = $4, error_at = now(),
                state = CASE WHEN $5 AND state = ANY($6) THEN $7 ELSE state END,
                finished_at = CASE WHEN $5 AND state = ANY($6) THEN now() ELSE finished_at END
          WHERE id = $1
          RETURNING attempts",
        &[
            id.into(),
            error.into(),
            sqlstate.into(),
            remedy.into(),
            fail.into(),
            texts(&[BackfillState::Queued, BackfillState::Running]).into(),
            BackfillState::Failed.as_str().into(),
        ],
    )
}

/// The worker reached a transaction that rewrote a captured table's heap (table-rewriting
/// `ALTER TABLE`), committed at `lsn`. Such a rewrite can change every row's values without a
/// row event, so the rows the target already has may be stale: the table is read again.
/// - An active backfill (queued, running or paused) starts over from the first key: chunks
///   emitted before the rewrite are read again, and the whole table is read (a `condition` —
///   a repair's ranges, attached partitions, the user's own — is dropped: the rewrite may have
///   changed every row; a repair keeps its deletes).
/// - Otherwise, if the table was backfilled before (its last whole-table backfill is done), a new
///   backfill is queued with the same owner, chunk size and throttle.
/// - A table that was never backfilled only streams: nothing is read.
///
/// The backfill's `required_lsn` is set to `lsn` (kept when it has an earlier one: a waiter past
/// that earlier rewrite still needs this backfill): it now carries changes of the stream (the
/// rewritten values), so `tide.wait_for_pipeline` waits for it like for the stream itself.
///
/// Returns a line for the server log saying which. Called by the worker, in the iteration's
/// transaction that applies the rewrite's position (one or two statements).
pub(crate) fn reread_after_rewrite(
    c: &mut SpiClient<'_>,
    pipeline: &str,
    relid: u32,
    lsn: &str,
) -> TideResult<String> {
    let note = format!(
        "the table was rewritten at {lsn} (ALTER TABLE with a rewrite): reading it again from the start"
    );
    let restarted = crate::sql::update(
        c,
        "UPDATE tide.backfill
            SET last_key = NULL, read_complete = false, error = $3, remedy = NULL,
                condition = NULL, required_lsn = coalesce(required_lsn, $5::pg_lsn)
          WHERE pipeline = $1 AND relid = $2::int8::oid AND state = ANY($4)
          RETURNING id",
        None,
        &[
            pipeline.into(),
            (relid as i64).into(),
            note.clone().into(),
            active_states().into(),
            lsn.into(),
        ],
    )?;
    if let Some(id) = sql::first::<i64>(restarted)? {
        return Ok(format!("backfill {id}: {note}"));
    }
    let queued = crate::sql::update(
        c,
        "INSERT INTO tide.backfill (pipeline, relid, relation, key_columns, owner, generation, chunk_size,
                                   rows_per_second, estimated_rows, error, required_lsn)
         SELECT b.pipeline, b.relid, b.relation, t.key_columns,
                (SELECT p.owner FROM tide.pipeline p WHERE p.name = b.pipeline),
                (SELECT max(generation) FROM tide.backfill WHERE pipeline = $1 AND relid = b.relid) + 1,
                -- (the chunk size carries over; a throttle belongs to its backfill only)
                b.chunk_size, NULL::int,
                -- (the worker refreshes it at the first chunk; tide._estimate_rows here would
                -- lock the table in the stream's transaction)
                (SELECT CASE WHEN reltuples >= 0 THEN reltuples::int8 END FROM pg_class WHERE oid = b.relid), $3,
                $5::pg_lsn
           FROM tide.backfill b
           JOIN tide.pipeline_table t ON t.pipeline = b.pipeline AND t.relid = b.relid
          WHERE b.pipeline = $1 AND b.relid = $2::int8::oid AND b.state = $4
            AND b.condition IS NULL AND b.repair_deletes IS NULL
          ORDER BY b.id DESC LIMIT 1
         RETURNING id",
        None,
        &[
            pipeline.into(),
            (relid as i64).into(),
            note.clone().into(),
            BackfillState::Done.as_str().into(),
            lsn.into(),
        ],
    )?;
    Ok(match sql::first::<i64>(queued)? {
        Some(id) => format!("backfill {id} queued: {note}"),
        None => format!(
            "table {relid} was rewritten at {lsn}; it was never backfilled, so rows already at the target keep the values they had (start a backfill to read them again)"
        ),
    })
}

/// The worker passed a `tide.alter_table` marker (commit LSN `lsn`) of `relid`: the table is
/// read again under its new row filter and column list, as a resync reads it (`resync = true`: a
/// table target's rows the chunks do not find at the source, now those the new filter leaves out,
/// are deleted at each high watermark; see `catalog::slots`). An active backfill of the table is
/// cancelled first (its chunks were read with the shaping before). Returns a line for the server
/// log. Called by the worker, in its iteration's transaction.
pub(crate) fn queue_reseed(
    c: &mut SpiClient<'_>,
    pipeline: &str,
    relid: u32,
    lsn: &str,
) -> TideResult<String> {
    crate::sql::update(
        c,
        "UPDATE tide.backfill SET state = $3, finished_at = now(),
                error = 'cancelled by pg_tide: tide.alter_table changed the table''s row filter or column list, and the table is read again'
          WHERE pipeline = $1 AND relid = $2::int8::oid AND state = ANY($4)",
        None,
        &[
            pipeline.into(),
            (relid as i64).into(),
            BackfillState::Cancelled.as_str().into(),
            active_states().into(),
        ],
    )?;
    let queued = crate::sql::update(
        c,
        "INSERT INTO tide.backfill (pipeline, relid, relation, key_columns, owner, generation, chunk_size,
                                   rows_per_second, estimated_rows, error, required_lsn, resync)
         SELECT t.pipeline, t.relid, t.relation, t.key_columns, p.owner,
                coalesce((SELECT max(b.generation) FROM tide.backfill b WHERE b.pipeline = $1 AND b.relid = t.relid), 0) + 1,
                coalesce((SELECT b.chunk_size FROM tide.backfill b WHERE b.pipeline = $1 AND b.relid = t.relid ORDER BY b.id DESC LIMIT 1), $4),
                NULL::int,
                -- (the worker refreshes it at the first chunk)
                (SELECT CASE WHEN c.reltuples >= 0 THEN c.reltuples::int8 END FROM pg_catalog.pg_class c WHERE c.oid = t.relid),
                'queued by pg_tide: tide.alter_table changed the row filter or column list at ' || $3, $3::pg_lsn, true
           FROM tide.pipeline_table t JOIN tide.pipeline p ON p.name = t.pipeline
          WHERE t.pipeline = $1 AND t.relid = $2::int8::oid AND NOT t.removing
         RETURNING id",
        None,
        &[
            pipeline.into(),
            (relid as i64).into(),
            lsn.into(),
            tide_core::model::DEFAULT_CHUNK_SIZE.into(),
        ],
    )?;
    Ok(match sql::first::<i64>(queued)? {
        Some(id) => format!(
            "backfill {id} queued: tide.alter_table changed the row filter or column list of table {relid} at {lsn}, so it is read again"
        ),
        None => format!("table {relid} is being removed: not read again after its tide.alter_table at {lsn}"),
    })
}

/// Queue a backfill of the rows of some partitions (`partitions`, attached since the table was
/// added) of captured partitioned table `relid`: condition `tableoid = ANY (...)`, owned by the
/// pipeline's owner, the default chunk size (or the last backfill's). Returns its id, or `None`
/// when a backfill of the table is active (queue it once that one is over: it may have read past
/// the partitions' keys already). Called by the worker, in its iteration's transaction.
pub(crate) fn queue_for_partitions(
    c: &mut SpiClient<'_>,
    pipeline: &str,
    relid: u32,
    partitions: &[u32],
    owner: &str,
    chunk_size: i32,
) -> TideResult<Option<i64>> {
    let active = crate::sql::select(
        c,
        "SELECT 1 FROM tide.backfill WHERE pipeline = $1 AND relid = $2::int8::oid AND state = ANY($3)",
        None,
        &[pipeline.into(), (relid as i64).into(), active_states().into()],
    )?;
    if !active.is_empty() {
        return Ok(None);
    }
    let list = partitions
        .iter()
        .map(|o| o.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let condition = format!("tableoid = ANY ('{{{list}}}'::oid[])");
    let queued = crate::sql::update(
        c,
        "INSERT INTO tide.backfill (pipeline, relid, relation, key_columns, owner, generation, chunk_size, condition, estimated_rows, error)
         SELECT t.pipeline, t.relid, t.relation, t.key_columns, $4::text::name,
                coalesce((SELECT max(generation) FROM tide.backfill WHERE pipeline = $1 AND relid = t.relid), 0) + 1,
                coalesce((SELECT b.chunk_size FROM tide.backfill b WHERE b.pipeline = $1 AND b.relid = t.relid ORDER BY b.id DESC LIMIT 1), $5),
                $3,
                (SELECT sum(CASE WHEN reltuples >= 0 THEN reltuples END)::int8 FROM pg_class WHERE oid::int8 = ANY($6::int8[])),
                $7
           FROM tide.pipeline_table t WHERE t.pipeline = $1 AND t.relid = $2::int8::oid
         RETURNING id",
        None,
        &[
            pipeline.into(),
            (relid as i64).into(),
            condition.into(),
            owner.into(),
            chunk_size.into(),
            partitions.iter().map(|&o| o as i64).collect::<Vec<_>>().into(),
            "queued by pg_tide: partitions were attached".into(),
        ],
    )?;
    Ok(sql::first::<i64>(queued)?)
}

// --- the SQL API ---------------------------------------------------------------------------------

/// The state of the table's active backfill for the pipeline, if any, with a snapshot taken
/// for this statement (`fresh`): the caller holds the table's backfill lock and must see a start
/// committed just before it got it. Called by the SQL API (`tide.start_backfill`); runs as
/// pg_tide.
pub(crate) fn active_state_after_lock(
    pipeline: &str,
    relid: pg_sys::Oid,
) -> TideResult<Option<BackfillState>> {
    super::table_row(
        "SELECT state FROM tide.backfill WHERE pipeline = $1 AND relid = $2::oid AND state = ANY(string_to_array($3, ','))",
        pipeline,
        relid,
        &[&comma_list(&active_states())],
        true,
    )?
    .map(|r| state(r[0].as_deref(), pipeline))
    .transpose()
}

/// The state of the table's active backfill for the pipeline, if any. Called by the SQL API
/// (`tide.verify`); runs as pg_tide.
pub(crate) fn active_state(
    pipeline: &str,
    relid: pg_sys::Oid,
) -> TideResult<Option<BackfillState>> {
    sql_as_tide::one::<String>(
        "SELECT state FROM tide.backfill WHERE pipeline = $1 AND relid = $2 AND state = ANY($3)",
        &[pipeline.into(), relid.into(), active_states().into()],
    )?
    .map(|s| state(Some(&s), pipeline))
    .transpose()
}

/// The table's active backfill for the pipeline, if any: (id, state). Called by the SQL API
/// (pause, resume, cancel, alter); runs as pg_tide.
pub(crate) fn active(
    pipeline: &str,
    relid: pg_sys::Oid,
) -> TideResult<Option<(i64, BackfillState)>> {
    let (id, s) = sql_as_tide::two::<i64, String>(
        "SELECT id, state FROM tide.backfill WHERE pipeline = $1 AND relid = $2 AND state = ANY($3)",
        &[pipeline.into(), relid.into(), active_states().into()],
    )?;
    match id {
        Some(id) => Ok(Some((id, state(s.as_deref(), pipeline)?))),
        None => Ok(None),
    }
}

/// The id of the table's latest backfill for the pipeline when it failed and the table is still
/// captured (not being removed). Called by the SQL API; runs as pg_tide.
pub(crate) fn failed_latest(pipeline: &str, relid: pg_sys::Oid) -> TideResult<Option<i64>> {
    sql_as_tide::one::<i64>(
        "SELECT b.id FROM tide.backfill b
           JOIN tide.pipeline_table t ON t.pipeline = b.pipeline AND t.relid = b.relid AND NOT t.removing
          WHERE b.pipeline = $1 AND b.relid = $2 AND b.state = $3
            AND NOT EXISTS (SELECT 1 FROM tide.backfill l WHERE l.pipeline = $1 AND l.relid = $2 AND l.id > b.id)",
        &[pipeline.into(), relid.into(), BackfillState::Failed.as_str().into()],
    )
}

/// Queue a backfill of a captured table (state queued, the next generation, the planner's
/// estimate of its rows) owned by `owner`; returns its id. Called by the SQL API; runs as
/// pg_tide.
pub(crate) fn insert(
    pipeline: &str,
    relid: pg_sys::Oid,
    chunk_size: i32,
    condition: Option<&str>,
    owner: &str,
) -> TideResult<i64> {
    let id = crate::security::as_tide(|| {
        Spi::connect_mut(|c| -> TideResult<Option<i64>> {
            Ok(sql::first::<i64>(crate::sql::update(
        c,
            "INSERT INTO tide.backfill (pipeline, relid, relation, key_columns, owner, generation, chunk_size, condition, estimated_rows)
             SELECT t.pipeline, t.relid, t.relation, t.key_columns, $5::text::name,
                    coalesce((SELECT max(generation) FROM tide.backfill WHERE pipeline = $1 AND relid = $2), 0) + 1,
                    $3, $4, tide._estimate_rows($2)
               FROM tide.pipeline_table t WHERE t.pipeline = $1 AND t.relid = $2
             RETURNING id",
            None,
            &[pipeline.into(), relid.into(), chunk_size.into(), condition.into(), owner.into()],
        )?)?)
        })
    })?;
    id.ok_or_else(|| TideError::internal("the backfill row was not inserted"))
}

/// Give a repair's backfill its keys to delete (a JSON array of key value arrays). Called by the
/// SQL API (`tide.repair`), right after [`insert`]; runs as pg_tide.
pub(crate) fn set_repair_deletes(id: i64, deletes: &str) -> TideResult<()> {
    sql_as_tide::exec(
        "UPDATE tide.backfill SET repair_deletes = $2::jsonb WHERE id = $1",
        &[id.into(), deletes.into()],
    )
}

/// Set a backfill's state (pause, resume, cancel; a cancelled one is finished now). Called by the
/// SQL API; runs as pg_tide.
pub(crate) fn set_state(id: i64, to: BackfillState) -> TideResult<()> {
    sql_as_tide::exec(
        "UPDATE tide.backfill SET state = $2, finished_at = CASE WHEN $2 = $3 THEN now() END WHERE id = $1",
        &[
            id.into(),
            to.as_str().into(),
            BackfillState::Cancelled.as_str().into(),
        ],
    )
}

/// Change a backfill's chunk size and throttle: `None` keeps a value, `rows_per_second` 0 removes
/// the throttle. Called by the SQL API; runs as pg_tide.
pub(crate) fn alter(
    id: i64,
    chunk_size: Option<i32>,
    rows_per_second: Option<i32>,
) -> TideResult<()> {
    sql_as_tide::exec(
        "UPDATE tide.backfill SET chunk_size = coalesce($2, chunk_size),
                rows_per_second = CASE WHEN $3 IS NULL THEN rows_per_second WHEN $3 = 0 THEN NULL ELSE $3 END
          WHERE id = $1",
        &[id.into(), chunk_size.into(), rows_per_second.into()],
    )
}

/// Cancel the table's active backfill for the pipeline, if any, because the table was removed
/// from it. Called by the SQL API (`tide.remove_table`); runs as pg_tide.
pub(crate) fn cancel_for_removed_table(pipeline: &str, relid: pg_sys::Oid) -> TideResult<()> {
    sql_as_tide::exec(
        "UPDATE tide.backfill SET state = $3, finished_at = now(), error = 'the table was removed from the pipeline'
          WHERE pipeline = $1 AND relid = $2 AND state = ANY($4)",
        &[
            pipeline.into(),
            relid.into(),
            BackfillState::Cancelled.as_str().into(),
            active_states().into(),
        ],
    )
}

/// Record that backfill `id` writes into a target that already held rows (tide.readiness then
/// waits for a verification that finds no difference). Called by `tide.add_table`; runs as
/// pg_tide.
pub(crate) fn mark_target_held_rows(id: i64) -> TideResult<()> {
    sql_as_tide::exec(
        "UPDATE tide.backfill SET target_held_rows = true WHERE id = $1",
        &[id.into()],
    )
}

/// The latest backfill of a table for a pipeline.
pub struct Latest {
    pub state: BackfillState,
    /// Commit LSN of the last chunk's high watermark; set when the state is done.
    pub finished_lsn: Option<Lsn>,
    pub error: Option<String>,
}

/// The table's latest backfill for the pipeline, if any, with a snapshot taken for this
/// statement (`fresh`: the caller polls while the worker commits progress). A done backfill
/// without a valid `finished_lsn` is [`corrupt`]. Called by the SQL API
/// (`tide.wait_for_backfill`); runs as pg_tide.
pub(crate) fn latest(pipeline: &str, relid: pg_sys::Oid) -> TideResult<Option<Latest>> {
    let Some(mut r) = super::table_row(
        "SELECT state, finished_lsn::text, error FROM tide.backfill WHERE pipeline = $1 AND relid = $2::oid ORDER BY id DESC LIMIT 1",
        pipeline,
        relid,
        &[],
        true,
    )? else {
        return Ok(None);
    };
    let state = state(r[0].as_deref(), pipeline)?;
    let finished_lsn = match r[1].as_deref() {
        Some(l) => Some(
            l.parse::<Lsn>()
                .map_err(|_| corrupt("backfill finished_lsn", pipeline))?,
        ),
        None if state == BackfillState::Done => {
            return Err(corrupt("backfill finished_lsn", pipeline))
        }
        None => None,
    };
    Ok(Some(Latest {
        state,
        finished_lsn,
        error: r[2].take(),
    }))
}

/// What a table's rewrite (at or before a waiter's position) still needs: the latest such
/// requirement (`required_id`), and the latest whole-table backfill from it on that could meet
/// it (`None`: none exists, e.g. it was cancelled and replaced by one with a condition). What
/// `tide.wait_for_pipeline` waits for besides the stream.
pub(crate) struct Required {
    pub required_id: i64,
    pub relation: String,
    pub by: Option<(i64, BackfillState, Option<Lsn>, Option<String>)>,
}

/// For each of `pipeline`'s tables with a backfill whose `required_lsn` is at or before `upto`:
/// the latest such backfill, and the latest backfill from it on that reads the whole table (no
/// condition; a repair's deletes are fine), preferring a done one. Called by the SQL API; runs
/// as pg_tide.
pub(crate) fn required_by(pipeline: &str, upto: Lsn) -> TideResult<Vec<Required>> {
    let rows = sql_as_tide::text_rows(
        "WITH req AS (
             SELECT DISTINCT ON (b.relid) b.relid, b.id, b.relation
               FROM tide.backfill b
               JOIN tide.pipeline_table t ON t.pipeline = b.pipeline AND t.relid = b.relid
              WHERE b.pipeline = $1 AND b.required_lsn <= $2::pg_lsn
              ORDER BY b.relid, b.id DESC)
         SELECT r.id::text, r.relation, c.id::text, c.state, c.finished_lsn::text, c.error
           FROM req r
           LEFT JOIN LATERAL (
                SELECT c.* FROM tide.backfill c
                 WHERE c.pipeline = $1 AND c.relid = r.relid AND c.id >= r.id AND c.condition IS NULL
                 ORDER BY c.state = 'done' DESC, c.id DESC LIMIT 1) c ON true",
        &[Some(pipeline), Some(&upto.to_string())],
        0,
        // (a new snapshot each call: the caller polls while the worker commits)
        true,
    )?;
    rows.into_iter()
        .map(|mut r| {
            let bad = || TideError::internal("tide.backfill returned an incomplete row");
            let by = match r[2].take().and_then(|s| s.parse::<i64>().ok()) {
                None => None,
                Some(id) => Some((
                    id,
                    r[3].take()
                        .and_then(|s| BackfillState::parse(&s))
                        .ok_or_else(bad)?,
                    r[4].take().and_then(|s| s.parse().ok()),
                    r[5].take(),
                )),
            };
            Ok(Required {
                required_id: r[0].take().and_then(|s| s.parse().ok()).ok_or_else(bad)?,
                relation: r[1].take().ok_or_else(bad)?,
                by,
            })
        })
        .collect()
}
