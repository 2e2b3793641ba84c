//! Column masks of `tide.add_table(..., masks => ...)` (see `tide_core::mask` for what each
//! mask does, `catalog::masks` for where they and the salt are kept), and the pipeline salt's
//! functions `tide.mask_salt` and `tide.rotate_mask_salt`.
//!
//! Guarantees: a stored mask names an existing, non-generated, non-key column of the table (and
//! one of its column list, when it has one); a constant is a valid value of its column's type
//! (it is delivered in that type); the JSON stored is keyed by attribute number. Column names
//! are looked up as `$n` parameters and types written with `format_type`; nothing of a mask is
//! ever put into SQL text.

use super::*;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use tide_core::mask::{Mask, Masks};

/// A table's masks as checked by [`check`]: the JSON to store (attribute number → mask), and
/// by column name the masks and whether each column is delivered as text.
pub struct Checked {
    pub stored: serde_json::Value,
    pub by_name: Vec<(String, Mask)>,
}

impl Checked {
    /// Whether column `name` is delivered as text (`hash`, `truncate`).
    pub fn retyped(&self, name: &str) -> bool {
        self.by_name.iter().any(|(n, m)| n == name && m.retypes())
    }

    /// Whether column `name` is masked with `null` (its target column takes NULL).
    pub fn nulled(&self, name: &str) -> bool {
        self.by_name
            .iter()
            .any(|(n, m)| n == name && *m == Mask::Null)
    }
}

fn hint_form() -> &'static str {
    "Pass a JSON object of column names and masks, e.g. masks => '{\"email\": \"hash\", \"name\": {\"truncate\": 3}, \"ssn\": \"null\", \"note\": {\"constant\": \"redacted\"}}'."
}

/// Check `masks => spec` for table `relid` (`qualified`, key `key_columns`), whose column list
/// (names) is `listed` when it has one.
pub(crate) fn check(
    relid: pg_sys::Oid,
    qualified: &str,
    key_columns: &[String],
    listed: Option<&[String]>,
    spec: &serde_json::Value,
) -> TideResult<Checked> {
    let masks = Masks::from_json(spec).map_err(|why| {
        TideError::invalid(format!("invalid masks for {qualified}: {}", shown(&why)))
            .hint(hint_form())
    })?;
    if masks.is_empty() {
        return Err(
            TideError::invalid(format!("the masks for {qualified} are empty")).hint(
                "Name at least one column to mask, or omit masks (NULL) to deliver the values as they are.",
            ),
        );
    }
    let mut stored = serde_json::Map::new();
    for (name, mask) in &masks.columns {
        let row = sql::text_rows(
            "SELECT a.attnum::text, a.attgenerated::text, pg_catalog.format_type(a.atttypid, a.atttypmod)
               FROM pg_catalog.pg_attribute a
              WHERE a.attrelid = $1::oid AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
            &[Some(&relid.to_u32().to_string()), Some(name)],
            1,
            false,
        )?;
        let Some(r) = row.first() else {
            return Err(TideError::new(
                PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
                format!("column \"{}\" of {qualified} does not exist", shown(name)),
            )
            .hint(
                "Name the columns to mask as pg_attribute spells them (case matters, no quotes).",
            ));
        };
        if r[1].as_deref().is_some_and(|g| !g.is_empty()) {
            return Err(TideError::invalid(format!(
                "column \"{}\" of {qualified} is generated, and generated columns are not delivered",
                shown(name)
            ))
            .hint("Leave it out of the masks."));
        }
        if key_columns.contains(name) {
            return Err(TideError::invalid(format!(
                "column \"{}\" of {qualified} is part of its key, which cannot be masked",
                shown(name)
            ))
            .hint(format!(
                "Every event and every target row is identified by the key ({}): mask other columns, or capture the table with another key (REPLICA IDENTITY USING INDEX).",
                key_columns.join(", ")
            )));
        }
        if let Some(l) = listed {
            if !l.contains(name) {
                return Err(TideError::invalid(format!(
                    "column \"{}\" of {qualified} is masked but not in the column list",
                    shown(name)
                ))
                .hint("A column left out of the column list is not delivered at all: add it to columns, or drop its mask."));
            }
        }
        if let Mask::Constant(c) = mask {
            let ty = r[2].clone().unwrap_or_default();
            check_constant(qualified, name, &ty, c)?;
        }
        let attnum = r[0].clone().unwrap_or_default();
        stored.insert(attnum, mask.to_json());
    }
    Ok(Checked {
        stored: serde_json::Value::Object(stored),
        by_name: masks.columns,
    })
}

/// A constant is delivered in its column's type: it must be a valid value of it (the type's
/// input function, in a subtransaction, as the caller).
fn check_constant(qualified: &str, column: &str, ty: &str, constant: &str) -> TideResult<()> {
    // `ty` is format_type's output (a type name as SQL spells it); the constant is `$1`.
    let cast = format!("SELECT ($1::pg_catalog.text)::{ty} IS NOT NULL");
    super::follow::in_subtransaction(|| sql::one::<bool>(&cast, &[constant.into()])).map_err(
        |e| {
            TideError::new(
                PgSqlErrorCode::ERRCODE_INVALID_TEXT_REPRESENTATION,
                format!(
                    "the constant mask of column \"{}\" of {qualified} is not a valid {ty}: {}",
                    shown(column),
                    e.message
                ),
            )
            .hint(format!(
                "A constant replaces the value in the column's type ({ty}): give one of that type, or mask the column with \"null\" or \"hash\"."
            ))
        },
    )?;
    Ok(())
}

/// `tide.mask_salt(pipeline)`: the salt of the pipeline's `hash` masks, for its owner (a member
/// of the owning role) or a superuser; NULL when it has none. With it, the owner can compute
/// what a target holds for a known value: `encode(sha256(salt || convert_to(value, 'UTF8')),
/// 'hex')`.
#[pg_extern]
fn mask_salt(pipeline: Option<&str>) -> Option<Vec<u8>> {
    (|| {
        let pipeline = required(pipeline, "pipeline")?;
        require_pipeline(pipeline)?;
        catalog::masks::salt(pipeline)
    })()
    .or_raise()
}

/// `tide.rotate_mask_salt(pipeline)`: a new salt for the pipeline's `hash` masks, used by every
/// event the worker decodes from its next iteration on and by every backfill chunk read after
/// the commit. Rows already at the target keep the hash of the old salt until a backfill (or
/// `tide.repair`) writes them again.
#[pg_extern]
fn rotate_mask_salt(pipeline: Option<&str>) {
    (|| {
        let pipeline = required(pipeline, "pipeline")?;
        require_pipeline(pipeline)?;
        catalog::masks::rotate(pipeline)?;
        wake_on_commit(shmem::worker_pid(pipeline));
        Ok(())
    })()
    .or_raise()
}
