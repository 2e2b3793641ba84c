//! `tide.pipeline_definition`: each pipeline's definition by name, for `pg_dump` (README,
//! Upgrading > Dump and restore). Kept equal to the pipelines by the launcher
//! (`worker::definitions`), read by `tide.restore_pipeline` and `tide.restorable_pipelines`
//! (`api::restore`).

use crate::error::TideResult;
use crate::sql;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use pgrx::JsonB;

/// Whether a pipeline's definition differs from its saved one (or has none). Read-only: an idle
/// launcher's round must take no transaction id. Called by the launcher, in its transaction.
pub(crate) fn changed() -> TideResult<bool> {
    Ok(sql::one::<bool>(
        "SELECT EXISTS (SELECT FROM tide.pipeline p
                         WHERE NOT EXISTS (SELECT FROM tide.pipeline_definition o
                                            WHERE o.name = p.name AND o.owner = p.owner
                                              AND o.definition = tide._definition(p.name)))",
        &[],
    )?
    .unwrap_or(false))
}

/// Save the definitions that changed (`tide._save_definitions`); how many rows it wrote. Called
/// by the launcher, in its transaction.
pub(crate) fn save() -> TideResult<Option<i64>> {
    sql::write_one::<i64>("SELECT tide._save_definitions()", &[])
}

/// The owner and definition saved for pipeline `name`. Called by the SQL API inside its
/// `as_tide` block.
pub(crate) fn get(name: &str) -> TideResult<(Option<String>, Option<JsonB>)> {
    sql::two::<String, JsonB>(
        "SELECT owner::text, definition FROM tide.pipeline_definition WHERE name = $1",
        &[name.into()],
    )
}

/// Every saved definition without a pipeline (a restored one): (name, owner, saved_at), by name.
/// Called by the SQL API inside its `as_tide` block.
pub(crate) fn unrestored() -> TideResult<Vec<(String, String, Option<TimestampWithTimeZone>)>> {
    Spi::connect(
        |c| -> TideResult<Vec<(String, String, Option<TimestampWithTimeZone>)>> {
            let t = sql::select(
                c,
                "SELECT d.name, d.owner::text, d.saved_at FROM tide.pipeline_definition d
                  WHERE NOT EXISTS (SELECT 1 FROM tide.pipeline p WHERE p.name = d.name)
                  ORDER BY d.name",
                None,
                &[],
            )?;
            let mut out = Vec::new();
            for r in t {
                if let (Some(n), Some(o)) = (r.get::<String>(1)?, r.get::<String>(2)?) {
                    out.push((n, o, r.get(3)?));
                }
            }
            Ok(out)
        },
    )
}
