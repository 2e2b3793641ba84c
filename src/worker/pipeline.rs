//! The pipeline worker: one per pipeline, started by the launcher.
//!
//! Owns: reading its slot through pg_tide's output plugin (a [`Decoder`] kept open across
//! iterations), turning the decoded changes into target writes, recording the applied position,
//! and confirming the slot's position.
//!
//! One iteration is one transaction ([`tx::run`]):
//! 1. take the pipeline's advisory lock shared (a concurrent `drop_pipeline` waits for us, and we
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
//! on an iteration error.
//!
//! Between iterations, when the last one reached the end of the WAL, the worker waits
//! `tide.poll_interval` and then compares the flush position with its decoder's position: a quiet
//! server costs a comparison per poll, not a transaction.
//!
//! Table membership is exact in stream order: `tide.add_table` writes a pg_tide logical message
//! in its own transaction; changes of the table are delivered from that message on. A table
//! whose message the worker reaches while the plugin was not yet filtering for it ends the
//! iteration at that transaction, and the decoder is reopened with the new table list (the same
//! happens whenever the list changes).

use crate::catalog::{self, PipelineRow};
use crate::error::{TideError, TideResult};
use crate::gucs;
use crate::shmem::{self, WorkerState};
use crate::sink::{Event, Sink};
use crate::worker::backfill::Backfiller;
use crate::worker::decoder::{self, Decoder};
use crate::worker::tx;
use pgrx::bgworkers::*;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tide_core::json;
use tide_core::lsn::Lsn;
use tide_core::model::{Op, OwnedColumn, RelDesc, Txn, WatermarkKind};
use tide_core::wire::{self, Message, Tuple};

/// What one successful iteration did.
#[derive(Default)]
struct Outcome {
    gone: bool,
    paused: bool,
    events: u64,
    txns: u64,
    last_commit_time: Option<i64>,
    /// Where the slot may be confirmed (everything committed before it is applied).
    advance: Option<Lsn>,
    /// The decoder must be reopened (its table list is out of date).
    reopen: bool,
    /// The iteration consumed everything the slot had when it started.
    drained: bool,
    /// WAL flush position read before decoding started.
    start_flush: Lsn,
    /// Backfill rows emitted at high watermarks.
    backfill_rows: u64,
    /// Bytes of decoded output that went to a temporary file.
    spilled: u64,
    /// Lines for the server log, written once the iteration's transaction has ended (LOG is
    /// quieted inside it, see `iterate`).
    notes: Vec<String>,
}

/// Main function of a pipeline worker. The pipeline name is in `bgw_extra`, the database OID in
/// the argument.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn tide_pipeline_worker_main(arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    // SIGTERM (pg_terminate_backend, drop_pipeline, server shutdown) ends the worker at the next
    // CHECK_FOR_INTERRUPTS, even inside a lock wait or a long decoding call: PostgreSQL's die().
    // Whatever the worker was doing is rolled back; the slot was not advanced past it.
    unsafe {
        pg_sys::pqsignal(pg_sys::SIGTERM as i32, Some(postgres_die));
    }
    let name = BackgroundWorker::get_extra().to_string();
    let dboid = unsafe { pg_sys::Oid::from_datum(arg, false) }.unwrap_or(pg_sys::InvalidOid);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(dboid), None);

    let pid = unsafe { pg_sys::MyProcPid };
    let Some(slot_idx) = shmem::claim(&name, pid, now_us()) else {
        log!("pg_tide worker: no free worker slot for pipeline \"{name}\" (at most {} pipelines run at once)", shmem::MAX_PIPELINES);
        return;
    };
    // Free the shared-memory slot however the process ends (FATAL on SIGTERM included).
    unsafe {
        pg_sys::before_shmem_exit(Some(release_slot), pg_sys::Datum::from(slot_idx));
    }
    log!("pg_tide worker for pipeline \"{name}\" started");
    // The launcher starts no worker while the SQL objects are of another version; this covers an
    // `ALTER EXTENSION` between its check and this start. The slot keeps the worker's place.
    if let Err(e) = tx::run(crate::catalog::version_gate) {
        log!("pg_tide worker \"{name}\": not running: {e}");
        return;
    }
    // Deterministic text output for every value the worker renders (stream and backfill alike).
    if let Err(e) = tx::run(|| {
        crate::sql::text_rows(
            "SELECT set_config('DateStyle', 'ISO, YMD', false), set_config('IntervalStyle', 'postgres', false),
                    set_config('extra_float_digits', '1', false), set_config('bytea_output', 'hex', false),
                    set_config('TimeZone', 'UTC', false)",
            &[],
            1,
            false,
        )
    }) {
        log!("pg_tide worker \"{name}\": could not set output settings: {e}");
    }
    // Mark this worker's transactions (its target writes above all) as pg_tide's.
    if let Err(e) = tx::run(|| super::origin::setup(&name)) {
        warning!(
            "pg_tide worker \"{name}\": could not set up its replication origin, so its writes to table targets are decoded like any other change: {e}"
        );
    }

    let mut failures: u32 = 0;
    let mut bf = Backfiller::default();
    let mut last_snapshot_log = std::time::Instant::now();
    let mut sink: Option<Sink> = None;
    let mut dec: Option<Decoder> = None;
    let mut rels: HashMap<u32, RelDesc> = HashMap::new();
    // The last iteration reached the end of the WAL and no chunk waits: poll cheaply.
    let mut quiet = false;
    let mut last_iteration = std::time::Instant::now();
    loop {
        pg_sys::check_for_interrupts!();
        let sighup = BackgroundWorker::sighup_received();
        if sighup {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        if quiet && !sighup && last_iteration.elapsed() < FULL_ITERATION_EVERY {
            if let Some(d) = dec.as_ref() {
                if !bf.has_pending() {
                    if let Err(e) = bf.step(&name) {
                        log_backfill_error(&name, &e);
                    }
                }
                let flush = unsafe { pg_sys::GetFlushRecPtr(std::ptr::null_mut()) };
                let position = d.position();
                if !bf.has_pending() && flush <= position.0 {
                    // Nothing new was written anywhere since the last read, which handed out
                    // every transaction committed before `position`.
                    shmem::update(slot_idx, |w| {
                        w.caught_up_lsn = w.caught_up_lsn.max(position.0);
                        w.last_poll = now_us();
                    });
                    let wait = Duration::from_millis(gucs::POLL_INTERVAL_MS.get().max(1) as u64);
                    // A commit elsewhere wakes us (shmem::wake_sleepers); the poll is the fallback.
                    shmem::sleeping(slot_idx, pid);
                    let alive = BackgroundWorker::wait_latch(Some(wait));
                    shmem::awake(slot_idx);
                    if !alive {
                        break;
                    }
                    continue;
                }
            }
        }
        last_iteration = std::time::Instant::now();
        quiet = false;
        let chunk_waiting = bf.has_pending();
        let result = tx::run(|| iterate(&name, &mut bf, &mut sink, &mut dec, &mut rels));
        let wait: Duration = match result {
            Ok(o) if o.gone => {
                log!("pg_tide worker: pipeline \"{name}\" was dropped; exiting");
                break;
            }
            Ok(o) if o.paused => {
                failures = 0;
                // A paused pipeline does not hold its slot.
                if dec.is_some() {
                    close_decoder(&name, &mut dec, &mut rels);
                }
                shmem::update(slot_idx, |w| {
                    w.state = WorkerState::Paused;
                    w.drained = true;
                    w.last_poll = now_us();
                });
                Duration::from_secs(10)
            }
            Ok(o) => {
                failures = 0;
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
                        last_snapshot_log = std::time::Instant::now();
                        // The slot's restart point (where a reopened decoder starts, and up to
                        // which WAL is retained) moves only at running-transactions records,
                        // which the background writer logs about every 15 s. While busy, log one
                        // now, as pg_log_standby_snapshot() does in PostgreSQL 16.
                        if let Err(e) = tx::run(|| {
                            unsafe { pg_sys::LogStandbySnapshot() };
                            Ok(())
                        }) {
                            warning!(
                                "pg_tide worker \"{name}\": could not log a standby snapshot: {e}"
                            );
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
                    close_decoder(&name, &mut dec, &mut rels);
                }
                shmem::update(slot_idx, |w| {
                    w.state = WorkerState::Streaming;
                    w.events += o.events;
                    w.txns += o.txns;
                    if let Some(t) = o.last_commit_time {
                        w.last_commit_time = t;
                    }
                    w.drained = o.drained;
                    // Decoding is in commit order: everything committed before the position
                    // the slot may be confirmed at has been applied (or had nothing to apply).
                    if let Some(high) = &o.advance {
                        w.caught_up_lsn = w.caught_up_lsn.max(high.0);
                    }
                    if o.drained {
                        w.caught_up_lsn = w.caught_up_lsn.max(o.start_flush.0);
                    }
                    w.last_poll = now_us();
                });
                // Between iterations: read the next backfill chunk when one is due. Its high
                // watermark is then in the WAL, so the next iteration runs at once.
                //
                // Not right after the iteration that wrote a chunk, though: what committed
                // while the chunk was written goes first (one more, short, iteration), so the
                // stream waits for at most one of the two, never for both back to back.
                let chunk_written = chunk_waiting && !bf.has_pending();
                let mut stepped = false;
                if !bf.has_pending() && !chunk_written {
                    match bf.step(&name) {
                        Ok(()) => stepped = bf.has_pending(),
                        Err(e) => log_backfill_error(&name, &e),
                    }
                }
                if o.drained && !stepped && !chunk_written {
                    quiet = !bf.has_pending() && dec.is_some();
                    Duration::from_millis(gucs::POLL_INTERVAL_MS.get().max(1) as u64)
                } else {
                    Duration::ZERO
                }
            }
            Err(e) => {
                // The chunk in memory may have seen part of a stream that will be replayed, and
                // the decoder has read past what the target has.
                bf.forget();
                if let Some(s) = sink.as_mut() {
                    s.reset();
                }
                close_decoder(&name, &mut dec, &mut rels);
                if e.pause_pipeline {
                    // Retrying cannot help until the user acts: pause, keep the reason.
                    if let Err(e2) = tx::run(|| catalog::pause_for(&name)) {
                        log!("pg_tide worker \"{name}\": could not pause the pipeline: {e2}");
                    }
                }
                failures = (failures + 1).min(16);
                let delay = Duration::from_millis(
                    (250u64 << failures.min(10)).min(gucs::MAX_RETRY_DELAY_S.get() as u64 * 1000),
                );
                log!(
                    "pg_tide worker \"{name}\": iteration failed (SQLSTATE {}): {e}; retrying in {:.1} s{}",
                    e.sqlstate(),
                    delay.as_secs_f64(),
                    e.hint.as_deref().map(|h| format!(". Hint: {h}")).unwrap_or_default()
                );
                if let Err(e2) = tx::run(|| catalog::record_error(&name, &e)) {
                    log!("pg_tide worker \"{name}\": could not record the error: {e2}");
                }
                shmem::update(slot_idx, |w| {
                    w.state = WorkerState::Error;
                    w.last_poll = now_us();
                });
                delay
            }
        };
        if !wait.is_zero() {
            // Waiting for WAL (quiet) can be cut short by a commit; a back-off cannot.
            if quiet {
                shmem::sleeping(slot_idx, pid);
            }
            let alive = BackgroundWorker::wait_latch(Some(wait));
            shmem::awake(slot_idx);
            if !alive {
                break;
            }
        }
        if wait.is_zero() {
            pg_sys::check_for_interrupts!();
        }
    }
    close_decoder(&name, &mut dec, &mut rels);
    shmem::release(slot_idx, pid);
}

/// A quiet worker still runs a full iteration this often (it notices a pause or a due backfill
/// chunk even when nothing writes WAL).
const FULL_ITERATION_EVERY: Duration = Duration::from_secs(1);

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
    shmem::release(arg.value(), unsafe { pg_sys::MyProcPid });
}

fn now_us() -> i64 {
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// One iteration, inside a transaction.
fn iterate(
    name: &str,
    bf: &mut Backfiller,
    sink: &mut Option<Sink>,
    dec: &mut Option<Decoder>,
    rels: &mut HashMap<u32, RelDesc>,
) -> TideResult<Outcome> {
    Spi::connect_mut(|c| {
        let Some(p) = catalog::lock_pipeline(c, name)? else {
            return Ok(Outcome {
                gone: true,
                ..Default::default()
            });
        };
        if !p.enabled {
            return Ok(Outcome {
                paused: true,
                ..Default::default()
            });
        }
        if p.confirmed_lsn.is_none() {
            return Err(TideError::undefined(format!("replication slot \"{}\" of pipeline \"{name}\" does not exist", p.slot_name))
                .hint(format!("The slot was dropped behind pg_tide's back. Drop and re-create the pipeline: SELECT tide.drop_pipeline('{name}'); SELECT tide.create_pipeline('{name}');")));
        }
        catalog::allow_output_plugin()?;
        // Opening a decoder logs "starting logical decoding for slot" and the snapshot builder
        // logs its progress, at LOG. Quiet them for this transaction only (the worker's own
        // messages are logged after the transaction ends).
        crate::sql::one::<String>("SELECT set_config('log_min_messages', 'fatal', true)", &[])?;
        if sink.is_none() {
            *sink = Some(Sink::for_pipeline(&p)?);
        }
        let Some(sink) = sink.as_mut() else {
            return Err(TideError::internal("no sink"));
        };
        stream(c, &p, bf, sink, dec, rels)
    })
}

struct TableSets {
    /// Tables whose add marker has been passed: their changes are delivered.
    capturing: HashSet<u32>,
    /// Tables in the catalog whose add marker lies ahead in the stream.
    pending: HashSet<u32>,
}

fn stream(
    c: &mut SpiClient<'_>,
    p: &PipelineRow,
    bf: &mut Backfiller,
    sink: &mut Sink,
    dec: &mut Option<Decoder>,
    rels: &mut HashMap<u32, RelDesc>,
) -> TideResult<Outcome> {
    let tables = catalog::tables(c, &p.name)?;
    sink.begin(c, &p.name)?;
    let (signal_relid, marker_relid) = crate::sql::two::<i64, i64>(
        "SELECT 'tide.signal'::regclass::oid::int8, 'tide.marker'::regclass::oid::int8",
        &[],
    )?;
    let (signal_relid, marker_relid) = (
        signal_relid.unwrap_or(0) as u32,
        marker_relid.unwrap_or(0) as u32,
    );
    let mut sets = TableSets {
        capturing: tables
            .iter()
            .filter(|t| t.capturing)
            .map(|t| t.relid)
            .collect(),
        pending: tables
            .iter()
            .filter(|t| !t.capturing)
            .map(|t| t.relid)
            .collect(),
    };
    let filter: String = tables
        .iter()
        .map(|t| t.relid)
        .chain([signal_relid, marker_relid])
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let applied = match &p.applied_lsn {
        Some(s) => s
            .parse::<Lsn>()
            .map_err(|_| TideError::internal(format!("bad applied_lsn {s}")))?,
        None => Lsn(0),
    };
    // A remote target keeps its own applied position (written in its own transactions).
    let applied = applied.max(sink.applied()?.unwrap_or(Lsn(0)));
    let confirmed = p
        .confirmed_lsn
        .as_deref()
        .and_then(|s| s.parse::<Lsn>().ok())
        .unwrap_or(Lsn(0));

    // The decoder follows the catalog's table list; a changed list means a new decoding session
    // from the confirmed position (the plugin's filter is fixed when it starts).
    if dec
        .as_ref()
        .is_some_and(|d| d.filter != filter || d.slot != p.slot_name)
    {
        if let Some(d) = dec.take() {
            d.close();
        }
    }
    if dec.is_none() {
        rels.clear();
        *dec = Some(Decoder::open(&p.slot_name, &filter)?);
    }
    let Some(decoder) = dec.as_mut() else {
        return Err(TideError::internal("no decoder"));
    };
    let batch_events = gucs::BATCH_EVENTS.get().max(1) as usize;
    let spilled_before = decoder.spilled_total();
    let read = decoder.read(batch_events)?;
    let position = decoder.position();

    let mut out = Outcome {
        spilled: decoder.spilled_total() - spilled_before,
        ..Default::default()
    };
    let mut marks: Vec<(u32, Lsn)> = Vec::new();
    let mut removals: Vec<u32> = Vec::new();
    // Captured tables rewritten by a transaction of this batch, with its commit LSN.
    let mut rewrites: Vec<(u32, Lsn)> = Vec::new();
    let mut stopped = false;
    let mut high = applied.max(confirmed);
    let mut txn: Option<Txn> = None;
    let mut last_applied: Option<(Lsn, i64)> = None;

    let mut messages = decoder.messages();
    'fetch: loop {
        {
            let Some(data) = messages.next_message()? else {
                break;
            };
            let msg = wire::decode(data).map_err(|e| {
                TideError::internal(format!("cannot decode a message of the pg_tide output plugin: {e}"))
                    .hint("The server's pg_tide library and the worker disagree on the wire format; restart the server after upgrading pg_tide.")
            })?;
            match msg {
                Message::Begin {
                    xid,
                    final_lsn,
                    commit_time,
                } => {
                    txn = Some(Txn {
                        xid,
                        lsn: final_lsn,
                        commit_time,
                        skip: final_lsn < applied,
                        position: 0,
                        barrier: false,
                    });
                }
                Message::Relation {
                    relid,
                    namespace,
                    name,
                    columns,
                } => {
                    rels.insert(
                        relid,
                        RelDesc {
                            qualified: format!("{}.{}", quote_ident(namespace), quote_ident(name)),
                            columns: columns
                                .iter()
                                .map(|col| OwnedColumn {
                                    name: col.name.to_string(),
                                    type_oid: col.type_oid,
                                    key: col.flags & wire::COLUMN_KEY != 0,
                                })
                                .collect(),
                        },
                    );
                    if sets.capturing.contains(&relid) || sets.pending.contains(&relid) {
                        if let Some(rel) = rels.get(&relid) {
                            sink.relation(c, relid, rel)?;
                        }
                    }
                }
                Message::Signal { body } => {
                    // Markers are rows of tide.marker: a logical message with pg_tide's prefix
                    // can be written by any role (pg_logical_emit_message is PUBLIC), so it is
                    // never trusted.
                    if let Some(t) = txn.as_ref().filter(|t| !t.skip) {
                        out.notes.push(format!(
                            "ignored a logical message with prefix \"pg_tide\" ({} bytes, transaction {} committed at {}): pg_tide does not write such messages",
                            body.len(),
                            t.xid,
                            t.lsn
                        ));
                    }
                }
                Message::Insert { relid, new } if relid == marker_relid => {
                    let Some(t) = txn.as_mut() else { continue };
                    let rel = rel_desc(rels, relid)?;
                    if let Some((op, pipeline, relid)) = parse_marker(rel, &new) {
                        if pipeline != p.name {
                            continue;
                        }
                        let op = op.as_str();
                        match op {
                            "add_table" => {
                                if sets.pending.remove(&relid) || sets.capturing.contains(&relid) {
                                    sets.capturing.insert(relid);
                                } else {
                                    // The decoder's plugin was not filtering for this table.
                                    t.barrier = true;
                                }
                                if !t.skip {
                                    marks.push((relid, t.lsn));
                                }
                            }
                            "remove_table" => {
                                sets.capturing.remove(&relid);
                                sets.pending.remove(&relid);
                                if !t.skip {
                                    removals.push(relid);
                                }
                            }
                            _ => {}
                        }
                    }
                }
                Message::Insert { relid, new }
                | Message::Update {
                    relid,
                    new,
                    old_key: _,
                } if relid == signal_relid => {
                    if let Some(t) = txn.as_mut() {
                        if !t.skip {
                            let rel = rel_desc(rels, relid)?;
                            if let Some((pipeline, watermark, kind)) = parse_watermark(rel, &new) {
                                if pipeline == p.name {
                                    if bf.awaits(watermark, kind) {
                                        // Make the stream events before the chunk visible
                                        // now, rather than after the chunk's rows.
                                        if let Some((end, _)) = last_applied {
                                            sink.commit_early(c, &p.name, end)?;
                                        }
                                    }
                                    if let Some(e) = bf.on_signal(c, sink, t, watermark, kind)? {
                                        out.backfill_rows += e.rows;
                                    }
                                }
                            }
                        }
                    }
                }
                Message::Insert { relid, new } => {
                    if let Some(t) = txn.as_mut() {
                        if !t.skip && sets.capturing.contains(&relid) {
                            let rel = rel_desc(rels, relid)?;
                            let mut key = String::new();
                            json::render_key(&rel.columns, &new, &mut key).map_err(render_err)?;
                            bf.on_change(relid, &key, t.xid);
                            emit_row(sink, c, t, relid, rel, Op::Insert, key, &new)?;
                        }
                    }
                }
                Message::Update {
                    relid,
                    old_key,
                    new,
                } => {
                    if let Some(t) = txn.as_mut() {
                        if !t.skip && sets.capturing.contains(&relid) {
                            let rel = rel_desc(rels, relid)?;
                            let old = match &old_key {
                                Some(old) => {
                                    let mut k = String::new();
                                    json::render_key(&rel.columns, old, &mut k)
                                        .map_err(render_err)?;
                                    Some(k)
                                }
                                None => None,
                            };
                            let mut new_key = String::new();
                            match json::render_key(&rel.columns, &new, &mut new_key) {
                                Ok(()) => {}
                                // A key column stored out of line and not changed: the old key
                                // (which PostgreSQL logs in that case) is the key.
                                Err(json::RenderError::UnchangedKey { .. }) if old.is_some() => {
                                    new_key = old.clone().unwrap_or_default();
                                }
                                Err(e) => return Err(render_err(e)),
                            }
                            if let Some(old) = &old {
                                bf.on_change(relid, old, t.xid);
                            }
                            bf.on_change(relid, &new_key, t.xid);
                            match old {
                                Some(old) if old != new_key => {
                                    // A key change is a delete of the old key and an insert of the new row.
                                    t.position += 1;
                                    sink.push(c, t, key_event(relid, rel, Op::Delete, Some(old)))?;
                                    emit_row(sink, c, t, relid, rel, Op::Insert, new_key, &new)?;
                                }
                                _ => emit_row(sink, c, t, relid, rel, Op::Update, new_key, &new)?,
                            }
                        }
                    }
                }
                Message::Delete { relid, old_key } => {
                    if let Some(t) = txn.as_mut() {
                        if !t.skip && sets.capturing.contains(&relid) {
                            let rel = rel_desc(rels, relid)?;
                            let mut k = String::new();
                            json::render_key(&rel.columns, &old_key, &mut k).map_err(render_err)?;
                            bf.on_change(relid, &k, t.xid);
                            t.position += 1;
                            sink.push(c, t, key_event(relid, rel, Op::Delete, Some(k)))?;
                        }
                    }
                }
                Message::Truncate { relids, .. } => {
                    if let Some(t) = txn.as_mut() {
                        if !t.skip {
                            for relid in relids {
                                if sets.capturing.contains(&relid) {
                                    bf.on_truncate(relid, t.xid);
                                    let rel = rel_desc(rels, relid)?;
                                    t.position += 1;
                                    sink.push(c, t, key_event(relid, rel, Op::Truncate, None))?;
                                }
                            }
                        }
                    }
                }
                Message::Commit {
                    end_lsn,
                    commit_time,
                    ..
                } => {
                    let Some(t) = txn.take() else { continue };
                    high = high.max(end_lsn);
                    if !t.skip && t.position > 0 {
                        out.txns += 1;
                        out.events += t.position as u64;
                        last_applied = Some((end_lsn, commit_time));
                    }
                    if t.barrier {
                        // Later transactions were decoded without the new table: read them
                        // again with a reopened decoder.
                        stopped = true;
                        break 'fetch;
                    }
                }
                Message::Rewrite { relid } => {
                    if let Some(t) = txn.as_mut() {
                        if !t.skip && sets.capturing.contains(&relid) {
                            // Every row may have new values that no row event carries: the
                            // table is read again (after this transaction, in stream order).
                            bf.on_rewrite(relid);
                            rewrites.push((relid, t.lsn));
                        }
                    }
                }
                Message::Keepalive { end_lsn } => {
                    if txn.is_none() {
                        high = high.max(end_lsn);
                    }
                }
            }
        }
    }
    // Empties the buffer (what follows a barrier is read again after the reopen).
    drop(messages);
    if txn.is_some() {
        // Cannot happen: the plugin writes whole transactions. Refuse to commit half of one.
        return Err(TideError::internal(
            "the decoded stream ended inside a transaction",
        ));
    }
    sink.finish(c, &p.name, last_applied.map(|(end, _)| end))?;
    for relid in &removals {
        catalog::forget_removed(c, &p.name, *relid)?;
    }
    for (relid, lsn) in &marks {
        catalog::mark_capturing(c, &p.name, *relid, &lsn.to_string())?;
    }
    for (relid, lsn) in &rewrites {
        out.notes.push(catalog::reread_after_rewrite(
            c,
            &p.name,
            *relid,
            &lsn.to_string(),
        )?);
    }
    if let Some((end, time)) = last_applied {
        catalog::record_applied(c, &p.name, &end.to_string(), Some(time))?;
        out.last_commit_time = Some(time);
    } else if p.has_error {
        catalog::clear_error(c, &p.name)?;
    }
    out.drained = !stopped && read.reached_end;
    out.reopen = stopped;
    out.start_flush = read.end_of_wal;
    if !stopped {
        // Every transaction committed before the decoder's position has been handed out, and
        // those with changes for us are in this transaction.
        high = high.max(position);
    }
    if high > confirmed {
        out.advance = Some(high);
    }
    Ok(out)
}

/// The text of column `name` in a row of one of pg_tide's own tables.
fn column_text<'t>(rel: &RelDesc, t: &Tuple<'t>, name: &str) -> Option<&'t str> {
    let i = rel.columns.iter().position(|c| c.name == name)?;
    match t.values.get(i)? {
        wire::Value::Text(s) => Some(*s),
        _ => None,
    }
}

/// The (pipeline, watermark, kind) of a `tide.signal` row (`None` for a row that is not one:
/// its CHECK constraint allows only the two kinds).
fn parse_watermark(rel: &RelDesc, t: &Tuple<'_>) -> Option<(String, u64, WatermarkKind)> {
    Some((
        column_text(rel, t, "pipeline")?.to_string(),
        column_text(rel, t, "watermark")?.parse().ok()?,
        WatermarkKind::parse(column_text(rel, t, "kind")?)?,
    ))
}

/// The (op, pipeline, relid) of a `tide.marker` row.
fn parse_marker(rel: &RelDesc, t: &Tuple<'_>) -> Option<(String, String, u32)> {
    Some((
        column_text(rel, t, "op")?.to_string(),
        column_text(rel, t, "pipeline")?.to_string(),
        column_text(rel, t, "relid")?.parse().ok()?,
    ))
}

fn rel_desc(rels: &HashMap<u32, RelDesc>, relid: u32) -> TideResult<&RelDesc> {
    rels.get(&relid).ok_or_else(|| {
        TideError::internal(format!(
            "change for relation {relid} arrived before its description"
        ))
    })
}

fn render_err(e: json::RenderError) -> TideError {
    TideError::internal(format!("cannot render a decoded row: {e}"))
}

#[allow(clippy::too_many_arguments)]
fn emit_row(
    sink: &mut Sink,
    c: &mut SpiClient<'_>,
    t: &mut Txn,
    relid: u32,
    rel: &RelDesc,
    op: Op,
    key: String,
    new: &Tuple<'_>,
) -> TideResult<()> {
    let mut row = String::new();
    let unchanged = json::render_row(&rel.columns, new, &mut row).map_err(render_err)?;
    let columns = rel
        .columns
        .iter()
        .enumerate()
        .filter(|(i, _)| !unchanged.contains(i))
        .map(|(_, c)| c.name.clone())
        .collect();
    let unchanged = unchanged
        .iter()
        .map(|&i| rel.columns[i].name.clone())
        .collect();
    t.position += 1;
    sink.push(
        c,
        t,
        Event {
            relid,
            relation: rel.qualified.clone(),
            op,
            key: Some(key),
            row: Some(row),
            unchanged,
            columns,
            backfill: None,
        },
    )
}

/// An event without a row (delete, truncate).
fn key_event(relid: u32, rel: &RelDesc, op: Op, key: Option<String>) -> Event {
    Event {
        relid,
        relation: rel.qualified.clone(),
        op,
        key,
        row: None,
        unchanged: Vec::new(),
        columns: Vec::new(),
        backfill: None,
    }
}

fn quote_ident(s: &str) -> String {
    pgrx::spi::quote_identifier(s)
}
