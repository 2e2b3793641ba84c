//! Running a verification: reading each range on both sides, waiting for the pipeline,
//! comparing, re-checking what differs, recording the results.

use super::*;
use crate::catalog::verification::Counts;

pub(super) fn read_source(
    ctx: &Ctx,
    from: Option<&[String]>,
    to: Option<&[String]>,
    limit: i64,
) -> TideResult<Vec<(String, Vec<String>, String)>> {
    if ctx.key.is_empty() {
        let rows = sql::text_rows(&ctx.multiset_select(&ctx.scan, false), &[], 0, true)?;
        return Ok(rows
            .into_iter()
            .map(|r| {
                let key = r[0].clone().unwrap_or_default();
                (key.clone(), vec![key], r[1].clone().unwrap_or_default())
            })
            .collect());
    }
    let (clause, params) = ctx.range_clause(from, to, 1);
    let keys_plain = ctx.key_names();
    let order = ctx.key_list("");
    let q = format!(
        "SELECT {}, {keys_plain} FROM {} WHERE {clause} ORDER BY {order}",
        ctx.hash_select(false),
        ctx.scan
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

pub(super) fn read_target(
    ctx: &Ctx,
    from: Option<&[String]>,
    to: Option<&[String]>,
) -> TideResult<Side> {
    let (clause, params) = ctx.range_clause(from, to, 1);
    // Each key value as the source's type renders it, as text (the source's are read as text
    // too): a remote target returns text only, whatever the key's type (timestamptz, date,
    // numeric, ...), and the fixed output settings make both sides render it alike.
    let keys_cast = ctx
        .key
        .iter()
        .map(|k| format!("({}::{})::text", quote(k), ctx.key_type(k)))
        .collect::<Vec<_>>()
        .join(", ");
    let q = if ctx.key.is_empty() {
        ctx.multiset_select(&ctx.target, true)
    } else {
        format!(
            "SELECT {}, {keys_cast} FROM {} WHERE {clause}",
            ctx.hash_select(true),
            ctx.target
        )
    };
    let rows = match &ctx.remote {
        Some(r) => remote_read(r, &ctx.target, q, params)?,
        None => {
            let args: Vec<Option<&str>> = params.iter().map(|s| Some(s.as_str())).collect();
            // Lock before the read's snapshot, so a rewrite of the target by the worker's schema
            // propagation cannot make it look empty (the read's own lock outlives this one).
            let lockmode = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
            if let Some(oid) = ctx.local_target {
                // SAFETY: a lock on the local target's OID, released below or at the end of the
                // transaction; main thread, inside the SQL function's transaction.
                unsafe { pg_sys::LockRelationOid(oid, lockmode) };
            }
            let rows = sql::text_rows(&q, &args, 0, true);
            if let Some(oid) = ctx.local_target {
                // SAFETY: releases the lock taken above on the same OID and mode; main thread.
                unsafe { pg_sys::UnlockRelationOid(oid, lockmode) };
            }
            rows?
        }
    };
    let keyless = ctx.key.is_empty();
    Ok(rows
        .into_iter()
        .map(|r| {
            if keyless {
                let key = r[0].clone().unwrap_or_default();
                return (key.clone(), (vec![key], r[1].clone().unwrap_or_default()));
            }
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
pub(super) fn remote_read(
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
        if let Some(refused) = crate::target::remote::refusal_error(&e) {
            return refused;
        }
        TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_FDW_ERROR,
            format!("cannot read the remote target {target}: {}", e.message),
        )
        .hint("Check that the target server is up; verification can be run again at any time.")
    })?;
    Ok(res.pop().unwrap_or_default())
}

/// Wait until the pipeline has applied everything committed before now.
pub(super) fn wait_caught_up(pipeline: &str) -> TideResult<bool> {
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

impl Diff {
    pub(super) fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.extra.is_empty() && self.changed.is_empty()
    }
    pub(super) fn keys(&self) -> HashSet<String> {
        self.missing
            .keys()
            .chain(self.extra.keys())
            .chain(self.changed.keys())
            .cloned()
            .collect()
    }
    pub(super) fn retain(&mut self, keep: &HashSet<String>) {
        self.missing.retain(|k, _| keep.contains(k));
        self.extra.retain(|k, _| keep.contains(k));
        self.changed.retain(|k, _| keep.contains(k));
    }
    pub(super) fn kinds(&self) -> String {
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

pub(super) fn diff(src: &[(String, Vec<String>, String)], tgt: &Side) -> Diff {
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

pub(super) fn run_verify(ctx: &Ctx, ranges: Option<i32>) -> TideResult<Summary> {
    let range_rows = range_rows(ctx, ranges)?;
    let id = catalog::verification::start(&ctx.pipeline, ctx.relid, &ctx.source)?;
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
        // A table without a key is one range: the whole table, as a multiset.
        let last_range = ctx.key.is_empty() || (first.len() as i64) < range_rows;
        let to: Option<Vec<String>> = if last_range {
            None
        } else {
            first.last().map(|r| r.1.clone())
        };
        summary.ranges += 1;
        compare_range(ctx, from.as_ref(), to.as_ref(), first, &mut summary)?;
        if last_range {
            break;
        }
        from = to;
    }
    let totals = record_ranges(id, &summary)?;
    catalog::verification::finish(id, summary.ranges, summary.differing.len() as i32, &totals)?;
    // Keep the last 100 verifications of a table.
    catalog::verification::keep_last_runs(&ctx.pipeline, ctx.relid)?;
    Ok(summary)
}

/// A source row as a range reads it: its key (rendered), its key values, its rendered row.
type SourceRow = (String, Vec<String>, String);

/// Rows per range: `ranges` ranges over the table's estimated rows, or the default.
fn range_rows(ctx: &Ctx, ranges: Option<i32>) -> TideResult<i64> {
    Ok(match ranges {
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
    })
}

/// Compare one key range (after `from`, up to `to`; `first` is the source's rows as first
/// read) until it agrees or [`ATTEMPTS`] reads in a row differ in the same keys; counts it in
/// `summary` (a range still differing among its differing ranges).
fn compare_range(
    ctx: &Ctx,
    from: Option<&Vec<String>>,
    to: Option<&Vec<String>>,
    first: Vec<SourceRow>,
    summary: &mut Summary,
) -> TideResult<()> {
    let mut src = first;
    let mut candidate: Option<Diff> = None;
    let mut tgt_rows = 0;
    for attempt in 0..ATTEMPTS {
        // The first comparison does not wait: a range that agrees at once is settled. Only a
        // differing range is read again after the target has caught up with the source read.
        if attempt > 0 {
            src = read_source(ctx, from.map(Vec::as_slice), to.map(Vec::as_slice), 0)?;
            if !wait_caught_up(&ctx.pipeline)? {
                summary.unsettled += 1;
            }
        }
        let tgt = read_target(ctx, from.map(Vec::as_slice), to.map(Vec::as_slice))?;
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
            from: from.cloned(),
            to: to.cloned(),
            source_rows: src.len() as i64,
            target_rows: tgt_rows,
            diff: d,
        });
    }
    Ok(())
}

/// Record each differing range of `summary` in verification `id`; the totals.
fn record_ranges(id: i64, summary: &Summary) -> TideResult<Counts> {
    let mut totals = Counts {
        source_rows: summary.rows,
        target_rows: summary.target_rows,
        missing: 0,
        extra: 0,
        changed: 0,
    };
    for r in &summary.differing {
        let counts = Counts {
            source_rows: r.source_rows,
            target_rows: r.target_rows,
            missing: r.diff.missing.len() as i64,
            extra: r.diff.extra.len() as i64,
            changed: r.diff.changed.len() as i64,
        };
        totals.missing += counts.missing;
        totals.extra += counts.extra;
        totals.changed += counts.changed;
        let extra_keys = serde_json::to_string(&r.diff.extra.values().collect::<Vec<_>>())
            .unwrap_or_else(|_| "[]".into());
        catalog::verification::record_range(
            id,
            &catalog::verification::Range {
                range: r.range,
                key_from: r.from.clone(),
                key_to: r.to.clone(),
                counts,
                kinds: r.diff.kinds(),
                extra_keys,
            },
        )?;
    }
    Ok(totals)
}
