//! The backfill half of a pipeline worker: watermark writes, keyset chunk reads and the
//! reconciliation of each chunk with the stream (the DBLog algorithm; `tide_core::reconcile`).
//! (A table without a key is not read here: it is copied whole at an iteration boundary,
//! [`keyless`], which uses this module's delivered transactions and holds.)
//!
//! For one chunk:
//! 1. transaction 1 writes the low watermark (LW) into `tide.signal` and commits;
//! 2. transaction 2, whose snapshot is therefore taken after the LW commit, SELECTs the chunk
//!    (`WHERE (k1, k2, ...) > (last key) ORDER BY k1, k2, ... LIMIT n`, as the role that started
//!    the backfill, under AccessShareLock only) and writes the high watermark (HW), then commits
//!    ([`chunk`]);
//! 3. the chunk waits in memory (as JSON, as row values for a local target that takes them, or
//!    as COPY text for a remote target that takes it); the stream iteration feeds every change
//!    of a captured table to the reconciler, which drops the chunk's keys changed between LW
//!    and HW, and at the HW the surviving rows are written to the target as `read` events (or
//!    as one batch of row values, [`crate::sink::RowBatch`], or of COPY text,
//!    [`crate::sink::CopyBatch`]), at that position of the stream, in the same target
//!    transaction as the backfill's progress (last key, counters, done). Row values and COPY
//!    text are used only if the table and its target still have the chunk's shape then;
//!    otherwise the chunk is read again.
//!
//! Several backfills of a pipeline run at once (`tide.max_parallel_backfills`, default 4: the
//! first that many running, then queued, oldest first; `catalog::backfills::due`): between
//! stream iterations the worker reads the next chunk of each that has none in memory, one after
//! the other, each under watermarks of its own, and the stream iteration that follows writes
//! every chunk whose high watermark it reaches, each at its own high watermark. The reconciler
//! keeps each chunk's window apart (a change drops its key from every chunk of its table whose
//! window is open: `tide_core::reconcile`, model-checked with several tables' windows open at
//! once in `crates/tide-core/tests/reconcile_model.rs`). A throttle, a pause, a cancel, a locked
//! table hold back only their own backfill.
//!
//! Several readers of one table (`tide.max_backfill_readers` > 1): between iterations the worker
//! plans the key ranges of a backfill's next chunks from where its last chunk in memory ends
//! ([`ranges`]); when the iteration writes one of its chunks, the backfill's next chunks are
//! asked of the idle readers at once, one planned range each and an open one after the last
//! bound ([`Backfiller::read_ahead`]). A backfill's durable progress is one last key, so its
//! chunks are emitted in key order: a chunk whose high watermark the stream reaches while an
//! earlier chunk of its backfill still waits is *held* — its window stays open in the
//! reconciler — and written right after that chunk, at that chunk's high watermark. Sound
//! because a key the stream did not change from the chunk's low watermark to the point where it
//! is written has there the value the chunk read (the model test checks holding, and that
//! closing the window at the chunk's own high watermark instead is caught). A chunk that is not
//! written (read again, refused by its progress) takes the chunks of its backfill after it along
//! ([`Backfiller::forget_backfill`]); `record_progress` refuses any chunk that does not start
//! where the backfill durably stands, whatever happened.
//!
//! While the stream applies source changes (any in the last second, [`Backfiller::stream_applied`])
//! every chunk asked for reads at most `tide.streaming_chunk_size` rows
//! ([`backfills::Due::chunk_cap`]): the stream's events committed while a chunk is written wait
//! for that write, so shorter writes bound their latency. The chunk size plays no part in the
//! watermark argument.
//!
//! A resync's chunk at a target in another PostgreSQL also carries, once read, the deletes of
//! the target's keys in its key range that it did not find at the source (`sweep`, between
//! stream iterations; see `catalog::slots`).
//!
//! Steps 1 and 2 run in the worker, or, for the chunk after one being written, in the worker's
//! reader process ([`read_ahead`]), which the worker waits for before it decodes further.
//! A chunk whose snapshot misses a transaction the stream has already delivered (decoded before
//! it became visible: `tide_core::snapshot::DeliveredXids`) is read again rather than registered.
//!
//! Guarantees: the worker's memory holds at most one chunk per running backfill
//! (`tide.max_parallel_backfills`) with one reader, or up to twice `tide.max_backfill_readers`
//! of a backfill with several (its next chunks are asked for only as many as top it up to that),
//! and each reader one; no transaction opened here outlives one chunk; the
//! stream never waits for a chunk's high watermark (between two iterations it waits for the
//! reads of at most that many chunks). A crash loses only the chunks in memory: durable progress points at the last emitted
//! chunk, so the chunk is read again under new watermarks (watermark ids come from a sequence and
//! are never reused), and a chunk that does not start at the durable progress is never emitted
//! (`catalog::backfills::record_progress`). Any failed stream iteration forgets the chunks for
//! the same reason.

mod chunk;
mod estimate;
pub(crate) mod keyless;
mod ranges;
mod read_ahead;
mod row_values;

use chunk::{
    chunk_end, form_for, read_chunk_locked, sweep_deletes, table_meta, wanted_form, ChunkRead, Job,
};
use estimate::Estimate;

use crate::catalog::backfills;
use crate::error::{TideError, TideResult};
use crate::sink::{Batch, CopyBatch, Event, Row, RowBatch, RowForm, Target};
use read_ahead::Reader;
use row_values::RowValues;

use crate::worker::tx;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tide_core::lsn::Lsn;
use tide_core::model::{BackfillState, ChunkWrite, Op, Txn, WatermarkKind};
use tide_core::reconcile::Reconciler;
use tide_core::snapshot::{DeliveredXids, InvisibleXids};

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
    /// Its high watermark passed while an earlier chunk of its backfill still waited for its
    /// own: it is written right after that one (its window stays open until then).
    held: bool,
    low_lsn: Option<Lsn>,
    /// A TRUNCATE of the table inside the window invalidates every row of the chunk.
    truncated: bool,
    /// The columns of the rows, (name, `format_type`), in order.
    columns: Vec<(String, String)>,
    /// The rows' values, when the chunk holds them as row values ([`Row::Value`]), with the
    /// attribute numbers of `columns` they were read with.
    values: Option<(RowValues, Vec<i32>)>,
    /// The attribute numbers of `columns` when the chunk was read.
    attnums: Vec<i32>,
    /// Transactions in progress in the chunk's snapshot (32-bit xids, as decoding reports them).
    invisible: InvisibleXids,
    /// Progress estimates taken while the chunk was read (see [`ChunkRead`]).
    estimate: Estimate,
    /// The backfill as the chunk was read (its `last_key` is where the chunk started).
    job: backfills::Due,
    /// How the target wanted the rows held.
    form: RowForm,
}

/// Planned chunk bounds after a key (`None`: the table's start); see [`Backfiller::plans`].
type Plan = (Option<Vec<String>>, Vec<Vec<String>>);

/// In-memory backfill state of one worker.
pub struct Backfiller {
    /// A row to upsert (in the form the target asked for), or a repair's delete of a key gone
    /// at the source ([`Row::Key`]).
    reconciler: Reconciler<u32, String, Row>,
    /// The chunks waiting for their high watermark (or held after it), in the order they were
    /// read: of at most `tide.max_parallel_backfills` backfills, one per backfill, or, with
    /// several readers, up to twice `tide.max_backfill_readers` of one backfill.
    pending: Vec<PendingChunk>,
    /// Bounds of the next chunks of a backfill, planned by [`ranges::plan`] after the key its
    /// next unread chunk starts after (the first of the pair): used when its chunks are next
    /// asked of several readers at once.
    plans: HashMap<i64, Plan>,
    /// The chunk cap the plans were made with ([`Self::chunk_cap`]): a plan's ranges hold that
    /// many keys each.
    planned_cap: Option<i64>,
    /// When an iteration last applied source changes (not only chunks): while that is recent,
    /// chunks are capped at `tide.streaming_chunk_size` rows ([`Self::chunk_cap`]).
    stream_at: Option<Instant>,
    /// No chunk is read before then (after a failure, or when nothing was due).
    not_before: Instant,
    /// Backfills whose next chunk waits until then: a throttled one (its pace; `true`: it lapses
    /// when the backfill's throttle is removed), one whose chunk could not be read now (its
    /// table locked, say) or must be read again (a snapshot that missed a delivered
    /// transaction). Each belongs to its backfill only: the others go on.
    held: HashMap<i64, (Instant, bool)>,
    /// The backfills whose "waiting" reason was written to tide.backfills (cleared by their next
    /// chunk read).
    waiting_noted: HashSet<i64>,
    /// The helpers that read the next chunks while these are written (`read_ahead`), at most
    /// `tide.max_backfill_readers`.
    readers: Vec<Reader>,
    /// Not before then does the worker try to start a reader again.
    reader_retry: Instant,
    /// Transactions the stream delivered that a chunk read next may not see yet.
    delivered: DeliveredXids,
    /// Iterations in a row that failed with a chunk in memory (reset when one is written): the
    /// next chunk is read only after a back-off, so a chunk that cannot be written (a
    /// constraint of the target, say) is not read again and again at full speed.
    chunk_failures: u32,
    /// The chunks whose rows were handed to the target in the current iteration
    /// ([`Self::begin_iteration`]): what a failure of the iteration may be due to.
    written: Vec<Written>,
    /// Backfills a chunk of which was written in an iteration that failed, among other
    /// transactions: until one of their chunks is written, the stream is applied one source
    /// transaction per iteration while one of their chunks is in memory ([`Self::isolating`]), so
    /// that a failure at its high watermark is the chunk's alone (`pipeline::Worker::failed`).
    suspects: HashSet<i64>,
}

/// A chunk handed to the target in the current iteration.
#[derive(Clone, Debug)]
pub struct Written {
    pub backfill_id: i64,
    pub chunk_no: i64,
    pub relation: String,
    /// Its high watermark's commit LSN: the source transaction it was written at.
    pub high_lsn: Lsn,
}

impl Default for Backfiller {
    fn default() -> Self {
        Backfiller {
            reconciler: Reconciler::new(),
            pending: Vec::new(),
            plans: HashMap::new(),
            planned_cap: None,
            stream_at: None,
            not_before: Instant::now(),
            held: HashMap::new(),
            waiting_noted: HashSet::new(),
            readers: Vec::new(),
            reader_retry: Instant::now(),
            delivered: DeliveredXids::default(),
            chunk_failures: 0,
            written: Vec::new(),
            suspects: HashSet::new(),
        }
    }
}

/// What the HW of a chunk produced in the current iteration.
pub struct Emitted {
    pub rows: u64,
}

impl Backfiller {
    /// An iteration applied source changes (`true`), or only chunks and pg_tide's own rows.
    pub fn stream_applied(&mut self, changes: bool) {
        if changes {
            self.stream_at = Some(Instant::now());
        }
    }

    /// The most rows the chunks read now may have: `tide.streaming_chunk_size` while the stream
    /// applied source changes in the last second (the stream's events wait behind a chunk's
    /// write, so a shorter write bounds their latency), else none beyond the backfill's own
    /// chunk size.
    fn chunk_cap(&self) -> Option<i64> {
        let cap = i64::from(crate::gucs::STREAMING_CHUNK_SIZE.get());
        let busy = self
            .stream_at
            .is_some_and(|at| at.elapsed() < Duration::from_secs(1));
        (cap > 0 && busy).then_some(cap)
    }

    /// The start of an iteration: no chunk written in it yet.
    pub fn begin_iteration(&mut self) {
        self.written.clear();
    }

    /// The chunks written in the iteration that just ended (taking them forgets them).
    pub fn take_written(&mut self) -> Vec<Written> {
        std::mem::take(&mut self.written)
    }

    /// Backfill `id` had a chunk written in an iteration that failed: its next chunk is written
    /// in an iteration of its own ([`Self::isolating`]).
    pub fn suspect(&mut self, id: i64) {
        self.suspects.insert(id);
    }

    /// Backfill `id` failed or was written: no longer suspected.
    pub fn acquit(&mut self, id: i64) {
        self.suspects.remove(&id);
    }

    /// Whether a chunk of a suspected backfill ([`Self::suspect`]) is in memory: the stream is
    /// then applied one source transaction per iteration, so the chunk's high watermark is an
    /// iteration's only transaction.
    pub fn isolating(&self) -> bool {
        self.pending
            .iter()
            .any(|p| self.suspects.contains(&p.backfill_id))
    }

    /// Forget the chunk in memory (after a failed iteration): it will be read again, and so will
    /// the chunks asked of the readers meanwhile (they start after the ones forgotten).
    pub fn forget(&mut self) {
        self.reconciler.forget_all();
        self.pending.clear();
        self.plans.clear();
        for r in &mut self.readers {
            r.drop_in_flight();
        }
    }

    /// Forget every chunk of backfill `id` in memory or asked of a reader: an earlier one was
    /// not written, so they do not start where the backfill durably stands; its next chunk is
    /// read again from there.
    fn forget_backfill(&mut self, id: i64) {
        for p in self.pending.iter().filter(|p| p.backfill_id == id) {
            self.reconciler.on_high_watermark(p.watermark);
        }
        self.pending.retain(|p| p.backfill_id != id);
        self.plans.remove(&id);
        for r in &mut self.readers {
            r.drop_in_flight_of(id);
        }
    }

    /// After a failed iteration: forget the chunks in memory ([`Self::forget`]) and, when there
    /// was one, read the next only after a back-off that doubles with each failure in a row (up
    /// to `max`).
    pub fn failed(&mut self, max: Duration) {
        let had_chunk = !self.pending.is_empty() || self.in_flight();
        self.forget();
        if had_chunk {
            self.chunk_failures = (self.chunk_failures + 1).min(16);
            self.not_before =
                Instant::now() + tide_core::worker_loop::backoff(self.chunk_failures, max);
        }
    }

    /// After a successful iteration: forget the delivered transactions no snapshot can miss any
    /// more, when there are many: those older than the oldest one still running, then those no
    /// longer in progress (a long-running transaction elsewhere keeps the first bound low).
    /// Not while a chunk asked of the reader is in flight: its snapshot may predate the oldest
    /// running transaction, and registering it looks its invisible transactions up here.
    pub fn prune(&mut self) {
        if self.in_flight() {
            return;
        }
        if self.delivered.len() > 1024 {
            // SAFETY: reads the process array under its lock; outside or inside a transaction.
            let oldest = unsafe { pg_sys::GetOldestActiveTransactionId() };
            self.delivered.forget_before(oldest.into_inner());
        }
        if self.delivered.len() > 1024 {
            // SAFETY: as above, per xid (a finished one mostly answers from its fast paths).
            self.delivered.retain(|x| unsafe {
                pg_sys::TransactionIdIsInProgress(pg_sys::TransactionId::from(x))
            });
        }
    }

    /// Whether the copy of keyless backfill `id` waits (see `worker::backfill::keyless`).
    pub(crate) fn copy_held(&self, id: i64) -> bool {
        self.held
            .get(&id)
            .is_some_and(|(until, _)| Instant::now() < *until)
    }

    /// The copy of keyless backfill `id` is read again in `d` at the earliest; `true` the first
    /// time (its waiting reason is then noted in `tide.backfills`).
    pub(crate) fn hold_copy(&mut self, id: i64, d: Duration) -> bool {
        self.held.insert(id, (Instant::now() + d, false));
        self.waiting_noted.insert(id)
    }

    /// The copy of keyless backfill `id` was taken.
    pub(crate) fn copy_taken(&mut self, id: i64) {
        self.held.remove(&id);
        self.waiting_noted.remove(&id);
    }

    /// A transaction the stream delivered for table `relid` that a copy's snapshot `invisible`
    /// does not see (`tide_core::snapshot::copy_misses`).
    pub(crate) fn copy_missed(&self, relid: u32, invisible: &InvisibleXids) -> Option<u32> {
        tide_core::snapshot::copy_misses(&self.delivered, relid, invisible)
    }

    /// Whether a chunk waits for its high watermark.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether a chunk asked of the reader has not arrived yet: it must be registered before
    /// the next iteration decodes further (see `read_ahead`).
    pub fn in_flight(&self) -> bool {
        self.readers.iter().any(Reader::in_flight)
    }

    /// Whether `watermark` is the high watermark a chunk in memory waits for and will be written
    /// at (its rows are emitted when the stream reaches it; not a chunk that will be held
    /// there, see [`Self::on_signal`]).
    pub fn awaits(&self, watermark: u64, kind: WatermarkKind) -> bool {
        kind == WatermarkKind::High
            && self.pending.iter().any(|p| {
                p.watermark == watermark
                    && !self
                        .pending
                        .iter()
                        .any(|q| q.backfill_id == p.backfill_id && q.chunk_no < p.chunk_no)
            })
    }

    /// A change of a captured table, in stream order: it drops the key from every chunk of the
    /// table whose window is open (the reconciler knows each chunk's own window), and from every
    /// chunk of the table whose snapshot could not see `xid`, the changing transaction (it was
    /// in progress then), even before that chunk's low watermark.
    pub fn on_change(&mut self, relid: u32, key: &str, xid: u32) {
        self.delivered.record(relid, xid);
        if self.pending.is_empty() {
            return;
        }
        let key = key.to_string();
        for p in &self.pending {
            if p.relid == relid && p.invisible.contains(xid) {
                self.reconciler.drop_key(p.watermark, &key);
            }
        }
        self.reconciler.on_change(&relid, &key);
    }

    /// A heap rewrite of a captured table, in stream order (its transaction's commit lies after
    /// every high watermark already seen). A chunk of the table still waiting for its high
    /// watermark may hold rows from before or after the rewrite: it is dropped, and the table is
    /// read again from the start (`catalog::reread_after_rewrite`, in the same transaction).
    pub fn on_rewrite(&mut self, relid: u32) {
        if self.pending.iter().any(|p| p.relid == relid) {
            self.forget();
        }
    }

    /// A TRUNCATE of a captured table, in stream order.
    /// A TRUNCATE inside the window (or by a transaction the chunk could not see) invalidates
    /// the whole chunk; one the chunk's snapshot already reflects does not.
    pub fn on_truncate(&mut self, relid: u32, xid: u32) {
        self.delivered.record(relid, xid);
        for p in self.pending.iter_mut() {
            if p.relid == relid && (p.low_lsn.is_some() || p.invisible.contains(xid)) {
                p.truncated = true;
            }
        }
    }

    /// A TRUNCATE of some partitions of a captured partitioned table, in stream order. Like
    /// [`Self::on_truncate`], but the chunk also holds rows of other partitions, which the
    /// stream will not carry again: it is read again instead of emptied.
    pub fn on_partition_truncate(&mut self, relid: u32, xid: u32) {
        self.delivered.record(relid, xid);
        if self
            .pending
            .iter()
            .any(|p| p.relid == relid && (p.low_lsn.is_some() || p.invisible.contains(xid)))
        {
            self.forget();
        }
    }

    /// A write to `tide.signal` by this pipeline, in stream order. At a high watermark, the
    /// surviving rows are written through `sink` at the current position, with the progress;
    /// a chunk whose backfill has an earlier chunk still waiting is held (its window stays open)
    /// and written right after that one, at that one's high watermark: its rows are those of
    /// its snapshot for every key the stream did not change from its low watermark to there.
    pub(crate) fn on_signal(
        &mut self,
        c: &mut SpiClient<'_>,
        sink: &mut dyn Target,
        t: &mut Txn,
        watermark: u64,
        kind: WatermarkKind,
    ) -> TideResult<Option<Emitted>> {
        let Some(mut at) = self.pending.iter().position(|p| p.watermark == watermark) else {
            return Ok(None);
        };
        if kind == WatermarkKind::Low {
            if self.reconciler.on_low_watermark(watermark) {
                self.pending[at].low_lsn = Some(t.lsn);
            }
            return Ok(None);
        }
        let (id, no) = (self.pending[at].backfill_id, self.pending[at].chunk_no);
        if self
            .pending
            .iter()
            .any(|q| q.backfill_id == id && q.chunk_no < no)
        {
            self.pending[at].held = true;
            return Ok(None);
        }
        let mut rows = None;
        loop {
            let p = self.pending.remove(at);
            let Some(n) = self.emit(c, sink, t, &p)? else {
                // Not written: nor are the chunks of its backfill after it.
                self.forget_backfill(id);
                break;
            };
            rows = Some(rows.unwrap_or(0) + n);
            // The backfill's next chunk, when its high watermark has passed.
            let next = self
                .pending
                .iter()
                .enumerate()
                .filter(|(_, q)| q.backfill_id == id)
                .min_by_key(|(_, q)| q.chunk_no);
            match next {
                Some((i, q)) if q.held => at = i,
                _ => break,
            }
        }
        Ok(rows.map(|rows| Emitted { rows }))
    }

    /// Write chunk `p` (its high watermark is reached, and every earlier chunk of its backfill
    /// was written): the rows written, or `None` when it was not written (read again). Once its
    /// progress is recorded and before its rows are written, its backfill's next chunks are
    /// asked of the readers ([`Self::read_ahead`]), so that they are read while it is written.
    fn emit(
        &mut self,
        c: &mut SpiClient<'_>,
        sink: &mut dyn Target,
        t: &mut Txn,
        p: &PendingChunk,
    ) -> TideResult<Option<u64>> {
        let Some(result) = self.reconciler.on_high_watermark(p.watermark) else {
            // LW never seen (cannot happen for a chunk read after its LW committed): read again.
            return Ok(None);
        };
        let rows = if p.truncated { Vec::new() } else { result.rows };
        let dropped = if p.truncated {
            result.read
        } else {
            result.dropped
        };
        if rows.iter().any(|(_, r)| r.batched()) && !still_in_form(sink, p)? {
            return Ok(None);
        }
        // Progress first: if the backfill was cancelled meanwhile, nothing is emitted.
        let mut done = backfills::ChunkDone {
            backfill_id: p.backfill_id,
            chunk_no: p.chunk_no,
            key_from: p.key_from.clone(),
            key_to: p.key_to.clone(),
            low_lsn: p.low_lsn,
            high_lsn: t.lsn,
            rows_read: p.rows_read,
            rows_dropped: dropped,
            rows_emitted: rows.len(),
            is_last: p.is_last,
            read_at: p.read_at,
            table_rows: p.estimate.table_rows,
            key_fraction: p.estimate.key_fraction,
            written_as: None,
        };
        let Some((state, throttle)) = backfills::record_progress(c, &done)? else {
            return Ok(None);
        };
        if state == BackfillState::Running && !p.is_last && throttle.is_none() {
            self.read_ahead(p);
        }
        if p.chunk_no % 100 == 0 {
            backfills::trim_chunks(c, p.backfill_id, p.chunk_no)?;
        }
        let n = rows.len() as u64;
        self.written.push(Written {
            backfill_id: p.backfill_id,
            chunk_no: p.chunk_no,
            relation: p.relation.clone(),
            high_lsn: t.lsn,
        });
        write_rows(c, sink, t, p, rows, &mut done)?;
        backfills::record_chunk(c, &done)?;
        self.chunk_failures = 0;
        Ok(Some(n))
    }

    /// Read ahead (see `read_ahead`): after chunk `p` was written, its backfill's next chunks
    /// are asked of the idle readers, unless some are asked already, to be read while the
    /// iteration goes on: one chunk after the last in memory, or, with several idle readers and
    /// a plan ([`ranges::plan`]) from there, one chunk per planned range and one after the
    /// last bound. Called inside the iteration's transaction (after the progress was written):
    /// the iteration decodes nothing the readers write, and the next step receives their chunks
    /// before the next iteration. Not for a throttled backfill (the worker spaces its chunks
    /// itself).
    fn read_ahead(&mut self, p: &PendingChunk) {
        let id = p.backfill_id;
        if self.readers.iter().any(|r| r.asks_for(id)) {
            return;
        }
        // The next unread chunk: after the backfill's last one in memory, else after `p`.
        let last = self
            .pending
            .iter()
            .filter(|q| q.backfill_id == id)
            .max_by_key(|q| q.chunk_no)
            .unwrap_or(p);
        if last.is_last {
            return;
        }
        let idle: Vec<usize> = (0..self.readers.len())
            .filter(|&i| !self.readers[i].in_flight())
            .collect();
        if idle.is_empty() {
            return;
        }
        let from = last.key_to.clone();
        let cap = self.chunk_cap();
        let bounds = match self.plans.remove(&id) {
            Some((f, b)) if f == from && plannable(&p.job) && self.planned_cap == cap => b,
            _ => Vec::new(),
        };
        // SAFETY: reads this transaction's xid (it has one: it just wrote the progress).
        let writer = unsafe { pg_sys::GetTopTransactionIdIfAny() }.into_inner();
        let mut next = p.job.clone();
        next.chunk_cap = cap;
        next.last_key = from;
        next.chunk_no = last.chunk_no + 1;
        // The planned ranges, then the chunk after the last bound used (or the only one); no
        // more than tops the backfill's chunks in memory up to two per reader (its memory bound:
        // nothing of it is in flight now; one iteration usually writes all of them, but one cut
        // short by its batch size under a backlog would otherwise ask again at each).
        let in_memory = self.pending.iter().filter(|q| q.backfill_id == id).count();
        let m = idle
            .len()
            .min(bounds.len() + 1)
            .min((2 * self.readers.len()).saturating_sub(in_memory));
        if m == 0 {
            return;
        }
        let mut gone = Vec::new();
        for (k, &i) in idle.iter().enumerate().take(m) {
            next.to_key = if k + 1 < m {
                bounds.get(k).cloned()
            } else {
                None
            };
            if let Err(e) = self.readers[i].request(&next, p.form, writer) {
                // Gone: the next step reads the chunk itself (or asks another reader).
                pgrx::log!("pg_tide worker: {e}; it reads the chunks itself");
                gone.push(i);
                break;
            }
            if next.to_key.is_none() {
                break;
            }
            next.last_key = next.to_key.take();
            next.chunk_no += 1;
        }
        for i in gone.into_iter().rev() {
            self.readers.remove(i);
        }
    }

    /// Receive the chunks asked of the readers, then read the next chunk of each backfill that
    /// may progress (`tide.max_parallel_backfills`) and has none in memory, and plan the key
    /// ranges its readers will read next ([`ranges::plan`]). Runs their transactions (two per
    /// chunk read here); call it between stream iterations. `sink` is the pipeline's target,
    /// when it exists yet: it says how it takes the chunks' rows.
    pub fn step(&mut self, pipeline: &str, sink: &mut Option<Box<dyn Target>>) -> TideResult<()> {
        let received = self.receive(pipeline, sink);
        // `tide.read_ahead` turned off or fewer readers (a reload): idle readers go.
        let readers = if crate::gucs::READ_AHEAD.get() {
            crate::gucs::MAX_BACKFILL_READERS.get().max(1) as usize
        } else {
            0
        };
        if self.readers.len() > readers {
            self.readers.truncate(readers);
        }
        received?;
        let parallel = crate::gucs::MAX_PARALLEL_BACKFILLS.get().max(1) as usize;
        if self.readers.len() > 1 && Instant::now() >= self.not_before {
            // Several readers: the next chunks of backfills with none in memory are read by
            // them at once, and received now (asked between iterations, they must be
            // registered before the next one); the worker reads what is left itself.
            self.ask_readers(pipeline, sink, parallel)?;
            self.receive(pipeline, sink)?;
        }
        while self.running() < parallel && Instant::now() >= self.not_before {
            if !self.read_one(pipeline, sink, parallel)? {
                break;
            }
        }
        if self.pending.iter().any(|p| p.job.rows_per_second.is_none()) {
            self.start_readers(pipeline, readers);
        }
        self.plan(pipeline);
        Ok(())
    }

    /// Receive every chunk asked of a reader (each must be registered before the next
    /// iteration decodes further: see `read_ahead`). A reader that is gone is dropped (the
    /// worker reads its chunk itself); the first error registering a chunk is returned after
    /// all were received.
    fn receive(&mut self, pipeline: &str, sink: &mut Option<Box<dyn Target>>) -> TideResult<()> {
        let mut first_error = None;
        let mut gone = Vec::new();
        for i in 0..self.readers.len() {
            if !self.readers[i].in_flight() {
                continue;
            }
            let started = Instant::now();
            match self.readers[i].receive() {
                // Asked by an iteration that failed: dropped; the next step reads again.
                Ok(None) => {}
                Ok(Some((job, read))) => {
                    let read = sweep(sink.as_deref_mut(), &job, read);
                    if let Err(e) = self.register(pipeline, job, read, started) {
                        first_error.get_or_insert(e);
                    }
                }
                Err(e) => {
                    pgrx::log!("pg_tide worker \"{pipeline}\": {e}; it reads the chunks itself");
                    gone.push(i);
                    self.reader_retry = Instant::now() + Duration::from_secs(30);
                }
            }
        }
        for i in gone.into_iter().rev() {
            self.readers.remove(i);
        }
        // Nothing is in flight now: the pruning skipped meanwhile (see `prune`).
        self.prune();
        first_error.map_or(Ok(()), Err)
    }

    /// Ask each idle reader for the next chunk of a backfill that may progress, has no chunk in
    /// memory and no hold, and is not throttled (the worker paces those itself), in the order
    /// `backfills::due` gives them. A backfill whose rows' form cannot be decided now (its
    /// table gone, a remote target that does not answer) is left to the worker's own read.
    fn ask_readers(
        &mut self,
        pipeline: &str,
        sink: &mut Option<Box<dyn Target>>,
        parallel: usize,
    ) -> TideResult<()> {
        let Some(sink) = sink.as_deref_mut() else {
            return Ok(());
        };
        let now = Instant::now();
        self.held.retain(|_, (until, _)| *until > now);
        let busy: HashSet<i64> = self.pending.iter().map(|p| p.backfill_id).collect();
        let room = parallel.saturating_sub(busy.len());
        let idle: Vec<usize> = (0..self.readers.len())
            .filter(|&i| !self.readers[i].in_flight())
            .collect();
        let mut idle = idle.into_iter();
        let due =
            tx::run(|| backfills::due(pipeline, i32::try_from(parallel).unwrap_or(i32::MAX)))?;
        let mut gone = None;
        for mut b in due
            .into_iter()
            .filter(|b| !busy.contains(&b.id) && !is_held(&self.held, b, now))
            .filter(|b| b.rows_per_second.is_none())
            .take(room)
        {
            let Some(i) = idle.next() else {
                break;
            };
            let Ok(Some(form)) = tx::run(|| wanted_form(pipeline, &b, sink)) else {
                continue;
            };
            b.chunk_size = b.chunk_size.max(1);
            b.chunk_cap = self.chunk_cap();
            if let Err(e) = self.readers[i].request(&b, form, 0) {
                pgrx::log!("pg_tide worker \"{pipeline}\": {e}; it reads the chunks itself");
                gone = Some(i);
                break;
            }
        }
        if let Some(i) = gone {
            self.readers.remove(i);
        }
        Ok(())
    }

    /// How many backfills have chunks in memory.
    fn running(&self) -> usize {
        let ids: HashSet<i64> = self.pending.iter().map(|p| p.backfill_id).collect();
        ids.len()
    }

    /// With several readers: plan the key ranges of the next chunks of each backfill in memory
    /// ([`ranges::plan`]) from where its next unread chunk starts, unless planned from there
    /// already. A probe that fails leaves the backfill to read one chunk at a time.
    fn plan(&mut self, pipeline: &str) {
        let cap = self.chunk_cap();
        if self.readers.len() < 2 || self.planned_cap != cap {
            self.plans.clear();
            self.planned_cap = cap;
        }
        if self.readers.len() < 2 {
            return;
        }
        let mut last: HashMap<i64, &PendingChunk> = HashMap::new();
        for p in &self.pending {
            let e = last.entry(p.backfill_id).or_insert(p);
            if p.chunk_no > e.chunk_no {
                *e = p;
            }
        }
        let wanted: Vec<(i64, Option<Vec<String>>, backfills::Due)> = last
            .into_values()
            .filter(|p| !p.is_last && plannable(&p.job))
            .filter(|p| {
                self.plans
                    .get(&p.backfill_id)
                    .is_none_or(|(from, _)| from != &p.key_to)
            })
            .map(|p| (p.backfill_id, p.key_to.clone(), p.job.clone()))
            .collect();
        self.plans
            .retain(|id, _| self.pending.iter().any(|p| p.backfill_id == *id));
        for (id, from, mut job) in wanted {
            job.chunk_cap = cap;
            match ranges::plan(&job, from.as_deref(), self.readers.len() - 1) {
                Ok(bounds) => {
                    self.plans.insert(id, (from, bounds));
                }
                Err(e) => pgrx::log!(
                    "pg_tide worker \"{pipeline}\": cannot plan the next chunks of backfill {id} ({e}); they are read one at a time"
                ),
            }
        }
    }

    /// Read one chunk, of the first backfill that may progress and has no chunk in memory and
    /// no hold ([`Self::held`]): its low watermark, then the chunk and its high watermark.
    /// `false` when there was none to read.
    fn read_one(
        &mut self,
        pipeline: &str,
        sink: &mut Option<Box<dyn Target>>,
        parallel: usize,
    ) -> TideResult<bool> {
        super::origin::ensure_not_held("a backfill chunk's watermarks are written")?;
        let now = Instant::now();
        self.held.retain(|_, (until, _)| *until > now);
        let busy: Vec<i64> = self.pending.iter().map(|p| p.backfill_id).collect();
        let held = self.held.clone();
        let cap = self.chunk_cap();
        let Some(job) = tx::run(|| low_watermark(pipeline, parallel, &busy, &held, cap))? else {
            if self.pending.is_empty() {
                // Nothing to read: look again in a while (start_backfill wakes the worker
                // anyway), or when a throttled backfill's time comes (sooner: it may be paused,
                // cancelled or altered meanwhile).
                let wait = if self.held.is_empty() { 500 } else { 200 };
                let soonest = self.held.values().map(|(until, _)| *until).min();
                let by = now + Duration::from_millis(wait);
                self.not_before = soonest.map_or(by, |s| s.min(by));
                // No backfill: no reader (it would hold a background worker slot for nothing).
                if self.held.is_empty() {
                    self.readers.clear();
                }
            }
            return Ok(false);
        };
        let started = Instant::now();
        let Some(sink) = sink.as_deref_mut() else {
            // No target yet (the first iteration makes it): it decides how the rows are held.
            // The low watermark alone is ignored by the stream.
            self.not_before = Instant::now() + Duration::from_millis(200);
            return Ok(false);
        };
        // The table's lock before the chunk's snapshot (see `tx::run_locked`).
        let read = read_chunk_locked(
            pipeline,
            &job,
            &mut |meta| form_for(sink, job.b.relid, &meta.shape()),
            None,
        );
        let read = sweep(Some(sink), &job, read);
        self.register(pipeline, job, read, started)?;
        Ok(true)
    }

    /// Start readers until there are `wanted`, unless one failed to start lately. Outside a
    /// transaction.
    fn start_readers(&mut self, pipeline: &str, wanted: usize) {
        while self.readers.len() < wanted && Instant::now() >= self.reader_retry {
            match Reader::start(pipeline) {
                Ok(r) => self.readers.push(r),
                Err(e) => {
                    pgrx::log!(
                        "pg_tide worker \"{pipeline}\": no reader ({e}); it reads the chunks itself"
                    );
                    self.reader_retry = Instant::now() + Duration::from_secs(60);
                }
            }
        }
    }

    /// Take a chunk read for `job` (by this worker or its reader): register it with the
    /// reconciler, or note why it could not be read.
    fn register(
        &mut self,
        pipeline: &str,
        job: Job,
        read: TideResult<ChunkRead>,
        started: Instant,
    ) -> TideResult<()> {
        let read = match read {
            Ok(r) => {
                self.waiting_noted.remove(&job.b.id);
                r
            }
            Err(e) if e.retry => {
                pgrx::debug1!(
                    "pg_tide worker \"{pipeline}\": chunk {} of backfill {} is read again later: {}",
                    job.b.chunk_no,
                    job.b.id,
                    e.message
                );
                // Nothing was read: the low watermark alone is ignored by the stream. Say why
                // in tide.backfills (once; the next emitted chunk clears it). The other
                // backfills go on meanwhile.
                self.held.insert(
                    job.b.id,
                    (Instant::now() + Duration::from_millis(200), false),
                );
                if self.waiting_noted.insert(job.b.id) {
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
        // A transaction the stream already delivered that the chunk's snapshot does not see yet
        // (see `DeliveredXids`): its rows may be older than the target's. Read it again.
        if self.delivered.missed_by(job.b.relid, &read.invisible) {
            pgrx::debug1!(
                "pg_tide worker \"{pipeline}\": chunk {} of backfill {} missed a delivered transaction; read again",
                job.b.chunk_no,
                job.b.id
            );
            self.held.insert(
                job.b.id,
                (Instant::now() + Duration::from_millis(20), false),
            );
            return Ok(());
        }
        if let Some(xmin) = read.invisible.xmin {
            self.delivered.forget_before(xmin);
        }
        let n = read.rows.len();
        let key_to = chunk_end(&job.b, &read.rows);
        let mut rows: Vec<(String, Row)> = read.rows.into_iter().map(|r| (r.key, r.row)).collect();
        rows.extend(
            read.deletes
                .into_iter()
                .map(|(k, by_name)| (k, Row::Key(by_name))),
        );
        self.reconciler.add_chunk(job.watermark, job.b.relid, rows);
        // Throttle: spread the rows of this chunk over rows / rows_per_second seconds before
        // this backfill's next chunk (no other backfill waits for it).
        match job.b.rows_per_second {
            Some(rps) if rps > 0 && !read.is_last => {
                self.held.insert(
                    job.b.id,
                    (
                        started + Duration::from_secs_f64(n as f64 / rps as f64),
                        true,
                    ),
                );
            }
            _ => {
                self.held.remove(&job.b.id);
            }
        }
        self.pending.push(PendingChunk {
            watermark: job.watermark,
            backfill_id: job.b.id,
            chunk_no: job.b.chunk_no,
            relid: job.b.relid,
            relation: read.relation,
            key_from: job.b.last_key.clone(),
            key_to,
            rows_read: n,
            is_last: read.is_last,
            read_at: read.read_at,
            held: false,
            low_lsn: None,
            truncated: false,
            columns: read.columns,
            values: read.values,
            attnums: read.attnums,
            invisible: read.invisible,
            estimate: read.estimate,
            job: job.b,
            form: read.form,
        });
        Ok(())
    }
}

/// A resync's chunk at a target in another PostgreSQL: the target's keys in the chunk's key
/// range that the chunk did not find at the source join its rows as deletes (see
/// `chunk::sweep_deletes`; a local table target's are found in the chunk's own snapshot). The
/// target is asked between stream iterations, before the stream reaches the chunk's low
/// watermark; when it cannot answer, the chunk is read again later. Other chunks pass as they are.
fn sweep(
    sink: Option<&mut (dyn Target + 'static)>,
    job: &Job,
    read: TideResult<ChunkRead>,
) -> TideResult<ChunkRead> {
    let mut read = read?;
    if !job.b.resync {
        return Ok(read);
    }
    let Some(sink) = sink else {
        return Err(
            TideError::internal("the target is not ready to sweep a resync's chunk").retry_later(),
        );
    };
    let upper = if read.is_last {
        None
    } else {
        chunk_end(&job.b, &read.rows)
    };
    let found = sink
        .sweep_keys(
            job.b.relid,
            &job.b.key_columns,
            job.b.last_key.as_deref(),
            upper.as_deref(),
        )
        .map_err(TideError::retry_later)?;
    let Some(found) = found else {
        return Ok(read);
    };
    let deletes = tx::run(|| sweep_deletes(job, &read, found))?;
    read.deletes.extend(deletes);
    Ok(read)
}

/// Whether backfill `b` must not be read now: a hold in `held` that has not passed, unless it is
/// a throttle the backfill no longer has.
fn is_held(held: &HashMap<i64, (Instant, bool)>, b: &backfills::Due, now: Instant) -> bool {
    held.get(&b.id).is_some_and(|(until, throttle)| {
        now < *until && (!throttle || b.rows_per_second.is_some_and(|r| r > 0))
    })
}

/// Whether the chunks of backfill `b` may be read on planned key ranges, several at once: not a
/// repair's or a resync's (their deletes are found per chunk range as one reader reads them) nor
/// a throttled one's.
fn plannable(b: &backfills::Due) -> bool {
    b.repair_deletes.is_none() && !b.resync && b.sweep.is_none() && b.rows_per_second.is_none()
}

/// Transaction 1: pick the backfill (the first of those that may progress, [`backfills::due`],
/// that has no chunk in memory, `busy`, and is not held: a hold in `held` that has not passed,
/// unless it is a throttle the backfill no longer has), mark it running, write the LW.
fn low_watermark(
    pipeline: &str,
    parallel: usize,
    busy: &[i64],
    held: &HashMap<i64, (Instant, bool)>,
    cap: Option<i64>,
) -> TideResult<Option<Job>> {
    let now = Instant::now();
    let due = backfills::due(pipeline, i32::try_from(parallel).unwrap_or(i32::MAX))?;
    let Some(mut b) = due
        .into_iter()
        .find(|b| !busy.contains(&b.id) && !is_held(held, b, now))
    else {
        return Ok(None);
    };
    b.chunk_size = b.chunk_size.max(1);
    b.chunk_cap = cap;
    let watermark = backfills::next_watermark(pipeline)?;
    backfills::write_low_watermark(pipeline, b.id, watermark, b.chunk_no)?;
    Ok(Some(Job { watermark, b }))
}

fn fail_backfill(id: i64, e: &TideError) -> TideResult<()> {
    let remedy = e.hint.clone().unwrap_or_else(|| {
        "Fix the cause, then start the backfill again with tide.start_backfill.".to_string()
    });
    backfills::fail(id, &e.message, &e.sqlstate(), &remedy)
}

/// Whether a chunk held in a batch form can still be written so: row values are read with the
/// row type the chunk was read with, so only while the table still has the same columns (no DDL
/// since the read), and the target still takes them (its table has those columns with the same
/// types); COPY text likewise (the target's staging table and upsert are made from the chunk's
/// columns). Otherwise the chunk is read again.
fn still_in_form(sink: &mut dyn Target, p: &PendingChunk) -> TideResult<bool> {
    let attnums = match &p.values {
        Some((_, attnums)) => attnums,
        None => &p.attnums,
    };
    let listed = crate::catalog::tables::columns_of_backfill(p.backfill_id)?;
    let masks = crate::catalog::masks::of_backfill(p.backfill_id)?;
    let same_source = table_meta(p.relid, &[])?.is_some_and(|mut m| {
        if let Some(l) = &listed {
            m.restrict(l);
        }
        if let Some(masks) = &masks {
            m.mask(masks);
        }
        m.shape() == p.columns && &m.attnums == attnums
    });
    if same_source && sink.row_form(p.relid, Some(&p.columns))? == p.form {
        return Ok(true);
    }
    pgrx::log!(
        "pg_tide: {} or its target changed shape while chunk {} of backfill {} waited for its high watermark; reading the chunk again",
        p.relation,
        p.chunk_no,
        p.backfill_id
    );
    Ok(false)
}

/// Write a chunk's surviving `rows` at the current position of `t`: the per-row forms as `read`
/// events (a repair's [`Row::Key`] as a delete), the batch forms as one batch each. Records how
/// they were written in `done`.
fn write_rows(
    c: &mut SpiClient<'_>,
    sink: &mut dyn Target,
    t: &mut Txn,
    p: &PendingChunk,
    rows: Vec<(String, Row)>,
    done: &mut backfills::ChunkDone,
) -> TideResult<()> {
    let mut as_values = Vec::new();
    let (mut copy_text, mut copy_rows) = (String::new(), 0usize);
    for (key, row) in rows {
        let op = match row {
            Row::Value(i) => {
                as_values.push(i);
                continue;
            }
            Row::Copy(line) => {
                copy_text.push_str(&line);
                copy_rows += 1;
                continue;
            }
            // A repair's delete of a key gone at the source.
            Row::Key(_) => Op::Delete,
            Row::None | Row::Json(_) | Row::Jsonb(_) | Row::Text(_) => Op::Read,
        };
        t.position += 1;
        done.written_as = Some(ChunkWrite::Events);
        sink.push(
            c,
            t,
            Event {
                relid: p.relid,
                relation: p.relation.clone(),
                op,
                key: Some(key),
                columns: if op == Op::Read {
                    p.columns.iter().map(|(name, _)| name.clone()).collect()
                } else {
                    Vec::new()
                },
                row,
                unchanged: Vec::new(),
                old: Row::None,
                backfill: Some((p.backfill_id, p.chunk_no)),
                only_where: None,
            },
        )?;
    }
    if let (Some((values, _)), false) = (&p.values, as_values.is_empty()) {
        t.position += i32::try_from(as_values.len()).unwrap_or(i32::MAX);
        done.written_as = Some(sink.write_chunk(
            c,
            t,
            Batch::Values(RowBatch {
                relid: p.relid,
                relation: &p.relation,
                columns: &p.columns,
                rows: values.rows_at(&as_values)?,
                row_type: values.row_type(),
            }),
        )?);
    }
    if copy_rows > 0 {
        let upper = done.key_to.as_deref().ok_or_else(|| {
            TideError::internal(format!(
                "chunk {} of backfill {} has rows but no last key",
                p.chunk_no, p.backfill_id
            ))
        })?;
        t.position += i32::try_from(copy_rows).unwrap_or(i32::MAX);
        done.written_as = Some(sink.write_chunk(
            c,
            t,
            Batch::Copy(CopyBatch {
                relid: p.relid,
                relation: &p.relation,
                columns: &p.columns,
                data: copy_text,
                count: copy_rows,
                lower: done.key_from.as_deref(),
                upper,
            }),
        )?);
    }
    Ok(())
}
