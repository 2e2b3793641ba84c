//! `tide.skipped_transaction`: source transactions a pipeline is told to skip
//! (`tide.skip_transaction`), by commit LSN, with who asked and when; the worker records when it
//! skipped each.

use crate::error::TideResult;
use crate::sql_as_tide;
use pgrx::spi::SpiClient;
use std::collections::HashSet;
use tide_core::lsn::Lsn;

/// Ask the pipeline's worker to skip the transaction committed at `lsn`, for role `by`; false
/// when that was asked already. Called by the SQL API; runs as pg_tide.
pub(crate) fn request(pipeline: &str, lsn: Lsn, by: &str) -> TideResult<bool> {
    Ok(sql_as_tide::write_one::<bool>(
        "INSERT INTO tide.skipped_transaction (pipeline, lsn, requested_by) VALUES ($1, $2::pg_lsn, $3::text::name)
         ON CONFLICT (pipeline, lsn) DO NOTHING RETURNING true",
        &[pipeline.into(), lsn.to_string().into(), by.into()],
    )?
    .unwrap_or(false))
}

/// The pipeline's applied position (`None` before the first transaction). Called by the SQL
/// API; runs as pg_tide.
pub(crate) fn applied(pipeline: &str) -> TideResult<Option<Lsn>> {
    Ok(sql_as_tide::one::<String>(
        "SELECT applied_lsn::text FROM tide.pipeline WHERE name = $1",
        &[pipeline.into()],
    )?
    .and_then(|s| s.parse().ok()))
}

/// The commit LSNs of the transactions the pipeline skips. Called by the worker, in its
/// iteration's transaction.
pub(crate) fn lsns(c: &SpiClient<'_>, pipeline: &str) -> TideResult<HashSet<Lsn>> {
    let rows = crate::sql::select(
        c,
        "SELECT lsn::text FROM tide.skipped_transaction WHERE pipeline = $1",
        None,
        &[pipeline.into()],
    )?;
    let mut out = HashSet::new();
    for r in rows {
        if let Some(l) = r.get::<String>(1)?.and_then(|s| s.parse::<Lsn>().ok()) {
            out.insert(l);
        }
    }
    Ok(out)
}

/// Record that the transaction committed at `lsn` (`xid`) was skipped (the first time only).
/// Called by the worker, in the iteration's transaction that passes it.
pub(crate) fn mark_skipped(
    c: &mut SpiClient<'_>,
    pipeline: &str,
    lsn: Lsn,
    xid: u32,
) -> TideResult<()> {
    crate::sql::update(
        c,
        "UPDATE tide.skipped_transaction SET skipped_at = now(), xid = $3
          WHERE pipeline = $1 AND lsn = $2::pg_lsn AND skipped_at IS NULL",
        None,
        &[
            pipeline.into(),
            lsn.to_string().into(),
            i64::from(xid).into(),
        ],
    )?;
    Ok(())
}
