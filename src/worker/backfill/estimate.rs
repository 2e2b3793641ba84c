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
/// until the last chunk). `key_fraction` alone: from the key's histogram (trusted); with
/// `table_rows`: from the integer key range, trusted only while the total it implies is within a
/// factor of 2 of `table_rows` (`catalog::chunks::record_progress`).
pub use tide_core::read_ahead::Estimate;

/// The estimate after a chunk of `relation` (how the chunk reads it: `ONLY` a table, or a
/// partitioned table) whose last key is `last`. For a whole-table backfill on a one-column
/// key, the share of the rows up to `last`, from the key's distribution:
/// - from the histogram `ANALYZE` keeps for the key column (`pg_stats.histogram_bounds`:
///   about as many rows between each two bounds), so sparse and skewed keys do not mislead
///   it;
/// - without one (a table never analyzed), for an integer key, the share of the key range
///   `[min, max]`, with the planner's estimate alongside: a few keys far from the rest (one
///   row moved to id 50,000 in a 5,000-row table) make the range say ten times too many, so
///   the share counts only while the total it implies is within a factor of 2 of the
///   planner's (`catalog::chunks::record_progress`).
///
/// Otherwise the planner's estimate (`tide._estimate_rows`).
pub fn take(
    relid: u32,
    relation: &str,
    key_columns: &[String],
    key_types: &[String],
    whole: bool,
    last: Option<&String>,
    owner: pg_sys::Oid,
) -> TideResult<Estimate> {
    let single = match (whole, key_columns, key_types, last) {
        (true, [k], [t], Some(l)) => Some((k, t, l)),
        _ => None,
    };
    if let Some((key, ty, last)) = single {
        if let Some(f) = histogram_fraction(relid, key, ty, last, owner)? {
            return Ok(Estimate {
                table_rows: None,
                key_fraction: Some(f),
            });
        }
    }
    let table_rows = sql::one::<i64>(
        "SELECT tide._estimate_rows($1::int8::oid)",
        &[(relid as i64).into()],
    )?;
    let key_fraction = match single {
        Some((key, ty, last)) => range_fraction(relation, key, ty, last, owner)?,
        None => None,
    };
    Ok(Estimate {
        table_rows,
        key_fraction,
    })
}

/// The share of the table's rows whose key is at most `last`, from the key column's histogram
/// (`pg_stats`, as the backfill's owner: it shows only columns the owner may read), when
/// `ANALYZE` made one: the bounds below `last`, and within its bucket the position of `last`
/// between the bounds for an integer key (the middle for other types). `None` without a
/// histogram, or when `last` lies outside it (the table changed since it was analyzed).
fn histogram_fraction(
    relid: u32,
    key: &str,
    ty: &str,
    last: &str,
    owner: pg_sys::Oid,
) -> TideResult<Option<f64>> {
    let integer = matches!(ty, "smallint" | "integer" | "bigint");
    // `ty` is `format_type`'s text of the key's type, a type name as SQL writes it.
    let within = if integer {
        "(k.v - h.b[n.c])::float8 / nullif(h.b[n.c + 1] - h.b[n.c], 0)::float8"
    } else {
        "0.5::float8"
    };
    let q = format!(
        "WITH h AS (
             SELECT s.histogram_bounds::text::{ty}[] AS b
               FROM pg_catalog.pg_stats s
               JOIN pg_catalog.pg_class c ON c.relname = s.tablename
               JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace AND ns.nspname = s.schemaname
              WHERE c.oid = $1::int8::oid AND s.attname = $2 AND s.inherited = (c.relkind = 'p')
                AND s.histogram_bounds IS NOT NULL),
              k AS (SELECT $3::{ty} AS v)
         SELECT n.len::int8, n.c::int8, {within}
           FROM h, k, LATERAL (SELECT cardinality(h.b) AS len,
                                      (SELECT count(*) FROM unnest(h.b) x WHERE x <= k.v)::int AS c) n"
    );
    let row = crate::security::as_owner(owner, || {
        sql::text_rows(
            &q,
            &[Some(&(relid as i64).to_string()), Some(key), Some(last)],
            1,
            false,
        )
    })?;
    let Some(r) = row.into_iter().next() else {
        return Ok(None);
    };
    let num = |i: usize| {
        r.get(i)
            .and_then(|v| v.as_deref())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let (Some(len), Some(c)) = (num(0), num(1)) else {
        return Ok(None);
    };
    if len < 2.0 || c < 1.0 || c >= len {
        return Ok(None);
    }
    let within = num(2).unwrap_or(0.5).clamp(0.0, 1.0);
    Ok(Some(
        ((c - 1.0 + within) / (len - 1.0)).clamp(f64::MIN_POSITIVE, 1.0),
    ))
}

/// The share of the table's key range up to `last`, for an integer key: two index probes, as
/// the backfill's owner. Right for keys spread evenly, wrong for sparse or skewed ones: the
/// caller weighs it against the planner's estimate.
fn range_fraction(
    relation: &str,
    key: &str,
    ty: &str,
    last: &str,
    owner: pg_sys::Oid,
) -> TideResult<Option<f64>> {
    if !matches!(ty, "smallint" | "integer" | "bigint") {
        return Ok(None);
    }
    let Ok(last) = last.parse::<i64>() else {
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
