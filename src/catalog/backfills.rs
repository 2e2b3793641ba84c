//! `tide.backfill`, `tide.chunk` and the watermarks (`tide.signal`, `tide.watermark_seq`). So
//! far: the worker's re-read of a table after a rewrite.

use crate::error::TideResult;
use pgrx::spi::SpiClient;

/// The worker reached a transaction that rewrote a captured table's heap (table-rewriting
/// `ALTER TABLE`), committed at `lsn`. Such a rewrite can change every row's values without a
/// row event, so the rows the target already has may be stale: the table is read again.
/// - An active backfill (queued, running or paused) starts over from the first key: chunks
///   emitted before the rewrite are read again.
/// - Otherwise, if the table was backfilled before (its last whole-table backfill is done), a new
///   backfill is queued with the same owner, chunk size and throttle.
/// - A table that was never backfilled only streams: nothing is read.
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
