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
use super::backfill::{relation_name, resolve_pipeline, start_backfill_internal};
use super::{check_server, sleep_ms};
use crate::error::{OrRaise, TideError, TideResult};
use crate::shmem;
use crate::sink::remote::{RemoteSink, RemoteStatement};
use crate::sink::table::conninfo_for_server;
use crate::sql;
use crate::tsql;
use pgrx::prelude::*;
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};
use tide_core::model::TargetKind;

/// How many times a differing range is checked before it is reported.
pub const ATTEMPTS: usize = 5;
/// Keys per range when `ranges` is not given.
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

fn quote(ident: &str) -> String {
    pgrx::spi::quote_identifier(ident)
}

struct Ctx {
    pipeline: String,
    relid: pg_sys::Oid,
    source: String,
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

impl Ctx {
    fn collate(&self, k: &str) -> &'static str {
        if self.collatable.contains(k) {
            " COLLATE \"C\""
        } else {
            ""
        }
    }

    fn key_type(&self, k: &str) -> String {
        self.cols
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| "text".into())
    }

    fn key_list(&self, alias: &str) -> String {
        self.key
            .iter()
            .map(|k| format!("{alias}{}{}", quote(k), self.collate(k)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `(k1, k2) > ($1::T1, $2::T2) AND (k1, k2) <= ($3::T1, $4::T2)` for the given bounds.
    fn range_clause(
        &self,
        from: Option<&[String]>,
        to: Option<&[String]>,
        first_param: usize,
    ) -> (String, Vec<String>) {
        let mut clauses = Vec::new();
        let mut params = Vec::new();
        let mut n = first_param;
        for (bound, op) in [(from, ">"), (to, "<=")] {
            if let Some(vals) = bound {
                let ps: Vec<String> = self
                    .key
                    .iter()
                    .map(|k| {
                        let p = format!("${n}::{}{}", self.key_type(k), self.collate(k));
                        n += 1;
                        p
                    })
                    .collect();
                clauses.push(format!("({}) {op} ({})", self.key_list(""), ps.join(", ")));
                params.extend(vals.iter().cloned());
            }
        }
        let sql = if clauses.is_empty() {
            "true".to_string()
        } else {
            clauses.join(" AND ")
        };
        (sql, params)
    }

    fn hash_select(&self, cast: bool) -> String {
        let c = |name: &str, ty: &str| {
            if cast {
                format!("{}::{ty}", quote(name))
            } else {
                quote(name)
            }
        };
        let keys: Vec<String> = self.key.iter().map(|k| c(k, &self.key_type(k))).collect();
        let all: Vec<String> = self.cols.iter().map(|(n, t)| c(n, t)).collect();
        format!(
            "ROW({})::text, md5(ROW({})::text)",
            keys.join(", "),
            all.join(", ")
        )
    }
}

fn setup(
    relid: pg_sys::Oid,
    pipeline: Option<&str>,
    allow_running_backfill: bool,
) -> TideResult<Ctx> {
    check_server()?;
    let pipeline = resolve_pipeline(relid, pipeline)?;
    // (After the ownership check.) Held to the end of the transaction: every source read below
    // takes a fresh snapshot after this, so none of them can see a rewritten source as empty.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
    let source = relation_name(relid)?;
    let (target, options) = tsql::two::<String, String>(
        "SELECT target, options::text FROM tide.pipeline WHERE name = $1",
        &[pipeline.clone().into()],
    )?;
    let target_kind = crate::catalog::target_kind(target, &pipeline)?;
    if target_kind == TargetKind::Outbox {
        return Err(TideError::prerequisite(format!("pipeline \"{pipeline}\" writes to the outbox: there is no target table to compare"))
            .hint("tide.verify compares table targets ('table' or 'postgres'). For the outbox, replay it onto a copy and compare that."));
    }
    let options: serde_json::Value =
        serde_json::from_str(&options.unwrap_or_default()).unwrap_or_default();
    let relid_text = relid.to_u32().to_string();
    let row = tsql::text_rows(
        "SELECT target_schema, target_name, to_json(key_columns)::text FROM tide.pipeline_table WHERE pipeline = $1 AND relid = $2::oid",
        &[Some(&pipeline), Some(&relid_text)],
        1,
        false,
    )?;
    let Some(row) = row.into_iter().next() else {
        return Err(TideError::prerequisite(format!(
            "pipeline \"{pipeline}\" does not capture {source}"
        ))
        .hint("Add it with tide.add_table."));
    };
    let target = format!(
        "{}.{}",
        quote(row[0].as_deref().unwrap_or("")),
        quote(row[1].as_deref().unwrap_or(""))
    );
    let key: Vec<String> =
        serde_json::from_str(row[2].as_deref().unwrap_or("[]")).unwrap_or_default();
    if !allow_running_backfill {
        let active = tsql::one::<String>(
            "SELECT state FROM tide.backfill WHERE pipeline = $1 AND relid = $2 AND state IN ('queued', 'running', 'paused')",
            &[pipeline.clone().into(), relid.into()],
        )?;
        if let Some(state) = active {
            return Err(TideError::prerequisite(format!("a backfill of {source} for pipeline \"{pipeline}\" is {state}: the target is not complete yet"))
                .hint(format!("Wait for it (SELECT tide.wait_for_backfill('{source}', '{pipeline}')) and verify then.")));
        }
    }
    let collatable: HashSet<String> = sql::text_rows(
        "SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = $1::oid AND a.attnum > 0 AND a.attcollation <> 0",
        &[Some(&relid_text)],
        0,
        false,
    )?
    .into_iter()
    .filter_map(|r| r.into_iter().next().flatten())
    .collect();
    let enabled = tsql::one::<bool>(
        "SELECT enabled FROM tide.pipeline WHERE name = $1",
        &[pipeline.clone().into()],
    )?
    .unwrap_or(false);
    if !enabled || shmem::worker_pid(&pipeline).is_none() {
        return Err(TideError::prerequisite(format!("pipeline \"{pipeline}\" is not streaming (paused or without a worker)"))
            .hint("Verification compares the target after it has caught up with the source: resume the pipeline (tide.resume_pipeline) and look at tide.pipelines."));
    }
    let cols: Vec<(String, String)> = sql::text_rows(
        "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
          WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
        &[Some(&relid_text)],
        0,
        false,
    )?
    .into_iter()
    .map(|r| (r[0].clone().unwrap_or_default(), r[1].clone().unwrap_or_default()))
    .collect();
    let remote = if target_kind == TargetKind::Postgres {
        let server = options
            .get("server")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let owner = tsql::one::<String>(
            "SELECT owner::text FROM tide.pipeline WHERE name = $1",
            &[pipeline.clone().into()],
        )?
        .unwrap_or_default();
        Some(RemoteSink::start(
            conninfo_for_server(server, &owner)?,
            "pg_tide verify",
        ))
    } else {
        None
    };
    let local_target = if remote.is_none() {
        sql::one::<pg_sys::Oid>("SELECT to_regclass($1)::oid", &[target.clone().into()])?
    } else {
        None
    };
    for (k, v) in SETTINGS {
        sql::one::<String>(
            "SELECT set_config($1, $2, true)",
            &[(*k).into(), (*v).into()],
        )?;
    }
    Ok(Ctx {
        local_target,
        collatable,
        pipeline,
        relid,
        source,
        target,
        key,
        cols,
        remote,
    })
}

/// One side of a range: key text → (key values, row hash).
type Side = BTreeMap<String, (Vec<String>, String)>;

fn read_source(
    ctx: &Ctx,
    from: Option<&[String]>,
    to: Option<&[String]>,
    limit: i64,
) -> TideResult<Vec<(String, Vec<String>, String)>> {
    let (clause, params) = ctx.range_clause(from, to, 1);
    let keys_plain = ctx
        .key
        .iter()
        .map(|k| quote(k))
        .collect::<Vec<_>>()
        .join(", ");
    let order = ctx.key_list("");
    let q = format!(
        "SELECT {}, {keys_plain} FROM ONLY {} WHERE {clause} ORDER BY {order}",
        ctx.hash_select(false),
        ctx.source
    );
    let args: Vec<Option<&str>> = params.iter().map(|s| Some(s.as_str())).collect();
    let rows = sql::text_rows(&q, &args, limit, true)?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let key = r[0].clone().unwrap_or_default();
            let hash = r[1].clone().unwrap_or_default();
            let vals = r[2..]
                .iter()
                .map(|v| v.clone().unwrap_or_default())
                .collect();
            (key, vals, hash)
        })
        .collect())
}

fn read_target(ctx: &Ctx, from: Option<&[String]>, to: Option<&[String]>) -> TideResult<Side> {
    let (clause, params) = ctx.range_clause(from, to, 1);
    let keys_cast = ctx
        .key
        .iter()
        .map(|k| format!("{}::{}", quote(k), ctx.key_type(k)))
        .collect::<Vec<_>>()
        .join(", ");
    let q = format!(
        "SELECT {}, {keys_cast} FROM {} WHERE {clause}",
        ctx.hash_select(true),
        ctx.target
    );
    let rows = match &ctx.remote {
        Some(r) => remote_read(r, &ctx.target, q, params)?,
        None => {
            let args: Vec<Option<&str>> = params.iter().map(|s| Some(s.as_str())).collect();
            // Lock before the read's snapshot, so a rewrite of the target by the worker's schema
            // propagation cannot make it look empty (the read's own lock outlives this one).
            let lockmode = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
            if let Some(oid) = ctx.local_target {
                unsafe { pg_sys::LockRelationOid(oid, lockmode) };
            }
            let rows = sql::text_rows(&q, &args, 0, true);
            if let Some(oid) = ctx.local_target {
                unsafe { pg_sys::UnlockRelationOid(oid, lockmode) };
            }
            rows?
        }
    };
    Ok(rows
        .into_iter()
        .map(|r| {
            let vals = r[2..]
                .iter()
                .map(|v| v.clone().unwrap_or_default())
                .collect();
            (
                r[0].clone().unwrap_or_default(),
                (vals, r[1].clone().unwrap_or_default()),
            )
        })
        .collect())
}

/// Run one read on the remote target under the fixed output settings; its rows as text.
fn remote_read(
    r: &RemoteSink,
    target: &str,
    q: String,
    params: Vec<String>,
) -> TideResult<Vec<Vec<Option<String>>>> {
    let mut stmts: Vec<RemoteStatement> = SETTINGS
        .iter()
        .map(|(k, v)| RemoteStatement {
            sql: format!("SET LOCAL {k} = {}", pgrx::spi::quote_literal(v)),
            params: vec![],
        })
        .collect();
    stmts.push(RemoteStatement {
        sql: q,
        params: params.into_iter().map(Some).collect(),
    });
    let mut res = r.transaction(stmts, REMOTE_TIMEOUT).map_err(|e| {
        TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_FDW_ERROR,
            format!("cannot read the remote target {target}: {}", e.message),
        )
        .hint("Check that the target server is up; verification can be run again at any time.")
    })?;
    Ok(res.pop().unwrap_or_default())
}

/// Wait until the pipeline has applied everything committed before now.
fn wait_caught_up(pipeline: &str) -> TideResult<bool> {
    let target = sql::text_rows("SELECT pg_current_wal_lsn()::text", &[], 1, true)?
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next().flatten())
        .and_then(|s| s.parse::<tide_core::lsn::Lsn>().ok())
        .unwrap_or_default();
    if let Some(pid) = shmem::worker_pid(pipeline) {
        shmem::wake(pid);
    }
    let deadline = Instant::now() + CATCH_UP_TIMEOUT;
    while Instant::now() < deadline {
        if shmem::caught_up_lsn(pipeline).is_some_and(|l| l >= target.0) {
            return Ok(true);
        }
        sleep_ms(10);
    }
    Ok(false)
}

#[derive(Default, Clone)]
struct Diff {
    missing: BTreeMap<String, Vec<String>>,
    extra: BTreeMap<String, Vec<String>>,
    changed: BTreeMap<String, Vec<String>>,
}

impl Diff {
    fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.extra.is_empty() && self.changed.is_empty()
    }
    fn keys(&self) -> HashSet<String> {
        self.missing
            .keys()
            .chain(self.extra.keys())
            .chain(self.changed.keys())
            .cloned()
            .collect()
    }
    fn retain(&mut self, keep: &HashSet<String>) {
        self.missing.retain(|k, _| keep.contains(k));
        self.extra.retain(|k, _| keep.contains(k));
        self.changed.retain(|k, _| keep.contains(k));
    }
    fn kinds(&self) -> String {
        let mut k = Vec::new();
        if !self.missing.is_empty() {
            k.push("missing rows");
        }
        if !self.extra.is_empty() {
            k.push("extra rows");
        }
        if !self.changed.is_empty() {
            k.push("changed values");
        }
        k.join(", ")
    }
}

fn diff(src: &[(String, Vec<String>, String)], tgt: &Side) -> Diff {
    let mut d = Diff::default();
    let mut seen = HashSet::new();
    for (k, vals, h) in src {
        seen.insert(k.clone());
        match tgt.get(k) {
            None => {
                d.missing.insert(k.clone(), vals.clone());
            }
            Some((_, th)) if th != h => {
                d.changed.insert(k.clone(), vals.clone());
            }
            _ => {}
        }
    }
    for (k, (vals, _)) in tgt {
        if !seen.contains(k) {
            d.extra.insert(k.clone(), vals.clone());
        }
    }
    d
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

fn run_verify(ctx: &Ctx, ranges: Option<i32>) -> TideResult<Summary> {
    let throttle = tsql::one::<i32>(
        "SELECT rows_per_second FROM tide.backfill WHERE pipeline = $1 AND relid = $2 ORDER BY id DESC LIMIT 1",
        &[ctx.pipeline.clone().into(), ctx.relid.into()],
    )?;
    let range_rows = match ranges {
        Some(n) if n <= 0 => {
            return Err(
                TideError::invalid(format!("ranges must be positive, not {n}"))
                    .hint("Omit it to check ranges of 1000 keys."),
            )
        }
        Some(n) => {
            let est = sql::one::<f64>(
                "SELECT greatest(reltuples, 0)::float8 FROM pg_class WHERE oid = $1",
                &[ctx.relid.into()],
            )?
            .unwrap_or(0.0);
            if est <= 0.0 {
                // Never analysed: no estimate to divide.
                DEFAULT_RANGE_ROWS
            } else {
                ((est / n as f64).ceil() as i64).max(1)
            }
        }
        None => DEFAULT_RANGE_ROWS,
    };
    let id = tsql::write_one::<i64>(
        "INSERT INTO tide.verification (pipeline, relid, relation) VALUES ($1, $2, $3) RETURNING id",
        &[ctx.pipeline.clone().into(), ctx.relid.into(), ctx.source.clone().into()],
    )?
    .ok_or_else(|| TideError::internal("the verification row was not inserted"))?;
    let mut summary = Summary {
        id,
        ranges: 0,
        rows: 0,
        target_rows: 0,
        differing: Vec::new(),
        unsettled: 0,
    };
    let mut from: Option<Vec<String>> = None;
    loop {
        pg_sys::check_for_interrupts!();
        let first = read_source(ctx, from.as_deref(), None, range_rows)?;
        let last_range = (first.len() as i64) < range_rows;
        let to: Option<Vec<String>> = if last_range {
            None
        } else {
            first.last().map(|r| r.1.clone())
        };
        summary.ranges += 1;
        let mut src = first;
        let mut candidate: Option<Diff> = None;
        let mut tgt_rows = 0;
        for attempt in 0..ATTEMPTS {
            // The first comparison does not wait: a range that agrees at once is settled. Only a
            // differing range is read again after the target has caught up with the source read.
            if attempt > 0 {
                src = read_source(ctx, from.as_deref(), to.as_deref(), 0)?;
                if !wait_caught_up(&ctx.pipeline)? {
                    summary.unsettled += 1;
                }
            }
            let tgt = read_target(ctx, from.as_deref(), to.as_deref())?;
            tgt_rows = tgt.len() as i64;
            let mut d = diff(&src, &tgt);
            if let Some(prev) = &candidate {
                let keep: HashSet<String> = prev.keys().intersection(&d.keys()).cloned().collect();
                d.retain(&keep);
            }
            if d.is_empty() {
                candidate = None;
                break;
            }
            candidate = Some(d);
        }
        summary.rows += src.len() as i64;
        summary.target_rows += tgt_rows;
        if let Some(d) = candidate {
            summary.differing.push(RangeResult {
                range: summary.ranges,
                from: from.clone(),
                to: to.clone(),
                source_rows: src.len() as i64,
                target_rows: tgt_rows,
                diff: d,
            });
        }
        if last_range {
            break;
        }
        from = to;
        // Honour the table's backfill throttle (rows per second), if one is set.
        if let Some(rps) = throttle.filter(|&r| r > 0) {
            let ms = (src.len() as u64).saturating_mul(1000) / rps as u64;
            let until = Instant::now() + Duration::from_millis(ms);
            while Instant::now() < until {
                sleep_ms(20);
            }
        }
    }
    let (mut missing, mut extra, mut changed) = (0i64, 0i64, 0i64);
    for r in &summary.differing {
        missing += r.diff.missing.len() as i64;
        extra += r.diff.extra.len() as i64;
        changed += r.diff.changed.len() as i64;
        let extra_keys = serde_json::to_string(&r.diff.extra.values().collect::<Vec<_>>())
            .unwrap_or_else(|_| "[]".into());
        tsql::exec(
            "INSERT INTO tide.verification_range (verification_id, range, key_from, key_to, source_rows, target_rows, missing, extra, changed, kinds, extra_keys)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb)",
            &[
                id.into(),
                r.range.into(),
                r.from.clone().into(),
                r.to.clone().into(),
                r.source_rows.into(),
                r.target_rows.into(),
                (r.diff.missing.len() as i64).into(),
                (r.diff.extra.len() as i64).into(),
                (r.diff.changed.len() as i64).into(),
                r.diff.kinds().into(),
                extra_keys.into(),
            ],
        )?;
    }
    tsql::exec(
        "UPDATE tide.verification SET finished_at = clock_timestamp(), ranges_checked = $2, ranges_differing = $3, source_rows = $4,
                target_rows = $5, missing = $6, extra = $7, changed = $8 WHERE id = $1",
        &[
            id.into(),
            summary.ranges.into(),
            (summary.differing.len() as i32).into(),
            summary.rows.into(),
            summary.target_rows.into(),
            missing.into(),
            extra.into(),
            changed.into(),
        ],
    )?;
    // Keep the last 100 verifications of a table.
    tsql::exec(
        "DELETE FROM tide.verification WHERE pipeline = $1 AND relid = $2 AND id NOT IN
           (SELECT id FROM tide.verification WHERE pipeline = $1 AND relid = $2 ORDER BY id DESC LIMIT 100)",
        &[ctx.pipeline.clone().into(), ctx.relid.into()],
    )?;
    Ok(summary)
}

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

#[allow(clippy::type_complexity)]
/// Compare a table target with its source; one row per differing range (and per sampled row
/// whose columns differ), then a summary row (`kind = 'summary'`).
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
    let s = run_verify(&ctx, ranges)?;
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
        for (key, cols) in sample_columns(&ctx, sample)? {
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

/// Compare `n` random rows column by column; returns (key, columns that differ) for rows that
/// differ in every attempt.
fn sample_columns(ctx: &Ctx, n: i32) -> TideResult<Vec<(Vec<String>, Vec<String>)>> {
    let keys_plain = ctx
        .key
        .iter()
        .map(|k| quote(k))
        .collect::<Vec<_>>()
        .join(", ");
    let picked = sql::text_rows(
        &format!(
            "SELECT {keys_plain} FROM ONLY {} ORDER BY random() LIMIT {n}",
            ctx.source
        ),
        &[],
        0,
        true,
    )?;
    // Both sides rendered the same way: as the source type, cast to text (a remote read can
    // only return text). Rendering the source by the type's output function instead flagged
    // equal values: boolean `t` against `true`, char(5) `'ab   '` against `'ab'`, inet `::1`
    // against `::1/128`.
    let cols_tgt: Vec<String> = ctx
        .cols
        .iter()
        .map(|(c, t)| format!("(({})::{t})::text", quote(c)))
        .collect();
    let cols_src = &cols_tgt;
    let mut out = Vec::new();
    for key in picked {
        let key: Vec<String> = key.into_iter().map(Option::unwrap_or_default).collect();
        let mut differing: Option<HashSet<String>> = None;
        for _ in 0..ATTEMPTS {
            let eq: Vec<String> = ctx
                .key
                .iter()
                .enumerate()
                .map(|(i, k)| format!("{} = ${}::{}", quote(k), i + 1, ctx.key_type(k)))
                .collect();
            let args: Vec<Option<&str>> = key.iter().map(|s| Some(s.as_str())).collect();
            let src = sql::text_rows(
                &format!(
                    "SELECT {} FROM ONLY {} WHERE {}",
                    cols_src.join(", "),
                    ctx.source,
                    eq.join(" AND ")
                ),
                &args,
                1,
                true,
            )?;
            wait_caught_up(&ctx.pipeline)?;
            let q = format!(
                "SELECT {} FROM {} WHERE {}",
                cols_tgt.join(", "),
                ctx.target,
                eq.join(" AND ")
            );
            let tgt = match &ctx.remote {
                Some(r) => remote_read(r, &ctx.target, q, key.clone())?,
                None => sql::text_rows(&q, &args, 1, true)?,
            };
            let (Some(s), Some(t)) = (src.first(), tgt.first()) else {
                // Missing on one side: the range check reports it.
                differing = Some(HashSet::new());
                break;
            };
            let d: HashSet<String> = ctx
                .cols
                .iter()
                .enumerate()
                .filter(|(i, _)| s[*i] != t[*i])
                .map(|(_, (c, _))| c.clone())
                .collect();
            let d = match &differing {
                Some(prev) => prev.intersection(&d).cloned().collect(),
                None => d,
            };
            let empty = d.is_empty();
            differing = Some(d);
            if empty {
                break;
            }
        }
        if let Some(d) = differing {
            if !d.is_empty() {
                let mut cols: Vec<String> = d.into_iter().collect();
                cols.sort();
                out.push((key, cols));
            }
        }
    }
    Ok(out)
}

type RepairRow = (i32, i64, i64, Option<i64>, String);

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

fn repair_impl(relid: pg_sys::Oid, pipeline: Option<&str>) -> TideResult<Vec<RepairRow>> {
    let ctx = setup(relid, pipeline, false)?;
    let s = run_verify(&ctx, None)?;
    if s.differing.is_empty() {
        return Ok(vec![(
            0,
            0,
            0,
            None,
            "nothing to repair: the target equals the source".to_string(),
        )]);
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
    tsql::exec(
        "UPDATE tide.verification SET repair_backfill_id = $2 WHERE id = $1",
        &[s.id.into(), id.into()],
    )?;
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
            "re-seeding {} range(s) through backfill {id}; {} extra row(s) are deleted at its high watermarks; wait with tide.wait_for_backfill('{}', '{}')",
            s.differing.len(),
            deletes.len(),
            ctx.source,
            ctx.pipeline
        ),
    )])
}
