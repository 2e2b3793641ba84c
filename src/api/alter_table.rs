//! `tide.alter_table`: change the row filter or the column list of a table a pipeline captures.
//!
//! Guarantees:
//! - Checked as `tide.add_table` checks them (the caller may act for the pipeline's owner, both
//!   may read the table, `row_filter::check_text` for the filter, `tables::column_list` for the
//!   list), before anything is written.
//! - The change takes effect at the commit position of the calling transaction: it writes an
//!   `alter_table` marker (`tide.marker`, only pg_tide can write one) whose payload is the schema
//!   event that announces it. The stream shapes the table's changes committed before it the old
//!   way and those committed after it the new way, in every target (the worker ends its batch
//!   there and reopens its decoder with the new plugin options, `worker::apply`); the catalog
//!   keeps the old shaping in `shaping_before` until then, for the decoder and the backfills.
//! - At the marker the table is read again under the new shaping, as a resync reads it
//!   (`catalog::backfills::queue_reseed`): rows newly delivered reach the target, and a table
//!   target's rows the new filter leaves out are deleted.
//! - One change at a time per table: a second call before the worker has reached the first one's
//!   marker is refused (the row is locked, so two concurrent calls cannot both pass the check).

use super::tables::{column_list, validate_source};
use super::*;
use tide_core::model::MarkerOp;

/// What `tide.alter_table` changes: `None` leaves it as it is, `Some(None)` clears it (every
/// row, every column), `Some(Some(..))` sets it.
#[derive(Default)]
pub(super) struct Reshaping<'a> {
    pub row_filter: Option<Option<&'a str>>,
    pub columns: Option<Option<&'a [Option<String>]>>,
}

impl Reshaping<'_> {
    fn is_empty(&self) -> bool {
        self.row_filter.is_none() && self.columns.is_none()
    }
}

/// Change the row filter or the column list of a captured table, from the commit of the calling
/// transaction on (see the module doc). NULL arguments leave that part unchanged;
/// `clear_row_filter => true` delivers every row again, `clear_columns => true` every column.
#[pg_extern]
pub(super) fn alter_table(
    pipeline: Option<&str>,
    source: Option<Regclass>,
    row_filter: default!(Option<&str>, "NULL"),
    columns: default!(Option<Vec<Option<String>>>, "NULL"),
    clear_row_filter: default!(Option<bool>, false),
    clear_columns: default!(Option<bool>, false),
) {
    (|| {
        let r = Reshaping {
            row_filter: one_of(
                row_filter,
                required(clear_row_filter, "clear_row_filter")?,
                "row_filter",
            )?,
            columns: one_of(
                columns.as_deref(),
                required(clear_columns, "clear_columns")?,
                "columns",
            )?,
        };
        alter_table_impl(
            required(pipeline, "pipeline")?,
            relation(source, "source")?,
            &r,
        )
    })()
    .or_raise()
}

/// A part of the shaping from its value and its `clear_<what>` flag.
fn one_of<T>(value: Option<T>, clear: bool, what: &str) -> TideResult<Option<Option<T>>> {
    match (value, clear) {
        (Some(_), true) => Err(TideError::invalid(format!(
            "{what} and clear_{what} => true contradict each other"
        ))
        .hint(format!(
            "Pass {what} to set a new one, or clear_{what} => true to remove it, not both."
        ))),
        (Some(v), false) => Ok(Some(Some(v))),
        (None, true) => Ok(Some(None)),
        (None, false) => Ok(None),
    }
}

fn alter_table_impl(pipeline: &str, relid: pg_sys::Oid, r: &Reshaping<'_>) -> TideResult<()> {
    check_server()?;
    let owner = require_pipeline(pipeline)?;
    if r.is_empty() {
        return Err(
            TideError::invalid("tide.alter_table was given nothing to change").hint(
                "Pass row_filter, columns, clear_row_filter => true or clear_columns => true.",
            ),
        );
    }
    // Held until commit, as add_table holds it: no ALTER TABLE commits between the shape read
    // here and the marker.
    // SAFETY: a lock on a relation's OID, released at the end of the transaction.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
    let name = super::backfill::relation_name(relid)?;
    let Some(row) = catalog::tables::lock_for_alter(pipeline, relid)? else {
        return Err(TideError::undefined(format!(
            "pipeline \"{}\" does not capture {name}",
            shown(pipeline)
        ))
        .hint("SELECT * FROM tide.tables lists what each pipeline captures; tide.add_table captures a table with its row filter and column list."));
    };
    let wait = |what: &str| {
        format!(
            "Wait until the worker has reached {what} (SELECT tide.wait_for_pipeline('{}') waits for it), then call tide.alter_table again.",
            pipeline.replace('\'', "''")
        )
    };
    if row.removing {
        return Err(TideError::prerequisite(format!(
            "{name} is being removed from pipeline \"{}\"",
            shown(pipeline)
        ))
        .hint("Add it again with tide.add_table, which takes a row filter and a column list."));
    }
    if !row.capturing {
        return Err(TideError::prerequisite(format!(
            "{name} is still pending in pipeline \"{}\" (the worker has not reached its tide.add_table yet)",
            shown(pipeline)
        ))
        .hint(wait("its tide.add_table (tide.tables shows it 'capturing')")));
    }
    if row.altering {
        return Err(TideError::prerequisite(format!(
            "an earlier tide.alter_table of {name} in pipeline \"{}\" has not taken effect yet",
            shown(pipeline)
        ))
        .hint(wait("the earlier tide.alter_table")));
    }
    let s = validate_source(relid, &owner)?;
    let new_filter = match r.row_filter {
        None => row.row_filter.clone(),
        Some(None) => None,
        Some(Some(f)) => {
            if f.trim().is_empty() {
                return Err(TideError::invalid(format!(
                    "the row filter for {} is empty",
                    s.qualified
                ))
                .hint("Pass a boolean expression on the table's columns, or clear_row_filter => true to deliver every row."));
            }
            let owner_oid = crate::security::owner_oid(&owner, "the pipeline")?;
            crate::row_filter::check_text(relid, &s.qualified, f, owner_oid)?;
            Some(f.to_string())
        }
    };
    let new_columns = match r.columns {
        None => row.columns.clone(),
        Some(None) => None,
        Some(Some(names)) => Some(
            column_list(relid, &s, names)
                .map_err(|mut e| {
                    e.hint = e.hint.map(|h| {
                        h.replace(
                            "omit columns (NULL) for every column",
                            "clear_columns => true for every column",
                        )
                    });
                    e
                })?
                .0,
        ),
    };
    if new_filter == row.row_filter && new_columns == row.columns {
        pgrx::notice!(
            "the row filter and column list of {name} in pipeline \"{}\" are already these: nothing changed",
            shown(pipeline)
        );
        return Ok(());
    }
    let payload = catalog::tables::alter(
        pipeline,
        relid,
        new_filter.as_deref(),
        new_columns.as_deref(),
    )?;
    catalog::tables::write_marker_with(MarkerOp::AlterTable, pipeline, relid, Some(&payload))?;
    wake_on_commit(shmem::worker_pid(pipeline));
    Ok(())
}
