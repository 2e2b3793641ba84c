//! One iteration of a pipeline worker, inside its transaction (`worker::pipeline` runs the loop
//! around it): the pipeline's row locked and read, the decoder opened on its table list, the
//! stream read and applied to the target ([`crate::worker::apply`]), the batch recorded with the
//! applied position.
//!
//! Owns: what an iteration does between its transaction's start and commit, with the worker's
//! state lent to it ([`Lent`]). Guarantees: the target commits (or buffers, inside the
//! transaction) before the catalog records the applied position, in the same transaction; what
//! the worker must know of a failed iteration reaches it through [`Trail`], not through the
//! error.

use crate::catalog::{self, pipelines::PipelineRow, pipelines::Resync};
use crate::error::{TideError, TideResult};
use crate::gucs;
use crate::target::Target;
use crate::worker::apply::{Applier, Outcome, TableSets, Trail};
use crate::worker::backfill::{keyless, Backfiller};
use crate::worker::decoder::Decoder;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use std::collections::{HashMap, HashSet};
use tide_core::lsn::Lsn;
use tide_core::model::RelDesc;
use tide_core::wire;

/// Now, as PostgreSQL's timestamps count it (microseconds since 2000).
pub(super) fn now_us() -> i64 {
    // SAFETY: reads the clock; no pointer; main thread.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// A paused pipeline's worker keeps this server's hold on a remote target (its lease): a copy of
/// the source started meanwhile must not take it (see `target::table::fence`). A failure is left
/// for the resume to report (the pause's reason stays what it is).
fn keep_lease(p: &PipelineRow, sink: &mut Option<Box<dyn Target>>) {
    if !crate::target::kind(p.target).remote {
        return;
    }
    if sink.is_none() {
        match crate::target::for_pipeline(p) {
            Ok(s) => *sink = Some(s),
            Err(e) => {
                debug1!(
                    "pg_tide worker \"{}\": paused, cannot reach its target to keep its lease: {e}",
                    p.name
                );
                return;
            }
        }
    }
    if let Some(s) = sink.as_deref_mut().and_then(crate::target::as_remote) {
        if let Err(e) = s.keep_lease(p) {
            debug1!(
                "pg_tide worker \"{}\": paused, could not renew its lease on the target: {e}",
                p.name
            );
        }
    }
}

/// How an iteration reads the stream.
#[derive(Clone, Copy)]
pub(super) struct ReadMode {
    /// One source transaction at most (after a failure, see `name_failed_transaction`).
    pub one_at_a_time: bool,
    /// A decoder opened now streams transactions in progress (see `Worker::no_stream_until`).
    pub streaming: bool,
}

/// What one iteration works with: the worker's state across iterations, lent to it for its
/// transaction.
pub(super) struct Lent<'w> {
    pub name: &'w str,
    pub bf: &'w mut Backfiller,
    pub sink: &'w mut Option<Box<dyn Target>>,
    pub dec: &'w mut Option<Decoder>,
    pub rels: &'w mut HashMap<u32, RelDesc>,
    pub trail: &'w mut Trail,
    pub mode: ReadMode,
}

/// One iteration, inside its transaction: the pipeline's state (gone, paused, its slot lost:
/// nothing is read), else the stream read and applied ([`stream`]).
pub(super) fn in_transaction(mut w: Lent<'_>) -> TideResult<Outcome> {
    let name = w.name;
    Spi::connect_mut(|c| {
        let Some(p) = catalog::pipelines::lock_pipeline(c, name)? else {
            return Ok(Outcome {
                gone: true,
                ..Default::default()
            });
        };
        if !p.enabled {
            if let Some(e) = catalog::slots::bound_paused_wal(c, &p)? {
                return Err(e);
            }
            // A paused pipeline's lost slot shows in tide.pipelines at once; it is recovered
            // when the pipeline is resumed.
            if let (Some(problem), None) = (&p.slot_problem, p.resync) {
                catalog::slots::mark_lost_in(c, name, &problem.reason(&p.slot_name))?;
            }
            catalog::slots::note_paused(c, &p)?;
            keep_lease(&p, w.sink);
            return Ok(Outcome {
                paused: true,
                ..Default::default()
            });
        }
        // A lost slot (or a recovery that did not finish): recovered before anything else,
        // outside this transaction (see catalog::slots).
        if p.slot_problem.is_some() || p.resync == Some(Resync::SlotLost) {
            let reason = match &p.slot_problem {
                Some(problem) => problem.reason(&p.slot_name),
                None => format!(
                    "the recovery of replication slot \"{}\" did not finish",
                    p.slot_name
                ),
            };
            let error = catalog::slots::lost_error(c, &p, &reason)?;
            return Ok(Outcome {
                slot_lost: Some(catalog::slots::SlotLost { reason, error }),
                ..Default::default()
            });
        }
        catalog::slots::note_paused(c, &p)?;
        let mut notes = Vec::new();
        // A kafka pipeline's resync end events, sent first in this iteration (an outbox's are
        // written by finish_resync).
        let mut resync_end = Vec::new();
        if p.resync == Some(Resync::Resyncing) {
            if let Some(note) = catalog::slots::finish_resync(c, &p)? {
                notes.push(note);
                resync_end = catalog::slots::kafka_marks(c, name, catalog::slots::Phase::End)?;
            }
        }
        catalog::slots::allow_output_plugin()?;
        // Mark this iteration's transaction (its target writes above all) as pg_tide's.
        super::origin::acquire(name, &p.slot_name)?;
        // Opening a decoder logs "starting logical decoding for slot" and the snapshot builder
        // logs its progress, at LOG. Quiet them for this transaction only (the worker's own
        // messages are logged after the transaction ends).
        crate::sql::one::<String>("SELECT set_config('log_min_messages', 'fatal', true)", &[])?;
        // A remote target checks what it connects with in `begin` (after a foreign server,
        // user mapping or role changed) and connects anew, or stops with the reason.
        if w.sink.is_none() {
            *w.sink = Some(crate::target::for_pipeline(&p)?);
        }
        let mut out = stream(c, &p, &mut w, resync_end)?;
        notes.append(&mut out.notes);
        out.notes = notes;
        Ok(out)
    })
}

/// Read the stream and apply it to the target, then record the batch (the pipeline row
/// `p` locked; `resync_end`: a kafka pipeline's resync end events, sent first).
fn stream(
    c: &mut SpiClient<'_>,
    p: &PipelineRow,
    w: &mut Lent<'_>,
    resync_end: Vec<(u32, String, String)>,
) -> TideResult<Outcome> {
    let Lent {
        bf,
        sink,
        dec,
        rels,
        trail,
        mode,
        ..
    } = w;
    let sink: &mut dyn Target = sink
        .as_deref_mut()
        .ok_or_else(|| TideError::internal("no sink"))?;
    let tables = catalog::tables::captured(c, &p.name)?;
    let mut notes = Vec::new();
    if tables.iter().any(|t| t.partitioned && t.capturing) {
        super::partitions::follow(c, p, now_us(), &mut notes)?;
    }
    // A remote target keeps its own applied position (written in its own transactions).
    let target_applied = sink.begin(c, p)?;
    send_resync_end(c, sink, resync_end)?;
    let (signal_relid, marker_relid) = catalog::signal_and_marker_relids()?;
    let (sets, filter) = table_sets(&tables, signal_relid, marker_relid);
    let (applied, recorded, confirmed) = positions(p, target_applied)?;
    let extra = plugin_options(c, &tables, p)?;
    let decoder = open_decoder(dec, rels, p, &filter, &extra, mode.streaming)?;
    // Tables without a key: copied at this boundary, skipped where a copy holds them.
    let copies = keyless::at_start(c, (p, &tables), bf, sink, decoder, applied, &mut notes)?;
    // One message: the decoder stops at the record boundary after it, which is the end of one
    // source transaction (a transaction's messages are handed out whole at its commit).
    let batch_events = if mode.one_at_a_time {
        1
    } else {
        gucs::BATCH_EVENTS.get().max(1) as usize
    };
    let spilled_before = decoder.spilled_total();
    let read = decoder.read(batch_events)?;
    let position = decoder.position();
    let skips = catalog::skips::lsns(c, &p.name)?;
    // Taken for the batch and put back after it (an error drops it with the decoder's
    // session: every remote transaction of a streamed one is rolled back).
    let streams = std::mem::take(&mut decoder.streams);
    let mut ap = Applier {
        c,
        p,
        bf,
        sink,
        rels,
        trail,
        sets,
        signal_relid,
        marker_relid,
        applied,
        recorded,
        txn: None,
        last_applied: None,
        high: applied.max(confirmed),
        marks: Vec::new(),
        removals: Vec::new(),
        announce: Vec::new(),
        rewrites: Vec::new(),
        stopped: false,
        owner: crate::security::owner_oid(&p.owner, &format!("pipeline \"{}\"", p.name))?,
        readable: HashSet::new(),
        skips,
        skipped: Vec::new(),
        streams,
        elsewhere: None,
        copies,
        out: Outcome {
            spilled: decoder.spilled_total() - spilled_before,
            notes,
            ..Default::default()
        },
    };
    apply_messages(decoder, &mut ap)?;
    let Applier {
        c,
        sink,
        last_applied,
        high,
        marks,
        removals,
        rewrites,
        stopped,
        skipped,
        mut out,
        streams,
        ..
    } = ap;
    decoder.streams = streams;
    let done = Done {
        removals,
        skipped,
        marks,
        rewrites,
        last_applied,
    };
    commit_batch(c, p, sink, &done, &mut out)?;
    out.drained = !stopped && read.reached_end;
    out.reopen = stopped;
    out.start_flush = read.end_of_wal;
    // Unless stopped, every transaction committed before the decoder's position has been
    // handed out, and those with changes for us are in this transaction.
    let high = if stopped { high } else { high.max(position) };
    out.advance = (high > confirmed).then_some(high);
    Ok(out)
}

/// The batch made durable: the target's part (its own commit, or its buffered writes inside
/// the iteration's transaction) first, then the catalog's, with the applied position.
fn commit_batch(
    c: &mut SpiClient<'_>,
    p: &PipelineRow,
    sink: &mut dyn Target,
    done: &Done,
    out: &mut Outcome,
) -> TideResult<()> {
    let applied = done.last_applied.map(|(end, _)| end);
    sink.commit(c, &p.name, applied, crate::target::CommitPoint::End)?;
    record_batch(c, p, done, out)
}

/// A kafka pipeline's resync end events (`resync_end`, none unless its resync just finished),
/// at the current WAL position.
fn send_resync_end(
    c: &mut SpiClient<'_>,
    sink: &mut dyn Target,
    resync_end: Vec<(u32, String, String)>,
) -> TideResult<()> {
    if resync_end.is_empty() {
        return Ok(());
    }
    let now = crate::sql::one::<String>("SELECT pg_catalog.pg_current_wal_lsn()::text", &[])?
        .and_then(|l| l.parse::<Lsn>().ok())
        .ok_or_else(|| TideError::internal("cannot read the current WAL position"))?;
    send_resync_marks(c, sink, resync_lsn(now, true), resync_end)
}

/// What a batch did that the catalog records after the target committed it.
struct Done {
    removals: Vec<u32>,
    skipped: Vec<(Lsn, u32)>,
    marks: Vec<(u32, Lsn)>,
    rewrites: Vec<(u32, Lsn)>,
    last_applied: Option<(Lsn, i64)>,
}

/// Record a batch in the catalog, in the iteration's transaction: tables removed, transactions
/// skipped, tables now captured, `tide.alter_table`s now in effect (and their re-reads),
/// rewritten tables' re-reads, the applied position (or the
/// cleared error of a pipeline that failed before).
fn record_batch(
    c: &mut SpiClient<'_>,
    p: &PipelineRow,
    d: &Done,
    out: &mut Outcome,
) -> TideResult<()> {
    for relid in &d.removals {
        catalog::tables::forget_removed(c, &p.name, *relid)?;
    }
    for (lsn, xid) in &d.skipped {
        catalog::skips::mark_skipped(c, &p.name, *lsn, *xid)?;
        out.notes.push(format!(
            "skipped the transaction committed at {lsn} (xid {xid}), as tide.skip_transaction asked"
        ));
    }
    for (relid, lsn) in &d.marks {
        catalog::tables::mark_capturing(c, &p.name, *relid, &lsn.to_string())?;
    }
    for (relid, xid, lsn) in std::mem::take(&mut out.alters) {
        // From here the decoder and the backfills shape the table the new way, and it is read
        // again under it.
        catalog::tables::end_alter(c, &p.name, relid, &xid)?;
        let note = catalog::backfills::queue_reseed(c, &p.name, relid, &lsn.to_string())?;
        out.notes.push(note);
    }
    for (relid, lsn) in &d.rewrites {
        out.notes.push(catalog::backfills::reread_after_rewrite(
            c,
            &p.name,
            *relid,
            &lsn.to_string(),
        )?);
    }
    if let Some((end, time)) = d.last_applied {
        catalog::pipelines::record_applied(c, &p.name, &end.to_string(), Some(time))?;
        out.last_commit_time = Some(time);
    } else if p.has_error {
        catalog::pipelines::clear_error(c, &p.name)?;
    }
    Ok(())
}

/// The pipeline's tables as the applier sorts them, and the decoder's filter: their OIDs and
/// those of pg_tide's signal and marker tables.
fn table_sets(
    tables: &[catalog::tables::TableRow],
    signal_relid: u32,
    marker_relid: u32,
) -> (TableSets, String) {
    let sets = TableSets {
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
        removing: tables
            .iter()
            .filter(|t| t.removing)
            .map(|t| t.relid)
            .collect(),
        listed: tables.iter().map(|t| t.relid).collect(),
    };
    let filter: String = tables
        .iter()
        .map(|t| t.relid)
        .chain([signal_relid, marker_relid])
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(",");
    (sets, filter)
}

/// The output plugin's options beyond the table list: the row filters and column lists
/// ([`row_filter_options`]), the column masks and their salt (`catalog::masks`; the plugin
/// applies them, see `tide_core::mask`).
fn plugin_options(
    c: &mut SpiClient<'_>,
    tables: &[catalog::tables::TableRow],
    p: &PipelineRow,
) -> TideResult<Vec<(String, String)>> {
    let mut extra = row_filter_options(tables, &p.owner)?;
    extra.extend(catalog::masks::plugin_options(c, &p.name)?);
    Ok(extra)
}

/// The output plugin's shaping options for `tables`: `row_filter.<relid>` per filtered table,
/// and the owner's OID (whose rights the plugin checks the filters' functions against);
/// `columns.<relid>` (attribute numbers) per table with a column list.
fn row_filter_options(
    tables: &[catalog::tables::TableRow],
    owner: &str,
) -> TideResult<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = tables
        .iter()
        .filter_map(|t| {
            t.row_filter
                .as_ref()
                .map(|f| (format!("row_filter.{}", t.relid), f.clone()))
        })
        .collect();
    let filters = !out.is_empty();
    out.extend(tables.iter().filter_map(|t| {
        t.columns.as_ref().map(|c| {
            let list = c.iter().map(|a| a.to_string()).collect::<Vec<_>>();
            (format!("columns.{}", t.relid), list.join(","))
        })
    }));
    if filters {
        let oid = crate::security::owner_oid(owner, "the pipeline")?;
        out.push(("row_filter_owner".into(), oid.to_u32().to_string()));
    }
    Ok(out)
}

/// The decoder, open on the pipeline's slot with `filter`: the decoder follows the catalog's
/// table list, so a changed list means a new decoding session from the confirmed position (the
/// plugin's filter is fixed when it starts).
fn open_decoder<'d>(
    dec: &'d mut Option<Decoder>,
    rels: &mut HashMap<u32, RelDesc>,
    p: &PipelineRow,
    filter: &str,
    extra: &[(String, String)],
    streaming: bool,
) -> TideResult<&'d mut Decoder> {
    if dec
        .as_ref()
        .is_some_and(|d| d.filter != filter || d.extra != extra || d.slot != p.slot_name)
    {
        if let Some(d) = dec.take() {
            d.close();
        }
    }
    if dec.is_none() {
        rels.clear();
        let kind = crate::target::kind(p.target);
        let remote_streams = if kind.remote {
            gucs::REMOTE_STREAM_CONNECTIONS.get().max(0) as usize
        } else {
            0
        };
        *dec = Some(Decoder::open(
            &p.slot_name,
            filter,
            extra,
            remote_streams,
            streaming,
            // A target outside the source database gets only WAL the standbys have.
            kind.outside,
        )?);
    }
    dec.as_mut()
        .ok_or_else(|| TideError::internal("no decoder"))
}

/// Where the pipeline has applied up to (its row's position, or the target's own when that is
/// later: a remote target commits on its own), where its catalog recorded that (its row's
/// position), and where its slot is confirmed.
fn positions(p: &PipelineRow, target_applied: Option<Lsn>) -> TideResult<(Lsn, Lsn, Lsn)> {
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
    Ok((
        applied.max(target_applied.unwrap_or(Lsn(0))),
        applied,
        confirmed,
    ))
}

/// Hand every decoded message of this read to the applier, in order, until the end or a
/// barrier (what follows a barrier is read again after the reopen: the buffer is emptied).
/// The batch must end between transactions.
fn apply_messages(decoder: &mut Decoder, ap: &mut Applier<'_, '_>) -> TideResult<()> {
    let mut messages = decoder.messages();
    while let Some(data) = messages.next_message()? {
        let msg = wire::decode(data).map_err(|e| {
            TideError::internal(format!("cannot decode a message of the pg_tide output plugin: {e}"))
                .hint("The server's pg_tide library and the worker disagree on the wire format; restart the server after upgrading pg_tide.")
        })?;
        if !ap.dispatch(msg)? {
            break;
        }
    }
    if ap.txn.is_some() || ap.elsewhere.is_some() {
        // Cannot happen: the plugin writes whole transactions. Refuse to commit half of one.
        return Err(TideError::internal(
            "the decoded stream ended inside a transaction",
        ));
    }
    Ok(())
}

/// The commit position of a resync's pseudo transaction near `lsn`: the start of its WAL page
/// (`next`: of the next page, so an end's is always after its start's). No WAL record starts at a
/// page boundary (each page begins with its header), so no source transaction commits there:
/// the events' identities (`commit_lsn`, `position`) are never a real event's.
pub(super) fn resync_lsn(lsn: Lsn, next: bool) -> Lsn {
    let page = u64::from(pg_sys::XLOG_BLCKSZ);
    Lsn((lsn.0 / page + u64::from(next)) * page)
}

/// Hand a resync's events (`marks`: relid, relation, payload) to `sink` as one pseudo source
/// transaction (xid 0) at `lsn`.
pub(super) fn send_resync_marks(
    c: &mut SpiClient<'_>,
    sink: &mut dyn Target,
    lsn: Lsn,
    marks: Vec<(u32, String, String)>,
) -> TideResult<()> {
    let marks: Vec<crate::target::ResyncMark> = marks
        .into_iter()
        .map(|(relid, relation, payload)| crate::target::ResyncMark {
            relid,
            relation,
            payload,
        })
        .collect();
    let mut t = tide_core::model::Txn {
        xid: 0,
        lsn,
        commit_time: now_us(),
        skip: false,
        position: 0,
        barrier: false,
    };
    sink.send(c, &mut t, crate::target::Change::Resync(&marks))?;
    Ok(())
}
