//! Column masks (`tide.pipeline_table.masks`) and each pipeline's mask salt (`tide.mask_salt`).
//!
//! Owns: reading and writing a captured table's masks (a JSON object of attribute number →
//! mask; the ones in effect in the stream are those of `shaping_before` until the worker reaches
//! a `tide.alter_table` marker, see `tide_core::mask`; by number, so a renamed column stays masked), and the salt
//! `hash` masks use: 32 bytes from `pg_strong_random`, made for a pipeline when its first masked
//! table is added, replaced by `tide.rotate_mask_salt`, deleted with the pipeline.
//!
//! Guarantees:
//! - `tide.mask_salt` is readable by no role but superusers (pg_tide's tables are not granted to
//!   anyone, `tide_admin` included); the salt leaves it only through [`plugin_options`] (the
//!   worker's decoder options, in its memory: never in a query's text, so never in
//!   `pg_stat_activity` or the log), [`of_table`] (the chunk reader and `tide.verify`, which pass
//!   it as a `$n` parameter) and `tide.mask_salt(pipeline)`, which returns it to the pipeline's
//!   owner (a member of its owning role) and superusers only.

use crate::error::{TideError, TideResult};
use crate::sql_as_tide;
use pgrx::spi::SpiClient;
use tide_core::mask::{hex, Masks};

/// The decoder options of a pipeline's masks: `masks.<relid>` (the stored JSON) per masked
/// table, and `mask_salt` (hex) when there is one. Called by the worker, in its iteration's
/// transaction (its SPI runs as pg_tide).
pub(crate) fn plugin_options(
    c: &mut SpiClient<'_>,
    pipeline: &str,
) -> TideResult<Vec<(String, String)>> {
    let rows = crate::sql::select(
        c,
        concat!(
            "SELECT relid::int8, m::text FROM (SELECT t.relid, ",
            crate::catalog::tables::effective_masks_t!(),
            " AS m FROM tide.pipeline_table t WHERE t.pipeline = $1) e
              WHERE m IS NOT NULL ORDER BY relid"
        ),
        None,
        &[pipeline.into()],
    )?;
    let mut out = Vec::new();
    for r in rows {
        if let (Some(relid), Some(m)) = (r.get::<i64>(1)?, r.get::<String>(2)?) {
            out.push((format!("masks.{relid}"), m));
        }
    }
    if !out.is_empty() {
        let row = crate::sql::select(
            c,
            "SELECT salt FROM tide.mask_salt WHERE pipeline = $1",
            None,
            &[pipeline.into()],
        )?
        .first();
        if row.is_empty() {
            return Err(missing_salt(pipeline));
        }
        let salt = row
            .get::<Vec<u8>>(1)?
            .ok_or_else(|| missing_salt(pipeline))?;
        out.push(("mask_salt".into(), hex(&salt)));
    }
    Ok(out)
}

fn missing_salt(pipeline: &str) -> TideError {
    TideError::internal(format!(
        "pipeline \"{pipeline}\" has masked tables but no mask salt"
    ))
    .hint(format!(
        "SELECT tide.rotate_mask_salt('{}') makes one.",
        pipeline.replace('\'', "''")
    ))
}

/// The masks of `relid` in `pipeline` (by attribute number, as stored) and the pipeline's
/// salt; `None` when the table has no masks. Called by the chunk reader (`worker::backfill::meta`)
/// and `tide.verify`; runs as pg_tide.
pub(crate) fn of_table(pipeline: &str, relid: u32) -> TideResult<Option<(Masks, Vec<u8>)>> {
    let (masks, salt) = sql_as_tide::two::<String, Vec<u8>>(
        concat!(
            "SELECT (",
            crate::catalog::tables::effective_masks_t!(),
            ")::text, s.salt FROM tide.pipeline_table t
           LEFT JOIN tide.mask_salt s ON s.pipeline = t.pipeline
          WHERE t.pipeline = $1 AND t.relid = $2::int8::oid"
        ),
        &[pipeline.into(), (relid as i64).into()],
    )?;
    let Some(masks) = masks else {
        return Ok(None);
    };
    let masks = Masks::parse(&masks).map_err(|e| {
        TideError::internal(format!(
            "the masks of table {relid} in pipeline \"{pipeline}\" cannot be read: {e}"
        ))
    })?;
    let salt = salt.ok_or_else(|| missing_salt(pipeline))?;
    Ok(Some((masks, salt)))
}

/// 32 random bytes from the server's strong random source.
fn new_salt() -> TideResult<Vec<u8>> {
    let mut buf = vec![0u8; 32];
    // SAFETY: writes exactly `buf.len()` bytes into `buf`.
    let ok = unsafe { pgrx::pg_sys::pg_strong_random(buf.as_mut_ptr().cast(), buf.len()) };
    if !ok {
        return Err(TideError::internal(
            "the server's strong random source gave no bytes for a mask salt",
        ));
    }
    Ok(buf)
}

/// Store `masks` (the JSON by attribute number; `None`: no masks) for a table `tide.add_table`
/// just recorded, and make the pipeline's salt if it has none. Runs as pg_tide.
pub(crate) fn set(
    pipeline: &str,
    relid: pgrx::pg_sys::Oid,
    masks: Option<&serde_json::Value>,
) -> TideResult<()> {
    let text = masks.map(|m| m.to_string());
    sql_as_tide::exec(
        "UPDATE tide.pipeline_table SET masks = $3::text::jsonb WHERE pipeline = $1 AND relid = $2",
        &[pipeline.into(), relid.into(), text.into()],
    )?;
    if masks.is_some() {
        ensure_salt(pipeline)?;
    }
    Ok(())
}

/// Make the pipeline's salt if it has none (a table masked for the first time). Runs as pg_tide.
pub(crate) fn ensure_salt(pipeline: &str) -> TideResult<()> {
    sql_as_tide::exec(
        "INSERT INTO tide.mask_salt (pipeline, salt) VALUES ($1, $2) ON CONFLICT (pipeline) DO NOTHING",
        &[pipeline.into(), new_salt()?.into()],
    )
}

/// Replace the pipeline's salt with a new one (made if it had none). Runs as pg_tide.
pub(crate) fn rotate(pipeline: &str) -> TideResult<()> {
    sql_as_tide::exec(
        "INSERT INTO tide.mask_salt (pipeline, salt) VALUES ($1, $2)
         ON CONFLICT (pipeline) DO UPDATE SET salt = excluded.salt, rotated_at = now()",
        &[pipeline.into(), new_salt()?.into()],
    )
}

/// The pipeline's salt, if it has one. Runs as pg_tide (the caller checks who may see it).
pub(crate) fn salt(pipeline: &str) -> TideResult<Option<Vec<u8>>> {
    sql_as_tide::one::<Vec<u8>>(
        "SELECT salt FROM tide.mask_salt WHERE pipeline = $1",
        &[pipeline.into()],
    )
}
