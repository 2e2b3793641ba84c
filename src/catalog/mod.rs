//! All SQL on pg_tide's own tables; its replication slots' names, locks and orphans; the version
//! gate. The tables' DDL is in `schema`; every other module reads and writes them through the
//! functions here. (Creating and dropping a pipeline's slot, interleaved with the checks of
//! `tide.create_pipeline` and `tide.drop_pipeline`, stays in `api::pipelines`; the worker's
//! decoder reads its slot.)
//!
//! One file per concern:
//! - [`pipelines`]: `tide.pipeline` (the worker's view of its pipeline, the applied position and
//!   the error columns; create, drop, pause and resume; ownership);
//! - [`tables`]: `tide.pipeline_table` (captured tables, their targets and keys) and the
//!   add/remove markers (`tide.marker`);
//! - [`backfills`]: `tide.backfill`, and the re-read after a table rewrite;
//! - [`chunks`]: each chunk's watermarks (`tide.signal`, `tide.watermark_seq`), its progress
//!   at its high watermark, and `tide.chunk`;
//! - [`verification`]: `tide.verification` and `tide.verification_range`;
//! - [`outbox`]: the outbox target's INSERT into `tide.outbox`;
//! - [`consumers`]: `tide.consumer` (named outbox consumers), the reads of `tide.outbox` their
//!   batches and positions need, and the outbox retention (`tide.outbox_prune`, its DELETEs);
//! - [`follows`]: `tide.followed_schema` and `tide.follow_skip` (followed schemas, the tables
//!   they do not capture), and the tables a DDL command made in them;
//! - [`masks`]: `tide.pipeline_table.masks` (column masks) and `tide.mask_salt` (each
//!   pipeline's salt for `hash` masks);
//! - [`skips`]: `tide.skipped_transaction` (transactions `tide.skip_transaction` skips);
//! - [`definitions`]: `tide.pipeline_definition` (each pipeline's definition, for `pg_dump`);
//! - [`slots`]: the slots' names and locks, orphaned slots, `output_plugin_libraries`;
//! - this file: the version gate, the OIDs of the tables the stream watches, [`corrupt`].
//!
//! Guarantees:
//! - each function runs one statement, or one tightly coupled group its doc names; values are
//!   typed arguments bound as `$n` parameters, never formatted into the text, and the result is
//!   typed (a struct where several columns come back);
//! - no backfill state, watermark kind, marker op or target kind is a literal in SQL text: they
//!   are bound from `tide_core::model`'s enums (`lib.rs`'s `#[pg_test]`
//!   `schema_checks_list_the_enums` holds `schema`'s CHECK constraints and partial index to the
//!   same lists);
//! - every SPI error is returned to the caller;
//! - a NULL or malformed value in a column pg_tide always fills is [`corrupt`], never a default.
//!
//! These functions are data access, not policy: what an outcome means (an error with a hint, a
//! retry, a skip) is decided by their callers.
//!
//! Security contexts (each function's doc says which applies):
//! - called by the SQL API: runs as pg_tide itself, through `crate::sql_as_tide` (`security::as_tide`
//!   around `crate::sql`), or inside the caller's `as_tide` block, as the doc says. No other role
//!   can read or write these tables;
//! - called by the worker or the launcher (which run as pg_tide's bootstrap superuser): through
//!   `crate::sql` or the iteration's `SpiClient`, in the caller's transaction.
//!
//! Reads never assign a transaction id (see `crate::sql`); a "fresh" read (`text_rows(..,
//! fresh = true)`) takes a new snapshot for its statement, which polling loops and reads after a
//! lock rely on; other reads use the statement's or transaction's snapshot as `crate::sql` says.

use crate::error::{TideError, TideResult};

pub mod backfills;
pub mod chunks;
pub mod consumers;
pub mod definitions;
pub mod follows;
pub mod masks;
pub mod outbox;
pub mod pipelines;
pub mod skips;
pub mod slots;
pub mod tables;
pub mod verification;

/// The version of this build of the library; the SQL objects of the database it runs in must be
/// of the same version (see [`version_gate`]).
pub const LIBRARY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The version of pg_tide's SQL objects in this database (`pg_extension.extversion`), or `None`
/// when the extension is not installed. Called by the worker, the launcher and the SQL API, as
/// whoever they run as (it reads `pg_extension`, which every role may read).
pub(crate) fn installed_version() -> TideResult<Option<String>> {
    crate::sql::one::<String>(
        "SELECT extversion::text FROM pg_catalog.pg_extension WHERE extname = 'pg_tide'",
        &[],
    )
}

/// `Ok` when the SQL objects of this database are of the library's version (or not installed),
/// else the error that says which step of an upgrade is missing. The library only knows the
/// catalog of its own version, so neither the worker nor the SQL API runs against another: after
/// a new `pg_tide.so` is installed and the server restarted, pipelines wait (and API calls fail
/// with this error) until `ALTER EXTENSION pg_tide UPDATE` has run; after an `ALTER EXTENSION`
/// to a version newer than the library loaded at server start, until the server is restarted.
pub(crate) fn version_gate() -> TideResult<()> {
    match installed_version()? {
        Some(v) if v != LIBRARY_VERSION => Err(version_mismatch(&v)),
        _ => Ok(()),
    }
}

/// The error for SQL objects of version `installed` under this library.
pub(crate) fn version_mismatch(installed: &str) -> TideError {
    let e = TideError::prerequisite(format!(
        "pg_tide's library is version {LIBRARY_VERSION} but its SQL objects in this database are version {installed}"
    ))
    .detail("Pipelines do not run and the pg_tide functions refuse to act while the two differ; nothing is lost meanwhile (each pipeline's slot keeps the WAL it has not applied).");
    if version_key(installed) < version_key(LIBRARY_VERSION) {
        e.hint("Run ALTER EXTENSION pg_tide UPDATE in this database: the pipelines resume by themselves once it commits.")
    } else {
        e.hint(format!(
            "The server loaded an older pg_tide.so ({LIBRARY_VERSION}) at start: restart the server so it loads the installed library of version {installed}."
        ))
    }
}

/// `"1.20.3"` as `[1, 20, 3]`, for comparing versions (non-numeric parts count as 0).
fn version_key(v: &str) -> Vec<u64> {
    v.split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0))
        .collect()
}

/// The OIDs of `tide.signal` and `tide.marker`, whose inserts and updates the worker picks out
/// of the stream. Called by the worker, in its iteration's transaction (a read).
pub(crate) fn signal_and_marker_relids() -> TideResult<(u32, u32)> {
    let (signal, marker) = crate::sql::two::<i64, i64>(
        "SELECT 'tide.signal'::regclass::oid::int8, 'tide.marker'::regclass::oid::int8",
        &[],
    )?;
    let oid = |v: Option<i64>| {
        v.and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| TideError::internal("tide.signal or tide.marker is missing"))
    };
    Ok((oid(signal)?, oid(marker)?))
}

/// The first row of a query on one table of one pipeline, `$1` the pipeline and `$2` the table's
/// OID (as text: cast it, `$2::oid`), then `more`: `crate::sql_as_tide::text_rows`, run as pg_tide,
/// every value as its text output. `fresh`: a snapshot of its own (see `crate::sql`).
fn table_row(
    query: &str,
    pipeline: &str,
    relid: pgrx::pg_sys::Oid,
    more: &[&str],
    fresh: bool,
) -> TideResult<Option<Vec<Option<String>>>> {
    let relid = relid.to_u32().to_string();
    let mut args = vec![Some(pipeline), Some(relid.as_str())];
    args.extend(more.iter().map(|m| Some(*m)));
    Ok(crate::sql_as_tide::text_rows(query, &args, 1, fresh)?
        .into_iter()
        .next())
}

/// A catalog value that must be there: a NULL or malformed value in pg_tide's own tables is an
/// error naming the column, never a default (an empty key would plan `ON CONFLICT ()`, relid 0
/// would match no table).
fn corrupt(what: &str, pipeline: &str) -> TideError {
    TideError::new(
        pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        format!("pg_tide's catalog has no valid {what} for pipeline \"{pipeline}\""),
    )
    .hint("The row was changed by hand. Remove the table from the pipeline (tide.remove_table) and add it again.")
}

/// An `int8` column holding a relation's OID as a `u32`: a NULL, 0 or out-of-range value is
/// [`corrupt`].
fn relid(v: Option<i64>, what: &str, pipeline: &str) -> TideResult<u32> {
    v.and_then(|v| u32::try_from(v).ok())
        .filter(|v| *v != 0)
        .ok_or_else(|| corrupt(what, pipeline))
}
