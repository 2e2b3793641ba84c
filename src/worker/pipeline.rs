//! The pipeline worker: one per pipeline, started by the launcher.
//!
//! Owns: reading its slot through pg_tide's output plugin, turning the decoded changes into
//! target writes, recording the applied position, and advancing the slot.
//!
//! One iteration is one transaction ([`tx::run`]):
//! 1. lock the pipeline row `FOR KEY SHARE` (a concurrent `drop_pipeline` waits for us, and we
//!    wait for it) and read the captured tables;
//! 2. `pg_logical_slot_peek_binary_changes` through a cursor (peek, not get: the slot does not
//!    move until the target has committed), decoding whole source transactions;
//! 3. skip transactions at or below the applied position (replays after a crash), write the rest
//!    to the target in batches, closing the iteration at a source-transaction boundary once
//!    `tide.batch_events` events were written: many source transactions per target transaction,
//!    never part of one;
//! 4. record the applied position in the same transaction, and commit.
//!
//! Then, in a second transaction, the slot is advanced to what was committed. A crash between
//! the two replays transactions the target already has; step 3 skips them: exactly once in
//! effect. Errors abort the iteration, land in `tide.pipelines` with a remedy and in the log,
//! and the worker retries with exponential back-off; it never exits on an iteration error.
//!
//! Table membership is exact in stream order: `tide.add_table` writes a pg_tide logical message
//! in its own transaction; changes of the table are delivered from that message on. A table
//! whose message the worker reaches while the plugin was not yet filtering for it ends the
//! iteration at that transaction, and the next peek includes it.

use crate::catalog::{self, PipelineRow};
use crate::error::{TideError, TideResult};
use crate::gucs;
use crate::shmem::{self, WorkerState};
use crate::worker::backfill::Backfiller;
use crate::worker::tx;
use pgrx::bgworkers::*;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tide_core::json::{self, ColumnDesc};
use tide_core::lsn::Lsn;
use tide_core::wire::{self, Message, Tuple};

/// Rows per outbox INSERT statement.
const FLUSH_ROWS: usize = 1000;
/// Rows fetched from the decoding cursor at a time.
const FETCH_ROWS: i64 = 1000;

pub(crate) struct OwnedColumn {
    pub name: String,
    pub type_oid: u32,
    pub key: bool,
}

impl ColumnDesc for OwnedColumn {
    fn name(&self) -> &str {
        &self.name
    }
    fn type_oid(&self) -> u32 {
        self.type_oid
    }
    fn is_key(&self) -> bool {
        self.key
    }
}

struct RelDesc {
    qualified: String,
    columns: Vec<OwnedColumn>,
}

/// What one successful iteration did.
#[derive(Default)]
struct Outcome {
    gone: bool,
    paused: bool,
    events: u64,
    txns: u64,
    last_commit_time: Option<i64>,
    /// Slot name and where it may be advanced to (everything up to it is committed).
    advance: Option<(String, Lsn)>,
    /// The iteration consumed everything the slot had when it started.
    drained: bool,
    /// WAL flush position read before decoding started.
    start_flush: Lsn,
    /// Backfill rows emitted at high watermarks.
    backfill_rows: u64,
}

/// Main function of a pipeline worker. The pipeline name is in `bgw_extra`, the database OID in
/// the argument.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn tide_pipeline_worker_main(arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let name = BackgroundWorker::get_extra().to_string();
    let dboid = unsafe { pg_sys::Oid::from_datum(arg, false) }.unwrap_or(pg_sys::InvalidOid);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(dboid), None);

    let pid = unsafe { pg_sys::MyProcPid };
    let Some(slot_idx) = shmem::claim(&name, pid, now_us()) else {
        log!("pg_tide worker: no free worker slot for pipeline \"{name}\" (at most {} pipelines run at once)", shmem::MAX_PIPELINES);
        return;
    };
    log!("pg_tide worker for pipeline \"{name}\" started");
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

    let mut failures: u32 = 0;
    let mut bf = Backfiller::default();
    loop {
        if BackgroundWorker::sigterm_received() {
            break;
        }
        if BackgroundWorker::sighup_received() {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        let result = tx::run(|| iterate(&name, &mut bf));
        let wait: Duration = match result {
            Ok(o) if o.gone => {
                log!("pg_tide worker: pipeline \"{name}\" was dropped; exiting");
                break;
            }
            Ok(o) if o.paused => {
                failures = 0;
                shmem::update(slot_idx, |w| {
                    w.state = WorkerState::Paused;
                    w.drained = true;
                    w.last_poll = now_us();
                });
                Duration::from_secs(10)
            }
            Ok(o) => {
                failures = 0;
                let mut advance_failed = None;
                if let Some((slot, lsn)) = &o.advance {
                    let lsn_text = lsn.to_string();
                    if let Err(e) = tx::run(|| catalog::advance_slot(slot, &lsn_text)) {
                        advance_failed = Some(e);
                    }
                }
                if let Some(e) = advance_failed {
                    // The target already has the data; the next iteration re-reads and skips it.
                    warning!("pg_tide worker \"{name}\": could not advance slot: {e}");
                }
                shmem::update(slot_idx, |w| {
                    w.state = WorkerState::Streaming;
                    w.events += o.events;
                    w.txns += o.txns;
                    if let Some(t) = o.last_commit_time {
                        w.last_commit_time = t;
                    }
                    w.drained = o.drained;
                    if o.drained {
                        w.caught_up_lsn = w.caught_up_lsn.max(o.start_flush.0);
                    }
                    w.last_poll = now_us();
                });
                // Between iterations: read the next backfill chunk when one is due. Its high
                // watermark is then in the slot, so the next iteration runs at once.
                let mut stepped = false;
                if !bf.has_pending() {
                    match bf.step(&name) {
                        Ok(()) => stepped = bf.has_pending(),
                        Err(e) => log!(
                            "pg_tide worker \"{name}\": reading a backfill chunk failed (SQLSTATE {}): {e}{}",
                            e.sqlstate(),
                            e.hint.as_deref().map(|h| format!(". Hint: {h}")).unwrap_or_default()
                        ),
                    }
                }
                if o.drained && !stepped {
                    Duration::from_millis(gucs::POLL_INTERVAL_MS.get().max(1) as u64)
                } else {
                    Duration::ZERO
                }
            }
            Err(e) => {
                // The chunk in memory may have seen part of a stream that will be replayed.
                bf.forget();
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
        if !wait.is_zero() && !BackgroundWorker::wait_latch(Some(wait)) {
            break;
        }
        if wait.is_zero() {
            pg_sys::check_for_interrupts!();
        }
    }
    shmem::release(slot_idx, pid);
}

fn now_us() -> i64 {
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// One iteration, inside a transaction.
fn iterate(name: &str, bf: &mut Backfiller) -> TideResult<Outcome> {
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
        if p.target != "outbox" {
            return Err(TideError::unsupported(format!(
                "pipeline \"{name}\" has target \"{}\", which this version cannot apply",
                p.target
            )));
        }
        if p.confirmed_lsn.is_none() {
            return Err(TideError::undefined(format!("replication slot \"{}\" of pipeline \"{name}\" does not exist", p.slot_name))
                .hint(format!("The slot was dropped behind pg_tide's back. Drop and re-create the pipeline: SELECT tide.drop_pipeline('{name}'); SELECT tide.create_pipeline('{name}');")));
        }
        catalog::allow_output_plugin()?;
        // Every decoding call logs "starting logical decoding for slot" at LOG in PostgreSQL 15;
        // at one call per poll that would flood the server log. Quiet it for this transaction
        // only (the worker's own messages are logged after the transaction ends).
        crate::sql::one::<String>(
            "SELECT set_config('log_min_messages', 'warning', true)",
            &[],
        )?;
        stream(c, &p, bf)
    })
}

struct TableSets {
    /// Tables whose add marker has been passed: their changes are delivered.
    capturing: HashSet<u32>,
    /// Tables in the catalog whose add marker lies ahead in the stream.
    pending: HashSet<u32>,
}

fn stream(c: &mut SpiClient<'_>, p: &PipelineRow, bf: &mut Backfiller) -> TideResult<Outcome> {
    let tables = catalog::tables(c, &p.name)?;
    let signal_relid = crate::sql::one::<i64>("SELECT 'tide.signal'::regclass::oid::int8", &[])?
        .unwrap_or(0) as u32;
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
        .chain(std::iter::once(signal_relid))
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let applied = match &p.applied_lsn {
        Some(s) => s
            .parse::<Lsn>()
            .map_err(|_| TideError::internal(format!("bad applied_lsn {s}")))?,
        None => Lsn(0),
    };
    let confirmed = p
        .confirmed_lsn
        .as_deref()
        .and_then(|s| s.parse::<Lsn>().ok())
        .unwrap_or(Lsn(0));

    // Everything committed before this position is decoded by the peek below (it decodes up to
    // the flush position at its own start, which is later).
    let start_flush =
        crate::sql::one::<String>("SELECT pg_catalog.pg_current_wal_flush_lsn()::text", &[])?
            .and_then(|s| s.parse::<Lsn>().ok())
            .unwrap_or(Lsn(0));
    let batch_events = gucs::BATCH_EVENTS.get().max(1) as u64;
    let limit = batch_events as i64;
    let mut cursor = c.try_open_cursor(
        "SELECT data FROM pg_catalog.pg_logical_slot_peek_binary_changes($1::name, NULL, $2::int4, 'proto_version', '1', 'tables', $3)",
        &[p.slot_name.clone().into(), (limit as i32).into(), filter.into()],
    )?;

    let mut out = Outcome::default();
    let mut sink = OutboxSink::new(&p.name);
    let mut rels: HashMap<u32, RelDesc> = HashMap::new();
    let mut marks: Vec<(u32, Lsn)> = Vec::new();
    let mut removals: Vec<u32> = Vec::new();
    let mut rows_seen: i64 = 0;
    let mut stopped = false;
    let mut high = applied.max(confirmed);
    // Current transaction: (xid, commit lsn, commit time, skip?, next position, barrier?)
    let mut txn: Option<Txn> = None;
    let mut last_applied: Option<(Lsn, i64)> = None;
    let mut events_in_batch: u64 = 0;

    'fetch: loop {
        let table = cursor.fetch(FETCH_ROWS)?;
        if table.is_empty() {
            break;
        }
        for row in table {
            rows_seen += 1;
            let data: &[u8] = row.get::<&[u8]>(1)?.unwrap_or(&[]);
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
                }
                Message::Signal { body } => {
                    let Some(t) = txn.as_mut() else { continue };
                    if let Some((op, pipeline, relid)) = parse_signal(body) {
                        if pipeline != p.name {
                            continue;
                        }
                        match op {
                            "add_table" => {
                                if sets.pending.remove(&relid) || sets.capturing.contains(&relid) {
                                    sets.capturing.insert(relid);
                                } else {
                                    // The plugin was not filtering for this table in this peek.
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
                            let rel = rel_desc(&rels, relid)?;
                            if let Some((pipeline, watermark, kind)) = parse_watermark(rel, &new) {
                                if pipeline == p.name {
                                    if let Some(e) =
                                        bf.on_signal(c, &mut sink, t, watermark, &kind)?
                                    {
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
                            let rel = rel_desc(&rels, relid)?;
                            let mut key = String::new();
                            json::render_key(&rel.columns, &new, &mut key).map_err(render_err)?;
                            bf.on_change(relid, &key);
                            emit_row(&mut sink, c, t, rel, "insert", key, &new)?;
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
                            let rel = rel_desc(&rels, relid)?;
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
                                bf.on_change(relid, old);
                            }
                            bf.on_change(relid, &new_key);
                            match old {
                                Some(old) if old != new_key => {
                                    // A key change is a delete of the old key and an insert of the new row.
                                    t.position += 1;
                                    sink.push(
                                        c,
                                        t,
                                        &rel.qualified,
                                        "delete",
                                        Some(old),
                                        None,
                                        None,
                                    )?;
                                    emit_row(&mut sink, c, t, rel, "insert", new_key, &new)?;
                                }
                                _ => emit_row(&mut sink, c, t, rel, "update", new_key, &new)?,
                            }
                        }
                    }
                }
                Message::Delete { relid, old_key } => {
                    if let Some(t) = txn.as_mut() {
                        if !t.skip && sets.capturing.contains(&relid) {
                            let rel = rel_desc(&rels, relid)?;
                            let mut k = String::new();
                            json::render_key(&rel.columns, &old_key, &mut k).map_err(render_err)?;
                            bf.on_change(relid, &k);
                            t.position += 1;
                            sink.push(c, t, &rel.qualified, "delete", Some(k), None, None)?;
                        }
                    }
                }
                Message::Truncate { relids, .. } => {
                    if let Some(t) = txn.as_mut() {
                        if !t.skip {
                            for relid in relids {
                                if sets.capturing.contains(&relid) {
                                    bf.on_truncate(relid);
                                    let rel = rel_desc(&rels, relid)?;
                                    t.position += 1;
                                    sink.push(c, t, &rel.qualified, "truncate", None, None, None)?;
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
                        events_in_batch += t.position as u64;
                        last_applied = Some((end_lsn, commit_time));
                    }
                    if t.barrier || events_in_batch >= batch_events {
                        stopped = true;
                        break 'fetch;
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
    drop(cursor);
    if txn.is_some() {
        // Cannot happen: the plugin writes whole transactions. Refuse to commit half of one.
        return Err(TideError::internal(
            "the decoded stream ended inside a transaction",
        ));
    }
    sink.flush(c)?;
    for relid in &removals {
        catalog::forget_removed(c, &p.name, *relid)?;
    }
    for (relid, lsn) in &marks {
        catalog::mark_capturing(c, &p.name, *relid, &lsn.to_string())?;
    }
    if let Some((end, time)) = last_applied {
        catalog::record_applied(c, &p.name, &end.to_string(), Some(time))?;
        out.last_commit_time = Some(time);
    } else if p.has_error {
        catalog::clear_error(c, &p.name)?;
    }
    out.drained = !stopped && rows_seen < limit;
    out.start_flush = start_flush;
    if high > confirmed {
        out.advance = Some((p.slot_name.clone(), high));
    }
    Ok(out)
}

pub(crate) struct Txn {
    pub xid: u32,
    pub lsn: Lsn,
    pub commit_time: i64,
    pub skip: bool,
    pub position: i32,
    pub barrier: bool,
}

/// The (pipeline, watermark, kind) of a `tide.signal` row.
fn parse_watermark(rel: &RelDesc, t: &Tuple<'_>) -> Option<(String, u64, String)> {
    let get = |name: &str| -> Option<&str> {
        let i = rel.columns.iter().position(|c| c.name == name)?;
        match t.values.get(i)? {
            wire::Value::Text(s) => Some(*s),
            _ => None,
        }
    };
    Some((
        get("pipeline")?.to_string(),
        get("watermark")?.parse().ok()?,
        get("kind")?.to_string(),
    ))
}

fn parse_signal(body: &[u8]) -> Option<(&str, &str, u32)> {
    let s = std::str::from_utf8(body).ok()?;
    let mut parts = s.split('\t');
    let op = parts.next()?;
    let pipeline = parts.next()?;
    let relid = parts.next()?.parse().ok()?;
    Some((op, pipeline, relid))
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
    sink: &mut OutboxSink,
    c: &mut SpiClient<'_>,
    t: &mut Txn,
    rel: &RelDesc,
    op: &str,
    key: String,
    new: &Tuple<'_>,
) -> TideResult<()> {
    let mut row = String::new();
    let unchanged = json::render_row(&rel.columns, new, &mut row).map_err(render_err)?;
    let unchanged = if unchanged.is_empty() {
        None
    } else {
        let mut s = String::from("[");
        for (i, idx) in unchanged.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            json::push_string(&mut s, &rel.columns[*idx].name);
        }
        s.push(']');
        Some(s)
    };
    t.position += 1;
    sink.push(c, t, &rel.qualified, op, Some(key), Some(row), unchanged)
}

fn quote_ident(s: &str) -> String {
    pgrx::spi::quote_identifier(s)
}

/// Buffers outbox rows and writes them with one multi-row INSERT per [`FLUSH_ROWS`].
pub(crate) struct OutboxSink {
    pipeline: String,
    lsn: Vec<String>,
    xid: Vec<i64>,
    time: Vec<i64>,
    pos: Vec<i32>,
    rel: Vec<String>,
    op: Vec<String>,
    key: Vec<Option<String>>,
    row: Vec<Option<String>>,
    unchanged: Vec<Option<String>>,
    backfill: Vec<Option<i64>>,
    chunk: Vec<Option<i64>>,
}

impl OutboxSink {
    fn new(pipeline: &str) -> Self {
        OutboxSink {
            pipeline: pipeline.to_string(),
            lsn: Vec::new(),
            xid: Vec::new(),
            time: Vec::new(),
            pos: Vec::new(),
            rel: Vec::new(),
            op: Vec::new(),
            key: Vec::new(),
            row: Vec::new(),
            unchanged: Vec::new(),
            backfill: Vec::new(),
            chunk: Vec::new(),
        }
    }

    /// A backfill row, emitted at a high watermark.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_read(
        &mut self,
        c: &mut SpiClient<'_>,
        t: &Txn,
        rel: &str,
        key: String,
        row: String,
        backfill_id: i64,
        chunk: i64,
    ) -> TideResult<()> {
        self.push_full(
            c,
            t,
            rel,
            "read",
            Some(key),
            Some(row),
            None,
            Some(backfill_id),
            Some(chunk),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        c: &mut SpiClient<'_>,
        t: &Txn,
        rel: &str,
        op: &str,
        key: Option<String>,
        row: Option<String>,
        unchanged: Option<String>,
    ) -> TideResult<()> {
        self.push_full(c, t, rel, op, key, row, unchanged, None, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn push_full(
        &mut self,
        c: &mut SpiClient<'_>,
        t: &Txn,
        rel: &str,
        op: &str,
        key: Option<String>,
        row: Option<String>,
        unchanged: Option<String>,
        backfill_id: Option<i64>,
        chunk: Option<i64>,
    ) -> TideResult<()> {
        self.backfill.push(backfill_id);
        self.chunk.push(chunk);
        self.lsn.push(t.lsn.to_string());
        self.xid.push(t.xid as i64);
        self.time.push(t.commit_time);
        self.pos.push(t.position);
        self.rel.push(rel.to_string());
        self.op.push(op.to_string());
        self.key.push(key);
        self.row.push(row);
        self.unchanged.push(unchanged);
        if self.lsn.len() >= FLUSH_ROWS {
            self.flush(c)?;
        }
        Ok(())
    }

    fn flush(&mut self, c: &mut SpiClient<'_>) -> TideResult<()> {
        if self.lsn.is_empty() {
            return Ok(());
        }
        c.update(
            "INSERT INTO tide.outbox (pipeline, commit_lsn, xid, commit_time, position, relation, op, key, \"row\", unchanged, backfill_id, chunk)
             SELECT $1, u.l::pg_lsn, u.x, '2000-01-01 00:00:00+00'::timestamptz + u.t * interval '1 microsecond',
                    u.p, u.r, u.o, u.k::jsonb, u.w::jsonb,
                    CASE WHEN u.n IS NULL THEN NULL ELSE ARRAY(SELECT jsonb_array_elements_text(u.n::jsonb)) END,
                    u.b, u.c
               FROM unnest($2::text[], $3::int8[], $4::int8[], $5::int4[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[],
                           $11::int8[], $12::int8[])
                    AS u(l, x, t, p, r, o, k, w, n, b, c)",
            None,
            &[
                self.pipeline.clone().into(),
                std::mem::take(&mut self.lsn).into(),
                std::mem::take(&mut self.xid).into(),
                std::mem::take(&mut self.time).into(),
                std::mem::take(&mut self.pos).into(),
                std::mem::take(&mut self.rel).into(),
                std::mem::take(&mut self.op).into(),
                std::mem::take(&mut self.key).into(),
                std::mem::take(&mut self.row).into(),
                std::mem::take(&mut self.unchanged).into(),
                std::mem::take(&mut self.backfill).into(),
                std::mem::take(&mut self.chunk).into(),
            ],
        )?;
        Ok(())
    }
}
