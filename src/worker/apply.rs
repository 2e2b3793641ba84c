//! The applier: one iteration's decoded messages, turned into target writes and catalog
//! changes, one handler per message kind (as PostgreSQL's `apply_dispatch` in `worker.c`).
//!
//! Owns: the state of one batch — the source transaction being applied ([`Txn`]), which
//! captured tables are delivered ([`TableSets`]), the table-list and alter_table markers and
//! rewrites met on the way, the highest position the slot may be confirmed at, and the [`Outcome`] counters.
//!
//! Guarantees:
//! - A transaction at or below the applied position (a replay after a crash) is decoded only to
//!   follow pg_tide's own rows in it; nothing of it reaches the target again. Its catalog
//!   effects (tables added or removed, re-reads after a rewrite) are recorded again unless the
//!   catalog's own applied position passed it ([`Applier::records`]): a remote target can hold
//!   a batch whose record in the worker's transaction failed.
//! - So is a transaction whose commit LSN `tide.skip_transaction` named: nothing of it reaches
//!   the target, and the batch records that it was skipped.
//! - [`last_begun`] is the commit LSN of the last transaction begun (not a replay, not skipped):
//!   after a failed iteration the worker decodes one source transaction per batch until it has
//!   passed where that failed (`worker::pipeline`), so a failure is then that transaction's,
//!   and the error's hint names it.
//! - Changes of a table are delivered from its `add_table` marker on and up to its
//!   `remove_table` marker, exactly at those commit positions. An `add_table` marker for a table
//!   the decoder was not filtering for (it committed after the iteration read its table list)
//!   makes the iteration fail on purpose and be done again at once with the table listed
//!   (`Applier::restart`): the table's changes after the marker in that transaction were not
//!   sent. In a replay or a skipped transaction (nothing of it reaches the target) it only ends
//!   the batch at that transaction ([`Applier::stopped`]), and the decoder is reopened with the
//!   new list. At any of its pipeline's markers the applier first waits until the marker's
//!   transaction has left the process array: its commit record can be decoded before, and the
//!   catalog rows it wrote (the table's row, a pending alter) would then be invisible to the
//!   statements that follow (an `UPDATE` of none, silently).
//! - A `tide.alter_table` marker (its payload the schema event announcing the new row filter and
//!   column list) reaches the target at its transaction's commit, after the transaction's
//!   changes ([`Change::Schema`]), and ends the batch at that transaction: the changes committed before it were decoded with the old plugin options,
//!   those after it are decoded again by a decoder reopened with the new ones (the catalog
//!   switches at the marker, with the batch, and queues the table's re-read). A marker whose
//!   call already took effect (`catalog::tables::alter_pending`) is passed over.
//! - Every change of a captured table is reported to the backfill before it is pushed, so a
//!   chunk in flight drops the keys that changed in its window; a rewrite (`Rewrite`) discards
//!   the chunk and schedules the table to be read again.
//! - A TRUNCATE of some partitions of a captured partitioned table (`TruncatePartition`) is a
//!   truncate event that carries the partition's constraint (`Event::only_where`): only the
//!   rows it holds for are removed; a chunk whose window it falls in is read again.
//! - Only `tide.marker` and `tide.signal` rows are trusted as control messages (only pg_tide
//!   can write them); the output plugin sends no logical message (anyone can emit one).
//! - A captured table's changes reach the target only while the pipeline's owner may read all
//!   of it: the first change of each table in a batch checks SELECT and row-level security
//!   against the catalogs of now ([`Applier::check_read`]); a revoked right fails the iteration
//!   there.
//! - A streamed transaction's blocks reach the applier only for a remote target
//!   (`worker::stream_apply`): each block is written to the remote while the source transaction
//!   runs, into a remote transaction of its own (`Applier::on_stream_start`); at its commit
//!   (Begin ... Commit from the spool, as any committed transaction) its changes are followed as
//!   any transaction's (backfill keys, rights, table markers) but not written again: the main
//!   target commits what came before, then the streamed transaction's remote transaction
//!   commits with the applied position (`Applier::on_commit`). Anything the remote
//!   transaction cannot take makes the transaction fall back to being applied from the spool at
//!   its commit, as for other targets.
//! - A `schema` marker (written by the event trigger in an `ALTER TABLE`'s transaction) of a
//!   captured table reaches the target at its position ([`Change::Schema`]): the outbox writes
//!   an event op `schema`, table targets apply the change or pause. A changed key pauses the
//!   pipeline before the change (nothing after it is applied) unless the table is being
//!   removed, whose changes then stop at the key change.

use crate::catalog::pipelines::PipelineRow;
use crate::error::{TideError, TideResult};
use crate::target::{Change, CommitPoint, Row, SchemaEvent, Target};
use crate::worker::backfill::Backfiller;
use crate::worker::markers::{
    column_text, dropped_table, parse_marker, parse_watermark, schema_relation,
};
use crate::worker::rows::{key_event, render_err, update_keys, Emit};
use crate::worker::stream_apply::{LiveTxn, StreamApply};
use pgrx::pg_sys;
use pgrx::spi::SpiClient;
use std::collections::{HashMap, HashSet};
use tide_core::json;
use tide_core::lsn::Lsn;
use tide_core::model::{MarkerOp, Op, OwnedColumn, RelDesc, SchemaChange, Txn};
use tide_core::wire::{self, Column, Message, Tuple};

/// What one successful iteration did.
#[derive(Default)]
pub struct Outcome {
    pub gone: bool,
    pub paused: bool,
    /// The pipeline's slot is lost: recover before anything else (see `catalog::slots`).
    pub slot_lost: Option<crate::catalog::slots::SlotLost>,
    pub events: u64,
    pub txns: u64,
    pub last_commit_time: Option<i64>,
    /// Where the slot may be confirmed (everything committed before it is applied).
    pub advance: Option<Lsn>,
    /// The decoder must be reopened (its table list is out of date).
    pub reopen: bool,
    /// The iteration consumed everything the slot had when it started.
    pub drained: bool,
    /// WAL flush position read before decoding started.
    pub start_flush: Lsn,
    /// Backfill rows emitted at high watermarks.
    pub backfill_rows: u64,
    /// Bytes of decoded output that went to a temporary file.
    pub spilled: u64,
    /// `tide.alter_table` markers passed that take effect here: (relid, the call's transaction
    /// id, commit LSN); recorded with the batch.
    pub alters: Vec<(u32, String, Lsn)>,
    /// Lines for the server log, written once the iteration's transaction has ended (LOG is
    /// quieted inside it, see `pipeline::iterate`).
    pub notes: Vec<String>,
}

/// Which captured tables are delivered.
pub struct TableSets {
    /// Tables whose add marker has been passed: their changes are delivered.
    pub capturing: HashSet<u32>,
    /// Tables in the catalog whose add marker lies ahead in the stream.
    pub pending: HashSet<u32>,
    /// Tables `tide.remove_table` is removing (their remove marker lies ahead).
    pub removing: HashSet<u32>,
    /// Every table in the decoder's list (the catalog's when the iteration began): the output
    /// plugin sends their changes. Not changed by markers.
    pub listed: HashSet<u32>,
}

impl TableSets {
    pub(super) fn follows(&self, relid: u32) -> bool {
        self.capturing.contains(&relid) || self.pending.contains(&relid)
    }
}

/// One batch being applied.
pub struct Applier<'a, 'c> {
    pub c: &'a mut SpiClient<'c>,
    pub p: &'a PipelineRow,
    pub bf: &'a mut Backfiller,
    pub sink: &'a mut dyn Target,
    /// What the worker learns of the iteration even if it fails.
    pub trail: &'a mut Trail,
    pub rels: &'a mut HashMap<u32, RelDesc>,
    pub sets: TableSets,
    /// OIDs of `tide.signal` and `tide.marker`.
    pub signal_relid: u32,
    pub marker_relid: u32,
    /// Transactions ending at or below this were applied already.
    pub applied: Lsn,
    /// Transactions ending at or below this had their catalog effects (markers, rewrites)
    /// recorded: the applied position in pg_tide's catalog, which a remote target's own
    /// position ([`Applier::applied`]) can pass when the worker's transaction fails after the
    /// remote committed ([`Applier::records`]).
    pub recorded: Lsn,
    pub txn: Option<Txn>,
    /// End LSN and commit time of the last transaction with events for the target.
    pub last_applied: Option<(Lsn, i64)>,
    /// The highest position the slot may be confirmed at.
    pub high: Lsn,
    /// `add_table` markers passed: (relid, commit LSN).
    pub marks: Vec<(u32, Lsn)>,
    /// `remove_table` markers passed.
    pub removals: Vec<u32>,
    /// Schema events of `tide.alter_table` markers of the transaction being applied, written at
    /// its commit ([`Applier::on_commit`]).
    pub announce: Vec<SchemaEvent>,
    /// Captured tables rewritten by a transaction of this batch, with its commit LSN.
    pub rewrites: Vec<(u32, Lsn)>,
    /// The batch ended at a barrier (see the module header).
    pub stopped: bool,
    pub out: Outcome,
    /// The pipeline's owner, and the captured tables it was found able to read in this batch
    /// ([`Applier::check_read`]).
    pub owner: pgrx::pg_sys::Oid,
    pub readable: HashSet<u32>,
    /// Commit LSNs of the transactions `tide.skip_transaction` asked to skip, and those of them
    /// skipped in this batch (with their xid).
    pub skips: HashSet<Lsn>,
    pub skipped: Vec<(Lsn, u32)>,
    /// The streamed transactions written to the target while they run.
    pub streams: StreamApply,
    /// The transaction being applied was written while it ran: its changes are followed, not
    /// written again; its remote transaction commits at its Commit.
    pub elsewhere: Option<Box<LiveTxn>>,
    /// Tables without a key copied whole (`worker::backfill::keyless`) whose copy may hold transactions
    /// still ahead: their changes in those transactions are skipped ([`Applier::in_copy`]).
    pub copies: HashMap<u32, tide_core::snapshot::KeylessCopy>,
}

/// What the worker learns of an iteration whether it succeeds or fails (an error cannot carry
/// it): kept by the worker across the iteration, cleared at its start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trail {
    /// The commit LSN of the last transaction the iteration began to apply (not a replay, not
    /// skipped), for the error of a failed iteration.
    pub last_begun: Option<Lsn>,
    /// The table whose `add_table` marker (at that commit LSN) ended the iteration to be done
    /// again (see [`Applier::restart`]): with the table in the decoder's list, at once.
    pub restart: Option<(u32, Lsn)>,
}

/// Wait until transaction `xid`, whose commit record was decoded, is seen as committed by a
/// snapshot taken after this returns (it leaves the process array just after its commit record
/// is flushed; decoding can be faster). At once for one that ended long ago.
fn wait_for_transaction(xid: u32) {
    if xid == 0 {
        return;
    }
    // SAFETY: called inside the iteration's transaction; the transaction committed, so its lock
    // is free or about to be: this does not block on anything that waits for the worker.
    unsafe {
        pg_sys::XactLockTableWait(
            pg_sys::TransactionId::from(xid),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            pg_sys::XLTW_Oper::XLTW_None,
        )
    };
}

impl Applier<'_, '_> {
    /// Apply one message. Returns `false` when the batch must end here.
    pub fn dispatch(&mut self, msg: Message<'_>) -> TideResult<bool> {
        match msg {
            Message::Begin {
                xid,
                final_lsn,
                commit_time,
            } => self.on_begin(xid, final_lsn, commit_time),
            Message::Relation {
                relid,
                namespace,
                name,
                columns,
            } => self.on_relation(relid, namespace, name, &columns)?,
            // The plugin sends none (see docs/wire-format.md); never trusted.
            Message::Signal { .. } => {}
            Message::Insert { relid, new } if relid == self.marker_relid => {
                self.on_marker(relid, &new)?
            }
            Message::Insert { relid, new } | Message::Update { relid, new, .. }
                if relid == self.signal_relid =>
            {
                self.on_watermark(relid, &new)?
            }
            Message::Insert { relid, new } => self.on_insert(relid, &new)?,
            Message::Update {
                relid,
                old_key,
                new,
            } => self.on_update(relid, old_key.as_ref(), &new)?,
            Message::Delete { relid, old_key } => self.on_delete(relid, &old_key)?,
            Message::Truncate { relids, flags } => self.on_truncate(&relids, flags)?,
            Message::Commit {
                end_lsn,
                commit_time,
                ..
            } => return self.on_commit(end_lsn, commit_time),
            Message::Rewrite { relid } => self.on_rewrite(relid),
            Message::TruncatePartition {
                relid,
                partition,
                predicate,
            } => self.on_truncate_partition(relid, partition, predicate)?,
            Message::Keepalive { end_lsn } => self.on_keepalive(end_lsn),
            // Blocks, for a remote target only (`worker::stream_apply`).
            Message::StreamStart { xid, first } => self.on_stream_start(xid, first)?,
            Message::StreamChange { xid: _, body } => self.on_stream_change(body)?,
            Message::StreamStop => self.on_stream_stop(),
            Message::StreamAbort { xid, subxid } => {
                if xid == subxid {
                    self.streams.abort(xid);
                } else {
                    // Its rows must not stay locked at the remote: a later transaction may
                    // change them.
                    self.streams.fall_back(xid);
                }
            }
            // The decoder turns a streamed transaction into an ordinary one at its commit
            // (`tide_core::stream_spool`).
            Message::StreamCommit { .. } => {
                return Err(TideError::internal(
                    "a streamed transaction's commit reached the applier",
                ));
            }
        }
        Ok(true)
    }

    /// Before the first change of a captured table in a batch: its owner may still read every
    /// row of it (SELECT not revoked, no row-level security applying to it since). Otherwise
    /// the iteration fails here, before anything of this batch reaches the target, and keeps
    /// failing at this change (with the reason in `tide.pipelines`) until the right is back.
    fn check_read(&mut self, relid: u32) -> TideResult<()> {
        if self.readable.contains(&relid)
            || !self.sets.capturing.contains(&relid)
            || self.txn.as_ref().is_none_or(|t| t.skip)
        {
            return Ok(());
        }
        let qualified = self
            .rels
            .get(&relid)
            .map_or_else(|| relid.to_string(), |r| r.qualified.clone());
        if let Some(e) =
            crate::security::read_problem(self.owner, pgrx::pg_sys::Oid::from(relid), &qualified)
        {
            return Err(e);
        }
        self.readable.insert(relid);
        Ok(())
    }

    /// Whether the catalog effects of `t` (a table added or removed, a re-read after a rewrite)
    /// are recorded by this batch. Not only when `t` reaches the target: a remote target commits
    /// a batch before the worker's transaction records those effects, so when that transaction
    /// fails the retry reads the batch again as a replay (the remote has it) whose effects the
    /// catalog still lacks; and a transaction skipped by `tide.skip_transaction` still adds and
    /// removes tables. Recording them again is harmless: marking a table captured and
    /// forgetting a removed one touch only a row still in that state.
    fn records(&self, t: &Txn) -> bool {
        t.lsn >= self.recorded
    }

    /// Whether the transaction being applied is in a copy of table `relid` (a table without a
    /// key, `worker::backfill::keyless`): its changes of the table are there already.
    fn in_copy(&self, relid: u32) -> bool {
        match (self.copies.get(&relid), self.txn.as_ref()) {
            (Some(k), Some(t)) => k.holds(t.xid, t.lsn),
            _ => false,
        }
    }

    fn on_begin(&mut self, xid: u32, final_lsn: Lsn, commit_time: i64) {
        let replay = final_lsn < self.applied;
        // Skipped as a replay is: pg_tide's own rows in it are still followed.
        let skipped = !replay && self.skips.contains(&final_lsn);
        if skipped {
            self.skipped.push((final_lsn, xid));
        } else if !replay {
            self.trail.last_begun = Some(final_lsn);
        }
        if let Some(live) = self.streams.take(xid) {
            // Written while it ran: committed there at its Commit, unless it is not to be
            // applied, or wrote a table no longer captured at this point (dropped: rolled back).
            // Nor one a copy of a table without a key holds (its changes of the table are
            // skipped: applied from the spool, without them).
            let copied = live
                .written
                .iter()
                .any(|r| self.copies.get(r).is_some_and(|k| k.holds(xid, final_lsn)));
            if !replay
                && !skipped
                && !copied
                && live.written.iter().all(|r| self.sets.capturing.contains(r))
            {
                self.elsewhere = Some(live);
            } else {
                self.streams.abort(xid);
            }
        }
        self.txn = Some(Txn {
            xid,
            lsn: final_lsn,
            commit_time,
            skip: replay || skipped,
            position: 0,
            barrier: false,
        });
    }

    fn on_relation(
        &mut self,
        relid: u32,
        namespace: &str,
        name: &str,
        columns: &[Column<'_>],
    ) -> TideResult<()> {
        let rel = rel_desc_of(namespace, name, columns);
        if self.sets.follows(relid) {
            self.sink.describe(self.c, relid, &rel)?;
        }
        self.rels.insert(relid, rel);
        Ok(())
    }

    fn on_marker(&mut self, relid: u32, new: &Tuple<'_>) -> TideResult<()> {
        self.not_elsewhere("a marker")?;
        let Some(t) = self.txn.as_mut() else {
            return Ok(());
        };
        let rel = rel_desc(self.rels, relid)?;
        let Some((op, pipeline, table)) = parse_marker(rel, new) else {
            return Ok(());
        };
        if pipeline != self.p.name {
            return Ok(());
        }
        // What follows reads and updates catalog rows this transaction wrote (the table's row,
        // its pending alter): its commit record is decoded, but it may not have left the
        // process array yet, and a snapshot taken now would not see them.
        wait_for_transaction(t.xid);
        match op {
            MarkerOp::AddTable => self.on_add_marker(table)?,
            MarkerOp::RemoveTable => {
                let was_capturing = self.sets.capturing.remove(&table);
                self.sets.pending.remove(&table);
                if t.lsn >= self.recorded {
                    self.removals.push(table);
                }
                // The table was dropped (the marker of the event trigger tide._drop_marker, in
                // the DROP's transaction): it leaves here, with an event saying so.
                let dropped = column_text(rel, new, "payload").filter(|p| dropped_table(p));
                if let (Some(payload), false, true) = (dropped, t.skip, was_capturing) {
                    let relation = schema_relation(payload)
                        .or_else(|| self.rels.get(&table).map(|r| r.qualified.clone()))
                        .unwrap_or_else(|| format!("relation {table}"));
                    self.out.notes.push(format!(
                        "captured table {relation} was dropped (transaction {} committed at {}): it left the pipeline at that point of the stream",
                        t.xid, t.lsn
                    ));
                    self.sink.send(
                        self.c,
                        t,
                        Change::Schema(SchemaEvent {
                            relid: table,
                            relation,
                            payload: payload.to_string(),
                            change: SchemaChange::default(),
                            rewrite: false,
                            dropped: true,
                        }),
                    )?;
                }
            }
            MarkerOp::AlterTable => {
                let payload = column_text(rel, new, "payload");
                self.on_alter_marker(table, payload)?
            }
            MarkerOp::Schema => {
                if t.skip || !self.sets.capturing.contains(&table) {
                    return Ok(());
                }
                let payload = column_text(rel, new, "payload").ok_or_else(|| {
                    TideError::internal(format!(
                        "a schema marker of relation {table} (transaction {} committed at {}) has no payload",
                        t.xid, t.lsn
                    ))
                })?;
                let change = SchemaChange::parse(payload).ok_or_else(|| {
                    TideError::internal(format!(
                        "a schema marker of relation {table} (transaction {} committed at {}) has a payload pg_tide cannot read: {payload}",
                        t.xid, t.lsn
                    ))
                })?;
                let relation = schema_relation(payload)
                    .or_else(|| self.rels.get(&table).map(|r| r.qualified.clone()))
                    .unwrap_or_else(|| format!("relation {table}"));
                let removing = self.sets.removing.contains(&table);
                if change.key_changed() {
                    if !removing {
                        let mut e = TideError::prerequisite(format!(
                            "the key of {relation} changed from ({}) to ({}) (transaction {} committed at {}): pg_tide keys its events, backfills and table targets by the key recorded when the table was added",
                            change.previous_key.join(", "),
                            change.key.join(", "),
                            t.xid,
                            t.lsn
                        ))
                        .hint(format!(
                            "The pipeline is paused before the change. Remove the table, resume, then add it again to capture and backfill it with its new key: SELECT tide.remove_table('{0}', '{1}'); SELECT tide.resume_pipeline('{0}'); and once tide.tables no longer lists it, SELECT tide.add_table('{0}', '{1}') (a table target's table must have the new key first). Rows deleted at the source in between stay at a table target until tide.repair.",
                            self.p.name.replace('\'', "''"),
                            relation.replace('\'', "''")
                        ));
                        e.pause_pipeline = true;
                        return Err(e);
                    }
                    // Being removed: its changes stop here (the re-add backfills it again).
                    self.sets.capturing.remove(&table);
                }
                let rewrite = self.rewrites.iter().any(|&(r, l)| r == table && l == t.lsn);
                self.sink.send(
                    self.c,
                    t,
                    Change::Schema(SchemaEvent {
                        relid: table,
                        relation,
                        payload: payload.to_string(),
                        change,
                        rewrite,
                        dropped: false,
                    }),
                )?;
            }
        }
        Ok(())
    }

    /// A `tide.alter_table` marker: the table's new row filter and column list take effect at
    /// this transaction's commit. Its payload is the schema event that announces them, which
    /// reaches the target there, after the transaction's changes (a table target adds and drops
    /// the columns the new list adds and leaves out); the batch ends after this transaction, and the decoder is reopened with
    /// the new shaping (the plugin's options are fixed for a session); the catalog records it
    /// and queues the table's re-read ([`Done`](super::pipeline)). A marker whose call already
    /// took effect (a replay after it was recorded) is passed over.
    fn on_alter_marker(&mut self, table: u32, payload: Option<&str>) -> TideResult<()> {
        let Some(t) = self.txn.as_mut() else {
            return Ok(());
        };
        let payload = payload.ok_or_else(|| {
            TideError::internal(format!(
                "an alter_table marker of relation {table} (transaction {} committed at {}) has no payload",
                t.xid, t.lsn
            ))
        })?;
        let mut row: serde_json::Value = serde_json::from_str(payload).map_err(|e| {
            TideError::internal(format!("an alter_table marker's payload is not JSON: {e}"))
        })?;
        let Some(xid) = row
            .as_object_mut()
            .and_then(|o| o.remove("xid"))
            .and_then(|x| x.as_str().map(str::to_string))
        else {
            return Err(TideError::internal(format!(
                "an alter_table marker of relation {table} has no transaction id: {payload}"
            )));
        };
        if !crate::catalog::tables::alter_pending(self.c, &self.p.name, table, &xid)? {
            return Ok(());
        }
        t.barrier = true;
        self.out.alters.push((table, xid, t.lsn));
        if t.skip || !self.sets.capturing.contains(&table) {
            return Ok(());
        }
        let payload = row.to_string();
        let change = SchemaChange::parse(&payload).ok_or_else(|| {
            TideError::internal(format!(
                "an alter_table marker of relation {table} has a payload pg_tide cannot read: {payload}"
            ))
        })?;
        let relation = schema_relation(&payload)
            .or_else(|| self.rels.get(&table).map(|r| r.qualified.clone()))
            .unwrap_or_else(|| format!("relation {table}"));
        self.announce.push(SchemaEvent {
            relid: table,
            relation,
            payload,
            change,
            rewrite: false,
            dropped: false,
        });
        Ok(())
    }

    fn on_watermark(&mut self, relid: u32, new: &Tuple<'_>) -> TideResult<()> {
        self.not_elsewhere("a watermark")?;
        let Some(t) = self.txn.as_mut().filter(|t| !t.skip) else {
            return Ok(());
        };
        let rel = rel_desc(self.rels, relid)?;
        let Some((pipeline, watermark, kind)) = parse_watermark(rel, new) else {
            return Ok(());
        };
        if pipeline != self.p.name {
            return Ok(());
        }
        if self.bf.awaits(watermark, kind) {
            // The chunk may upsert rows a streamed transaction holds at the remote.
            self.streams.fall_back_all();
            // Make the stream events before the chunk visible now, rather than after the
            // chunk's rows.
            if let Some((end, _)) = self.last_applied {
                self.sink
                    .commit(self.c, &self.p.name, Some(end), CommitPoint::Early)?;
            }
        }
        if let Some(e) = self.bf.on_signal(self.c, self.sink, t, watermark, kind)? {
            self.out.backfill_rows += e.rows;
        }
        Ok(())
    }

    fn on_insert(&mut self, relid: u32, new: &Tuple<'_>) -> TideResult<()> {
        self.check_read(relid)?;
        if self.in_copy(relid) {
            return Ok(());
        }
        let Some((t, rel)) = captured(&self.sets, &mut self.txn, self.rels, relid)? else {
            return Ok(());
        };
        let mut key = String::new();
        json::render_key(&rel.columns, new, &mut key).map_err(render_err)?;
        self.bf.on_change(relid, &key, t.xid);
        if self.elsewhere.is_some() {
            t.position += 1;
            return Ok(());
        }
        let mut to = Emit {
            sink: &mut *self.sink,
            c: &mut *self.c,
            t,
        };
        to.row((relid, rel), Op::Insert, key, new)
    }

    fn on_update(
        &mut self,
        relid: u32,
        old_key: Option<&Tuple<'_>>,
        new: &Tuple<'_>,
    ) -> TideResult<()> {
        self.check_read(relid)?;
        if self.in_copy(relid) {
            return Ok(());
        }
        let Some((t, rel)) = captured(&self.sets, &mut self.txn, self.rels, relid)? else {
            return Ok(());
        };
        let (old, new_key) = update_keys(rel, old_key, new)?;
        if let Some(old) = &old {
            self.bf.on_change(relid, old, t.xid);
        }
        self.bf.on_change(relid, &new_key, t.xid);
        if self.elsewhere.is_some() {
            t.position += if old.as_ref().is_some_and(|o| *o != new_key) {
                2
            } else {
                1
            };
            return Ok(());
        }
        let mut to = Emit {
            sink: &mut *self.sink,
            c: &mut *self.c,
            t,
        };
        to.update((relid, rel), (old, old_key), new_key, new)
    }

    fn on_delete(&mut self, relid: u32, old_key: &Tuple<'_>) -> TideResult<()> {
        self.check_read(relid)?;
        if self.in_copy(relid) {
            return Ok(());
        }
        let Some((t, rel)) = captured(&self.sets, &mut self.txn, self.rels, relid)? else {
            return Ok(());
        };
        let mut k = String::new();
        json::render_key(&rel.columns, old_key, &mut k).map_err(render_err)?;
        self.bf.on_change(relid, &k, t.xid);
        if self.elsewhere.is_some() {
            t.position += 1;
            return Ok(());
        }
        let mut to = Emit {
            sink: &mut *self.sink,
            c: &mut *self.c,
            t,
        };
        to.delete((relid, rel), k, old_key)
    }

    /// One source `TRUNCATE` statement: a truncate event per captured table it emptied, handed
    /// to the target together ([`Change::Truncate`]: a table target empties them in one
    /// statement, as the source did).
    fn on_truncate(&mut self, relids: &[u32], flags: u8) -> TideResult<()> {
        self.not_elsewhere("a truncate")?;
        let mut events = Vec::new();
        for &relid in relids {
            if self.sets.capturing.contains(&relid) && !self.in_copy(relid) {
                self.check_read(relid)?;
                let Some(t) = self.txn.as_mut().filter(|t| !t.skip) else {
                    return Ok(());
                };
                self.bf.on_truncate(relid, t.xid);
                let rel = rel_desc(self.rels, relid)?;
                events.push(key_event(relid, rel, Op::Truncate, None));
            }
        }
        let Some(t) = self.txn.as_mut().filter(|t| !t.skip) else {
            return Ok(());
        };
        if events.is_empty() {
            return Ok(());
        }
        let restart_identity = flags & wire::TRUNCATE_RESTART_IDENTITY != 0;
        let change = Change::Truncate {
            events,
            restart_identity,
        };
        self.sink.send(self.c, t, change)?;
        Ok(())
    }

    /// A TRUNCATE of one partition of a captured partitioned table: a truncate event of the
    /// table that removes the rows `predicate` (the partition's constraint) is true for.
    fn on_truncate_partition(
        &mut self,
        relid: u32,
        partition: &str,
        predicate: &str,
    ) -> TideResult<()> {
        self.not_elsewhere("a truncate")?;
        self.check_read(relid)?;
        let Some(t) = self.txn.as_mut().filter(|t| !t.skip) else {
            return Ok(());
        };
        if !self.sets.capturing.contains(&relid) {
            return Ok(());
        }
        self.bf.on_partition_truncate(relid, t.xid);
        let rel = rel_desc(self.rels, relid)?;
        let mut row = String::from("{\"partition\":");
        json::push_string(&mut row, partition);
        row.push_str(",\"where\":");
        json::push_string(&mut row, predicate);
        row.push('}');
        let mut ev = key_event(relid, rel, Op::Truncate, None);
        ev.row = Row::Json(row);
        ev.columns = vec!["partition".into(), "where".into()];
        ev.only_where = Some(predicate.to_string());
        t.position += 1;
        self.sink.push(self.c, t, ev)
    }

    /// `table` is captured from here on (its `add_table` marker, in the transaction being
    /// applied).
    fn on_add_marker(&mut self, table: u32) -> TideResult<()> {
        let Some(t) = self.txn.as_mut() else {
            return Ok(());
        };
        self.sets.pending.remove(&table);
        if self.sets.listed.contains(&table) {
            // The plugin sends its changes (added before this iteration read its list; or
            // removed and added again since, the removal's marker passed in this batch).
            self.sets.capturing.insert(table);
        } else if t.skip {
            // The decoder's plugin was not sending this table's changes (add_table committed
            // after this iteration read its table list), but nothing of this transaction
            // reaches the target: end the batch after it.
            t.barrier = true;
        } else {
            return Err(self.restart(table));
        }
        if t.lsn >= self.recorded {
            self.marks.push((table, t.lsn));
        }
        Ok(())
    }

    /// The `add_table` marker of `table`, in the transaction being applied, was decoded while
    /// the plugin was not sending the table's changes: `add_table` committed after this
    /// iteration read its table list. The changes of the table after the marker in the same
    /// transaction were not sent, and ending the batch after the transaction (as for a
    /// replay) would take them as applied: lost. Ending it before the transaction is not
    /// possible either (its changes before the marker may have reached the target, its table
    /// markers the batch's state). So the iteration fails on purpose and is done again at
    /// once: everything rolls back, the decoder is reopened at the slot's confirmed position,
    /// and the next iteration reads the table list, the table in it (its transaction has left
    /// the process array: `on_marker` waited for it).
    fn restart(&mut self, table: u32) -> TideError {
        let lsn = self.txn.as_ref().map_or(Lsn(0), |t| t.lsn);
        self.trail.restart = Some((table, lsn));
        TideError::internal(format!(
            "relation {table} was added to the pipeline by the transaction committed at {lsn}, after this iteration read its table list: the iteration is done again with it"
        ))
    }

    /// Returns `false` at a barrier: later transactions were decoded without the new table and
    /// are read again with a reopened decoder.
    ///
    /// A transaction written while it ran commits now at the target: first the main target's
    /// batch (everything committed before it at the source), then its own remote transaction
    /// with the applied position. Should that fail, the iteration fails; the transaction is
    /// then applied from the spool (`stream_apply`: never live again).
    fn on_commit(&mut self, end_lsn: Lsn, commit_time: i64) -> TideResult<bool> {
        let Some(mut t) = self.txn.take() else {
            return Ok(true);
        };
        // A tide.alter_table's schema event: after every change of its transaction (all shaped
        // the old way), at the commit position where the new shaping takes effect. (Such a
        // transaction is never written while it ran: its marker row made it fall back.)
        for ev in std::mem::take(&mut self.announce) {
            self.sink.send(self.c, &mut t, Change::Schema(ev))?;
        }
        if let Some(mut live) = self.elsewhere.take() {
            let before = self.last_applied.map(|(end, _)| end);
            self.sink
                .commit(self.c, &self.p.name, before, CommitPoint::Early)?;
            live.target
                .commit(self.c, &self.p.name, Some(end_lsn), CommitPoint::End)?;
            self.streams.committed(t.xid);
        }
        self.high = self.high.max(end_lsn);
        if !t.skip && t.position > 0 {
            self.out.txns += 1;
            self.out.events += t.position as u64;
            self.last_applied = Some((end_lsn, commit_time));
        }
        if t.barrier {
            self.stopped = true;
            return Ok(false);
        }
        Ok(true)
    }

    /// Every row may have new values that no row event carries: the table is read again (after
    /// this transaction, in stream order).
    fn on_rewrite(&mut self, relid: u32) {
        if !self.sets.capturing.contains(&relid) {
            return;
        }
        let Some(t) = self.txn.as_ref() else {
            return;
        };
        if self.records(t) {
            let lsn = t.lsn;
            self.bf.on_rewrite(relid);
            self.rewrites.push((relid, lsn));
        }
    }

    /// Inside a transaction written while it ran, only row changes can come (anything else made
    /// it fall back).
    fn not_elsewhere(&self, what: &str) -> TideResult<()> {
        match &self.elsewhere {
            Some(l) => Err(TideError::internal(format!(
                "{what} in transaction {}, which was written to the target while it ran",
                l.txn.xid
            ))),
            None => Ok(()),
        }
    }

    fn on_keepalive(&mut self, end_lsn: Lsn) {
        if self.txn.is_none() {
            self.high = self.high.max(end_lsn);
        }
    }
}

/// The live transaction (not a replay) and the relation's description, when a change of
/// `relid` is to be delivered (the table is captured at this point of the stream).
fn captured<'a>(
    sets: &TableSets,
    txn: &'a mut Option<Txn>,
    rels: &'a HashMap<u32, RelDesc>,
    relid: u32,
) -> TideResult<Option<(&'a mut Txn, &'a RelDesc)>> {
    if !sets.capturing.contains(&relid) {
        return Ok(None);
    }
    let Some(t) = txn.as_mut().filter(|t| !t.skip) else {
        return Ok(None);
    };
    Ok(Some((t, rel_desc(rels, relid)?)))
}

/// A relation's description from its Relation message.
pub(super) fn rel_desc_of(namespace: &str, name: &str, columns: &[Column<'_>]) -> RelDesc {
    RelDesc {
        qualified: format!(
            "{}.{}",
            pgrx::spi::quote_identifier(namespace),
            pgrx::spi::quote_identifier(name)
        ),
        columns: columns
            .iter()
            .map(|col| OwnedColumn {
                name: col.name.to_string(),
                type_oid: col.type_oid,
                key: col.flags & wire::COLUMN_KEY != 0,
            })
            .collect(),
    }
}

pub(super) fn rel_desc(rels: &HashMap<u32, RelDesc>, relid: u32) -> TideResult<&RelDesc> {
    rels.get(&relid).ok_or_else(|| {
        TideError::internal(format!(
            "change for relation {relid} arrived before its description"
        ))
    })
}
