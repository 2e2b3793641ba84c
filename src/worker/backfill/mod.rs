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
//!    as one batch of row values, [`crate::target::RowBatch`], or of COPY text,
//!    [`crate::target::CopyBatch`]), at that position of the stream, in the same target
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
//! reconciler — and written right after that chunk, at that chunk's high watermark; a chunk that
//! is not written (read again, refused by its progress) takes the chunks of its backfill after it
//! along ([`Backfiller::forget_backfill`]). These decisions, with the chunk cap, the plans and
//! the holds, are `tide_core::backfill_schedule`'s (its header is their specification, and
//! `crates/tide-core/tests/reconcile_model.rs` drives it); this module reads and writes.
//! `record_progress` refuses any chunk that does not start where the backfill durably stands,
//! whatever happened.
//!
//! Files: this one, the state and the stream's hooks; [`step`], reading between iterations;
//! [`emit`], writing at a high watermark; [`chunk`], one chunk's read ([`meta`]: the table as it
//! is read); [`read_ahead`], the reader processes; [`ranges`], planned key ranges;
//! [`estimate`], progress estimates; [`row_values`], rows held as row values; [`keyless`],
//! tables without a key, copied whole.
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
//! (`catalog::chunks::record_progress`). Any failed stream iteration forgets the chunks for
//! the same reason.

mod chunk;
mod emit;
mod estimate;
pub(crate) mod keyless;
mod meta;
mod ranges;
mod read_ahead;
mod row_values;
mod step;

use chunk::{chunk_end, read_chunk_locked, sweep_deletes, ChunkRead, Job};
use estimate::Estimate;
use meta::{form_for, wanted_form};

use crate::catalog::{backfills, chunks};
use crate::error::{TideError, TideResult};
use crate::target::{Batch, CopyBatch, Event, Row, RowBatch, RowForm, Target};
use read_ahead::Reader;
use row_values::RowValues;

use crate::worker::tx;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tide_core::backfill_schedule::{
    self as schedule, Action, Holds, Plans, Ready, Schedule, Signal,
};
use tide_core::lsn::Lsn;
use tide_core::model::{BackfillState, ChunkWrite, Op, Txn, WatermarkKind};
use tide_core::snapshot::{DeliveredXids, InvisibleXids};

/// A chunk read and waiting for its high watermark.
struct PendingChunk {
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

/// In-memory backfill state of one worker.
pub struct Backfiller {
    /// The chunks waiting for their high watermark (or held after it), by backfill, and the
    /// reconciler their rows are in (a row to upsert, in the form the target asked for, or a
    /// repair's delete of a key gone at the source, [`Row::Key`]): of at most
    /// `tide.max_parallel_backfills` backfills, one per backfill, or, with several readers, up
    /// to twice `tide.max_backfill_readers` of one backfill. When each is written and what is
    /// forgotten with it is the schedule's (`tide_core::backfill_schedule`).
    sched: Schedule<i64, u32, String, Row, PendingChunk>,
    /// The pipeline's name (set by [`Self::step`], which reads every chunk in memory).
    pipeline: String,
    /// Bounds of the next chunks of a backfill, planned by [`ranges::plan`] after the key its
    /// next unread chunk starts after, with the chunk cap ([`Self::chunk_cap`]) they were
    /// planned with: used when its chunks are next asked of several readers at once.
    plans: Plans<i64, Vec<String>>,
    /// When an iteration last applied source changes (not only chunks): while that is recent,
    /// chunks are capped at `tide.streaming_chunk_size` rows ([`Self::chunk_cap`]).
    stream_at: Option<Instant>,
    /// No chunk is read before then (after a failure, or when nothing was due).
    not_before: Instant,
    /// Backfills whose next chunk waits until then: a throttled one (its pace; `true`: it lapses
    /// when the backfill's throttle is removed), one whose chunk could not be read now (its
    /// table locked, say) or must be read again (a snapshot that missed a delivered
    /// transaction). Each belongs to its backfill only: the others go on.
    held: Holds<i64>,
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
            sched: Schedule::new(),
            pipeline: String::new(),
            plans: Plans::default(),
            stream_at: None,
            not_before: Instant::now(),
            held: Holds::default(),
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
        schedule::chunk_cap(
            i64::from(crate::gucs::STREAMING_CHUNK_SIZE.get()),
            self.stream_at.map(|at| at.elapsed()),
        )
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
        self.sched
            .chunks()
            .any(|(_, p)| self.suspects.contains(&p.backfill_id))
    }

    /// Forget the chunk in memory (after a failed iteration): it will be read again, and so will
    /// the chunks asked of the readers meanwhile (they start after the ones forgotten).
    pub fn forget(&mut self) {
        self.sched.forget_all();
        self.plans.clear();
        for r in &mut self.readers {
            r.drop_in_flight();
        }
    }

    /// Forget every chunk of backfill `id` in memory or asked of a reader: an earlier one was
    /// not written, so they do not start where the backfill durably stands; its next chunk is
    /// read again from there.
    fn forget_backfill(&mut self, id: i64) {
        self.sched.forget_backfill(id);
        self.plans.remove(id);
        for r in &mut self.readers {
            r.drop_in_flight_of(id);
        }
    }

    /// After a failed iteration: forget the chunks in memory ([`Self::forget`]) and, when there
    /// was one, read the next only after a back-off that doubles with each failure in a row (up
    /// to `max`).
    pub fn failed(&mut self, max: Duration) {
        let had_chunk = self.sched.has_chunks() || self.in_flight();
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
        self.held.until_passed(id, Instant::now())
    }

    /// The copy of keyless backfill `id` is read again in `d` at the earliest; `true` the first
    /// time (its waiting reason is then noted in `tide.backfills`).
    pub(crate) fn hold_copy(&mut self, id: i64, d: Duration) -> bool {
        self.held.hold(id, Instant::now() + d, false);
        self.waiting_noted.insert(id)
    }

    /// The copy of keyless backfill `id` was taken.
    pub(crate) fn copy_taken(&mut self, id: i64) {
        self.held.release(id);
        self.waiting_noted.remove(&id);
    }

    /// A transaction the stream delivered for table `relid` that a copy's snapshot `invisible`
    /// does not see (`tide_core::snapshot::copy_misses`).
    pub(crate) fn copy_missed(&self, relid: u32, invisible: &InvisibleXids) -> Option<u32> {
        tide_core::snapshot::copy_misses(&self.delivered, relid, invisible)
    }

    /// Whether a chunk waits for its high watermark.
    pub fn has_pending(&self) -> bool {
        self.sched.has_chunks()
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
        kind == WatermarkKind::High && self.sched.decide(Signal::High(watermark)) == Action::Emit
    }

    /// A change of a captured table, in stream order: it drops the key from every chunk of the
    /// table whose window is open (the reconciler knows each chunk's own window), and from every
    /// chunk of the table whose snapshot could not see `xid`, the changing transaction (it was
    /// in progress then), even before that chunk's low watermark.
    pub fn on_change(&mut self, relid: u32, key: &str, xid: u32) {
        self.delivered.record(relid, xid);
        if !self.sched.has_chunks() {
            return;
        }
        let key = key.to_string();
        let missed: Vec<u64> = (self.sched.chunks())
            .filter(|(_, p)| p.relid == relid && p.invisible.contains(xid))
            .map(|(wm, _)| wm)
            .collect();
        for wm in missed {
            self.sched.drop_key(wm, &key);
        }
        self.sched.on_change(&relid, &key);
    }

    /// A heap rewrite of a captured table, in stream order (its transaction's commit lies after
    /// every high watermark already seen). A chunk of the table still waiting for its high
    /// watermark may hold rows from before or after the rewrite: it is dropped, and the table is
    /// read again from the start (`catalog::reread_after_rewrite`, in the same transaction).
    pub fn on_rewrite(&mut self, relid: u32) {
        if self.sched.chunks().any(|(_, p)| p.relid == relid) {
            self.forget();
        }
    }

    /// A TRUNCATE of a captured table, in stream order.
    /// A TRUNCATE inside the window (or by a transaction the chunk could not see) invalidates
    /// the whole chunk; one the chunk's snapshot already reflects does not.
    pub fn on_truncate(&mut self, relid: u32, xid: u32) {
        self.delivered.record(relid, xid);
        for (_, p) in self.sched.chunks_mut() {
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
        if (self.sched.chunks())
            .any(|(_, p)| p.relid == relid && (p.low_lsn.is_some() || p.invisible.contains(xid)))
        {
            self.forget();
        }
    }
}
