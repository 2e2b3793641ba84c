//! Read-ahead: a backfilling pipeline worker has a helper process (`backend_type = 'pg_tide
//! reader'`) read its next chunk while it writes the current one, so that reading (the chunk's
//! SELECT, its watermarks) and writing (a bulk load, a remote COPY, outbox rows) use two cores.
//!
//! Owns: the reader process, the shared memory it talks through (a DSM segment with two
//! `shm_mq` queues: requests to the reader, chunks back), and the encoding of both.
//!
//! A worker has up to `tide.max_backfill_readers` readers, each its own process and segment.
//! Protocol (one request in flight per reader at most):
//! 1. during the iteration that writes chunk N (at its high watermark), the worker sends the
//!    request for chunk N+1 to an idle reader: the backfill as the worker knows it, starting
//!    after N's last key (and, for a range planned ahead, ending at its bound: with several
//!    readers, N+1, N+2, ... go to several readers at once; see `super`), and how the
//!    target wants its rows held (a `RowForm`);
//! 2. the reader runs the same two transactions the worker would ([`super`]): the low
//!    watermark, then the chunk's SELECT and its high watermark (`super::chunk::read_chunk`, as
//!    the backfill's owner, security-restricted) and sends the chunk back (rows as JSON, as
//!    `jsonb` it parsed for the outbox, text, COPY text, or row values as their bytes), or the
//!    error;
//! 3. the worker receives every answer **before its next iteration** (`tide_core::worker_loop`:
//!    a read in flight comes first) and registers it with the reconciler as if it had read it
//!    itself.
//!
//! Why that order is sound: the iteration of step 1 decodes only WAL flushed before it started,
//! and the request is sent after that; so chunk N+1's low watermark lies beyond what that
//! iteration decodes, and the chunk is registered before any iteration reaches it — the
//! reconciler's one requirement. A failed iteration marks the read in flight stale (chunk N was
//! not written, so N+1's lower bound is not durable): it is received and dropped; and a chunk
//! whose lower bound is not the backfill's durable last key is never written anyway
//! (`catalog::chunks::record_progress`). Only the worker's main thread calls PostgreSQL; the
//! reader is a process of its own.
//!
//! Fallbacks: with `tide.read_ahead = off`, for a throttled backfill, when no background worker
//! slot is free (`max_worker_processes`), or after the reader died, the worker reads each chunk
//! itself, as before. The reader exits, normally, when the worker detaches (the worker drops it
//! when no backfill is due, or exits); one dropped while it reads a chunk is terminated; all
//! exit with the postmaster.

use super::chunk::Job;
use super::chunk::{read_chunk_locked, ChunkRead};
use super::row_values::RowValues;
use crate::catalog::backfills::{self, Due};
use crate::catalog::chunks;
use crate::error::{TideError, TideResult};
use crate::worker::tx;
use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::pg_sys;
use pgrx::prelude::*;
use tide_core::read_ahead::{
    decode_request, decode_response, encode_chunk, encode_failure, encode_request, Failure,
    Malformed, Request, RowBytes,
};
use tide_core::row::RowForm;

/// Bytes of each of the two queues (a larger chunk streams through).
const QUEUE_BYTES: usize = 4 << 20;

// ------------------------------------------------------------------------------ messages

// The messages and their encoding are `tide_core::read_ahead`'s (tested there); what is here
// turns them into the worker's types.

impl RowBytes for RowValues {
    fn row_type(&self) -> u32 {
        RowValues::row_type(self).to_u32()
    }
    fn each_row(&self, f: &mut dyn FnMut(&[u8])) {
        for r in self.bytes() {
            f(r)
        }
    }
    fn len(&self) -> usize {
        RowValues::len(self)
    }
}

fn malformed(e: Malformed) -> TideError {
    TideError::internal(e.to_string())
}

fn failure(e: &TideError) -> Failure {
    Failure {
        code: e.code as i32,
        message: e.message.clone(),
        detail: e.detail.clone(),
        hint: e.hint.clone(),
        retry: e.retry,
    }
}

fn error(f: Failure) -> TideError {
    let mut err = TideError::new(f.code.into(), f.message);
    err.detail = f.detail;
    err.hint = f.hint;
    err.retry = f.retry;
    err
}

/// The reader's answer as it sends it.
fn encode_answer(r: &TideResult<(u64, Due, ChunkRead)>) -> Vec<u8> {
    match r {
        Ok((w, job, c)) => encode_chunk(*w, job, c),
        Err(e) => encode_failure(&failure(e)),
    }
}

/// The reader's answer as the worker receives it (row values copied into the worker's memory).
fn decode_answer(buf: &[u8]) -> TideResult<TideResult<(u64, Due, ChunkRead)>> {
    match decode_response(buf).map_err(malformed)? {
        Err(f) => Ok(Err(error(f))),
        Ok((w, job, c)) => {
            let c = c.map_values(|v| {
                RowValues::from_bytes(v.rows.into_iter(), pg_sys::Oid::from(v.row_type))
            })?;
            Ok(Ok((w, job, c)))
        }
    }
}

// ------------------------------------------------------------------------------ the worker's side

/// A request sent and not yet answered.
struct InFlight {
    job: Due,
    /// The iteration that sent it failed: the answer is dropped.
    stale: bool,
}

/// The worker's reader: the process and the queues to it. Dropping it detaches (the reader then
/// exits) and frees the shared memory.
pub struct Reader {
    seg: *mut pg_sys::dsm_segment,
    to_reader: *mut pg_sys::shm_mq_handle,
    from_reader: *mut pg_sys::shm_mq_handle,
    worker: *mut pg_sys::BackgroundWorkerHandle,
    pipeline: String,
    in_flight: Option<InFlight>,
    /// Counted against the pipeline's owner (`crate::quota::reserve_reader`) until dropped.
    counted: bool,
}

impl Reader {
    /// Start a reader for `pipeline` (this worker's database). Outside a transaction. An error
    /// (no free background worker slot, say) leaves nothing behind.
    pub fn start(pipeline: &str) -> TideResult<Reader> {
        // An ERROR here (no room in /dev/shm for the segment, say) is returned, not raised:
        // the worker then reads each chunk itself. A reader made before the error is dropped
        // as the error unwinds (detaching what it attached). What dsm_create allocated before
        // failing (its segment descriptor, a few dozen bytes in TopMemoryContext) stays: once
        // per attempt, and attempts are a minute apart.
        // Counted against the owner's tide.max_workers_per_role first (issue 44: readers took
        // the server's background worker slots, counted against no one).
        match crate::quota::reserve_reader(pipeline, crate::gucs::max_workers_per_role()) {
            Ok(()) => {}
            Err(crate::quota::NoReader::AtLimit { now, limit }) => {
                return Err(TideError::limit(format!(
                    "the owner's pipelines run {now} background processes, the most tide.max_workers_per_role allows ({limit})"
                ))
                .hint("The worker reads each chunk itself; a superuser may raise tide.max_workers_per_role."));
            }
            Err(crate::quota::NoReader::NotCounted) => {
                return Err(TideError::limit(
                    "the pipeline is not counted against its owner yet (its launcher counts it)",
                )
                .hint("The worker reads each chunk itself and tries again a minute later."));
            }
        }
        match tx::guard(|| Self::start_unguarded(pipeline)) {
            Ok(mut r) => {
                r.counted = true;
                Ok(r)
            }
            Err(e) => {
                crate::quota::reader_gone(pipeline);
                Err(e)
            }
        }
    }

    fn start_unguarded(pipeline: &str) -> TideResult<Reader> {
        // SAFETY: PostgreSQL's DSM, shm_mq and dynamic background worker API, as parallel query
        // and pg_background use them: the segment is mapped for the life of this process
        // (pinned) and each queue lies inside it; the handles are freed in `Drop`.
        unsafe {
            let seg = pg_sys::dsm_create(
                2 * QUEUE_BYTES,
                pg_sys::DSM_CREATE_NULL_IF_MAXSEGMENTS as i32,
            );
            if seg.is_null() {
                return Err(TideError::prerequisite(
                    "no dynamic shared memory segment is free for a pg_tide reader",
                )
                .hint("The worker reads each chunk itself; raise max_connections or max_worker_processes (which size the segment table) to let it read ahead."));
            }
            pg_sys::dsm_pin_mapping(seg);
            let base = pg_sys::dsm_segment_address(seg) as *mut u8;
            let to_q = pg_sys::shm_mq_create(base as *mut std::ffi::c_void, QUEUE_BYTES);
            let from_q =
                pg_sys::shm_mq_create(base.add(QUEUE_BYTES) as *mut std::ffi::c_void, QUEUE_BYTES);
            pg_sys::shm_mq_set_sender(to_q, pg_sys::MyProc);
            pg_sys::shm_mq_set_receiver(from_q, pg_sys::MyProc);
            let mut reader = Reader {
                seg,
                to_reader: std::ptr::null_mut(),
                from_reader: std::ptr::null_mut(),
                worker: std::ptr::null_mut(),
                pipeline: pipeline.to_string(),
                in_flight: None,
                counted: false,
            };
            let mut w: pg_sys::BackgroundWorker = std::mem::zeroed();
            // NUL-terminated, cut to fit (the arrays are zeroed).
            let put = |dst: &mut [std::ffi::c_char], s: &str| {
                let room = dst.len() - 1;
                for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
                    *d = b as std::ffi::c_char;
                }
            };
            put(&mut w.bgw_name, &format!("pg_tide reader {pipeline}"));
            put(&mut w.bgw_type, "pg_tide reader");
            put(&mut w.bgw_library_name, "pg_tide");
            put(&mut w.bgw_function_name, "tide_reader_main");
            put(
                &mut w.bgw_extra,
                &format!("{} {pipeline}", pg_sys::MyDatabaseId.to_u32()),
            );
            w.bgw_flags = (pg_sys::BGWORKER_SHMEM_ACCESS
                | pg_sys::BGWORKER_BACKEND_DATABASE_CONNECTION) as i32;
            w.bgw_start_time = pg_sys::BgWorkerStartTime::BgWorkerStart_RecoveryFinished;
            w.bgw_restart_time = pg_sys::BGW_NEVER_RESTART;
            w.bgw_main_arg = pg_sys::Datum::from(pg_sys::dsm_segment_handle(seg));
            w.bgw_notify_pid = pg_sys::MyProcPid;
            let mut handle: *mut pg_sys::BackgroundWorkerHandle = std::ptr::null_mut();
            if !pg_sys::RegisterDynamicBackgroundWorker(&mut w, &mut handle) {
                return Err(TideError::prerequisite(
                    "no background worker slot is free for a pg_tide reader",
                )
                .hint("Raise max_worker_processes (a restart) to let backfills read ahead; meanwhile the worker reads each chunk itself."));
            }
            reader.worker = handle;
            reader.to_reader = pg_sys::shm_mq_attach(to_q, seg, handle);
            reader.from_reader = pg_sys::shm_mq_attach(from_q, seg, handle);
            let mut pid = 0;
            if pg_sys::WaitForBackgroundWorkerStartup(handle, &mut pid)
                != pg_sys::BgwHandleStatus::BGWH_STARTED
            {
                return Err(TideError::prerequisite("the pg_tide reader did not start")
                    .hint("The worker reads each chunk itself; see the server log."));
            }
            Ok(reader)
        }
    }

    /// Whether a request waits for its answer.
    pub fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Ask for the next chunk of `job` (its `last_key` is where the chunk starts), from inside
    /// the worker's transaction `writer` (its xid; 0 when it has none).
    pub fn request(&mut self, job: &Due, form: RowForm, writer: u32) -> TideResult<()> {
        if self.in_flight.is_some() {
            return Err(TideError::internal("a chunk was asked of the reader twice"));
        }
        let msg = encode_request(&Request {
            pipeline: self.pipeline.clone(),
            job: job.clone(),
            form,
            writer,
        });
        // SAFETY: the queue handle is attached (see `start`); the message is copied in.
        let r = unsafe {
            pg_sys::shm_mq_send(
                self.to_reader,
                msg.len(),
                msg.as_ptr() as *const std::ffi::c_void,
                false,
                true,
            )
        };
        if r != pg_sys::shm_mq_result::SHM_MQ_SUCCESS {
            return Err(gone());
        }
        self.in_flight = Some(InFlight {
            job: job.clone(),
            stale: false,
        });
        Ok(())
    }

    /// Whether a request for a chunk of backfill `id` waits for its answer (and will be used).
    pub fn asks_for(&self, id: i64) -> bool {
        self.in_flight
            .as_ref()
            .is_some_and(|f| f.job.id == id && !f.stale)
    }

    /// The answer in flight will not be used if it is a chunk of backfill `id` (an earlier
    /// chunk of it was not written).
    pub fn drop_in_flight_of(&mut self, id: i64) {
        if let Some(f) = self.in_flight.as_mut().filter(|f| f.job.id == id) {
            f.stale = true;
        }
    }

    /// The answer in flight will not be used (the iteration that asked for it failed).
    pub fn drop_in_flight(&mut self) {
        if let Some(f) = self.in_flight.as_mut() {
            f.stale = true;
        }
    }

    /// Wait for the answer in flight: `None` when there is none, or it is stale (then dropped);
    /// else the job it answers (the backfill, starting after its `last_key`) and the chunk (its
    /// watermark and rows) or why the reader could not read it. Outside a transaction (row
    /// values are copied into a memory context of their own).
    pub fn receive(&mut self) -> TideResult<Option<(Job, TideResult<ChunkRead>)>> {
        let Some(f) = self.in_flight.take() else {
            return Ok(None);
        };
        let from_reader = self.from_reader;
        // An ERROR while receiving (a chunk larger than a palloc can hold, no memory) is
        // returned, not raised: the caller drops the reader and reads the chunk itself.
        let decoded = tx::guard(|| {
            let mut n: pg_sys::Size = 0;
            let mut data: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: the queue handle is attached; the received bytes are valid until the
            // next receive on it, and are decoded (copied) before that.
            unsafe {
                let r = pg_sys::shm_mq_receive(from_reader, &mut n, &mut data, false);
                if r != pg_sys::shm_mq_result::SHM_MQ_SUCCESS {
                    return Err(gone());
                }
                decode_answer(std::slice::from_raw_parts(data as *const u8, n))
            }
        })?;
        if f.stale {
            return Ok(None);
        }
        Ok(Some(match decoded {
            Ok((watermark, b, read)) => (Job { watermark, b }, Ok(read)),
            Err(e) => (
                Job {
                    watermark: 0,
                    b: f.job,
                },
                Err(e),
            ),
        }))
    }
}

fn gone() -> TideError {
    TideError::new(
        pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
        "the pg_tide reader is gone",
    )
    .hint("The worker reads each chunk itself from now on; the chunk is read again.")
}

impl Drop for Reader {
    fn drop(&mut self) {
        if self.counted {
            crate::quota::reader_gone(&self.pipeline);
        }
        // An idle reader (no request in flight) leaves by itself, normally, once it sees the
        // request queue detached: terminating it would make PostgreSQL log a FATAL ("terminating
        // background worker ... due to administrator command") for every backfill that ends.
        // One reading a chunk is terminated: what it reads is no longer wanted.
        let terminate = self.in_flight.is_some();
        // SAFETY: detaching our own queue handles and segment once; terminating the worker we
        // registered (a no-op when it already exited).
        unsafe {
            if !self.to_reader.is_null() {
                pg_sys::shm_mq_detach(self.to_reader);
            }
            if !self.from_reader.is_null() {
                pg_sys::shm_mq_detach(self.from_reader);
            }
            if !self.worker.is_null() {
                if terminate {
                    pg_sys::TerminateBackgroundWorker(self.worker);
                }
                pg_sys::pfree(self.worker as *mut std::ffi::c_void);
            }
            pg_sys::dsm_detach(self.seg);
        }
    }
}

// ------------------------------------------------------------------------------ the reader

/// Main function of a reader: `bgw_extra` is "<database oid> <pipeline>", the argument the DSM
/// handle.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn tide_reader_main(arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    // SIGTERM (the worker dropping its reader, shutdown) ends the reader at once.
    // SAFETY: postgres_die is PostgreSQL's own SIGTERM handler (async-signal-safe), as
    // set_signal_handler requires; installed on the main thread at process start.
    unsafe {
        crate::pgver::set_signal_handler(pg_sys::SIGTERM as i32, Some(postgres_die));
    }
    let extra = BackgroundWorker::get_extra().to_string();
    let Some((db, pipeline)) = extra.split_once(' ') else {
        log!("pg_tide reader: bad arguments \"{extra}\"");
        return;
    };
    let dboid = pg_sys::Oid::from(db.parse::<u32>().unwrap_or(0));
    let pipeline = pipeline.to_string();
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(dboid), None);
    // SAFETY: attach the segment the worker made (its handle is our argument) and both queues
    // in it, as the receiver of requests and the sender of chunks; the segment stays mapped
    // until this process exits.
    let (to_worker, from_worker) = unsafe {
        let seg = pg_sys::dsm_attach(arg.value() as pg_sys::dsm_handle);
        if seg.is_null() {
            log!("pg_tide reader \"{pipeline}\": the worker's shared memory is gone");
            return;
        }
        pg_sys::dsm_pin_mapping(seg);
        let base = pg_sys::dsm_segment_address(seg) as *mut u8;
        let requests = base as *mut pg_sys::shm_mq;
        let chunks = base.add(QUEUE_BYTES) as *mut pg_sys::shm_mq;
        pg_sys::shm_mq_set_receiver(requests, pg_sys::MyProc);
        pg_sys::shm_mq_set_sender(chunks, pg_sys::MyProc);
        (
            pg_sys::shm_mq_attach(chunks, seg, std::ptr::null_mut()),
            pg_sys::shm_mq_attach(requests, seg, std::ptr::null_mut()),
        )
    };
    if let Err(e) = tx::run(tx::output_settings) {
        log!("pg_tide reader \"{pipeline}\": could not set output settings: {e}");
        return;
    }
    crate::sql::cache_plans();
    loop {
        let mut n: pg_sys::Size = 0;
        let mut data: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: attached queues; the request is decoded (copied) before the next receive.
        let request = unsafe {
            if pg_sys::shm_mq_receive(from_worker, &mut n, &mut data, false)
                != pg_sys::shm_mq_result::SHM_MQ_SUCCESS
            {
                // The worker detached (it dropped its reader, or exited).
                break;
            }
            decode_request(std::slice::from_raw_parts(data as *const u8, n)).map_err(malformed)
        };
        if let Err(e) = &request {
            // Another build's worker (a pg_tide.so replaced while it ran): not a reason to
            // fail its backfill. The reader exits; the worker sees it gone and reads itself.
            log!("pg_tide reader \"{pipeline}\": {e}; exiting");
            break;
        }
        // A reload (SIGHUP: its handler only sets a flag and the latch) applies before the
        // next chunk is read, as in the worker.
        if BackgroundWorker::sighup_received() {
            // SAFETY: re-reads the configuration files, outside a transaction, as the
            // worker's loop does.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        let answer = match request {
            Ok(r) => read(&r.pipeline, r.job, r.form, r.writer),
            Err(e) => Err(e),
        };
        if answer.is_err() {
            crate::sql::forget_plans();
        }
        let msg = encode_answer(&answer);
        drop(answer);
        // SAFETY: attached queue; the message is copied in (streamed when it is larger than the
        // queue: the worker receives it before its next iteration).
        let sent = unsafe {
            pg_sys::shm_mq_send(
                to_worker,
                msg.len(),
                msg.as_ptr() as *const std::ffi::c_void,
                false,
                true,
            )
        };
        if sent != pg_sys::shm_mq_result::SHM_MQ_SUCCESS {
            break;
        }
    }
}

/// The reader's work for one request: the chunk's low watermark, then the chunk and its high
/// watermark, as `super` does in the worker.
fn read(
    pipeline: &str,
    mut b: Due,
    form: RowForm,
    writer: u32,
) -> TideResult<(u64, Due, ChunkRead)> {
    let watermark = tx::run(|| {
        // The backfill's chunk size and throttle as they are now (alter_backfill).
        if let Some((size, rps)) = backfills::settings(b.id)? {
            b.chunk_size = size.max(1);
            b.rows_per_second = rps;
        }
        let watermark = chunks::next_watermark(pipeline)?;
        chunks::write_low_watermark(pipeline, b.id, watermark, b.chunk_no)?;
        Ok(watermark)
    })?;
    let job = Job { watermark, b };
    let read = read_chunk_locked(
        pipeline,
        &job,
        &mut |_| Ok(form),
        (writer != 0).then_some(writer),
    )?;
    Ok((watermark, job.b, read))
}

unsafe extern "C-unwind" {
    /// PostgreSQL's own SIGTERM handler.
    #[link_name = "die"]
    fn postgres_die(signal: std::ffi::c_int);
}
