//! `tide.verify` and `tide.repair`: prove that a table target equals its source, range by range,
//! while writes continue, and fix what differs through the normal watermark backfill.
//!
//! Verification walks the source's key space with keyset pagination (ranges of `n` keys, each
//! read in its own statement and snapshot). For each range it reads every row's key and an md5 of
//! the whole row (values cast to the source's types, rendered with fixed output settings) on the
//! source, waits until the pipeline has applied everything committed before that read, then reads
//! the same key range on the target. Keys present on one side only are *missing* or *extra*;
//! keys on both sides with different hashes are *changed*. A range that differs is checked again
//! (up to [`ATTEMPTS`] times, each with a fresh source read and a fresh wait); only keys that
//! differ in every attempt are reported, so a row that changed while it was being compared is
//! not a false alarm: to be reported wrongly, the same key would have to change inside every one
//! of the short windows between a source read and the matching target read.
//!
//! A table without a key (`REPLICA IDENTITY FULL`) is one range, compared as a multiset: each
//! row's md5 numbered by its copies (`<md5> #2` is the second copy of a row), so a row the
//! target holds once too few is *missing*, once too many *extra*; never *changed*. `repair` of
//! it starts its backfill, one copy of the whole table at one point of the stream
//! (`worker::backfill::keyless`), which replaces the target's rows by the source's (a backfill by key
//! cannot read part of such a table).
//!
//! Results are kept in `tide.verification` (one row per run) and `tide.verification_range`
//! (the differing ranges, with the extra keys `tide.repair` needs).
//!
//! Table rewrites (PostgreSQL's "MVCC caveat": after TRUNCATE or a table-rewriting ALTER TABLE,
//! a snapshot taken before the rewrite committed sees the table empty): every read here takes
//! its snapshot while the table it reads is locked. The source is locked (ACCESS SHARE) for the
//! whole call, so a rewrite of it waits for the verification, like for any long SELECT; a local
//! target is locked before each of its reads takes its snapshot (the read's own lock then lasts
//! to the end of the call, as for any SELECT in a transaction, so the worker's schema changes at
//! the target wait for the verification). The remote target is read by one statement, which
//! PostgreSQL locks before taking its snapshot.
//!
//! Known limit: the calling statement's own snapshot is held for the whole call (PostgreSQL
//! keeps the snapshot of a running statement); each range's reads take fresh snapshots.

use super::args::{relation, required, Regclass};
use super::backfill::{
    relation_name, resolve_pipeline, start_backfill_impl, start_backfill_internal,
};
use super::{check_server, sleep_ms};
use crate::catalog;
use crate::error::{OrRaise, TideError, TideResult};
use crate::shmem;
use crate::sql;
use crate::target::remote::remote_access;
use crate::target::remote::{RemoteSink, RemoteStatement};
use pgrx::prelude::*;
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

/// How many times a differing range is checked before it is reported.
pub const ATTEMPTS: usize = 5;
/// Keys per range when `ranges` is not given.
mod plan;
mod run;
mod sample;
use plan::*;
use run::*;
use sample::*;

const DEFAULT_RANGE_ROWS: i64 = 1000;
const REMOTE_TIMEOUT: Duration = Duration::from_secs(60);
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// Fixed output settings on both sides, so equal values hash equally.
const SETTINGS: &[(&str, &str)] = &[
    ("DateStyle", "ISO, YMD"),
    ("IntervalStyle", "postgres"),
    ("extra_float_digits", "1"),
    ("bytea_output", "hex"),
    ("TimeZone", "UTC"),
];

/// Run `f` (the reads of a verification: source and local target, with casts to the key's
/// types, so the table's domain checks run) as the pipeline's owner, security-restricted, as
/// the worker's chunk reads do: a superuser who verifies or repairs a member's pipeline lends
/// the member's code nothing. The owner must still read every row of the source.
fn as_pipeline_owner<R>(ctx: &Ctx, f: impl FnOnce() -> TideResult<R>) -> TideResult<R> {
    let owner = crate::catalog::pipelines::owner(&ctx.pipeline)?.ok_or_else(|| {
        TideError::undefined(format!("pipeline \"{}\" does not exist", ctx.pipeline))
    })?;
    let oid = crate::security::owner_oid(&owner, &format!("pipeline \"{}\"", ctx.pipeline))?;
    if let Some(e) = crate::security::read_problem(oid, ctx.relid, &ctx.source) {
        return Err(e);
    }
    crate::security::as_owner(oid, f)
}

fn quote(ident: &str) -> String {
    pgrx::spi::quote_identifier(ident)
}

struct Ctx {
    pipeline: String,
    relid: pg_sys::Oid,
    source: String,
    /// How the source is read: `ONLY source`, or a partitioned table with its partitions.
    scan: String,
    target: String,
    key: Vec<String>,
    /// (column, source type)
    cols: Vec<(String, String)>,
    /// Key columns whose type has a collation: ranges compare them with COLLATE "C" on both
    /// sides, so a target with another collation pages the same way as the source.
    collatable: HashSet<String>,
    remote: Option<RemoteSink>,
    /// The local target table (locked around each read), `None` for a remote target.
    local_target: Option<pg_sys::Oid>,
}

#[derive(Default, Clone)]
struct Diff {
    missing: BTreeMap<String, Vec<String>>,
    extra: BTreeMap<String, Vec<String>>,
    changed: BTreeMap<String, Vec<String>>,
}

/// A differing range, as reported.
struct RangeResult {
    range: i32,
    from: Option<Vec<String>>,
    to: Option<Vec<String>>,
    source_rows: i64,
    target_rows: i64,
    diff: Diff,
}

struct Summary {
    id: i64,
    ranges: i32,
    rows: i64,
    target_rows: i64,
    differing: Vec<RangeResult>,
    unsettled: i32,
}

#[allow(clippy::type_complexity)]
/// Compare a table target with its source; one row per differing range (and per sampled row
/// whose columns differ), then a summary row (`kind = 'summary'`).
type VerifyRow = (
    Option<i32>,
    Option<Vec<String>>,
    Option<Vec<String>>,
    i64,
    i64,
    i64,
    i64,
    i64,
    String,
    Option<Vec<String>>,
);
type RepairRow = (i32, i64, i64, Option<i64>, String);

// The result's columns are named in the signature, as pgrx reads them from it.
#[allow(clippy::type_complexity)]
#[pg_extern]
fn verify(
    source: Option<Regclass>,
    pipeline: default!(Option<&str>, "NULL"),
    ranges: default!(Option<i32>, "NULL"),
    sample: default!(Option<i32>, 0),
) -> TableIterator<
    'static,
    (
        name!(range, Option<i32>),
        name!(key_from, Option<Vec<String>>),
        name!(key_to, Option<Vec<String>>),
        name!(source_rows, i64),
        name!(target_rows, i64),
        name!(missing, i64),
        name!(extra, i64),
        name!(changed, i64),
        name!(kind, String),
        name!(columns, Option<Vec<String>>),
    ),
> {
    TableIterator::new(
        (|| {
            verify_impl(
                relation(source, "source")?,
                pipeline,
                ranges,
                required(sample, "sample")?,
            )
        })()
        .or_raise(),
    )
}

fn verify_impl(
    relid: pg_sys::Oid,
    pipeline: Option<&str>,
    ranges: Option<i32>,
    sample: i32,
) -> TideResult<Vec<VerifyRow>> {
    if sample < 0 {
        return Err(
            TideError::invalid(format!("sample must be zero or positive, not {sample}"))
                .hint("Pass the number of random rows to compare column by column."),
        );
    }
    let ctx = setup(relid, pipeline, false)?;
    if ctx.key.is_empty() && sample > 0 {
        return Err(TideError::unsupported(format!(
            "{} has no key (it is captured by REPLICA IDENTITY FULL): a sample compares rows by key",
            ctx.source
        ))
        .hint("Omit sample: the verification compares the whole table as a multiset (every column of every row)."));
    }
    let s = as_pipeline_owner(&ctx, || run_verify(&ctx, ranges))?;
    let mut out: Vec<_> = s
        .differing
        .iter()
        .map(|r| {
            (
                Some(r.range),
                r.from.clone(),
                r.to.clone(),
                r.source_rows,
                r.target_rows,
                r.diff.missing.len() as i64,
                r.diff.extra.len() as i64,
                r.diff.changed.len() as i64,
                r.diff.kinds(),
                None,
            )
        })
        .collect();
    if sample > 0 {
        for (key, cols) in as_pipeline_owner(&ctx, || sample_columns(&ctx, sample))? {
            out.push((
                None,
                Some(key),
                None,
                1,
                1,
                0,
                0,
                1,
                "column values".to_string(),
                Some(cols),
            ));
        }
    }
    let missing = s
        .differing
        .iter()
        .map(|r| r.diff.missing.len() as i64)
        .sum();
    let extra = s.differing.iter().map(|r| r.diff.extra.len() as i64).sum();
    let changed = s
        .differing
        .iter()
        .map(|r| r.diff.changed.len() as i64)
        .sum();
    out.push((
        None,
        None,
        None,
        s.rows,
        s.target_rows,
        missing,
        extra,
        changed,
        format!(
            "summary: {} ranges checked, {} differ{}",
            s.ranges,
            s.differing.len(),
            if s.unsettled > 0 {
                format!(" ({} waits for the target timed out)", s.unsettled)
            } else {
                String::new()
            }
        ),
        None,
    ));
    Ok(out)
}

/// Verify, then re-seed exactly the differing ranges through the watermark backfill and delete
/// (at a high watermark, so never a key inserted meanwhile) target rows whose key no longer exists.
#[pg_extern]
fn repair(
    source: Option<Regclass>,
    pipeline: default!(Option<&str>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(ranges_differing, i32),
        name!(rows_missing_or_changed, i64),
        name!(rows_extra, i64),
        name!(backfill_id, Option<i64>),
        name!(action, String),
    ),
> {
    TableIterator::new(
        relation(source, "source")
            .and_then(|relid| repair_impl(relid, pipeline))
            .or_raise(),
    )
}

/// The repair of a table without a key (`REPLICA IDENTITY FULL`), whose verification found
/// rows the target holds too few or too many times: its backfill, one copy of the whole table
/// applied at one point of the stream (`worker::backfill::keyless`), which replaces the target's rows of
/// the table by the source's, so the surplus copies go and the missing ones come, while the
/// stream goes on (a table without a key has no key to re-read a part of it by).
fn repair_keyless(relid: pg_sys::Oid, ctx: &Ctx, s: &Summary) -> TideResult<Vec<RepairRow>> {
    let id = start_backfill_impl(relid, Some(&ctx.pipeline), None, None)?;
    catalog::verification::set_repair_backfill(s.id, id)?;
    let (missing, extra) = s.differing.iter().fold((0i64, 0i64), |(m, e), r| {
        (
            m + (r.diff.missing.len() + r.diff.changed.len()) as i64,
            e + r.diff.extra.len() as i64,
        )
    });
    Ok(vec![(
        s.differing.len() as i32,
        missing,
        extra,
        Some(id),
        format!(
            "copying the table again through backfill {id} (a table without a key is copied whole, with no lock): its {missing} missing row copies come and its {extra} extra ones go; wait with tide.wait_for_backfill({}, {})",
            pgrx::spi::quote_literal(&ctx.source),
            pgrx::spi::quote_literal(&ctx.pipeline)
        ),
    )])
}

fn repair_impl(relid: pg_sys::Oid, pipeline: Option<&str>) -> TideResult<Vec<RepairRow>> {
    let ctx = setup(relid, pipeline, false)?;
    let s = as_pipeline_owner(&ctx, || run_verify(&ctx, None))?;
    if s.differing.is_empty() {
        return Ok(vec![(
            0,
            0,
            0,
            None,
            "nothing to repair: the target equals the source".to_string(),
        )]);
    }
    if ctx.key.is_empty() {
        return repair_keyless(relid, &ctx, &s);
    }
    // One condition covering the differing ranges; the backfill re-reads them under watermarks.
    let mut ors = Vec::new();
    for r in &s.differing {
        let lit = |vals: &[String]| -> String {
            ctx.key
                .iter()
                .zip(vals)
                .map(|(k, v)| format!("{}::{}", pgrx::spi::quote_literal(v), ctx.key_type(k)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut parts = Vec::new();
        if let Some(f) = &r.from {
            parts.push(format!("({}) > ({})", ctx.key_list(""), lit(f)));
        }
        if let Some(t) = &r.to {
            parts.push(format!("({}) <= ({})", ctx.key_list(""), lit(t)));
        }
        ors.push(if parts.is_empty() {
            "true".to_string()
        } else {
            format!("({})", parts.join(" AND "))
        });
    }
    let condition = ors.join(" OR ");
    let deletes: Vec<&Vec<String>> = s
        .differing
        .iter()
        .flat_map(|r| r.diff.extra.values())
        .collect();
    let deletes_json = serde_json::to_string(&deletes).unwrap_or_else(|_| "[]".into());
    let id = start_backfill_internal(relid, &ctx.pipeline, &condition, &deletes_json)?;
    catalog::verification::set_repair_backfill(s.id, id)?;
    let missing_or_changed: i64 = s
        .differing
        .iter()
        .map(|r| (r.diff.missing.len() + r.diff.changed.len()) as i64)
        .sum();
    Ok(vec![(
        s.differing.len() as i32,
        missing_or_changed,
        deletes.len() as i64,
        Some(id),
        format!(
            "re-seeding {} range(s) through backfill {id}; {} extra row(s) are deleted at its high watermarks; wait with tide.wait_for_backfill({}, {})",
            s.differing.len(),
            deletes.len(),
            pgrx::spi::quote_literal(&ctx.source),
            pgrx::spi::quote_literal(&ctx.pipeline)
        ),
    )])
}
