//! Read-ahead: a backfilling pipeline worker has a helper process (`backend_type = 'pg_tide
//! reader'`) read its next chunk while it writes the current one, so that reading (the chunk's
//! SELECT, its watermarks) and writing (a bulk load, a remote COPY, outbox rows) use two cores.
//!
//! Owns: the reader process, the shared memory it talks through (a DSM segment with two
//! `shm_mq` queues: requests to the reader, chunks back), and the encoding of both.
//!
//! Protocol (one request in flight at most):
//! 1. during the iteration that writes chunk N (at its high watermark), the worker sends the
//!    request for chunk N+1: the backfill as the worker knows it, starting after N's last key,
//!    and how the target wants its rows held ([`Holding`]);
//! 2. the reader runs the same two transactions the worker would ([`super::backfill`]): the low
//!    watermark, then the chunk's SELECT and its high watermark (`super::chunk::read_chunk`, as
//!    the backfill's owner, security-restricted) and sends the chunk back (rows as JSON, as
//!    `jsonb` it parsed for the outbox, text, COPY text, or row values as their bytes), or the
//!    error;
//! 3. the worker receives it **before its next iteration** (`tide_core::worker_loop`: a read in
//!    flight comes first) and registers it with the reconciler as if it had read it itself.
//!
//! Why that order is sound: the iteration of step 1 decodes only WAL flushed before it started,
//! and the request is sent after that; so chunk N+1's low watermark lies beyond what that
//! iteration decodes, and the chunk is registered before any iteration reaches it — the
//! reconciler's one requirement. A failed iteration marks the read in flight stale (chunk N was
//! not written, so N+1's lower bound is not durable): it is received and dropped; and a chunk
//! whose lower bound is not the backfill's durable last key is never written anyway
//! (`catalog::backfills::record_progress`). Only the worker's main thread calls PostgreSQL; the
//! reader is a process of its own.
//!
//! Fallbacks: with `tide.read_ahead = off`, for a throttled backfill, when no background worker
//! slot is free (`max_worker_processes`), or after the reader died, the worker reads each chunk
//! itself, as before. The reader exits when the worker detaches (the worker drops it when no
//! backfill is due, or exits), and with the postmaster.

use super::chunk::Job;
use super::chunk::{read_chunk, ChunkRead, ChunkRow, Holding, Item};
use super::estimate::Estimate;
use super::row_values::RowValues;
use super::tx::{self, Locked};
use crate::catalog::backfills::{self, Due};
use crate::error::{TideError, TideResult};
use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::pg_sys;
use pgrx::prelude::*;
use tide_core::snapshot::InvisibleXids;

/// Bytes of each of the two queues (a larger chunk streams through).
const QUEUE_BYTES: usize = 4 << 20;

// ------------------------------------------------------------------------------ encoding

/// Appends values to a message. Lengths and numbers little-endian.
#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    fn opt<T>(&mut self, v: Option<T>, f: impl FnOnce(&mut Self, T)) {
        match v {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                f(self, v)
            }
        }
    }
    fn strs(&mut self, v: &[String]) {
        self.len(v.len());
        for s in v {
            self.str(s);
        }
    }
    fn opt_strs(&mut self, v: &[Option<String>]) {
        self.len(v.len());
        for s in v {
            self.opt(s.as_deref(), |e, s| e.str(s));
        }
    }
}

/// Reads what [`Enc`] wrote; every read is bounds-checked (a malformed message is an error).
struct Dec<'a> {
    buf: &'a [u8],
    at: usize,
}

fn malformed() -> TideError {
    TideError::internal("a malformed message between a pipeline worker and its reader")
}

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> TideResult<&'a [u8]> {
        let end = self.at.checked_add(n).ok_or_else(malformed)?;
        let s = self.buf.get(self.at..end).ok_or_else(malformed)?;
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> TideResult<u8> {
        Ok(self.take(1)?[0])
    }
    fn bool(&mut self) -> TideResult<bool> {
        Ok(self.u8()? != 0)
    }
    fn u32(&mut self) -> TideResult<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i64(&mut self) -> TideResult<i64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }
    fn f64(&mut self) -> TideResult<f64> {
        Ok(f64::from_bits(self.i64()? as u64))
    }
    fn len(&mut self) -> TideResult<usize> {
        Ok(self.u32()? as usize)
    }
    fn bytes(&mut self) -> TideResult<&'a [u8]> {
        let n = self.len()?;
        self.take(n)
    }
    fn str(&mut self) -> TideResult<String> {
        std::str::from_utf8(self.bytes()?)
            .map(str::to_string)
            .map_err(|_| malformed())
    }
    fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> TideResult<T>) -> TideResult<Option<T>> {
        match self.u8()? {
            0 => Ok(None),
            1 => f(self).map(Some),
            _ => Err(malformed()),
        }
    }
    fn strs(&mut self) -> TideResult<Vec<String>> {
        let n = self.len()?;
        (0..n).map(|_| self.str()).collect()
    }
    fn opt_strs(&mut self) -> TideResult<Vec<Option<String>>> {
        let n = self.len()?;
        (0..n).map(|_| self.opt(|d| d.str())).collect()
    }
    fn end(&self) -> TideResult<()> {
        if self.at == self.buf.len() {
            Ok(())
        } else {
            Err(malformed())
        }
    }
}

fn put_due(e: &mut Enc, b: &Due) {
    e.i64(b.id);
    e.u32(b.relid);
    e.i64(b.chunk_size);
    e.opt(b.rows_per_second, |e, v| e.i64(v));
    e.opt(b.condition.as_deref(), |e, v| e.str(v));
    e.str(&b.owner);
    e.strs(&b.key_columns);
    e.opt(b.last_key.as_deref(), |e, v| e.strs(v));
    e.i64(b.chunk_no);
    e.opt(b.repair_deletes.as_deref(), |e, v| e.str(v));
}

fn get_due(d: &mut Dec<'_>) -> TideResult<Due> {
    Ok(Due {
        id: d.i64()?,
        relid: d.u32()?,
        chunk_size: d.i64()?,
        rows_per_second: d.opt(|d| d.i64())?,
        condition: d.opt(|d| d.str())?,
        owner: d.str()?,
        key_columns: d.strs()?,
        last_key: d.opt(|d| d.strs())?,
        chunk_no: d.i64()?,
        repair_deletes: d.opt(|d| d.str())?,
    })
}

/// A request: read the next chunk of `job` (pipeline `pipeline`), holding rows as `hold` says,
/// while the worker's transaction `writer` runs.
fn encode_request(pipeline: &str, job: &Due, hold: Holding, writer: u32) -> Vec<u8> {
    let mut e = Enc::default();
    e.str(pipeline);
    put_due(&mut e, job);
    e.bool(hold.values);
    e.bool(hold.copy);
    e.bool(hold.text);
    e.bool(hold.jsonb);
    e.u32(writer);
    e.0
}

fn decode_request(buf: &[u8]) -> TideResult<(String, Due, Holding, u32)> {
    let mut d = Dec { buf, at: 0 };
    let pipeline = d.str()?;
    let job = get_due(&mut d)?;
    let hold = Holding {
        values: d.bool()?,
        copy: d.bool()?,
        text: d.bool()?,
        jsonb: d.bool()?,
    };
    let writer = d.u32()?;
    d.end()?;
    Ok((pipeline, job, hold, writer))
}

/// The reader's answer: the chunk read under watermark `watermark` for the backfill as it was
/// then (its chunk size and throttle may have changed since the request), or why not.
fn encode_response(r: &TideResult<(u64, Due, ChunkRead)>) -> Vec<u8> {
    let mut e = Enc::default();
    match r {
        Err(err) => {
            e.u8(0);
            e.i64(i64::from(err.code as i32));
            e.str(&err.message);
            e.opt(err.detail.as_deref(), |e, v| e.str(v));
            e.opt(err.hint.as_deref(), |e, v| e.str(v));
            e.bool(err.retry);
        }
        Ok((watermark, job, c)) => {
            e.u8(1);
            e.i64(*watermark as i64);
            put_due(&mut e, job);
            e.str(&c.snapshot);
            e.opt(c.estimate.table_rows, |e, v| e.i64(v));
            e.opt(c.estimate.key_fraction, |e, v| e.f64(v));
            e.len(c.deletes.len());
            for (key, by_name) in &c.deletes {
                e.str(key);
                e.len(by_name.len());
                for (n, v) in by_name {
                    e.str(n);
                    e.opt(v.as_deref(), |e, v| e.str(v));
                }
            }
            e.str(&c.relation);
            e.len(c.columns.len());
            for (n, t) in &c.columns {
                e.str(n);
                e.str(t);
            }
            e.len(c.rows.len());
            for r in &c.rows {
                e.str(&r.key);
                e.strs(&r.key_values);
                match &r.row {
                    Item::Json(s) => {
                        e.u8(0);
                        e.str(s);
                    }
                    Item::Text(v) => {
                        e.u8(1);
                        e.opt_strs(v);
                    }
                    Item::Value(i) => {
                        e.u8(2);
                        e.u32(*i);
                    }
                    Item::Copy(s) => {
                        e.u8(3);
                        e.str(s);
                    }
                    // A chunk's rows are never deletes (those are in `deletes`).
                    Item::Delete(_) => e.u8(4),
                    Item::Jsonb(b) => {
                        e.u8(5);
                        e.bytes(b);
                    }
                }
            }
            e.opt(c.values.as_ref(), |e, (values, attnums)| {
                e.u32(values.row_type().to_u32());
                let rows: Vec<&[u8]> = values.bytes().collect();
                e.len(rows.len());
                for r in rows {
                    e.bytes(r);
                }
                e.len(attnums.len());
                for a in attnums {
                    e.u32(*a as u32);
                }
            });
            e.len(c.attnums.len());
            for a in &c.attnums {
                e.u32(*a as u32);
            }
            e.bool(c.is_last);
            e.i64(c.read_at);
        }
    }
    e.0
}

/// The answer to a request that asked for rows held as `holding`.
fn decode_response(buf: &[u8], holding: Holding) -> TideResult<TideResult<(u64, Due, ChunkRead)>> {
    let mut d = Dec { buf, at: 0 };
    let out = match d.u8()? {
        0 => {
            let code = d.i64()? as i32;
            let mut err = TideError::new(code.into(), d.str()?);
            err.detail = d.opt(|d| d.str())?;
            err.hint = d.opt(|d| d.str())?;
            err.retry = d.bool()?;
            Err(err)
        }
        1 => {
            let watermark = d.i64()? as u64;
            let job = get_due(&mut d)?;
            let snapshot = d.str()?;
            let invisible = InvisibleXids::parse(&snapshot).ok_or_else(malformed)?;
            let estimate = Estimate {
                table_rows: d.opt(|d| d.i64())?,
                key_fraction: d.opt(|d| d.f64())?,
            };
            let n = d.len()?;
            let mut deletes = Vec::with_capacity(n.min(1 << 16));
            for _ in 0..n {
                let key = d.str()?;
                let m = d.len()?;
                let mut by_name = Vec::with_capacity(m.min(64));
                for _ in 0..m {
                    by_name.push((d.str()?, d.opt(|d| d.str())?));
                }
                deletes.push((key, by_name));
            }
            let relation = d.str()?;
            let n = d.len()?;
            let mut columns = Vec::with_capacity(n.min(1600));
            for _ in 0..n {
                columns.push((d.str()?, d.str()?));
            }
            let n = d.len()?;
            let mut rows = Vec::with_capacity(n.min(1 << 20));
            for _ in 0..n {
                let key = d.str()?;
                let key_values = d.strs()?;
                let row = match d.u8()? {
                    0 => Item::Json(d.str()?),
                    1 => Item::Text(d.opt_strs()?),
                    2 => Item::Value(d.u32()?),
                    3 => Item::Copy(d.str()?),
                    5 => Item::Jsonb(d.bytes()?.to_vec()),
                    _ => return Err(malformed()),
                };
                rows.push(ChunkRow {
                    key,
                    key_values,
                    row,
                });
            }
            let values = match d.u8()? {
                0 => None,
                1 => {
                    let row_type = pg_sys::Oid::from(d.u32()?);
                    let n = d.len()?;
                    let mut bytes = Vec::with_capacity(n.min(1 << 20));
                    for _ in 0..n {
                        bytes.push(d.bytes()?);
                    }
                    let m = d.len()?;
                    let attnums = (0..m)
                        .map(|_| d.u32().map(|a| a as i32))
                        .collect::<TideResult<Vec<_>>>()?;
                    Some((RowValues::from_bytes(bytes.into_iter(), row_type)?, attnums))
                }
                _ => return Err(malformed()),
            };
            let n = d.len()?;
            let attnums = (0..n)
                .map(|_| d.u32().map(|a| a as i32))
                .collect::<TideResult<Vec<_>>>()?;
            let is_last = d.bool()?;
            let read_at = d.i64()?;
            Ok((
                watermark,
                job,
                ChunkRead {
                    holding,
                    invisible,
                    snapshot,
                    estimate,
                    deletes,
                    relation,
                    columns,
                    rows,
                    values,
                    attnums,
                    is_last,
                    read_at,
                },
            ))
        }
        _ => return Err(malformed()),
    };
    d.end()?;
    Ok(out)
}

// ------------------------------------------------------------------------------ the worker's side

/// A request sent and not yet answered.
struct InFlight {
    job: Due,
    hold: Holding,
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
        tx::guard(|| Self::start_unguarded(pipeline))
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
    pub fn request(&mut self, job: &Due, hold: Holding, writer: u32) -> TideResult<()> {
        if self.in_flight.is_some() {
            return Err(TideError::internal("a chunk was asked of the reader twice"));
        }
        let msg = encode_request(&self.pipeline, job, hold, writer);
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
            hold,
            stale: false,
        });
        Ok(())
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
                decode_response(std::slice::from_raw_parts(data as *const u8, n), f.hold)
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
                pg_sys::TerminateBackgroundWorker(self.worker);
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
    unsafe {
        pg_sys::pqsignal(pg_sys::SIGTERM as i32, Some(postgres_die));
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
            decode_request(std::slice::from_raw_parts(data as *const u8, n))
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
            Ok((p, job, hold, writer)) => read(&p, job, hold, writer),
            Err(e) => Err(e),
        };
        if answer.is_err() {
            crate::sql::forget_plans();
        }
        let msg = encode_response(&answer);
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
/// watermark, as `super::backfill` does in the worker.
fn read(
    pipeline: &str,
    mut b: Due,
    hold: Holding,
    writer: u32,
) -> TideResult<(u64, Due, ChunkRead)> {
    let watermark = tx::run(|| {
        // The backfill's chunk size and throttle as they are now (alter_backfill).
        if let Some((size, rps)) = backfills::settings(b.id)? {
            b.chunk_size = size.max(1);
            b.rows_per_second = rps;
        }
        let watermark = backfills::next_watermark(pipeline)?;
        backfills::write_low_watermark(pipeline, b.id, watermark, b.chunk_no)?;
        Ok(watermark)
    })?;
    let job = Job { watermark, b };
    match tx::run_locked(pg_sys::Oid::from(job.b.relid), || {
        read_chunk(
            pipeline,
            &job,
            &mut |_| Ok(hold),
            (writer != 0).then_some(writer),
        )
    })? {
        Locked::Ran(read) => Ok((watermark, job.b, read)),
        Locked::Busy => Err(super::chunk::table_locked()),
    }
}

unsafe extern "C-unwind" {
    /// PostgreSQL's own SIGTERM handler.
    #[link_name = "die"]
    fn postgres_die(signal: std::ffi::c_int);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let job = Due {
            id: 7,
            relid: 16384,
            chunk_size: 5000,
            rows_per_second: None,
            condition: Some("a > 1 -- é".into()),
            owner: "alice".into(),
            key_columns: vec!["id".into(), "Weird \"col\"".into()],
            last_key: Some(vec!["42".into(), "".into()]),
            chunk_no: 3,
            repair_deletes: None,
        };
        let hold = Holding {
            values: false,
            copy: true,
            text: true,
            jsonb: true,
        };
        let (p, j, h, w) = decode_request(&encode_request("pipé", &job, hold, 77)).unwrap();
        assert_eq!((p.as_str(), w), ("pipé", 77));
        assert_eq!(format!("{j:?}"), format!("{job:?}"));
        assert_eq!(h, hold);
        // Truncated or extended messages are errors, not defaults.
        let msg = encode_request("p", &job, hold, 0);
        for cut in 0..msg.len() {
            assert!(decode_request(&msg[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = msg.clone();
        longer.push(0);
        assert!(decode_request(&longer).is_err());
    }
}
