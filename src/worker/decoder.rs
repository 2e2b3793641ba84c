//! The pipeline worker's decoder: one logical decoding context on the pipeline's slot, kept open
//! for as long as the worker streams (the way a walsender or pg_squeeze decode), instead of one
//! `pg_logical_slot_peek_binary_changes` call per iteration.
//!
//! Owns: the slot (acquired while the decoder is open, so `pg_replication_slots.active_pid` is the
//! worker), the decoding context with its WAL reader and reorder buffer, and the messages the
//! pg_tide output plugin wrote since the last [`Decoder::read`].
//!
//! Guarantees:
//! - WAL is read once: each [`Decoder::read`] continues where the previous one stopped (a
//!   decoding call per iteration re-read everything from the slot's restart point, which was the
//!   worker's largest cost). Only [`Decoder::open`] starts at the restart point, as any decoding
//!   session must.
//! - Reads never wait for WAL: a read stops at the flush position taken when it started.
//! - After a read the buffer holds whole source transactions only (a transaction's changes are
//!   replayed by its commit record, in one call), and at least `max_messages` messages unless the
//!   read reached the flush position. Past `logical_decoding_work_mem` the buffer goes to a
//!   temporary file under `base/pgsql_tmp` ([`SpillBuffer`]), so a huge source transaction does
//!   not have to fit in memory.
//! - With `tide.stream_in_progress` on (when the decoder opens), the plugin streams transactions
//!   larger than `logical_decoding_work_mem` while they run; their blocks are spooled, one
//!   temporary file per transaction ([`Streams`]), and go into the buffer as one ordinary
//!   committed transaction at their commit record (dropped at their abort, an aborted
//!   subtransaction's part dropped at the commit). So the buffer, and what the applier sees, is
//!   the same as without streaming: whole transactions in commit order. The spools belong to the
//!   decoding session: closing the decoder removes them, and the next session (which starts at
//!   the slot's restart point, before the first change of every transaction still running, as
//!   PostgreSQL keeps it) streams those transactions again from their start.
//! - For a remote target (`remote_streams` above 0 at [`Decoder::open`]), the streamed blocks
//!   and aborts are also handed out in stream order (`Streams::pass_through`), for the applier
//!   to write each such transaction into a remote transaction of its own while it runs
//!   ([`Decoder::streams`], `worker::stream_apply`); the committed transaction still comes whole
//!   from the spool at its commit. That state belongs to the decoding session too: closing the
//!   decoder rolls back every such remote transaction.
//! - The files of the buffer and of the spools together never hold more than
//!   `tide.spool_file_limit` (-1: `temp_file_limit`, which does not count files written outside
//!   PostgreSQL's own temporary file layer): a write past it fails the read with SQLSTATE 53400,
//!   naming the pipeline and the setting; the iteration fails (shown in `tide.pipelines`), the
//!   slot keeps every change, and the worker retries from its confirmed position, through once
//!   the limit is raised.
//! - The confirmed position needs nothing more: a transaction in progress, streamed or not, has
//!   not committed before [`Decoder::position`], so confirming that position does not skip it
//!   (decoding skips only transactions that committed before the confirmed position, and
//!   PostgreSQL starts streaming a transaction again only past that position).
//! - The slot moves only through [`Decoder::confirm`], which the worker calls after the target
//!   committed up to that position.
//! - On a failover slot (PostgreSQL 17 and later) with `synchronized_standby_slots` set, what
//!   PostgreSQL's walsender guarantees for it holds here too (docs/high-availability.md): for a
//!   target outside the source database (remote, kafka) a read decodes only WAL those standbys
//!   confirmed ([`Decoder::standby_wait`] says while it waits), and for every target a position
//!   is confirmed only once they have the WAL written up to it (the target's own writes in the
//!   database included), so the slot a standby synchronises never runs ahead of its copy of
//!   the target.
//! - The worker closes the decoder after any failed iteration (the buffer and the context's
//!   position then disagree with what the target has) and whenever the set of captured tables
//!   changes; the next open starts again from the slot's confirmed position.
//!
//! Catalog caches: between reads the worker runs ordinary transactions, which fill the caches with
//! current catalog entries; decoding needs the entries as of the decoded WAL (historic
//! snapshots), and the ordinary queries after it must not see those. The two agree, and the
//! caches can be shared as they are, when no change of the system catalogs committed after the
//! oldest WAL position whose catalog state the read can use: the older of where the read starts
//! and the first change of the oldest transaction the reorder buffer holds (decoded at its commit
//! with a snapshot from its start). Every backend's commit callback reports catalog changes with
//! their commit position (`shmem::catalog_changed_after`, which also counts those committing
//! right now: visible before their end position is known). So a read resets the caches
//! (`InvalidateSystemCaches()`, as PostgreSQL's SQL decoding functions do around each call)
//! before it starts when such a change exists, and after it ends when one exists then; and
//! always around the first read of a decoder, and whenever `max_prepared_transactions` allows
//! prepared transactions (a `COMMIT PREPARED` runs no commit callback of the transaction that
//! changed the catalogs). Resetting on every read cost about a quarter of a backfilling
//! worker's CPU: every cached plan, relation and catalog entry was rebuilt after each read.

use crate::error::{TideError, TideResult};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CString;
use tide_core::lsn::Lsn;
use tide_core::spill::FileBudget;
use tide_core::spill::{Drain, SpillBuffer};
use tide_core::stream_spool::Streams;

/// PostgreSQL functions pgrx does not bind (`replication/decode.h`), or binds only as Rust
/// wrappers where a C function pointer is needed (`access/xlogutils.h`).
mod c {
    use pgrx::pg_sys;
    unsafe extern "C-unwind" {
        pub fn LogicalDecodingProcessRecord(
            ctx: *mut pg_sys::LogicalDecodingContext,
            record: *mut pg_sys::XLogReaderState,
        );
        pub fn read_local_xlog_page(
            state: *mut pg_sys::XLogReaderState,
            target_page_ptr: pg_sys::XLogRecPtr,
            req_len: std::ffi::c_int,
            target_rec_ptr: pg_sys::XLogRecPtr,
            cur_page: *mut std::ffi::c_char,
        ) -> std::ffi::c_int;
        pub fn wal_segment_open(
            state: *mut pg_sys::XLogReaderState,
            next_seg_no: pg_sys::XLogSegNo,
            tli_p: *mut pg_sys::TimeLineID,
        );
        pub fn wal_segment_close(state: *mut pg_sys::XLogReaderState);
    }
}

/// `LogicalDecodingProcessRecord`, with an ERROR turned into a Rust panic that pgrx reports
/// (a longjmp must not cross Rust frames). Returns with the memory context current that was
/// current when it was called.
///
/// Why the switch back: replaying a committed transaction (`ReorderBufferProcessTXN`) runs it in
/// an internal subtransaction of the worker's transaction and ends with
/// `RollbackAndReleaseCurrentSubTransaction()`, which leaves the *transaction's* memory context
/// current, not the caller's. The WAL reader allocates lazily in the current context and keeps
/// what it allocated across reads: its record buffer (`readRecordBuf`, grown for a record longer
/// than any before that spans pages) and oversized decoded records (freed only at the next
/// record, possibly in a later read). Allocated in the iteration's transaction context, they
/// dangle once it commits: the next read or `FreeDecodingContext` frees them from a context that
/// is gone (seen as "could not find block containing chunk", garbage catalog OIDs and segfaults
/// in later allocations). Walsenders have no outer transaction (the replay leaves
/// `TopMemoryContext` current) and the SQL decoding functions free their reader within their
/// transaction, so neither meets this; a reader kept across transactions does.
unsafe fn process_record(
    ctx: *mut pg_sys::LogicalDecodingContext,
    record: *mut pg_sys::XLogReaderState,
) {
    // SAFETY: the caller's: `ctx` is the decoder's open decoding context and `record` its reader
    // with a record just read; LogicalDecodingProcessRecord runs behind pgrx's FFI guard (an ERROR
    // becomes a panic), and `_restore` switches back to the caller's memory context on every path.
    unsafe {
        let cx = pg_sys::CurrentMemoryContext;
        let _restore = RestoreContext(cx);
        pg_sys::ffi::pg_guard_ffi_boundary(move || c::LogicalDecodingProcessRecord(ctx, record))
    }
}

fn io_err(e: std::io::Error) -> TideError {
    if let Some(reached) = tide_core::spill::limit_reached(&e) {
        return limit_err(reached);
    }
    TideError::new(
        pgrx::PgSqlErrorCode::ERRCODE_IO_ERROR,
        format!("pg_tide worker: cannot use its temporary file under base/pgsql_tmp: {e}"),
    )
    .hint("Check free space and permissions in the data directory.")
}

/// The error of a write refused by the worker's [`FileBudget`] (`tide.spool_file_limit`):
/// 53400, as `temp_file_limit`'s own, naming the pipeline and the setting.
fn limit_err(reached: tide_core::spill::FileLimitReached) -> TideError {
    let setting = crate::gucs::spool_file_limit()
        .map(|(_, s)| s)
        .unwrap_or("tide.spool_file_limit");
    TideError::new(
        pgrx::PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        format!(
            "pg_tide worker of pipeline \"{}\": its temporary files would exceed {setting} ({} kB; {} kB in use)",
            this_pipeline(),
            reached.limit / 1024,
            reached.used / 1024
        ),
    )
    .hint("A source transaction larger than the limit is being decoded (with a streamed one, about twice its size is needed at its commit). Nothing is lost: the slot keeps the changes and the worker retries. Raise tide.spool_file_limit (or temp_file_limit, which it follows at -1) with ALTER SYSTEM and SELECT pg_reload_conf().")
}

/// The pipeline this worker runs (its background worker's extra argument).
fn this_pipeline() -> String {
    // SAFETY: MyBgworkerEntry is this process's own entry, set before its main function runs
    // (NULL in a backend that is no background worker); bgw_extra holds the NUL-terminated
    // name the launcher gave.
    unsafe {
        let entry = pg_sys::MyBgworkerEntry;
        if entry.is_null() {
            return String::new();
        }
        let extra = &(*entry).bgw_extra;
        let bytes: Vec<u8> = extra
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Most bytes of decoded output kept in memory before the buffer moves to a temporary file: a
/// read of `tide.batch_events` ordinary messages fits (5000 messages of a few hundred bytes),
/// one huge source transaction goes to the file.
const SPILL_THRESHOLD_MAX: usize = 8 << 20;

/// The buffer's threshold: [`SPILL_THRESHOLD_MAX`], or less when the reorder buffer may hold
/// less (`logical_decoding_work_mem` as [`use_decoding_work_mem`] set it).
fn spill_threshold() -> usize {
    // SAFETY: reads this backend's setting (an int GUC); main thread.
    ((unsafe { pg_sys::logical_decoding_work_mem }.max(64) as usize) * 1024)
        .min(SPILL_THRESHOLD_MAX)
}

/// Make `tide.decoding_work_mem` this worker's `logical_decoding_work_mem`, which bounds what
/// its reorder buffer holds of transactions in progress before it writes the largest to disk
/// (read by PostgreSQL at every change it queues). Session-level, in this process only.
fn use_decoding_work_mem() {
    thread_local! {
        /// `logical_decoding_work_mem` as the worker started with it (before this set it).
        static SERVER: std::cell::Cell<Option<i32>> = const { std::cell::Cell::new(None) };
    }
    // SAFETY: reads a GUC variable of this process.
    let current = unsafe { pg_sys::logical_decoding_work_mem };
    let server = SERVER.with(|s| {
        let v = s.get().unwrap_or(current);
        s.set(Some(v));
        v
    });
    let kb = match crate::gucs::DECODING_WORK_MEM_KB.get() {
        kb if kb < 0 => server,
        kb => kb.max(64),
    };
    if current == kb {
        return;
    }
    let Ok(value) = CString::new(format!("{kb}kB")) else {
        return;
    };
    // SAFETY: sets a user-settable GUC for this session from a valid C string; the value is
    // within the GUC's range (64kB up to MAX_KILOBYTES), so it cannot error.
    unsafe {
        pg_sys::SetConfigOption(
            c"logical_decoding_work_mem".as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
        );
    }
}

/// Where the output plugin's messages go: the buffer of committed transactions, through the
/// spools of the streamed ones.
struct Output {
    out: SpillBuffer,
    streams: Streams,
    /// A streamed transaction's messages broke the protocol or could not be decoded (the read
    /// raised an ERROR): see [`Decoder::stream_failed`].
    stream_failed: bool,
}

/// The most of one streamed transaction a spool keeps in memory before its file: several may be
/// in progress at once, and at a commit the spool is copied into the buffer, which keeps up to
/// `logical_decoding_work_mem` itself.
const STREAM_SPOOL_MEMORY: usize = 8 << 20;

/// Hands out the buffered messages in order; the buffer is emptied when this is dropped.
pub struct Messages<'a>(Drain<'a>);

impl Messages<'_> {
    /// The next message, or `None` when all were handed out.
    pub fn next_message(&mut self) -> TideResult<Option<&[u8]>> {
        self.0.next_message().map_err(io_err)
    }
}

/// Switches back to a memory context when dropped (also when an ERROR unwinds).
struct RestoreContext(pg_sys::MemoryContext);

impl Drop for RestoreContext {
    fn drop(&mut self) {
        // SAFETY: switches back to a context that was current when the guard was made and outlives
        // it (the caller's, or the decoder's own, deleted only after the guard is gone); main
        // thread.
        unsafe { pg_sys::MemoryContextSwitchTo(self.0) };
    }
}

/// What one [`Decoder::read`] did.
pub struct ReadOutcome {
    /// The flush position taken when the read started.
    pub end_of_wal: Lsn,
    /// The read consumed all WAL up to `end_of_wal`.
    pub reached_end: bool,
}

/// An open decoding session on a pipeline's slot. Create and read inside a transaction; confirm
/// and close in or outside one.
pub struct Decoder {
    /// Parent of the decoding context's memory; deleted on close.
    cx: pg_sys::MemoryContext,
    ctx: *mut pg_sys::LogicalDecodingContext,
    out: Box<Output>,
    /// The `tables` option the output plugin was started with.
    pub filter: String,
    /// Its other options (`row_filter.<relid>`, `row_filter_owner`): see `plugin`.
    pub extra: Vec<(String, String)>,
    pub slot: String,
    /// No read yet: the next one resets the catalog caches around it whatever else holds.
    fresh: bool,
    /// The streamed transactions written to a remote target while they run (the applier takes
    /// it for each batch and puts it back).
    pub streams: crate::worker::stream_apply::StreamApply,
    /// What the files of `out` count against (`tide.spool_file_limit`, set at every read).
    budget: FileBudget,
    /// Reads hand out only WAL that the standbys of `synchronized_standby_slots` confirmed (a
    /// target outside the source database, on a failover slot: see [`Decoder::gated_end`]).
    gate_reads: bool,
    /// The end of WAL a read is waiting for the standbys to confirm before it decodes up to it.
    gate_pending: Option<u64>,
    /// A confirmed position held back until the standbys have the WAL up to the second value
    /// (the target's writes for it): see [`Decoder::confirm`].
    confirm_pending: Option<(Lsn, u64)>,
    /// Set by the last read: it decoded nothing new because the standbys of
    /// `synchronized_standby_slots` have not confirmed the WAL up to this position yet.
    pub standby_wait: Option<u64>,
}

/// Whether this server allows prepared transactions (set at server start).
fn two_phase() -> bool {
    // SAFETY: a lookup by a static name of a setting every server has; the string is read at
    // once.
    unsafe {
        let v = pg_sys::GetConfigOption(c"max_prepared_transactions".as_ptr(), true, false);
        v.is_null() || std::ffi::CStr::from_ptr(v).to_bytes() != b"0"
    }
}

impl Decoder {
    /// Acquire `slot` and start decoding at its restart point, for changes committed after its
    /// confirmed position. `remote_streams`: how many streamed transactions the applier may
    /// write while they run (0: none, and the blocks are not handed out).
    /// `streaming`: stream transactions in progress if `tide.stream_in_progress` allows (off
    /// after a streamed transaction could not be read, see [`Decoder::stream_failed`]).
    pub fn open(
        slot: &str,
        filter: &str,
        extra: &[(String, String)],
        remote_streams: usize,
        streaming: bool,
        gate_reads: bool,
    ) -> TideResult<Decoder> {
        let streaming_on = streaming && crate::gucs::STREAM_IN_PROGRESS.get();
        let remote_streams = if streaming_on { remote_streams } else { 0 };
        let slot_c = CString::new(slot).map_err(|_| TideError::internal("slot name with NUL"))?;
        let filter_c =
            CString::new(filter).map_err(|_| TideError::internal("table filter with NUL"))?;
        let extra_c = extra
            .iter()
            .map(|(n, v)| Ok((CString::new(n.as_str())?, CString::new(v.as_str())?)))
            .collect::<Result<Vec<_>, std::ffi::NulError>>()
            .map_err(|_| {
                TideError::invalid("a row filter contains a NUL byte")
                    .hint("Remove the table and add it again with a row filter without one.")
            })?;
        let budget = FileBudget::unlimited();
        budget.set_limit(crate::gucs::spool_file_limit().map(|(b, _)| b));
        // SAFETY: main thread, in a transaction (Decoder::open's contract). The decoding context is
        // created in `cx`, a child of TopMemoryContext that the Decoder deletes in Drop; the slot
        // acquired here is released by Drop, also on an ERROR (see below); `dec.out` is boxed, so
        // the pointer stored in `output_writer_private` stays valid until Drop frees the decoding
        // context, before the box.
        unsafe {
            pg_sys::CheckLogicalDecodingRequirements();
            let cx = pg_sys::AllocSetContextCreateInternal(
                pg_sys::TopMemoryContext,
                c"pg_tide decoder".as_ptr(),
                pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
            );
            let mut dec = Decoder {
                cx,
                ctx: std::ptr::null_mut(),
                out: Box::new(Output {
                    out: SpillBuffer::new(
                        "base/pgsql_tmp",
                        format!("pgsql_tmp_pg_tide.{}", { pg_sys::MyProcPid }),
                        spill_threshold(),
                    )
                    .with_budget(budget.clone()),
                    streams: Streams::new(
                        "base/pgsql_tmp",
                        format!("pgsql_tmp_pg_tide.{}.stream", { pg_sys::MyProcPid }),
                        spill_threshold().min(STREAM_SPOOL_MEMORY),
                    )
                    .with_budget(budget.clone()),
                    stream_failed: false,
                }),
                filter: filter.to_string(),
                extra: extra.to_vec(),
                slot: slot.to_string(),
                fresh: true,
                streams: crate::worker::stream_apply::StreamApply::new(remote_streams),
                budget,
                gate_reads,
                gate_pending: None,
                confirm_pending: None,
                standby_wait: None,
            };
            dec.out.streams.pass_through = remote_streams > 0;
            // An ERROR from here on drops `_restore` (back to the caller's memory context), then
            // `dec` (which releases the slot and deletes `cx`) while unwinding.
            crate::pgver::slot_acquire(&slot_c, true);
            let old = pg_sys::MemoryContextSwitchTo(cx);
            let _restore = RestoreContext(old);
            let mut options = std::ptr::null_mut::<pg_sys::List>();
            let proto = std::ffi::CString::new(tide_core::wire::PROTO_VERSION.to_string())
                .unwrap_or_default();
            let streaming = if streaming_on { c"on" } else { c"off" };
            let fixed = [
                (c"proto_version", proto.as_ptr()),
                (c"tables", filter_c.as_ptr()),
                (c"streaming", streaming.as_ptr()),
            ];
            let more = extra_c.iter().map(|(n, v)| (n.as_c_str(), v.as_ptr()));
            for (name, value) in fixed.into_iter().chain(more) {
                let def = pg_sys::makeDefElem(
                    pg_sys::pstrdup(name.as_ptr()),
                    pg_sys::makeString(pg_sys::pstrdup(value)) as *mut pg_sys::Node,
                    -1,
                );
                options = pg_sys::lappend(options, def as *mut std::ffi::c_void);
            }
            let mut routine = pg_sys::XLogReaderRoutine {
                page_read: Some(c::read_local_xlog_page),
                segment_open: Some(c::wal_segment_open),
                segment_close: Some(c::wal_segment_close),
            };
            let ctx = pg_sys::CreateDecodingContext(
                0,
                options,
                false,
                &mut routine,
                Some(prepare_write),
                Some(do_write),
                None,
            );
            pg_sys::MemoryContextSwitchTo(old);
            dec.ctx = ctx;
            (*ctx).output_writer_private = &mut *dec.out as *mut Output as *mut std::ffi::c_void;
            let restart = (*pg_sys::MyReplicationSlot).data.restart_lsn;
            if restart == 0 {
                dec.close();
                return Err(TideError::prerequisite(format!(
                    "replication slot \"{slot}\" has no restart position (it was invalidated)"
                ))
                .hint("The slot lost the WAL it needs (max_slot_wal_keep_size?). Drop and re-create the pipeline, then backfill its tables."));
            }
            pg_sys::XLogBeginRead((*ctx).reader, restart);
            Ok(dec)
        }
    }

    /// Decode from where the last read stopped up to the current flush position, or until at
    /// least `max_messages` messages are buffered (at a record boundary, so after whole
    /// transactions). Hand the messages out with [`Decoder::messages`].
    pub fn read(&mut self, max_messages: usize) -> TideResult<ReadOutcome> {
        // SAFETY: `self.ctx` is the open decoding context (set by open, cleared only in Drop), with
        // its reader and reorder buffer; the memory context switch is undone by `_restore` on every
        // path; main thread, in a transaction.
        unsafe {
            let end_of_wal = self.gated_end(pg_sys::GetFlushRecPtr(std::ptr::null_mut()));
            // The oldest position whose catalog state this read can use (see the header).
            let oldest = pg_sys::ReorderBufferGetOldestTXN((*self.ctx).reorder);
            let mut from = (*(*self.ctx).reader).EndRecPtr;
            if !oldest.is_null() && (*oldest).first_lsn != 0 {
                from = from.min((*oldest).first_lsn);
            }
            let reset = self.fresh || two_phase() || crate::shmem::catalog_changed_after(from);
            self.fresh = false;
            if reset {
                pg_sys::InvalidateSystemCaches();
            }
            use_decoding_work_mem();
            self.out.out.set_threshold(spill_threshold());
            self.budget
                .set_limit(crate::gucs::spool_file_limit().map(|(b, _)| b));
            let reader = (*self.ctx).reader;
            let mut reached_end = true;
            // The WAL reader allocates its buffers lazily in the current memory context and keeps
            // them: read in the decoding context's memory, which lives as long as the reader
            // (as a walsender does), not in this transaction's (`process_record` switches back
            // to it after each record).
            let old = pg_sys::MemoryContextSwitchTo((*self.ctx).context);
            let _restore = RestoreContext(old);
            // `XLogReadRecord` moves `(*reader).EndRecPtr` (clippy cannot see through the pointer).
            #[allow(clippy::while_immutable_condition)]
            while (*reader).EndRecPtr < end_of_wal {
                let mut errm: *mut std::ffi::c_char = std::ptr::null_mut();
                let record = pg_sys::XLogReadRecord(reader, &mut errm);
                if !errm.is_null() {
                    let msg = std::ffi::CStr::from_ptr(errm)
                        .to_string_lossy()
                        .into_owned();
                    return Err(TideError::internal(format!(
                        "could not read WAL for slot \"{}\": {msg}",
                        self.slot
                    )));
                }
                if !record.is_null() {
                    process_record(self.ctx, reader);
                }
                pg_sys::check_for_interrupts!();
                if self.out.out.len() >= max_messages && (*reader).EndRecPtr < end_of_wal {
                    reached_end = false;
                    break;
                }
            }
            // A record that began before the end and ends after it (read whole: the page reader
            // waits for its WAL) is handed out only once the standbys have it too.
            if self.gate_reads && (*reader).EndRecPtr > end_of_wal {
                crate::pgver::wait_for_standbys((*reader).EndRecPtr);
            }
            self.forget_orphan_streams();
            // Catalog entries built under the decoded transactions' historic snapshots must not
            // serve the ordinary queries that follow when the catalogs changed since (PostgreSQL's
            // SQL decoding functions always reset; after an ERROR, `release_after_error` does).
            if reset || crate::shmem::catalog_changed_after(from) {
                pg_sys::InvalidateSystemCaches();
            }
            Ok(ReadOutcome {
                end_of_wal: Lsn(end_of_wal),
                reached_end,
            })
        }
    }

    /// Forget the streamed transactions PostgreSQL will send nothing more of: when the reorder
    /// buffer holds no transaction, none of those spooled can get another block, a commit or an
    /// abort in this session. (PostgreSQL 15 sends no `stream_abort` for a transaction whose
    /// block it cut short at a concurrent abort: without this its spool, and a remote
    /// transaction written while it ran, would stay until the decoder is closed.)
    fn forget_orphan_streams(&mut self) {
        if self.out.streams.in_progress() == 0 || !self.idle() {
            return;
        }
        let xids = self.out.streams.in_progress_xids();
        for &xid in &xids {
            self.streams.abort(xid);
        }
        self.out.streams.clear();
        log!(
            "pg_tide worker: slot \"{}\": forgot {} streamed transaction(s) that ended without a stream abort (aborted while decoded): {xids:?}",
            self.slot,
            xids.len()
        );
    }

    /// The messages of the last read, in order; the buffer is emptied when this is dropped.
    pub fn messages(&mut self) -> Messages<'_> {
        Messages(self.out.out.drain())
    }

    /// Bytes of output written to temporary files since the decoder was opened.
    pub fn spilled_total(&self) -> u64 {
        self.out.out.spilled_total()
    }

    /// Streamed transactions in progress (spooled, not committed yet).
    pub fn streams_in_progress(&self) -> usize {
        self.out.streams.in_progress()
    }

    /// Whether a read failed on a streamed transaction's messages (out of order, or
    /// undecodable): the worker then decodes without streaming for a while (issue 42: a
    /// pipeline never stays stuck on a transaction it cannot read as a stream).
    pub fn stream_failed(&self) -> bool {
        self.out.stream_failed
    }

    /// Whether the reorder buffer holds no transaction: a new decoding session would start at
    /// the confirmed position, with nothing to read again.
    pub fn idle(&self) -> bool {
        // SAFETY: `ctx` is the live decoding context this decoder owns (freed only in drop);
        // the call reads the reorder buffer's list head.
        unsafe { pg_sys::ReorderBufferGetOldestTXN((*self.ctx).reorder).is_null() }
    }

    /// End of the last record read: every transaction committed before it has been handed out.
    pub fn position(&self) -> Lsn {
        // SAFETY: `self.ctx` is the open decoding context, whose reader lives as long as the
        // decoder.
        unsafe { Lsn((*(*self.ctx).reader).EndRecPtr) }
    }

    /// The target has everything committed before `lsn`: let the slot move there (and release
    /// WAL and catalog rows up to the restart point that implies).
    ///
    /// On a failover slot with `synchronized_standby_slots` set (17 and later), a position is
    /// confirmed only once those standbys have the WAL written up to now (the target's own
    /// writes for it, when the target is in the source database): the slot a standby
    /// synchronises never runs ahead of what the standby has of the target, so after a
    /// promotion the target holds everything before the synchronised slot's position. Until
    /// then the position waits (the oldest one waiting is kept, so a standby that keeps up
    /// always lets one through).
    pub fn confirm(&mut self, lsn: Lsn) {
        if !crate::pgver::acquired_slot_is_failover()
            || crate::pgver::synchronized_standby_slots().is_empty()
        {
            self.confirm_pending = None;
            Self::confirm_now(lsn);
            return;
        }
        // SAFETY: reads the WAL insert position (shared memory, under its own lock).
        let written = unsafe { pg_sys::GetXLogInsertRecPtr() };
        if let Some((held, needed)) = self.confirm_pending {
            if crate::pgver::standbys_caught_up(needed) {
                Self::confirm_now(held);
                self.confirm_pending = None;
            }
        }
        if crate::pgver::standbys_caught_up(written) {
            Self::confirm_now(lsn);
            self.confirm_pending = None;
        } else if self.confirm_pending.is_none() {
            self.confirm_pending = Some((lsn, written));
        }
    }

    fn confirm_now(lsn: Lsn) {
        // SAFETY: this process holds the decoder's slot (acquired by open, released only in Drop);
        // main thread.
        unsafe {
            pg_sys::LogicalConfirmReceivedLocation(lsn.0);
            // Written at the next checkpoint (a crash before that replays, and the applied
            // position makes the replay a no-op).
            pg_sys::ReplicationSlotMarkDirty();
        }
    }

    /// Where a read may decode up to, given the flush position `flush`: `flush`, unless the
    /// decoder gates its reads (a remote or kafka target) on a failover slot and the standbys
    /// of `synchronized_standby_slots` have not confirmed it yet, as PostgreSQL's walsender
    /// and `pg_logical_slot_get_changes` wait before handing out a failover slot's changes
    /// (`WaitForStandbyConfirmation`): then where the last read stopped (nothing new), and the
    /// next reads wait for that same position (not a newer one, which a standby under load
    /// would never have caught up with) before decoding up to it. pg_tide decodes in its own
    /// process, where PostgreSQL's check does not run. [`Decoder::standby_wait`] says which
    /// position it waits for.
    fn gated_end(&mut self, flush: u64) -> u64 {
        self.standby_wait = None;
        if !self.gate_reads || !crate::pgver::acquired_slot_is_failover() {
            self.gate_pending = None;
            return flush;
        }
        let want = self.gate_pending.unwrap_or(flush);
        if crate::pgver::standbys_caught_up(want) {
            self.gate_pending = None;
            return want;
        }
        self.gate_pending = Some(want);
        self.standby_wait = Some(want);
        // SAFETY: the decoding context and its reader live as long as the decoder.
        unsafe { (*(*self.ctx).reader).EndRecPtr }
    }

    /// Free the decoding context and release the slot (what dropping the decoder does).
    pub fn close(self) {
        drop(self)
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        // SAFETY: each pointer is checked for NULL and cleared after it is freed, so a second drop
        // (or a drop after release_after_error) frees nothing twice; FreeDecodingContext runs while
        // the slot is still acquired, as it needs; main thread.
        unsafe {
            if !self.ctx.is_null() {
                // Calls the plugin's shutdown callback, frees the reorder buffer (and its spill
                // files) and closes the WAL segment. Needs the slot still acquired.
                pg_sys::FreeDecodingContext(self.ctx);
                self.ctx = std::ptr::null_mut();
            }
            if !pg_sys::MyReplicationSlot.is_null() {
                pg_sys::ReplicationSlotRelease();
            }
            if !self.cx.is_null() {
                pg_sys::MemoryContextDelete(self.cx);
                self.cx = std::ptr::null_mut();
            }
        }
        self.out.out.clear();
        self.out.streams.clear();
    }
}

/// After a failed iteration or a failed [`Decoder::open`]: free what is left and release the slot,
/// whatever state the ERROR left them in. Call outside a transaction.
pub fn release_after_error(dec: Option<Decoder>) -> TideResult<()> {
    crate::worker::tx::run(|| {
        drop(dec);
        // SAFETY: MyReplicationSlot is this process's; released only if still acquired; the caches
        // are invalidated inside the transaction `tx::run` opened; main thread.
        unsafe {
            if !pg_sys::MyReplicationSlot.is_null() {
                pg_sys::ReplicationSlotRelease();
            }
            // A failed read may have left entries built under a historic snapshot.
            pg_sys::InvalidateSystemCaches();
        }
        Ok(())
    })
}

#[pg_guard]
unsafe extern "C-unwind" fn prepare_write(
    ctx: *mut pg_sys::LogicalDecodingContext,
    _lsn: pg_sys::XLogRecPtr,
    _xid: pg_sys::TransactionId,
    _last_write: bool,
) {
    // SAFETY: `ctx` is the decoding context PostgreSQL passes to its prepare_write callback, whose
    // `out` is its StringInfo.
    unsafe { pg_sys::resetStringInfo((*ctx).out) };
}

#[pg_guard]
unsafe extern "C-unwind" fn do_write(
    ctx: *mut pg_sys::LogicalDecodingContext,
    _lsn: pg_sys::XLogRecPtr,
    _xid: pg_sys::TransactionId,
    _last_write: bool,
) {
    // SAFETY: `ctx` is the decoding context PostgreSQL passes to its write callback;
    // `output_writer_private` is NULL or the decoder's boxed Output (see open), alive while the
    // context is; `out` holds `len` initialized bytes.
    unsafe {
        let out = (*ctx).output_writer_private as *mut Output;
        if out.is_null() {
            return;
        }
        let s = (*ctx).out;
        let bytes = std::slice::from_raw_parts((*s).data as *const u8, (*s).len as usize);
        let Output {
            out,
            streams,
            stream_failed,
        } = &mut *out;
        if bytes.first() == Some(&b'S') && crate::gucs::FAIL_STREAM_BLOCKS.get() {
            *stream_failed = true;
            TideError::internal(
                "pg_tide worker: a streamed block refused (tide.fail_stream_blocks is on)",
            )
            .hint("tide.fail_stream_blocks is fault injection for tests: turn it off.")
            .raise()
        }
        match streams.route(bytes, out) {
            Ok(()) => {}
            Err(tide_core::stream_spool::StreamError::Io(e)) => io_err(e).raise(),
            Err(e) => {
                *stream_failed = true;
                TideError::internal(format!("pg_tide worker: {e}"))
                    .hint("The worker reads the stream again without streaming transactions in progress until it has passed this point, and retries; nothing is lost. If the same error comes back, report it with the server log.")
                    .raise()
            }
        }
    }
}
