//! Key ranges of one backfill planned ahead, for several readers of one table
//! (`tide.max_backfill_readers`; see [`super`]).
//!
//! Owns: the probe that finds where the backfill's next chunks end. From the key its next
//! unread chunk starts after, it reads the table's keys alone, in key order (an index scan of the
//! key, usually index-only), and takes every `chunk_size`-th: the bounds of the chunks after it.
//! Chunk `i` then reads the keys after bound `i - 1` up to bound `i` (`Due::to_key`), each
//! under watermarks of its own, all at once in several reader processes.
//!
//! Guarantees: a bound is only a hint. Rows inserted into a planned range or deleted from it
//! after the probe change how many rows its chunk reads, not what is correct: every chunk reads
//! its whole range in its own snapshot (up to twice its size; past that it ends at its last row
//! and the chunks planned after it are not written: `catalog::chunks::record_progress` writes
//! only a chunk that starts where the backfill durably stands), so no key is skipped. The probe
//! runs as the backfill's owner, security-restricted, under `tide.chunk_timeout`, after taking the
//! table's lock without waiting (a table being rewritten is not probed: its chunks are read one
//! at a time meanwhile); it ignores the backfill's condition and the table's row filter (they
//! only thin out the chunks).

use super::chunk::quote;
use super::meta::table_meta;
use crate::catalog::backfills::Due;
use crate::error::{TideError, TideResult};
use crate::sql;
use crate::worker::tx::{self, Locked};
use pgrx::prelude::*;

/// Up to `n` bounds of the chunks of `b` after key `after` (`None`: from the table's first
/// key), each [`Due::rows_per_chunk`] keys after the one before; fewer when the table ends first (the
/// chunk after the last bound then reads to the end). In a transaction of its own; empty when the
/// table is locked by another transaction or gone.
pub(super) fn plan(b: &Due, after: Option<&[String]>, n: usize) -> TideResult<Vec<Vec<String>>> {
    if n == 0 || b.chunk_size < 1 {
        return Ok(Vec::new());
    }
    match tx::run_locked(pg_sys::Oid::from(b.relid), || probe(b, after, n))? {
        Locked::Ran(bounds) => Ok(bounds),
        Locked::Busy => Ok(Vec::new()),
    }
}

fn probe(b: &Due, after: Option<&[String]>, n: usize) -> TideResult<Vec<Vec<String>>> {
    let Some(meta) = table_meta(b.relid, &b.key_columns)? else {
        return Ok(Vec::new());
    };
    let mut types = Vec::with_capacity(b.key_columns.len());
    for k in &b.key_columns {
        let Some((_, ty)) = meta.columns.iter().find(|(c, _)| &c.name == k) else {
            // The chunk read says so, with its remedy.
            return Ok(Vec::new());
        };
        types.push(ty.clone());
    }
    let keys = b
        .key_columns
        .iter()
        .map(|k| quote(k))
        .collect::<Vec<_>>()
        .join(", ");
    let mut sql = format!("SELECT {keys} FROM (SELECT {keys}, pg_catalog.row_number() OVER (ORDER BY {keys}) AS tide_rn FROM (SELECT {keys} FROM {}", meta.scan);
    let mut args: Vec<&str> = Vec::new();
    if let Some(after) = after {
        let params = types
            .iter()
            .enumerate()
            .map(|(i, t)| format!("${}::{t}", i + 1))
            .collect::<Vec<_>>()
            .join(", ");
        sql.push_str(&format!(" WHERE ({keys}) > ({params})"));
        args.extend(after.iter().map(String::as_str));
    }
    let size = b.rows_per_chunk();
    let limit = size.saturating_mul(n as i64);
    sql.push_str(&format!(
        " ORDER BY {keys} LIMIT {limit}) s) s WHERE tide_rn OPERATOR(pg_catalog.%) {size} OPERATOR(pg_catalog.=) 0 ORDER BY tide_rn"
    ));
    let owner = crate::security::owner_oid(&b.owner, &format!("backfill {}", b.id))?;
    if crate::security::read_problem(owner, pg_sys::Oid::from(b.relid), &meta.relation).is_some() {
        // The chunk read fails the backfill with the reason.
        return Ok(Vec::new());
    }
    let params: Vec<Option<&str>> = args.into_iter().map(Some).collect();
    let timeout_ms = crate::gucs::CHUNK_TIMEOUT_MS.get().max(10);
    let rows = crate::security::as_owner(owner, || {
        tx::arm_timeout(timeout_ms);
        let r = sql::text_rows(&sql, &params, 0, false);
        tx::disarm_timeout();
        r
    })?;
    rows.into_iter()
        .map(|r| {
            r.into_iter()
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| TideError::internal("a key column of a backfilled table is NULL"))
        })
        .collect()
}
