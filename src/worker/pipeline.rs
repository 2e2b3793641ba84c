//! The pipeline worker: one per pipeline, started by the launcher.
//!
//! Owns: reading its slot through pg_tide's output plugin (a [`Decoder`] kept open across
//! iterations), turning the decoded changes into target writes, recording the applied position,
//! and confirming the slot's position.
//!
//! One iteration is one transaction ([`tx::run`]):
//! 1. take the pipeline's lock shared (a concurrent `drop_pipeline` waits for us, and we
//!    wait for it) and read the pipeline and its captured tables;
//! 2. decode from where the previous iteration stopped up to the flush position, or until about
//!    `tide.batch_events` messages (whole source transactions: many per target transaction, never
//!    part of one);
//! 3. skip transactions at or below the applied position (replays after a crash), write the rest
//!    to the target;
//! 4. record the applied position in the same transaction, and commit.
//!
//! Then the slot's confirmed position is moved to what was committed (in memory at once, on disk
//! at the next checkpoint or restart-point change). A crash in between replays transactions the
//! target already has; step 3 skips them: exactly once in effect. Errors abort the iteration,
//! close the decoder (it is reopened at the slot's confirmed position), land in `tide.pipelines`
//! with a remedy and in the log, and the worker retries with exponential back-off; it never exits
//! on an iteration error. Until the stream has passed the last transaction a failed iteration
//! began, each iteration applies one source transaction, so a transaction that fails at the
//! target is named (its commit LSN, for `tide.skip_transaction`) in the remedy.
//!
//! What the loop does between iterations (read a backfill chunk, poll, sleep, back off, exit)
//! is decided by `tide_core::worker_loop::decide`, a pure function whose module header is the
//! loop's specification; this file performs the actions. When the last iteration reached the
//! end of the WAL, the worker waits `tide.poll_interval` and then compares the flush position
//! with its decoder's position: a quiet server costs a comparison per poll, not a transaction.
//! The decoded messages of an iteration are applied by [`crate::worker::apply`], one handler
//! per message.
//!
//! Table membership is exact in stream order: `tide.add_table` writes a marker row in its
//! transaction; changes of the table are delivered from that marker on. A table whose marker the
//! worker reaches while the plugin was not yet sending its changes (`add_table` committed after
//! the iteration read its table list) makes the iteration be done again at once, rolled back,
//! with the decoder reopened on the new list (`apply::Applier::restart`): the table's changes
//! after the marker in that transaction must not be taken as applied. A changed list (whatever
//! changed it) always reopens the decoder.

use crate::catalog;
use crate::catalog::backfills;
use crate::error::{TideError, TideResult};
use crate::gucs;
use crate::shmem::{self, WorkerState};
use crate::target::Target;
use crate::worker::apply::{Outcome, Trail};
use crate::worker::backfill::{Backfiller, Written};
use crate::worker::decoder::{self, Decoder};
use crate::worker::iteration::{
    in_transaction, now_us, resync_lsn, send_resync_marks, Lent, ReadMode,
};
use crate::worker::tx;
use pgrx::bgworkers::*;
use pgrx::prelude::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tide_core::lsn::Lsn;
use tide_core::model::RelDesc;
use tide_core::worker_loop::{decide, Action, Facts, Iteration, Phase, Settings};

/// Main function of a pipeline worker. The pipeline name is in `bgw_extra`, the database OID in
/// the argument.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn tide_pipeline_worker_main(arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    // SIGTERM (pg_terminate_backend, drop_pipeline, alter_pipeline, the launcher, server
    // shutdown) ends the worker at the next CHECK_FOR_INTERRUPTS, even inside a lock wait or a
    // long decoding call: PostgreSQL's die(); whatever the worker was doing is rolled back, the
    // slot was not advanced past it. Between iterations it only asks the worker to leave, which
    // it does at once and normally (see `on_sigterm`).
    // SAFETY: on_sigterm is async-signal-safe (atomics and SetLatch, or PostgreSQL's own die()), as
    // set_signal_handler requires; installed on the main thread at process start.
    unsafe {
        crate::pgver::set_signal_handler(pg_sys::SIGTERM as i32, Some(on_sigterm));
    }
    let name = BackgroundWorker::get_extra().to_string();
    // SAFETY: the worker's argument is a by-value Oid Datum (set at registration by the launcher).
    let dboid = unsafe { pg_sys::Oid::from_datum(arg, false) }.unwrap_or(pg_sys::InvalidOid);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(dboid), None);

    // SAFETY: reads a process global set at process start; main thread.
    let pid = unsafe { pg_sys::MyProcPid };
    let Some(slot_idx) = shmem::claim(&name, pid, now_us()) else {
        log!("pg_tide worker: no free worker slot for pipeline \"{name}\" (at most {} pipelines run at once)", shmem::MAX_PIPELINES);
        return;
    };
    // Free the shared-memory slot however the process ends (FATAL on SIGTERM included).
    // SAFETY: callbacks of before_shmem_exit's signature (#[pg_guard]ed), registered on the main
    // thread; the Datum is the slot index by value.
    unsafe {
        pg_sys::before_shmem_exit(Some(release_slot), pg_sys::Datum::from(slot_idx));
        pg_sys::before_shmem_exit(Some(uncount_worker), pg_sys::Datum::from(0));
    }
    // Counted against its owner, server-wide (crate::quota).
    crate::quota::worker_starts(&name);
    log!("pg_tide worker for pipeline \"{name}\" started");
    // The launcher starts no worker while the SQL objects are of another version; this covers an
    // `ALTER EXTENSION` between its check and this start. The slot keeps the worker's place.
    if let Err(e) = tx::run(tx::output_settings) {
        // Without its pinned search_path the worker must not run a statement as itself.
        log!("pg_tide worker \"{name}\": not running: could not set its session settings: {e}");
        return;
    }
    if let Err(e) = tx::run(catalog::version_gate) {
        log!("pg_tide worker \"{name}\": not running: {e}");
        return;
    }
    // The worker runs the same statements over and over: keep their plans (see crate::sql).
    crate::sql::cache_plans();
    let mut w = Worker::new(name, slot_idx, pid);
    loop {
        pg_sys::check_for_interrupts!();
        let sighup = BackgroundWorker::sighup_received();
        if sighup {
            // SAFETY: rereads the configuration files at a SIGHUP, as PostgreSQL's own processes
            // do, outside any transaction; main thread.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        // Taken before the flush position is read: whatever committed before it is flushed by
        // then (synchronous commit), so a drained reader has applied it (caught_up_at).
        let loop_at = now_us();
        // SAFETY: reads the WAL flush position under its own spinlock (NULL: no timeline wanted);
        // main thread.
        let flush = unsafe { pg_sys::GetFlushRecPtr(std::ptr::null_mut()) };
        let position = w.dec.as_ref().map(|d| d.position());
        let facts = Facts {
            sighup,
            since_iteration: w.last_iteration.elapsed(),
            chunk_waiting: w.bf.has_pending(),
            chunk_in_flight: w.bf.in_flight(),
            decoder_open: position.is_some(),
            wal_ahead: position.is_none_or(|p| flush > p.0),
        };
        // A remote target's lease is renewed by the worker's iterations: failing or paused, it
        // still looks at least that often (see target::table::fence).
        let renew_every = w
            .sink
            .as_deref_mut()
            .and_then(crate::target::as_remote)
            .map(|r| r.renew_every());
        let bound = |d: Duration| renew_every.map_or(d, |r| d.min(r));
        let settings = Settings {
            poll: Duration::from_millis(gucs::POLL_INTERVAL_MS.get().max(1) as u64),
            max_retry_delay: bound(Duration::from_secs(
                gucs::MAX_RETRY_DELAY_S.get().max(0) as u64
            )),
            paused_recheck: bound(tide_core::worker_loop::PAUSED_RECHECK),
        };
        match decide(w.phase, facts, settings) {
            Action::Exit => break,
            Action::ReadChunk => {
                if let Err(e) = w.bf.step(&w.name, &mut w.sink) {
                    log_backfill_error(&w.name, &e);
                }
                w.phase = w.phase.after_read_chunk();
            }
            Action::Sleep {
                wait,
                wake_on_commit,
            } => {
                if !w.sleep(wait, wake_on_commit, position, loop_at) {
                    break;
                }
            }
            Action::Iterate => w.iterate(settings),
        }
    }
    if STOP.load(Ordering::SeqCst) {
        log!(
            "pg_tide worker for pipeline \"{}\" stopping, as asked (SIGTERM)",
            w.name
        );
    }
    close_decoder(&w.name, &mut w.dec, &mut w.rels);
    shmem::release(w.slot_idx, w.pid);
}

/// Set while the main loop waits between iterations ([`Worker::sleep`]: no transaction open,
/// nothing to roll back).
static IDLE: AtomicBool = AtomicBool::new(false);
/// A SIGTERM arrived while [`IDLE`]: the main loop leaves.
static STOP: AtomicBool = AtomicBool::new(false);

/// The worker's SIGTERM handler. Between iterations ([`IDLE`]) it only asks the main loop to
/// leave ([`STOP`], and the latch), so a worker stopped while idle (by `tide.alter_pipeline`, a
/// settings change, `tide.drop_pipeline`, a shutdown: the usual case) exits normally with a LOG
/// line instead of PostgreSQL's FATAL "terminating background worker ... due to administrator
/// command"; at any other time it is PostgreSQL's `die`.
unsafe extern "C-unwind" fn on_sigterm(signal: std::ffi::c_int) {
    if IDLE.load(Ordering::SeqCst) {
        // SAFETY: in a signal handler: atomics and SetLatch (async-signal-safe, as PostgreSQL's
        // own handlers use it) only, errno kept for the interrupted code.
        unsafe {
            let errno = *libc::__errno_location();
            STOP.store(true, Ordering::SeqCst);
            pg_sys::SetLatch(pg_sys::MyLatch);
            *libc::__errno_location() = errno;
        }
    } else {
        // SAFETY: PostgreSQL's own SIGTERM handler, called as a signal handler.
        unsafe { postgres_die(signal) };
    }
}

/// [`BackgroundWorker::wait_latch`] as an idle wait: a SIGTERM meanwhile ends it, and `false`
/// (the worker is to exit), as postmaster death does.
fn idle_wait(timeout: Duration) -> bool {
    IDLE.store(true, Ordering::SeqCst);
    let alive = !STOP.load(Ordering::SeqCst) && BackgroundWorker::wait_latch(Some(timeout));
    IDLE.store(false, Ordering::SeqCst);
    alive && !STOP.load(Ordering::SeqCst)
}

/// A pipeline worker's state across iterations (its main loop's; only the main thread).
struct Worker {
    name: String,
    slot_idx: usize,
    pid: i32,
    bf: Backfiller,
    sink: Option<Box<dyn Target>>,
    dec: Option<Decoder>,
    rels: HashMap<u32, RelDesc>,
    phase: Phase,
    failures: u32,
    /// After a failed iteration: one source transaction per iteration (see
    /// `name_failed_transaction`) until the stream has passed the last transaction the failed
    /// iteration began.
    one_at_a_time_until: Option<Lsn>,
    /// After a read failed on a streamed transaction's messages (`Decoder::stream_failed`): the
    /// flush position then. Decoder sessions do not stream transactions in progress until one
    /// has read past it and holds no transaction (then it is closed, and the next one streams
    /// again): whatever broke the stream, the same transactions are read whole at their commit,
    /// as without streaming (issue 42).
    no_stream_until: Option<Lsn>,
    /// The `add_table` marker (table, commit LSN) that ended the last iteration to be done again
    /// (`Trail::restart`): met again at once, the iteration fails as any other.
    restarted_for: Option<(u32, Lsn)>,
    /// What the last iteration left to know of it, failed or not (see [`Trail`]).
    trail: Trail,
    last_iteration: Instant,
    last_snapshot_log: Instant,
}

impl Worker {
    fn new(name: String, slot_idx: usize, pid: i32) -> Worker {
        Worker {
            name,
            slot_idx,
            pid,
            bf: Backfiller::default(),
            sink: None,
            dec: None,
            rels: HashMap::new(),
            phase: Phase::Iterate,
            failures: 0,
            one_at_a_time_until: None,
            no_stream_until: None,
            restarted_for: None,
            trail: Trail::default(),
            last_iteration: Instant::now(),
            last_snapshot_log: Instant::now(),
        }
    }

    /// Wait `wait` (a commit elsewhere ends it early when `wake_on_commit`; a back-off lasts its
    /// whole time). `position`: the decoder's, read with `loop_at`, recorded as caught up when
    /// the worker is quiet. `false`: the worker is to exit.
    fn sleep(
        &mut self,
        wait: Duration,
        wake_on_commit: bool,
        position: Option<Lsn>,
        loop_at: i64,
    ) -> bool {
        if let (Phase::Quiet { .. }, Some(p)) = (self.phase, position) {
            // Nothing new was written anywhere since the last read, which handed out every
            // transaction committed before `p`.
            shmem::update(self.slot_idx, |w| {
                w.caught_up_lsn = w.caught_up_lsn.max(p.0);
                w.caught_up_at = w.caught_up_at.max(loop_at);
                w.last_poll = now_us();
            });
        }
        // A commit elsewhere wakes a quiet worker (shmem::wake_sleepers); the poll is the
        // fallback. A back-off is not cut short.
        if wake_on_commit {
            shmem::sleeping(self.slot_idx, self.pid);
        }
        let deadline = Instant::now() + wait;
        let mut alive = idle_wait(wait);
        // A back-off lasts its whole time: the latch set meanwhile (the reader's queue, a
        // reload) does not end it early.
        while alive && matches!(self.phase, Phase::Failing { .. }) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            pg_sys::check_for_interrupts!();
            alive = idle_wait(left);
        }
        shmem::awake(self.slot_idx);
        if alive {
            self.phase = self.phase.after_sleep(wake_on_commit);
        }
        alive
    }

    /// The worker's state, lent to an iteration reading the stream as `mode` says.
    fn lend(&mut self, mode: ReadMode) -> Lent<'_> {
        Lent {
            name: &self.name,
            bf: &mut self.bf,
            sink: &mut self.sink,
            dec: &mut self.dec,
            rels: &mut self.rels,
            trail: &mut self.trail,
            mode,
        }
    }

    /// After an iteration that failed on purpose (`Trail::restart`): it is done again at
    /// once, the new table in the decoder's list (see `Applier::restart`); nothing was
    /// applied, nothing failed.
    fn restart(&mut self, e: &TideError) {
        log!("pg_tide worker \"{}\": {e}", self.name);
        self.forget_iteration();
    }

    /// Forget what an iteration that is done again saw (as after a failure): the chunks in
    /// memory saw a stream that will be decoded again, a kept plan may refer to what was rolled
    /// back, the target's and the decoder's state are past what the target has.
    fn forget_iteration(&mut self) {
        self.bf.forget();
        crate::sql::forget_plans();
        if let Some(s) = self.sink.as_mut() {
            s.reset();
        }
        close_decoder(&self.name, &mut self.dec, &mut self.rels);
    }

    /// After a failed iteration: forget what it saw, record the error, back off. `repeated`:
    /// it failed on purpose for the same marker as the iteration before (done again for it).
    fn failed(
        &mut self,
        e: TideError,
        one_at_a_time: bool,
        repeated: bool,
        settings: Settings,
    ) -> Iteration {
        // The chunk in memory may have seen part of a stream that will be replayed, and the
        // decoder has read past what the target has.
        self.bf.failed(settings.max_retry_delay);
        if self.dec.as_ref().is_some_and(|d| d.stream_failed()) {
            // SAFETY: reads the WAL flush position (shared memory, under its spinlock).
            let flushed = Lsn(unsafe { pg_sys::GetFlushRecPtr(std::ptr::null_mut()) });
            self.no_stream_until = Some(self.no_stream_until.map_or(flushed, |u| u.max(flushed)));
            log!(
                "pg_tide worker \"{}\": a streamed transaction could not be read; reading without streaming transactions in progress until past {flushed}",
                self.name
            );
        }
        crate::sql::forget_plans();
        if let Some(s) = self.sink.as_mut() {
            s.reset();
        }
        close_decoder(&self.name, &mut self.dec, &mut self.rels);
        let e = if repeated {
            // Not the transaction's fault: no skip hint, no one-at-a-time mode.
            TideError::internal(format!(
                "{}, but the table was still not in it when the iteration was done again",
                e.message
            ))
            .hint("The worker keeps retrying. The table's row in tide.tables should be there since its add_table committed; if it is, report this as a bug with the server log.")
        } else {
            let last_begun = self.trail.last_begun.filter(|_| one_at_a_time);
            name_failed_transaction(&self.name, e, last_begun)
        };
        // One source transaction per iteration until the stream has passed where this one
        // failed: a failure is then that transaction's, named.
        if let (Some(l), false) = (self.trail.last_begun, repeated) {
            self.one_at_a_time_until = Some(self.one_at_a_time_until.map_or(l, |u| u.max(l)));
        }
        after_failure(&self.name, self.slot_idx, &e, self.failures + 1, settings);
        Iteration::Failed
    }

    /// Past [`Worker::no_stream_until`] with no transaction in the reorder buffer: close the
    /// decoder, so that the next session streams transactions in progress again (it starts at
    /// the confirmed position, with nothing to read again).
    fn stream_again_when_past(&mut self) {
        let Some(until) = self.no_stream_until else {
            return;
        };
        match self.dec.as_ref() {
            Some(d) if d.position() > until && d.idle() => {
                self.no_stream_until = None;
                close_decoder(&self.name, &mut self.dec, &mut self.rels);
                log!(
                    "pg_tide worker \"{}\": past {until}; streaming transactions in progress again",
                    self.name
                );
            }
            // Closed meanwhile (a table added): the next session starts at the confirmed
            // position, still without streaming until it is past.
            _ => {}
        }
    }

    /// One iteration (see [`in_transaction`]) and what follows from its outcome.
    fn iterate(&mut self, settings: Settings) {
        self.last_iteration = Instant::now();
        // Before the iteration reads the flush position it drains up to (o.start_flush).
        let started_at = now_us();
        let chunk_was_waiting = self.bf.has_pending();
        self.trail = Trail::default();
        self.bf.begin_iteration();
        // While a chunk of a backfill suspected of a failure waits, its high watermark is an
        // iteration of its own (see `blame_chunks`).
        let one_at_a_time = self.one_at_a_time_until.is_some() || self.bf.isolating();
        let mode = ReadMode {
            one_at_a_time,
            streaming: self.no_stream_until.is_none(),
        };
        let result = tx::run(|| in_transaction(self.lend(mode)));
        // Held only inside an iteration (see worker::origin).
        super::origin::release();
        let written = self.bf.take_written();
        if result.is_ok() {
            for w in &written {
                self.bf.acquit(w.backfill_id);
            }
        }
        let met = self.trail.restart.take().filter(|_| result.is_err());
        let restart = met.filter(|r| self.restarted_for != Some(*r));
        // The same marker right after the iteration was done again for it: a real failure.
        let repeated = met.is_some() && restart.is_none();
        self.restarted_for = restart;
        let blame = match &result {
            Err(e) if restart.is_none() => self.blame_chunks(e, &written, one_at_a_time),
            _ => Blame::None,
        };
        let it = match result {
            Err(e) if restart.is_some() => {
                self.restart(&e);
                // At once, whatever a chunk waits for; the failures in a row stay as they were.
                self.phase = Phase::Iterate;
                return;
            }
            Ok(o) if o.gone => {
                log!(
                    "pg_tide worker: pipeline \"{}\" was dropped; exiting",
                    self.name
                );
                Iteration::Gone
            }
            Ok(Outcome {
                slot_lost: Some(lost),
                ..
            }) => {
                // Nothing of the old slot may be used again: the decoder, a chunk in memory (its
                // backfill is cancelled), the target's state.
                close_decoder(&self.name, &mut self.dec, &mut self.rels);
                self.bf.forget();
                self.sink = None;
                crate::sql::forget_plans();
                after_slot_lost(&self.name, lost, self.slot_idx, self.failures + 1, settings)
            }
            Ok(o) if o.paused => {
                // A paused pipeline does not hold its slot.
                if self.dec.is_some() {
                    close_decoder(&self.name, &mut self.dec, &mut self.rels);
                }
                shmem::update(self.slot_idx, |w| {
                    w.state = WorkerState::Paused;
                    w.drained = true;
                    w.last_poll = now_us();
                });
                Iteration::Paused
            }
            Ok(o) => {
                if self
                    .one_at_a_time_until
                    .is_some_and(|u| o.advance.is_some_and(|a| a > u))
                {
                    self.one_at_a_time_until = None;
                }
                self.bf.prune();
                self.bf
                    .stream_applied(o.events.saturating_sub(o.backfill_rows) > 0);
                after_success(
                    &self.name,
                    self.slot_idx,
                    started_at,
                    &o,
                    &mut self.dec,
                    &mut self.rels,
                    &mut self.last_snapshot_log,
                );
                self.stream_again_when_past();
                Iteration::Done { drained: o.drained }
            }
            Err(_) if blame == Blame::Refused => {
                // The target refused a chunk, and its backfill failed: the stream goes on at
                // once, without it.
                self.forget_iteration();
                self.phase = Phase::Iterate;
                return;
            }
            // (A chunk's own failure names no source transaction to skip.)
            Err(e) => self.failed(
                e,
                one_at_a_time && blame != Blame::Chunk,
                repeated,
                settings,
            ),
        };
        self.phase =
            Phase::after_iteration(it, chunk_was_waiting, self.bf.has_pending(), self.failures);
        self.failures = self.phase.failures();
    }
}

impl Worker {
    /// After a failed iteration that wrote backfill chunks (`written`): count the failed write
    /// on each one's backfill, with the error, in `tide.backfills`. When the iteration applied
    /// nothing but the high watermark of one backfill's chunks (`one_at_a_time`: one source
    /// transaction, and it is the watermark's), the failure is theirs: the target refusing
    /// them (`tide_core::worker_loop::chunk_refused`) fails the backfill, with the remedy, and
    /// [`Blame::Refused`] is returned: the stream goes on. Otherwise the backfill is suspected:
    /// its next chunk is written in an iteration of its own (`Backfiller::isolating`), and a
    /// chunk that fails for a passing reason is written again with back-off.
    fn blame_chunks(&mut self, e: &TideError, written: &[Written], one_at_a_time: bool) -> Blame {
        if written.is_empty() || e.pause_pipeline {
            return Blame::None;
        }
        let last = self.trail.last_begun;
        let alone = one_at_a_time && written.iter().all(|w| Some(w.high_lsn) == last);
        let sqlstate = e.sqlstate();
        let refused = alone && !e.retry && tide_core::worker_loop::chunk_refused(&sqlstate);
        let message = match &e.detail {
            Some(d) => format!("{} ({d})", e.message),
            None => e.message.clone(),
        };
        let mut seen = HashSet::new();
        for w in written.iter().filter(|w| seen.insert(w.backfill_id)) {
            let remedy = chunk_remedy(&self.name, w, alone, refused);
            let id = w.backfill_id;
            match tx::run(|| backfills::chunk_failed(id, &message, &sqlstate, &remedy, refused)) {
                Ok(attempts) => log!(
                    "pg_tide worker \"{}\": {} chunk {} of backfill {id} ({}) failed (SQLSTATE {sqlstate}, attempt {}): {message}. Hint: {remedy}",
                    self.name,
                    if refused { "the target refused" } else { "writing" },
                    w.chunk_no,
                    w.relation,
                    attempts.unwrap_or(0)
                ),
                Err(e2) => log!(
                    "pg_tide worker \"{}\": could not record the failed chunk of backfill {id}: {e2}",
                    self.name
                ),
            }
            if refused {
                self.bf.acquit(id);
            } else {
                self.bf.suspect(id);
            }
        }
        match (refused, alone) {
            (true, _) => Blame::Refused,
            (false, true) => Blame::Chunk,
            (false, false) => Blame::Suspected,
        }
    }
}

/// Whose a failed iteration is, as far as backfill chunks go ([`Worker::blame_chunks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Blame {
    /// No chunk was written in it (or it paused the pipeline).
    None,
    /// A chunk was written among other transactions: suspected.
    Suspected,
    /// Only a chunk was written in it, and it failed for a passing reason.
    Chunk,
    /// Only a chunk was written in it, and the target refused it: its backfill failed.
    Refused,
}

/// The remedy of a failed write of chunk `w` (see [`Worker::blame_chunks`]).
fn chunk_remedy(pipeline: &str, w: &Written, alone: bool, refused: bool) -> String {
    let literal = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let (rel, p) = (literal(&w.relation), literal(pipeline));
    if refused {
        format!(
            "The target refused a row of chunk {} of this backfill, and the backfill stopped there; the stream goes on. Fix the row at the target or at the source (the error names it), then SELECT tide.resume_backfill({rel}, {p}); reads the chunk again and goes on; or give the rest of the backfill up: SELECT tide.cancel_backfill({rel}, {p});",
            w.chunk_no
        )
    } else if alone {
        "Writing the chunk failed for a passing reason (see the SQLSTATE); the worker writes it again with back-off.".to_string()
    } else {
        "The iteration that wrote this chunk failed (tide.pipelines has its error); the worker writes the chunk again in an iteration of its own: if the target refuses it then, the backfill fails with the error.".to_string()
    }
}

/// After an iteration found the slot lost: recover ([`recover`]), and log what it did or record
/// why it could not (the `failures`-th failure in a row).
fn after_slot_lost(
    name: &str,
    lost: catalog::slots::SlotLost,
    slot_idx: usize,
    failures: u32,
    settings: Settings,
) -> Iteration {
    match recover(name, lost) {
        Ok(notes) => {
            for note in notes {
                log!("pg_tide worker \"{name}\": {note}");
            }
            Iteration::Done { drained: false }
        }
        Err(e) => {
            after_failure(name, slot_idx, &e, failures, settings);
            Iteration::Failed
        }
    }
}

/// Recover a lost slot (see `catalog::slots`, steps 1 to 4), each step in a transaction of its
/// own: record the loss; under `tide.on_slot_lost = 'error'` stop there with the error; else
/// create a new slot, then queue the resync. Returns lines for the server log. A crash at any
/// point leaves `resync = 'slot lost'`, and the next iteration starts here again.
fn recover(name: &str, lost: catalog::slots::SlotLost) -> TideResult<Vec<String>> {
    tx::run(|| catalog::slots::mark_lost(name, &lost.reason))?;
    if gucs::ON_SLOT_LOST.get() == gucs::OnSlotLost::Error {
        return Err(lost.error);
    }
    let mut notes = vec![format!(
        "{}; creating a new slot and reading every table again (tide.on_slot_lost = 'resync')",
        lost.reason
    )];
    let mut created = tx::run(|| catalog::slots::create_new_slot(name));
    if let Ok(catalog::slots::NewSlot::Dropped) = created {
        created = tx::run(|| catalog::slots::create_new_slot(name));
    }
    let lsn = match created {
        Ok(catalog::slots::NewSlot::Created(lsn)) => lsn,
        // Gone, or recovered meanwhile; or dropped again (someone re-created it): next time.
        Ok(_) => return Ok(notes),
        Err(e) => {
            // A creation that failed half-way leaves the new (ephemeral) slot held by this
            // process: releasing it drops it.
            if let Err(e2) = decoder::release_after_error(None) {
                log!("pg_tide worker \"{name}\": could not release a slot whose creation failed: {e2}");
            }
            return Err(e);
        }
    };
    notes.extend(tx::run(|| {
        let queued = catalog::slots::queue_resync(name, &lsn)?;
        if queued.is_some() {
            announce_resync_start(name, &lsn)?;
        }
        Ok(queued)
    })?);
    Ok(notes)
}

/// A kafka pipeline's `resync` start events (an outbox's are written by `queue_resync`): sent,
/// and acknowledged by the broker, inside the transaction that marks the pipeline `resyncing`,
/// as the pseudo transaction (xid 0) at the WAL page where the new slot starts (`lsn`; see
/// [`resync_lsn`]). If that transaction does not commit, the recovery starts again and sends
/// them again, still before any row read again.
fn announce_resync_start(name: &str, lsn: &str) -> TideResult<()> {
    Spi::connect_mut(|c| {
        let marks = catalog::slots::kafka_marks(c, name, catalog::slots::Phase::Start)?;
        if marks.is_empty() {
            return Ok(());
        }
        let Some(p) = catalog::pipelines::lock_pipeline(c, name)? else {
            return Ok(());
        };
        let lsn = lsn.parse::<Lsn>().map_err(|_| {
            TideError::internal(format!("a new slot starts at \"{lsn}\", not an LSN"))
        })?;
        let mut sink = crate::target::for_pipeline(&p)?;
        send_resync_marks(c, &mut *sink, resync_lsn(lsn, false), marks)?;
        sink.commit(c, name, None, crate::target::CommitPoint::End)
    })
}

/// Bookkeeping after a successful iteration: its log lines, a standby snapshot while busy, the
/// slot's confirmed position, the decoder reopen, and the worker's shared-memory state.
fn after_success(
    name: &str,
    slot_idx: usize,
    started_at: i64,
    o: &Outcome,
    dec: &mut Option<Decoder>,
    rels: &mut HashMap<u32, RelDesc>,
    last_snapshot_log: &mut Instant,
) {
    for note in &o.notes {
        log!("pg_tide worker \"{name}\": {note}");
    }
    if o.spilled > 0 {
        log!(
            "pg_tide worker \"{name}\": {} bytes of decoded changes went to a temporary file (more than logical_decoding_work_mem in one read)",
            o.spilled
        );
    }
    if let Some(lsn) = o.advance {
        if !o.drained
            && last_snapshot_log.elapsed()
                >= Duration::from_millis(gucs::SNAPSHOT_INTERVAL_MS.get().max(1) as u64)
        {
            *last_snapshot_log = Instant::now();
            // The slot's restart point (where a reopened decoder starts, and up to which WAL is
            // retained) moves only at running-transactions records, which the background writer
            // logs about every 15 s. While busy, log one now, as pg_log_standby_snapshot() does
            // in PostgreSQL 16.
            if let Err(e) = tx::run(|| {
                // SAFETY: inside the transaction tx::run opened, as pg_log_standby_snapshot calls
                // it; main thread.
                unsafe { pg_sys::LogStandbySnapshot() };
                Ok(())
            }) {
                warning!("pg_tide worker \"{name}\": could not log a standby snapshot: {e}");
            }
        }
        if let Some(d) = dec.as_mut() {
            if let Err(e) = tx::run(|| {
                d.confirm(lsn);
                Ok(())
            }) {
                // The target already has the data; a replay would skip it.
                warning!("pg_tide worker \"{name}\": could not confirm the slot's position: {e}");
            }
        }
    }
    if o.reopen {
        close_decoder(name, dec, rels);
    }
    let standby_wait = dec.as_ref().and_then(|d| d.standby_wait);
    shmem::update(slot_idx, |w| {
        w.state = if standby_wait.is_some() {
            WorkerState::WaitingForStandby
        } else {
            WorkerState::Streaming
        };
        w.events += o.events;
        w.txns += o.txns;
        if let Some(t) = o.last_commit_time {
            w.last_commit_time = t;
        }
        w.drained = o.drained;
        // Decoding is in commit order: everything committed before the position the slot may
        // be confirmed at has been applied (or had nothing to apply).
        if let Some(high) = &o.advance {
            w.caught_up_lsn = w.caught_up_lsn.max(high.0);
        }
        if o.drained {
            w.caught_up_lsn = w.caught_up_lsn.max(o.start_flush.0);
            w.caught_up_at = w.caught_up_at.max(started_at);
        }
        w.last_poll = now_us();
    });
}

/// The error of an iteration that applied one source transaction at most and failed inside it,
/// the one that began last at `last_begun`: its hint names the transaction's commit LSN and how
/// to skip it. A pipeline paused on purpose (a schema change) is left as it is.
fn name_failed_transaction(name: &str, mut e: TideError, last_begun: Option<Lsn>) -> TideError {
    let Some(lsn) = last_begun else {
        return e;
    };
    if e.pause_pipeline {
        return e;
    }
    let skip = format!(
        "The source transaction that failed committed at {lsn}; the pipeline retries it by itself once the cause is fixed, or give it up (its changes never reach the target): SELECT tide.skip_transaction('{name}', '{lsn}');"
    );
    e.hint = Some(match e.hint.take() {
        Some(h) => format!("{h} {skip}"),
        None => skip,
    });
    e
}

/// After a failed iteration (the `failures`-th in a row): pause the pipeline if retrying cannot
/// help, log with the back-off, record the error for `tide.pipelines`.
fn after_failure(name: &str, slot_idx: usize, e: &TideError, failures: u32, s: Settings) {
    if e.slot_lost {
        // The next iteration recovers the slot: a new one, every table read again.
        let reason = e.detail.as_deref().unwrap_or(&e.message);
        if let Err(e2) = tx::run(|| catalog::slots::mark_lost(name, reason)) {
            log!("pg_tide worker \"{name}\": could not record the lost slot: {e2}");
        }
    }
    if e.pause_pipeline {
        // Retrying cannot help until the user acts: pause, keep the reason.
        if let Err(e2) = tx::run(|| catalog::pipelines::pause_for(name)) {
            log!("pg_tide worker \"{name}\": could not pause the pipeline: {e2}");
        }
        // Each re-read on its own: one that cannot be queued (the table dropped meanwhile)
        // neither undoes the pause nor keeps the others from being queued.
        for &relid in &e.reread_after_resume {
            if let Err(e2) = tx::run(|| crate::api::backfill::reread_after_resume(name, relid)) {
                log!("pg_tide worker \"{name}\": could not queue the re-read of relation {relid}: {e2}");
            }
        }
    }
    let delay = tide_core::worker_loop::backoff(failures.min(16), s.max_retry_delay);
    log!(
        "pg_tide worker \"{name}\": iteration failed (SQLSTATE {}): {e}; retrying in {:.1} s{}",
        e.sqlstate(),
        delay.as_secs_f64(),
        e.hint
            .as_deref()
            .map(|h| format!(". Hint: {h}"))
            .unwrap_or_default()
    );
    if let Err(e2) = tx::run(|| catalog::pipelines::record_error(name, e)) {
        log!("pg_tide worker \"{name}\": could not record the error: {e2}");
    }
    shmem::update(slot_idx, |w| {
        w.state = WorkerState::Error;
        w.last_poll = now_us();
    });
}

/// Free the decoding context and release the slot; the next iteration opens a new one at the
/// slot's confirmed position.
fn close_decoder(name: &str, dec: &mut Option<Decoder>, rels: &mut HashMap<u32, RelDesc>) {
    rels.clear();
    if let Err(e) = decoder::release_after_error(dec.take()) {
        log!("pg_tide worker \"{name}\": could not close its decoder: {e}");
    }
}

fn log_backfill_error(name: &str, e: &TideError) {
    log!(
        "pg_tide worker \"{name}\": reading a backfill chunk failed (SQLSTATE {}): {e}{}",
        e.sqlstate(),
        e.hint
            .as_deref()
            .map(|h| format!(". Hint: {h}"))
            .unwrap_or_default()
    );
}

extern "C-unwind" {
    /// PostgreSQL's own SIGTERM handler (pgrx's `pg_sys::die` is a guarded Rust wrapper, not a
    /// signal handler).
    #[link_name = "die"]
    fn postgres_die(signal: std::ffi::c_int);
}

#[pg_guard]
unsafe extern "C-unwind" fn release_slot(_code: std::ffi::c_int, arg: pg_sys::Datum) {
    // SAFETY: reads a process global set at process start; before_shmem_exit callbacks run on the
    // main thread.
    shmem::release(arg.value(), unsafe { pg_sys::MyProcPid });
}

/// `before_shmem_exit` callback: this worker and its readers no longer count against its
/// pipeline's owner (`crate::quota`).
#[pg_guard]
unsafe extern "C-unwind" fn uncount_worker(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    crate::quota::worker_exits();
}
