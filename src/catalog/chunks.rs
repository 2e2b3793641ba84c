//! A backfill's chunks: the watermarks (`tide.signal`, one row per pipeline, updated in place,
//! with ids from `tide.watermark_seq`), each chunk's progress at its high watermark (the
//! backfill's last key and counters in `tide.backfill`, which refuse a chunk that does not
//! start where the backfill durably stands) and the recent chunks of each backfill
//! (`tide.chunk`). Written by the worker and its readers; the rest of `tide.backfill` is
//! [`super::backfills`]'.

use super::backfills::active_states;
use super::corrupt;
use crate::error::TideResult;
use crate::sql;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use tide_core::lsn::Lsn;
use tide_core::model::{BackfillState, WatermarkKind};

/// A new watermark id (never reused). Called by the worker, in the chunk's first transaction.
pub(crate) fn next_watermark(pipeline: &str) -> TideResult<u64> {
    sql::one::<i64>("SELECT nextval('tide.watermark_seq')", &[])?
        .map(|w| w as u64)
        .ok_or_else(|| corrupt("watermark_seq", pipeline))
}

/// Mark the backfill running if it was queued (and when it started), and write the chunk's low
/// watermark into the pipeline's `tide.signal` row (two statements). Called by the worker, in
/// the chunk's first transaction, which commits before the chunk is read.
pub(crate) fn write_low_watermark(
    pipeline: &str,
    backfill_id: i64,
    watermark: u64,
    chunk_no: i64,
) -> TideResult<()> {
    Spi::connect_mut(|c| -> TideResult<()> {
        crate::sql::update(
        c,
            // From queued only: a pause or cancel that committed meanwhile (this UPDATE then
            // re-reads the row it waited for) is not overwritten.
            "UPDATE tide.backfill SET state = $2, started_at = coalesce(started_at, now()) WHERE id = $1 AND state = $3",
            None,
            &[
                backfill_id.into(),
                BackfillState::Running.as_str().into(),
                BackfillState::Queued.as_str().into(),
            ],
        )?;
        write_signal(
            c,
            pipeline,
            WatermarkKind::Low,
            watermark,
            backfill_id,
            chunk_no,
        )?;
        Ok(())
    })
}

/// Upsert the pipeline's `tide.signal` row with a watermark of `kind` of chunk `chunk_no` of
/// backfill `backfill_id` (its WAL record is what the stream sees).
fn write_signal(
    c: &mut pgrx::spi::SpiClient<'_>,
    pipeline: &str,
    kind: WatermarkKind,
    watermark: u64,
    backfill_id: i64,
    chunk_no: i64,
) -> TideResult<()> {
    crate::sql::update(
        c,
        "INSERT INTO tide.signal AS s (pipeline, watermark, kind, backfill_id, chunk) VALUES ($1, $2, $5, $3, $4)
         ON CONFLICT (pipeline) DO UPDATE SET watermark = excluded.watermark, kind = excluded.kind, backfill_id = excluded.backfill_id,
                chunk = excluded.chunk, written_at = clock_timestamp()",
        None,
        &[
            pipeline.into(),
            (watermark as i64).into(),
            backfill_id.into(),
            chunk_no.into(),
            kind.as_str().into(),
        ],
    )?;
    Ok(())
}

/// Write the chunk's high watermark into the pipeline's `tide.signal` row (the whole row: another
/// chunk's low watermark may have been written over this one's meanwhile, by the worker or its
/// reader, when several chunks are in flight), and, for the last chunk, record that the table
/// has been read (`read_complete`): one or two statements. Called by the worker, in the chunk's
/// second transaction, after the chunk's SELECT.
pub(crate) fn write_high_watermark(
    pipeline: &str,
    watermark: u64,
    backfill_id: i64,
    chunk_no: i64,
    read_complete: bool,
) -> TideResult<()> {
    Spi::connect_mut(|c| -> TideResult<()> {
        write_signal(
            c,
            pipeline,
            WatermarkKind::High,
            watermark,
            backfill_id,
            chunk_no,
        )?;
        if read_complete {
            crate::sql::update(
                c,
                "UPDATE tide.backfill SET read_complete = true WHERE id = $1",
                None,
                &[backfill_id.into()],
            )?;
        }
        Ok(())
    })
}

/// A chunk at its high watermark: what it read, dropped and emits.
pub struct ChunkDone {
    pub backfill_id: i64,
    pub chunk_no: i64,
    /// Key of the last row of the previous chunk (`None` for the first).
    pub key_from: Option<Vec<String>>,
    /// Key of the last row read (`None`: none read, the backfill's last key stays).
    pub key_to: Option<Vec<String>>,
    pub low_lsn: Option<Lsn>,
    /// The high watermark's commit position: where the rows are emitted.
    pub high_lsn: Lsn,
    pub rows_read: usize,
    pub rows_dropped: usize,
    pub rows_emitted: usize,
    /// The last chunk: the backfill is done.
    pub is_last: bool,
    /// When it was read (PostgreSQL timestamp: microseconds since 2000-01-01).
    pub read_at: i64,
    /// The planner's estimate of the table's rows when the chunk was read.
    pub table_rows: Option<i64>,
    /// The share of the table's rows read so far (see `worker::backfill::estimate`: alone, from
    /// the key's histogram; with `table_rows`, from the key range, counted only when the two
    /// agree within a factor of 2).
    pub key_fraction: Option<f64>,
    /// How the surviving rows reached the target (`None`: there were none).
    pub written_as: Option<tide_core::model::ChunkWrite>,
}

/// Count a chunk emitted at its high watermark and move the backfill's last key past it (done at
/// the last chunk), unless the backfill is no longer active or the chunk does not start where the
/// backfill stands (its lower bound is not the backfill's last key: a chunk read after one that
/// was never written, or before the backfill started over after a rewrite). Returns the
/// backfill's state and throttle (`rows_per_second`) afterwards, `None` when nothing was
/// recorded: then nothing of the chunk may be emitted. Called by the worker, in its iteration's
/// transaction.
pub(crate) fn record_progress(
    c: &mut SpiClient<'_>,
    d: &ChunkDone,
) -> TideResult<Option<(BackfillState, Option<i32>)>> {
    let state = crate::sql::update(
        c,
        "UPDATE tide.backfill
            SET chunks_done = chunks_done + 1, rows_read = rows_read + $2, rows_dropped = rows_dropped + $3,
                rows_emitted = rows_emitted + $4, last_key = coalesce($5, last_key),
                -- the total from the share of the rows the chunk reached ($9: from the key's
                -- histogram; with the planner's estimate $8 beside it, from the integer key
                -- range, counted only within a factor of 2 of $8: sparse or skewed keys make
                -- it far too high), else as the planner estimates the table now; more than has
                -- been read until the last chunk (so fraction_done stays below 1 until then)
                estimated_rows = CASE WHEN $6 THEN rows_read + $2
                                      ELSE greatest(coalesce(
                                                (SELECT e.n FROM (SELECT round((rows_read + $2) / nullif($9::float8, 0))::int8 AS n) e
                                                  WHERE $8::int8 IS NULL OR e.n BETWEEN $8::int8 / 2 AND $8::int8 * 2),
                                                $8::int8, estimated_rows),
                                            rows_read + $2 + chunk_size) END,
                state = CASE WHEN $6 THEN $11 ELSE state END,
                finished_at = CASE WHEN $6 THEN now() END,
                finished_lsn = CASE WHEN $6 THEN $7::pg_lsn END,
                error = NULL, remedy = NULL, error_sqlstate = NULL, error_at = NULL, attempts = 0
          WHERE id = $1 AND state = ANY($10) AND last_key IS NOT DISTINCT FROM $12::text[]
          RETURNING state, rows_per_second",
        None,
        &[
            d.backfill_id.into(),
            (d.rows_read as i64).into(),
            (d.rows_dropped as i64).into(),
            (d.rows_emitted as i64).into(),
            d.key_to.clone().into(),
            d.is_last.into(),
            d.high_lsn.to_string().into(),
            d.table_rows.into(),
            d.key_fraction.into(),
            active_states().into(),
            BackfillState::Done.as_str().into(),
            d.key_from.clone().into(),
        ],
    )?;
    if state.is_empty() {
        return Ok(None);
    }
    let (s, rps) = state.first().get_two::<String, i32>()?;
    let s = s
        .as_deref()
        .and_then(BackfillState::parse)
        .ok_or_else(|| corrupt("backfill state", &d.backfill_id.to_string()))?;
    Ok(Some((s, rps)))
}

/// Record the chunk in `tide.chunk` (once: a replayed high watermark records nothing). Called by
/// the worker, in its iteration's transaction.
pub(crate) fn record_chunk(c: &mut SpiClient<'_>, d: &ChunkDone) -> TideResult<()> {
    crate::sql::update(
        c,
        "INSERT INTO tide.chunk (backfill_id, chunk, key_from, key_to, low_lsn, high_lsn, rows_read, rows_dropped, rows_emitted, read_at, written_as)
         VALUES ($1, $2, $3, $4, $5::pg_lsn, $6::pg_lsn, $7, $8, $9, '2000-01-01 00:00:00+00'::timestamptz + $10 * interval '1 microsecond', $11)
         ON CONFLICT (backfill_id, chunk) DO NOTHING",
        None,
        &[
            d.backfill_id.into(),
            d.chunk_no.into(),
            d.key_from.clone().into(),
            d.key_to.clone().into(),
            d.low_lsn.map(|l| l.to_string()).into(),
            d.high_lsn.to_string().into(),
            (d.rows_read as i32).into(),
            (d.rows_dropped as i32).into(),
            (d.rows_emitted as i32).into(),
            d.read_at.into(),
            d.written_as.map(|w| w.as_str()).into(),
        ],
    )?;
    Ok(())
}

/// Forget the backfill's chunks more than 1000 before `chunk_no`. Called by the worker, in its
/// iteration's transaction.
pub(crate) fn trim_chunks(
    c: &mut SpiClient<'_>,
    backfill_id: i64,
    chunk_no: i64,
) -> TideResult<()> {
    crate::sql::update(
        c,
        "DELETE FROM tide.chunk WHERE backfill_id = $1 AND chunk <= $2 - 1000",
        None,
        &[backfill_id.into(), chunk_no.into()],
    )?;
    Ok(())
}
