//! The backfill half of a pipeline worker: watermark writes, keyset chunk reads and the
//! reconciliation of each chunk with the stream (the DBLog algorithm; `tide_core::reconcile`).
//!
//! For one chunk:
//! 1. transaction 1 writes the low watermark (LW) into `tide.signal` and commits;
//! 2. transaction 2, whose snapshot is therefore taken after the LW commit, SELECTs the chunk
//!    (`WHERE (k1, k2, ...) > (last key) ORDER BY k1, k2, ... LIMIT n`, as the role that started
//!    the backfill, under AccessShareLock only) and writes the high watermark (HW), then commits;
//! 3. the chunk waits in memory; the stream iteration feeds every change of a captured table to
//!    the reconciler, which drops the chunk's keys changed between LW and HW, and at the HW the
//!    surviving rows are written to the target as `read` events, at that position of the stream,
//!    in the same target transaction as the backfill's progress (last key, counters, done).
//!
//! Guarantees: at most one chunk is in memory per pipeline (memory = one chunk); no transaction
//! opened here outlives one chunk; the stream never waits for a chunk. A crash loses only the
//! chunk in memory: durable progress points at the last emitted chunk, so the chunk is read again
//! under new watermarks (watermark ids come from a sequence and are never reused). Any failed
//! stream iteration forgets the chunk for the same reason.

use super::estimate::Estimate;
use crate::catalog::backfills;
use crate::error::{TideError, TideResult};
use crate::sink::{Event, Target};
use crate::sql;
use crate::worker::tx::{self, Locked};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tide_core::json;
use tide_core::lsn::Lsn;
use tide_core::model::{Op, OwnedColumn, Txn, WatermarkKind};
use tide_core::reconcile::Reconciler;
use tide_core::wire::{Tuple, Value};

/// A chunk read and waiting for its high watermark.
struct PendingChunk {
    watermark: u64,
    backfill_id: i64,
    chunk_no: i64,
    relid: u32,
    relation: String,
    key_from: Option<Vec<String>>,
    /// Key of the last row read (text output per key column).
    key_to: Option<Vec<String>>,
    rows_read: usize,
    is_last: bool,
    read_at: i64,
    low_lsn: Option<Lsn>,
    /// A TRUNCATE of the table inside the window invalidates every row of the chunk.
    truncated: bool,
    /// The columns of the rows, in order.
    columns: Vec<String>,
    /// Transactions in progress in the chunk's snapshot (32-bit xids, as decoding reports them).
    invisible: HashSet<u32>,
    /// Progress estimates taken while the chunk was read (see [`ChunkRead`]).
    estimate: Estimate,
}

/// In-memory backfill state of one worker.
pub struct Backfiller {
    /// Rows are `Some(row)` to upsert, or `None`: a repair's delete of a key gone at the source.
    reconciler: Reconciler<u32, String, Option<String>>,
    pending: Option<PendingChunk>,
    not_before: Instant,
    /// The backfill whose "waiting" reason was last written to tide.backfills.
    waiting_noted: Option<i64>,
}

impl Default for Backfiller {
    fn default() -> Self {
        Backfiller {
            reconciler: Reconciler::new(),
            pending: None,
            not_before: Instant::now(),
            waiting_noted: None,
        }
    }
}

/// What the HW of a chunk produced in the current iteration.
pub struct Emitted {
    pub rows: u64,
}

impl Backfiller {
    /// Forget the chunk in memory (after a failed iteration): it will be read again.
    pub fn forget(&mut self) {
        self.reconciler.forget_all();
        self.pending = None;
    }

    /// Whether a chunk waits for its high watermark.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Whether `watermark` is the high watermark the chunk in memory waits for (its rows are
    /// emitted when the stream reaches it).
    pub fn awaits(&self, watermark: u64, kind: WatermarkKind) -> bool {
        kind == WatermarkKind::High
            && self
                .pending
                .as_ref()
                .is_some_and(|p| p.watermark == watermark)
    }

    /// A change of a captured table, in stream order.
    /// `xid` is the changing transaction: if the chunk's snapshot could not see it (it was in
    /// progress then), its change drops the key even before the low watermark.
    pub fn on_change(&mut self, relid: u32, key: &str, xid: u32) {
        let Some(p) = &self.pending else { return };
        let key = key.to_string();
        if p.relid == relid && p.invisible.contains(&xid) {
            self.reconciler.drop_key(p.watermark, &key);
        } else {
            self.reconciler.on_change(&relid, &key);
        }
    }

    /// A heap rewrite of a captured table, in stream order (its transaction's commit lies after
    /// every high watermark already seen). A chunk of the table still waiting for its high
    /// watermark may hold rows from before or after the rewrite: it is dropped, and the table is
    /// read again from the start (`catalog::reread_after_rewrite`, in the same transaction).
    pub fn on_rewrite(&mut self, relid: u32) {
        if self.pending.as_ref().is_some_and(|p| p.relid == relid) {
            self.forget();
        }
    }

    /// A TRUNCATE of a captured table, in stream order.
    /// A TRUNCATE inside the window (or by a transaction the chunk could not see) invalidates
    /// the whole chunk; one the chunk's snapshot already reflects does not.
    pub fn on_truncate(&mut self, relid: u32, xid: u32) {
        if let Some(p) = self.pending.as_mut() {
            if p.relid == relid && (p.low_lsn.is_some() || p.invisible.contains(&xid)) {
                p.truncated = true;
            }
        }
    }

    /// A write to `tide.signal` by this pipeline, in stream order. At a high watermark, the
    /// surviving rows are written through `sink` at the current position, with the progress.
    pub(crate) fn on_signal(
        &mut self,
        c: &mut SpiClient<'_>,
        sink: &mut dyn Target,
        t: &mut Txn,
        watermark: u64,
        kind: WatermarkKind,
    ) -> TideResult<Option<Emitted>> {
        let Some(p) = self.pending.as_mut() else {
            return Ok(None);
        };
        if p.watermark != watermark {
            return Ok(None);
        }
        if kind == WatermarkKind::Low {
            if self.reconciler.on_low_watermark(watermark) {
                p.low_lsn = Some(t.lsn);
            }
            return Ok(None);
        }
        let Some(result) = self.reconciler.on_high_watermark(watermark) else {
            // LW never seen (cannot happen for a chunk read after its LW committed): read again.
            self.pending = None;
            return Ok(None);
        };
        let Some(p) = self.pending.take() else {
            return Ok(None);
        };
        let rows = if p.truncated { Vec::new() } else { result.rows };
        let dropped = if p.truncated {
            result.read
        } else {
            result.dropped
        };
        // Progress first: if the backfill was cancelled meanwhile, nothing is emitted.
        let done = backfills::ChunkDone {
            backfill_id: p.backfill_id,
            chunk_no: p.chunk_no,
            key_from: p.key_from,
            key_to: p.key_to,
            low_lsn: p.low_lsn,
            high_lsn: t.lsn,
            rows_read: p.rows_read,
            rows_dropped: dropped,
            rows_emitted: rows.len(),
            is_last: p.is_last,
            read_at: p.read_at,
            table_rows: p.estimate.table_rows,
            key_fraction: p.estimate.key_fraction,
        };
        if !backfills::record_progress(c, &done)? {
            return Ok(None);
        }
        backfills::record_chunk(c, &done)?;
        if p.chunk_no % 100 == 0 {
            backfills::trim_chunks(c, p.backfill_id, p.chunk_no)?;
        }
        let n = rows.len() as u64;
        for (key, row) in rows {
            t.position += 1;
            let op = if row.is_some() { Op::Read } else { Op::Delete };
            sink.push(
                c,
                t,
                Event {
                    relid: p.relid,
                    relation: p.relation.clone(),
                    op,
                    key: Some(key),
                    columns: if row.is_some() {
                        p.columns.clone()
                    } else {
                        Vec::new()
                    },
                    row,
                    unchanged: Vec::new(),
                    backfill: Some((p.backfill_id, p.chunk_no)),
                },
            )?;
        }
        Ok(Some(Emitted { rows: n }))
    }

    /// Read the next chunk of the pipeline's active backfill, if one is due. Runs its own two
    /// transactions; call it between stream iterations.
    pub fn step(&mut self, pipeline: &str) -> TideResult<()> {
        if self.pending.is_some() || Instant::now() < self.not_before {
            return Ok(());
        }
        let Some(job) = tx::run(|| low_watermark(pipeline))? else {
            // Nothing to do: look again in a while (start_backfill wakes the worker anyway).
            self.not_before = Instant::now() + Duration::from_millis(500);
            return Ok(());
        };
        let started = Instant::now();
        // The table's lock before the chunk's snapshot (see `tx::run_locked`).
        let read = match tx::run_locked(pg_sys::Oid::from(job.b.relid), || {
            read_chunk(pipeline, &job)
        }) {
            Ok(Locked::Ran(r)) => Ok(r),
            Ok(Locked::Busy) => Err(TideError::new(
                pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
                "the table is locked by another transaction (for example a table-rewriting ALTER TABLE, TRUNCATE, VACUUM FULL or CLUSTER, or a statement waiting for such a lock)",
            )
            .hint("The chunk is read once the lock is released; the stream keeps flowing meanwhile. Nothing is lost.")
            .retry_later()),
            Err(e) => Err(e),
        };
        let read = match read {
            Ok(r) => {
                self.waiting_noted = None;
                r
            }
            Err(e) if e.retry => {
                // Nothing was read: the low watermark alone is ignored by the stream. Say why
                // in tide.backfills (once; the next emitted chunk clears it).
                self.not_before = Instant::now() + Duration::from_millis(200);
                if self.waiting_noted != Some(job.b.id) {
                    self.waiting_noted = Some(job.b.id);
                    let remedy = e.hint.clone().unwrap_or_default();
                    let waiting = format!("waiting: {}", e.message);
                    if let Err(e2) =
                        tx::run(|| backfills::note_waiting(job.b.id, &waiting, &remedy))
                    {
                        pgrx::log!("pg_tide worker \"{pipeline}\": could not note why backfill {} waits: {e2}", job.b.id);
                    }
                }
                return Ok(());
            }
            Err(mut e) => {
                if e.code == pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_QUERY_CANCELED {
                    e = TideError::new(
                        e.code,
                        format!(
                            "a chunk of backfill {} was cancelled ({}): its SELECT may run for at most tide.chunk_timeout ({} ms)",
                            job.b.id,
                            e.message,
                            crate::gucs::CHUNK_TIMEOUT_MS.get()
                        ),
                    )
                    .hint("Make the condition cheaper (an index on what it tests), raise tide.chunk_timeout, or start the backfill again without the condition.");
                }
                let _ = tx::run(|| fail_backfill(job.b.id, &e));
                return Err(e);
            }
        };
        let n = read.rows.len();
        let last_key = read.rows.last().map(|r| r.key_values.clone());
        let mut rows: Vec<(String, Option<String>)> = read
            .rows
            .into_iter()
            .map(|r| (r.key, Some(r.row)))
            .collect();
        rows.extend(read.deletes.into_iter().map(|k| (k, None)));
        self.reconciler.add_chunk(job.watermark, job.b.relid, rows);
        self.pending = Some(PendingChunk {
            watermark: job.watermark,
            backfill_id: job.b.id,
            chunk_no: job.b.chunk_no,
            relid: job.b.relid,
            relation: read.relation,
            key_from: job.b.last_key.clone(),
            key_to: last_key.or(job.b.last_key.clone()),
            rows_read: n,
            is_last: read.is_last,
            read_at: read.read_at,
            low_lsn: None,
            truncated: false,
            columns: read.columns,
            invisible: read.invisible,
            estimate: read.estimate,
        });
        // Throttle: spread the rows of this chunk over rows / rows_per_second seconds.
        self.not_before = match job.b.rows_per_second {
            Some(rps) if rps > 0 => started + Duration::from_secs_f64(n as f64 / rps as f64),
            _ => Instant::now(),
        };
        Ok(())
    }
}

/// The next chunk to read, after its low watermark committed.
struct Job {
    watermark: u64,
    /// The backfill, as the catalog holds it.
    b: backfills::Due,
}

/// Transaction 1: pick the backfill, mark it running, write the LW.
fn low_watermark(pipeline: &str) -> TideResult<Option<Job>> {
    let Some(mut b) = backfills::due(pipeline)? else {
        return Ok(None);
    };
    b.chunk_size = b.chunk_size.max(1);
    let watermark = backfills::next_watermark(pipeline)?;
    backfills::write_low_watermark(pipeline, b.id, watermark, b.chunk_no)?;
    Ok(Some(Job { watermark, b }))
}

struct ChunkRow {
    key: String,
    key_values: Vec<String>,
    row: String,
}

struct ChunkRead {
    invisible: HashSet<u32>,
    estimate: Estimate,
    /// Keys (rendered) a repair deletes at the high watermark.
    deletes: Vec<String>,
    relation: String,
    columns: Vec<String>,
    rows: Vec<ChunkRow>,
    is_last: bool,
    read_at: i64,
}

/// Transaction 2: SELECT the chunk (snapshot taken after the LW commit) and write the HW.
fn read_chunk(pipeline: &str, job: &Job) -> TideResult<ChunkRead> {
    let relid = job.b.relid.to_string();
    // The table as it is now: columns in attribute order, as the output plugin sends them.
    let meta = sql::text_rows(
        "SELECT format('%I.%I', n.nspname, c.relname), a.attname::text, a.atttypid::int8, format_type(a.atttypid, a.atttypmod)
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
          WHERE c.oid = $1::oid ORDER BY a.attnum",
        &[Some(&relid)],
        0,
        false,
    )?;
    if meta.is_empty() {
        return Err(TideError::undefined(format!(
            "the table of backfill {} (OID {relid}) no longer exists",
            job.b.id
        ))
        .hint("Remove it from the pipeline with tide.remove_table, or cancel the backfill."));
    }
    let relation = meta[0][0].clone().unwrap_or_default();
    let columns: Vec<OwnedColumn> = meta
        .iter()
        .map(|m| {
            let name = m[1].clone().unwrap_or_default();
            OwnedColumn {
                key: job.b.key_columns.contains(&name),
                type_oid: m[2].as_deref().and_then(|s| s.parse().ok()).unwrap_or(0),
                name,
            }
        })
        .collect();
    let mut key_types = Vec::new();
    for k in &job.b.key_columns {
        let Some(m) = meta.iter().find(|m| m[1].as_deref() == Some(k.as_str())) else {
            return Err(TideError::prerequisite(format!("key column \"{k}\" of {relation} no longer exists"))
                .hint(format!("Remove and re-add the table: SELECT tide.remove_table('{pipeline}', '{relation}'); SELECT tide.add_table('{pipeline}', '{relation}').")));
        };
        key_types.push(m[3].clone().unwrap_or_default());
    }
    let key_idx: Vec<usize> = job
        .b
        .key_columns
        .iter()
        .filter_map(|k| columns.iter().position(|c| &c.name == k))
        .collect();

    let select_list = columns
        .iter()
        .map(|c| quote(&c.name))
        .collect::<Vec<_>>()
        .join(", ");
    let key_list = job
        .b
        .key_columns
        .iter()
        .map(|k| quote(k))
        .collect::<Vec<_>>()
        .join(", ");
    let mut query = format!("SELECT {select_list} FROM ONLY {relation}");
    let mut clauses = Vec::new();
    let mut args: Vec<Option<&str>> = Vec::new();
    if let Some(last) = &job.b.last_key {
        let params = key_types
            .iter()
            .enumerate()
            .map(|(i, t)| format!("${}::{t}", i + 1))
            .collect::<Vec<_>>()
            .join(", ");
        clauses.push(format!("({key_list}) > ({params})"));
        args.extend(last.iter().map(|s| Some(s.as_str())));
    }
    if let Some(cond) = &job.b.condition {
        // On lines of its own: a trailing `--` comment in it ends before the `)`.
        clauses.push(format!("(\n{cond}\n)"));
    }
    if !clauses.is_empty() {
        query.push_str(" WHERE ");
        query.push_str(&clauses.join(" AND "));
    }
    query.push_str(&format!(" ORDER BY {key_list} LIMIT {}", job.b.chunk_size));

    let read_at = unsafe { pg_sys::GetCurrentTimestamp() };
    // The chunk's snapshot (the transaction's, like the SELECT below: both run read-only). Its
    // in-progress transactions may include one whose commit record is already in the WAL before
    // the low watermark (PostgreSQL makes a transaction visible only after writing its commit
    // record); such a transaction is invisible to the chunk although the stream delivers it
    // before the window opens, so its keys are dropped from the chunk wherever it appears.
    let snapshot =
        sql::one::<String>("SELECT pg_current_snapshot()::text", &[])?.unwrap_or_default();
    let invisible: HashSet<u32> = snapshot
        .split(':')
        .nth(2)
        .unwrap_or("")
        .split(',')
        .filter_map(|x| x.trim().parse::<u64>().ok())
        .map(|x| x as u32)
        .collect();
    // A transaction already committed in the log (and in the commit log) but not yet visible,
    // e.g. waiting for a synchronous standby: the stream may already have delivered it, so its
    // keys cannot be dropped from this chunk. Do not read the chunk now; try again shortly.
    // pg_xact_status() reports such a transaction as "in progress" (it asks the process array
    // first), so ask the commit log itself.
    let committed_invisible = invisible
        .iter()
        .filter(|&&x| unsafe { pg_sys::TransactionIdDidCommit(pg_sys::TransactionId::from(x)) })
        .count();
    if committed_invisible > 0 {
        return Err(TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("{committed_invisible} committed transaction(s) are not visible yet"),
        )
        .hint("A transaction has committed but is still waiting (for example for a synchronous standby); the chunk is read again once it is visible.")
        .retry_later());
    }
    // Read as the role that started the backfill (its condition is its own SQL), in a
    // security-restricted operation (`SET ROLE`/`RESET ROLE` fail there), under a timeout: a
    // slow condition fails its backfill instead of holding the stream.
    let owner = crate::security::owner_oid(&job.b.owner, &format!("backfill {}", job.b.id))?;
    let timeout_ms = crate::gucs::CHUNK_TIMEOUT_MS.get().max(10);
    let raw = crate::security::as_owner(owner, || {
        tx::arm_timeout(timeout_ms);
        let r = sql::text_rows(&query, &args, 0, false);
        tx::disarm_timeout();
        r
    })?;

    let mut rows = Vec::with_capacity(raw.len());
    for r in &raw {
        let tuple = Tuple {
            values: r
                .iter()
                .map(|v| v.as_deref().map_or(Value::Null, Value::Text))
                .collect(),
        };
        let mut key = String::new();
        json::render_key(&columns, &tuple, &mut key)
            .map_err(|e| TideError::internal(format!("cannot render a chunk row: {e}")))?;
        let mut row = String::new();
        json::render_row(&columns, &tuple, &mut row)
            .map_err(|e| TideError::internal(format!("cannot render a chunk row: {e}")))?;
        let key_values = key_idx
            .iter()
            .map(|&i| r[i].clone().unwrap_or_default())
            .collect();
        rows.push(ChunkRow {
            key,
            key_values,
            row,
        });
    }
    let is_last = (rows.len() as i64) < job.b.chunk_size;
    // A repair: keys to delete that lie in this chunk's key range and, in this same snapshot, no
    // longer exist at the source. They are emitted as deletes at the high watermark unless the
    // stream touches them in the window (then the stream carries the truth, as for rows).
    let mut deletes = Vec::new();
    if let Some(list) = &job.b.repair_deletes {
        let to: Option<Vec<String>> = if is_last {
            None
        } else {
            rows.last().map(|r: &ChunkRow| r.key_values.clone())
        };
        let elem = |i: usize, k: &str| -> String {
            let ty = &key_types[job.b.key_columns.iter().position(|c| c == k).unwrap_or(0)];
            format!("(k.v->>{i})::{ty}")
        };
        let elems: Vec<String> = job
            .b
            .key_columns
            .iter()
            .enumerate()
            .map(|(i, k)| elem(i, k))
            .collect();
        let mut clauses = vec![format!(
            "NOT EXISTS (SELECT 1 FROM ONLY {relation} s WHERE ({}) = ({}))",
            job.b
                .key_columns
                .iter()
                .map(|k| format!("s.{}", quote(k)))
                .collect::<Vec<_>>()
                .join(", "),
            elems.join(", ")
        )];
        let mut dargs: Vec<Option<&str>> = vec![Some(list.as_str())];
        let mut n = 2;
        for (bound, op) in [(job.b.last_key.as_ref(), ">"), (to.as_ref(), "<=")] {
            if let Some(vals) = bound {
                let ps: Vec<String> = key_types
                    .iter()
                    .map(|t| {
                        let p = format!("${n}::{t}");
                        n += 1;
                        p
                    })
                    .collect();
                clauses.push(format!("({}) {op} ({})", elems.join(", "), ps.join(", ")));
                dargs.extend(vals.iter().map(|s| Some(s.as_str())));
            }
        }
        let q = format!(
            "SELECT {} FROM jsonb_array_elements($1::text::jsonb) AS k(v) WHERE {}",
            (0..job.b.key_columns.len())
                .map(|i| format!("k.v->>{i}"))
                .collect::<Vec<_>>()
                .join(", "),
            clauses.join(" AND ")
        );
        // As the backfill's owner, like the chunk: it reads the source (and casts to its key types).
        let found = crate::security::as_owner(owner, || sql::text_rows(&q, &dargs, 0, false))?;
        for r in found {
            let mut values = vec![Value::Null; columns.len()];
            for (ki, &ci) in key_idx.iter().enumerate() {
                values[ci] = r[ki].as_deref().map_or(Value::Null, Value::Text);
            }
            let mut key = String::new();
            json::render_key(&columns, &Tuple { values }, &mut key)
                .map_err(|e| TideError::internal(format!("cannot render a key to delete: {e}")))?;
            deletes.push(key);
        }
    }
    // Defence in depth: the chunk must have read the relation file its snapshot knows. The lock
    // taken before the snapshot guarantees it; if it ever did not hold (a rewrite committed after
    // the snapshot, so the rows read — possibly none — come from a file the snapshot cannot see
    // into), a short chunk would end the backfill with rows never read. Read it again instead.
    let (seen, current) = sql::two::<i64, i64>(
        "SELECT relfilenode::int8, pg_relation_filenode(oid)::int8 FROM pg_class WHERE oid = $1::int8::oid",
        &[(job.b.relid as i64).into()],
    )?;
    if seen != current {
        pgrx::log!(
            "pg_tide worker \"{pipeline}\": {relation} was rewritten while chunk {} of backfill {} was read (file {seen:?} in its snapshot, now {current:?}); reading the chunk again",
            job.b.chunk_no,
            job.b.id
        );
        return Err(TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
            format!("{relation} was rewritten while a chunk was read"),
        )
        .hint("The chunk is read again; nothing was emitted from it.")
        .retry_later());
    }
    let estimate = if is_last {
        Estimate::default()
    } else {
        // Whole-table backfills only: a condition or a repair reads part of the key range.
        let whole = job.b.condition.is_none() && job.b.repair_deletes.is_none();
        let last = rows.last().and_then(|r| r.key_values.first());
        Estimate::take(
            job.b.relid,
            &relation,
            &job.b.key_columns,
            &key_types,
            whole,
            last,
            owner,
        )?
    };
    backfills::write_high_watermark(pipeline, job.watermark, job.b.id, is_last)?;
    Ok(ChunkRead {
        invisible,
        estimate,
        deletes,
        relation,
        columns: columns.into_iter().map(|c| c.name).collect(),
        rows,
        is_last,
        read_at,
    })
}

fn fail_backfill(id: i64, e: &TideError) -> TideResult<()> {
    let remedy = e.hint.clone().unwrap_or_else(|| {
        "Fix the cause, then start the backfill again with tide.start_backfill.".to_string()
    });
    backfills::fail(id, &e.message, &remedy)
}

fn quote(ident: &str) -> String {
    pgrx::spi::quote_identifier(ident)
}
