//! How many rows a running backfill will read in all, for `tide.backfills.estimated_rows`.
//!
//! Owns: the estimate taken with each chunk. Guarantees: it is taken in the chunk's transaction,
//! under the table's lock that transaction already holds (outside it, even `pg_relation_size`
//! would queue for a lock behind a waiting ALTER TABLE and stall the stream), and reads the
//! table only as the backfill's owner (the key-range probes) or through the catalog.

use crate::error::TideResult;
use crate::sql;
use pgrx::prelude::*;

/// What a chunk read tells about the backfill's total (the read-ahead protocol carries it). The
/// worker turns it into `estimated_rows` at the chunk's high watermark (kept above the rows read
/// until the last chunk).
pub use tide_core::read_ahead::Estimate;

/// The estimate after a chunk of `relation` (how the chunk reads it: `ONLY` a table, or a
/// partitioned table) whose last key is `last`: the key-range share when the key is one integer
/// column and the backfill reads the whole table (`whole`), else the planner's estimate.
pub fn take(
    relid: u32,
    relation: &str,
    key_columns: &[String],
    key_types: &[String],
    whole: bool,
    last: Option<&String>,
    owner: pg_sys::Oid,
) -> TideResult<Estimate> {
    if let Some(f) = key_fraction(relation, key_columns, key_types, whole, last, owner)? {
        return Ok(Estimate {
            table_rows: None,
            key_fraction: Some(f),
        });
    }
    Ok(Estimate {
        table_rows: sql::one::<i64>(
            "SELECT tide._estimate_rows($1::int8::oid)",
            &[(relid as i64).into()],
        )?,
        key_fraction: None,
    })
}

/// The share of the table's key range up to `last`, as a progress estimate that does not depend
/// on the row width the planner guesses. Two index probes, as the backfill's owner.
fn key_fraction(
    relation: &str,
    key_columns: &[String],
    key_types: &[String],
    whole: bool,
    last: Option<&String>,
    owner: pg_sys::Oid,
) -> TideResult<Option<f64>> {
    let integer_key = matches!(
        key_types,
        [t] if t == "smallint" || t == "integer" || t == "bigint"
    );
    let (true, true, [key]) = (integer_key, whole, key_columns) else {
        return Ok(None);
    };
    let Some(last) = last.and_then(|v| v.parse::<i64>().ok()) else {
        return Ok(None);
    };
    let k = pgrx::spi::quote_identifier(key);
    let q = format!("SELECT min({k})::int8, max({k})::int8 FROM {relation}");
    let (lo, hi) = crate::security::as_owner(owner, || sql::two::<i64, i64>(&q, &[]))?;
    Ok(match (lo, hi) {
        (Some(lo), Some(hi)) if hi > lo && last >= lo => {
            let done = (last as f64 - lo as f64 + 1.0) / (hi as f64 - lo as f64 + 1.0);
            Some(done.clamp(f64::MIN_POSITIVE, 1.0))
        }
        _ => None,
    })
}
