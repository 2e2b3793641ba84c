//! `tide.alter_table`: change the row filter, the column list or the column masks of a table a
//! pipeline captures.
//!
//! Guarantees:
//! - Checked as `tide.add_table` checks them (the caller may act for the pipeline's owner, both
//!   may read the table, `row_filter::check_text` for the filter, `tables::column_list` for the
//!   list, `masks::check` for the masks, against the column list in effect after the call: a
//!   masked column the same call leaves out of the list is refused, not silently unmasked),
//!   before anything is written. At a `table` or `postgres` target, a column newly masked with
//!   `hash` or `truncate` (delivered as text), or no longer, is refused unless its type is one
//!   `text` holds (text, varchar, char; the target widens such a column to text under
//!   `schema_changes = 'propagate'`): pg_tide does not retype a target column that holds other
//!   values.
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
    pub masks: Option<Option<&'a serde_json::Value>>,
}

impl Reshaping<'_> {
    fn is_empty(&self) -> bool {
        self.row_filter.is_none() && self.columns.is_none() && self.masks.is_none()
    }
}

/// Change the row filter, the column list or the masks of a captured table, from the commit of
/// the calling transaction on (see the module doc). NULL arguments leave that part unchanged;
/// `clear_row_filter => true` delivers every row again, `clear_columns => true` every column,
/// `clear_masks => true` every value as it is.
#[allow(
    clippy::too_many_arguments,
    reason = "the arguments are the SQL function's, named and defaulted in SQL"
)]
#[pg_extern]
pub(super) fn alter_table(
    pipeline: Option<&str>,
    source: Option<Regclass>,
    row_filter: default!(Option<&str>, "NULL"),
    columns: default!(Option<Vec<Option<String>>>, "NULL"),
    clear_row_filter: default!(Option<bool>, false),
    clear_columns: default!(Option<bool>, false),
    masks: default!(Option<JsonB>, "NULL"),
    clear_masks: default!(Option<bool>, false),
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
            masks: one_of(
                masks.as_ref().map(|m| &m.0),
                required(clear_masks, "clear_masks")?,
                "masks",
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
                "Pass row_filter, columns, masks, or clear_row_filter, clear_columns or clear_masks => true.",
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
    let new_masks = new_masks(relid, &s, &row, r, new_columns.as_deref())?;
    check_target_types(
        pipeline,
        relid,
        &s.qualified,
        row.masks.as_ref(),
        new_masks.as_ref(),
    )?;
    if new_filter == row.row_filter && new_columns == row.columns && new_masks == row.masks {
        pgrx::notice!(
            "the row filter, column list and masks of {name} in pipeline \"{}\" are already these: nothing changed",
            shown(pipeline)
        );
        return Ok(());
    }
    if new_masks.is_some() {
        catalog::masks::ensure_salt(pipeline)?;
    }
    let payload = catalog::tables::alter(
        pipeline,
        relid,
        new_filter.as_deref(),
        new_columns.as_deref(),
        new_masks.as_ref(),
    )?;
    catalog::tables::write_marker_with(MarkerOp::AlterTable, pipeline, relid, Some(&payload))?;
    wake_on_commit(shmem::worker_pid(pipeline));
    Ok(())
}

/// The masks (JSON by attribute number) in effect after the call: the ones given, checked
/// against the column list in effect after it (`listed`, attribute numbers); none; or the stored
/// ones, which must still name listed columns.
fn new_masks(
    relid: pg_sys::Oid,
    s: &super::tables::SourceInfo,
    row: &catalog::tables::AlterRow,
    r: &Reshaping<'_>,
    listed: Option<&[i16]>,
) -> TideResult<Option<serde_json::Value>> {
    let names = match listed {
        Some(attnums) => Some(attnames(relid, attnums)?),
        None => None,
    };
    let spec = match r.masks {
        Some(None) => return Ok(None),
        Some(Some(spec)) => spec.clone(),
        None => match &row.masks {
            None => return Ok(None),
            // By name again (the stored JSON is by attribute number), to check it as given.
            Some(stored) => by_name(relid, stored)?,
        },
    };
    let checked = super::masks::check(relid, &s.qualified, &s.key_columns, names.as_deref(), &spec)
        .map_err(|mut e| {
            if r.masks.is_none() {
                e.hint = Some("The column list this call sets leaves out a masked column: pass masks without it (or clear_masks => true) in the same call, or keep the column in the list.".into());
            }
            e
        })?;
    Ok(Some(checked.stored))
}

/// The names of attributes `attnums` of `relid`, in attribute order.
fn attnames(relid: pg_sys::Oid, attnums: &[i16]) -> TideResult<Vec<String>> {
    Ok(sql::one::<Vec<String>>(
        "SELECT COALESCE(pg_catalog.array_agg(a.attname::text ORDER BY a.attnum), '{}')
           FROM pg_catalog.pg_attribute a
          WHERE a.attrelid = $1 AND a.attnum = ANY ($2) AND NOT a.attisdropped",
        &[relid.into(), attnums.to_vec().into()],
    )?
    .unwrap_or_default())
}

/// Stored masks (by attribute number) by column name.
fn by_name(relid: pg_sys::Oid, stored: &serde_json::Value) -> TideResult<serde_json::Value> {
    let text = sql::one::<String>(
        "SELECT COALESCE(pg_catalog.jsonb_object_agg(a.attname, m.value), '{}')::text
           FROM pg_catalog.jsonb_each($2::text::jsonb) m
           JOIN pg_catalog.pg_attribute a ON a.attrelid = $1 AND a.attnum = m.key::int2 AND NOT a.attisdropped",
        &[relid.into(), stored.to_string().into()],
    )?
    .unwrap_or_default();
    serde_json::from_str(&text).map_err(|e| TideError::internal(format!("stored masks: {e}")))
}

/// A `table` or `postgres` target's column holds the source column's values, or text while it
/// is masked with `hash` or `truncate`: a column that changes between the two must have a type
/// text holds (text, varchar, char), else the target would refuse the first row masked the new
/// way mid-stream (its shape check refuses anything but a safe widening).
fn check_target_types(
    pipeline: &str,
    relid: pg_sys::Oid,
    qualified: &str,
    old: Option<&serde_json::Value>,
    new: Option<&serde_json::Value>,
) -> TideResult<()> {
    let (kind, _) = catalog::pipelines::target(pipeline)?;
    if crate::target::kind(kind).tableless.is_some() {
        return Ok(());
    }
    let rows = sql::text_rows(
        "SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod), n.t::text
           FROM pg_catalog.pg_attribute a,
                LATERAL (SELECT COALESCE(m OPERATOR(pg_catalog.=) '\"hash\"' OR m OPERATOR(pg_catalog.?) 'truncate', false) AS t
                           FROM (SELECT $2::text::jsonb OPERATOR(pg_catalog.->) a.attnum::text AS m) x) o,
                LATERAL (SELECT COALESCE(m OPERATOR(pg_catalog.=) '\"hash\"' OR m OPERATOR(pg_catalog.?) 'truncate', false) AS t
                           FROM (SELECT $3::text::jsonb OPERATOR(pg_catalog.->) a.attnum::text AS m) x) n
          WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped AND o.t <> n.t
          ORDER BY a.attnum",
        &[
            Some(&relid.to_u32().to_string()),
            old.map(|m| m.to_string()).as_deref(),
            new.map(|m| m.to_string()).as_deref(),
        ],
        0,
        false,
    )?;
    for r in rows {
        let (name, ty) = (
            r[0].clone().unwrap_or_default(),
            r[1].clone().unwrap_or_default(),
        );
        if tide_core::plan::holds("text", &ty) {
            continue;
        }
        let (what, hint) = if r[2].as_deref() == Some("true") {
            ("cannot hold the text a hash or truncate mask delivers", "mask it with \"null\" or a constant, or remove the table and add it again with these masks (its target is then made with a text column).")
        } else {
            ("holds the text of its hash or truncate mask, not values of that type", "keep a hash or truncate mask on it, or remove the table and add it again with these masks (its target is then made with the column's type).")
        };
        return Err(TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "column \"{}\" of {qualified} is {ty}, and its target column {what}",
                shown(&name)
            ),
        )
        .hint(format!(
            "pg_tide does not retype a target column that holds other values: {hint}"
        )));
    }
    check_target_nullability(relid, qualified, old, new)
}

/// A column newly masked with `"null"` is NULL in every row from the marker on: a target column
/// made for a NOT NULL source column (as `add_table` makes it without that mask) would refuse
/// the first such row mid-stream, so the change is refused here instead.
fn check_target_nullability(
    relid: pg_sys::Oid,
    qualified: &str,
    old: Option<&serde_json::Value>,
    new: Option<&serde_json::Value>,
) -> TideResult<()> {
    let newly_null = sql::one::<String>(
        "SELECT a.attname::text FROM pg_catalog.pg_attribute a
          WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attnotnull
            AND COALESCE($3::text::jsonb OPERATOR(pg_catalog.->) a.attnum::text OPERATOR(pg_catalog.=) '\"null\"', false)
            AND NOT COALESCE($2::text::jsonb OPERATOR(pg_catalog.->) a.attnum::text OPERATOR(pg_catalog.=) '\"null\"', false)
          ORDER BY a.attnum LIMIT 1",
        &[
            relid.to_u32().to_string().into(),
            old.map(|m| m.to_string()).into(),
            new.map(|m| m.to_string()).into(),
        ],
    )?;
    match newly_null {
        None => Ok(()),
        Some(name) => Err(TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "column \"{}\" of {qualified} is NOT NULL, and its target column refuses the NULL a \"null\" mask delivers",
                shown(&name)
            ),
        )
        .hint("Mask it with a constant instead, or remove the table and add it again with these masks (its target is then made with a nullable column).")),
    }
}
