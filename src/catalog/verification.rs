//! `tide.verification` (one row per run of `tide.verify` or `tide.repair`, the last 100 per
//! table kept) and `tide.verification_range` (the ranges that differed). Written by the SQL API
//! only.

use crate::error::{TideError, TideResult};
use crate::sql_as_tide;
use pgrx::pg_sys;

/// Row counts of a range or of a whole run.
pub struct Counts {
    pub source_rows: i64,
    pub target_rows: i64,
    pub missing: i64,
    pub extra: i64,
    pub changed: i64,
}

/// A range that differed.
pub struct Range {
    /// Its number in the run, from 1.
    pub range: i32,
    /// Its keys (text per key column), exclusive and inclusive; `None`: unbounded.
    pub key_from: Option<Vec<String>>,
    pub key_to: Option<Vec<String>>,
    pub counts: Counts,
    /// What differs, in words.
    pub kinds: String,
    /// JSON array of the keys (value arrays) of the rows only the target has.
    pub extra_keys: String,
}

/// Start a run (its start time is now); returns its id. Called by the SQL API; runs as pg_tide.
pub(crate) fn start(pipeline: &str, relid: pg_sys::Oid, relation: &str) -> TideResult<i64> {
    sql_as_tide::write_one::<i64>(
        "INSERT INTO tide.verification (pipeline, relid, relation) VALUES ($1, $2, $3) RETURNING id",
        &[pipeline.into(), relid.into(), relation.into()],
    )?
    .ok_or_else(|| TideError::internal("the verification row was not inserted"))
}

/// Record a range of run `id` that differed. Called by the SQL API; runs as pg_tide.
pub(crate) fn record_range(id: i64, r: &Range) -> TideResult<()> {
    sql_as_tide::exec(
        "INSERT INTO tide.verification_range (verification_id, range, key_from, key_to, source_rows, target_rows, missing, extra, changed, kinds, extra_keys)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb)",
        &[
            id.into(),
            r.range.into(),
            r.key_from.clone().into(),
            r.key_to.clone().into(),
            r.counts.source_rows.into(),
            r.counts.target_rows.into(),
            r.counts.missing.into(),
            r.counts.extra.into(),
            r.counts.changed.into(),
            r.kinds.as_str().into(),
            r.extra_keys.as_str().into(),
        ],
    )
}

/// Record the end of run `id` (now) and its totals. Called by the SQL API; runs as pg_tide.
pub(crate) fn finish(
    id: i64,
    ranges_checked: i32,
    ranges_differing: i32,
    totals: &Counts,
) -> TideResult<()> {
    sql_as_tide::exec(
        "UPDATE tide.verification SET finished_at = clock_timestamp(), ranges_checked = $2, ranges_differing = $3, source_rows = $4,
                target_rows = $5, missing = $6, extra = $7, changed = $8 WHERE id = $1",
        &[
            id.into(),
            ranges_checked.into(),
            ranges_differing.into(),
            totals.source_rows.into(),
            totals.target_rows.into(),
            totals.missing.into(),
            totals.extra.into(),
            totals.changed.into(),
        ],
    )
}

/// Forget all but the last 100 runs of a table for a pipeline. Called by the SQL API; runs as
/// pg_tide.
pub(crate) fn keep_last_runs(pipeline: &str, relid: pg_sys::Oid) -> TideResult<()> {
    sql_as_tide::exec(
        "DELETE FROM tide.verification WHERE pipeline = $1 AND relid = $2 AND id NOT IN
           (SELECT id FROM tide.verification WHERE pipeline = $1 AND relid = $2 ORDER BY id DESC LIMIT 100)",
        &[pipeline.into(), relid.into()],
    )
}

/// Record the backfill that repairs what run `id` found. Called by the SQL API (`tide.repair`);
/// runs as pg_tide.
pub(crate) fn set_repair_backfill(id: i64, backfill_id: i64) -> TideResult<()> {
    sql_as_tide::exec(
        "UPDATE tide.verification SET repair_backfill_id = $2 WHERE id = $1",
        &[id.into(), backfill_id.into()],
    )
}
