//! `tide.pipeline_table`: the tables each pipeline captures, with their key and (table targets)
//! their target table; and the add/remove markers (`tide.marker`). Written by the SQL API (add,
//! remove) and by the worker (capturing from the add marker on; forgetting at the remove marker).

use super::{corrupt, relid};
use crate::error::TideResult;
use pgrx::spi::SpiClient;
use tide_core::plan::TableRef;

/// A captured table of a pipeline.
#[derive(Debug, Clone)]
pub struct TableRow {
    pub relid: u32,
    /// True once the worker has passed the add_table marker in the stream.
    pub capturing: bool,
}

/// A target table: schema, name, key columns in key order; a NULL or empty one is [`corrupt`].
fn table_ref(
    schema: Option<String>,
    name: Option<String>,
    key: Option<Vec<String>>,
    pipeline: &str,
) -> TideResult<TableRef> {
    Ok(TableRef {
        schema: schema.ok_or_else(|| corrupt("target_schema", pipeline))?,
        name: name.ok_or_else(|| corrupt("target_name", pipeline))?,
        key: key
            .filter(|k| !k.is_empty())
            .ok_or_else(|| corrupt("key_columns", pipeline))?,
    })
}

// --- the worker --------------------------------------------------------------------------------

/// The tables a pipeline captures, by relid. Called by the worker, in its iteration's
/// transaction.
pub(crate) fn captured(c: &mut SpiClient<'_>, pipeline: &str) -> TideResult<Vec<TableRow>> {
    let rows = c.select(
        "SELECT relid::int8, added_lsn IS NOT NULL FROM tide.pipeline_table WHERE pipeline = $1 ORDER BY relid",
        None,
        &[pipeline.into()],
    )?;
    let mut out = Vec::new();
    for r in rows {
        out.push(TableRow {
            relid: relid(r.get::<i64>(1)?, "relid", pipeline)?,
            capturing: r
                .get::<bool>(2)?
                .ok_or_else(|| corrupt("added_lsn", pipeline))?,
        });
    }
    Ok(out)
}

/// The target table of each captured table of a table pipeline (`relid` → schema, name, key
/// columns in key order). Called by the worker (table targets), in its iteration's transaction.
pub(crate) fn target_tables(
    c: &mut SpiClient<'_>,
    pipeline: &str,
) -> TideResult<Vec<(u32, TableRef)>> {
    let rows = c.select(
        "SELECT relid::int8, target_schema, target_name, key_columns
           FROM tide.pipeline_table WHERE pipeline = $1 AND target_name IS NOT NULL",
        None,
        &[pipeline.into()],
    )?;
    let mut out = Vec::new();
    for r in rows {
        let relid = relid(r.get::<i64>(1)?, "relid", pipeline)?;
        let t = table_ref(r.get(2)?, r.get(3)?, r.get(4)?, pipeline)?;
        out.push((relid, t));
    }
    Ok(out)
}

/// Record that the worker reached a table's add_table marker at commit LSN `lsn`. Called by the
/// worker, in its iteration's transaction.
pub(crate) fn mark_capturing(
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

/// The worker reached a table's remove marker: forget the table (unless it was re-added since).
/// Called by the worker, in its iteration's transaction.
pub(crate) fn forget_removed(c: &mut SpiClient<'_>, pipeline: &str, relid: u32) -> TideResult<()> {
    c.update(
        "DELETE FROM tide.pipeline_table WHERE pipeline = $1 AND relid = $2::int8::oid AND removing",
        None,
        &[pipeline.into(), (relid as i64).into()],
    )?;
    Ok(())
}
