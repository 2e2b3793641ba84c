//! Model check of streamed (in-progress) transactions, end to end through the code that runs:
//! the output plugin's bookkeeping ([`StreamBlocks`]), the wire format ([`wire`]) and the
//! worker's spools ([`Streams`]), between a simulated PostgreSQL reorder buffer and a simulated
//! target (issue 42).
//!
//! The source is a log of records: changes of several transactions interleaved (of a captured
//! table, of a table nobody captures, a table rewrite's rows, a pg_tide marker), subtransaction
//! aborts, commits and aborts. The reorder buffer replays it as PostgreSQL 15 does: it keeps
//! each transaction's changes in memory and, past `LIMIT` changes in all, streams the largest
//! transaction's in a block (`stream_start`, its changes, `stream_stop`); a transaction streamed
//! before its commit ends with the rest in a last block and `stream_commit`, one that was not is
//! replayed whole (`begin`, changes, `commit`); an abort of a streamed one is `stream_abort`.
//! While streaming a block it may meet the transaction's concurrent abort (the plugin's catalog
//! lookup fails half-way through a change: PostgreSQL catches the ERROR and stops the block).
//! Decoding sessions end at random (a kill -9, a decoder reopened after a failed iteration, a
//! table added) and start again as PostgreSQL does: at the slot's restart point, before every
//! transaction still in progress at the confirmed position, skipping what committed before that
//! position and streaming nothing until it is reached; a session may decode without streaming
//! (the worker's fallback after a stream it could not read).
//!
//! The plugin writes through the real [`StreamBlocks`] and [`wire`] encoders (lazy Begin and
//! StreamStart, a rewrite reported once per transaction, nothing for a table nobody captures);
//! its scratch buffer is emptied at each callback's entry, as `plugin::state` does. The worker
//! routes every message through the real [`Streams`] (with its spools spilling to files) and
//! applies what comes out to the target, a committed transaction at a time, skipping the ones
//! at or below the target's applied position (a replay). With `pass_through` (a remote target)
//! it also writes streamed transactions while they run, as `worker::stream_apply` does: live
//! up to `LIVE` at once, falling back (applied from the spool at the commit) on a subtransaction
//! abort, before a backfill chunk (`Op::Chunk`) or on a conflict (`Op::Conflict`); a live one's
//! own content is committed at the commit instead of the spool's.
//!
//! Property, for every schedule: no message is ever refused by `Streams` or `wire::decode`; at
//! the end the target equals the source's committed state, every committed transaction that
//! wrote the captured table was applied exactly once, in commit order, and no spool is left.
//! The same schedules with a fallback that forgets the blocks received before it (the entry
//! starts afresh from the next block instead of taking the spool at its commit) must violate it.

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use tide_core::lsn::Lsn;
use tide_core::spill::SpillBuffer;
use tide_core::stream_blocks::StreamBlocks;
use tide_core::stream_spool::Streams;
use tide_core::wire::{self, Message, Tuple, Value};

/// Changes the reorder buffer holds in memory before it streams the largest transaction.
const LIMIT: usize = 4;
/// Streamed transactions written live to the (remote) target at once.
const LIVE: usize = 2;
const CAPTURED: u32 = 100;

thread_local! {
    /// What this thread's schedules exercised (so a model that stopped streaming would not pass
    /// unnoticed): streamed transactions committed, live ones committed, concurrent aborts met,
    /// rewrites streamed, sessions ended mid-stream, replays skipped.
    static SEEN: [Cell<usize>; 6] = Default::default();
}
const STREAM_COMMITS: usize = 0;
const LIVE_COMMITS: usize = 1;
const CONCURRENT_ABORTS: usize = 2;
const REWRITES_STREAMED: usize = 3;
const RESTARTS_MID_STREAM: usize = 4;
const REPLAYS_SKIPPED: usize = 5;

fn seen(what: usize) {
    SEEN.with(|s| s[what].set(s[what].get() + 1));
}

/// One generated step of a schedule.
#[derive(Clone, Debug)]
enum Op {
    /// A transaction begins (its first change is its first record).
    Begin,
    /// A change by the n-th open transaction (mod the number open) in its current
    /// subtransaction: key, value (None: delete), whether of the captured table.
    Change(usize, u8, Option<u8>, bool),
    /// A rewritten row of the captured table (a table-rewriting ALTER).
    Rewrite(usize),
    /// The n-th open transaction starts a subtransaction.
    Savepoint(usize),
    /// The n-th open transaction's current subtransaction aborts.
    RollbackTo(usize),
    Commit(usize),
    Abort(usize),
    /// A marker: a small committed transaction with a pg_tide signal.
    Marker,
    /// The n-th open transaction aborts, and the decoder finds it aborted while it streams its
    /// changes (a concurrent abort: the abort happened before the decoder got there).
    AbortedAhead(usize),
    /// The worker applies what it has (the target commits) and confirms its position.
    Confirm,
    /// The worker applies what it has; the slot is not confirmed (a crash before it).
    Apply,
    /// The decoding session ends (kill -9, reopen); the next streams or not.
    Restart(bool),
    /// A backfill chunk is written: every live transaction falls back.
    Chunk,
    /// The n-th live transaction meets a conflict and falls back.
    Conflict(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let n = 0usize..4;
    prop_oneof![
        3 => Just(Op::Begin),
        14 => (n.clone(), 0u8..6, proptest::option::weighted(0.8, 0u8..50), proptest::bool::weighted(0.85))
            .prop_map(|(t, k, v, c)| Op::Change(t, k, v, c)),
        1 => n.clone().prop_map(Op::Rewrite),
        1 => n.clone().prop_map(Op::Savepoint),
        1 => n.clone().prop_map(Op::RollbackTo),
        3 => n.clone().prop_map(Op::Commit),
        1 => n.clone().prop_map(Op::Abort),
        1 => Just(Op::Marker),
        1 => n.clone().prop_map(Op::AbortedAhead),
        2 => Just(Op::Confirm),
        1 => Just(Op::Apply),
        1 => any::<bool>().prop_map(Op::Restart),
        1 => Just(Op::Chunk),
        1 => n.prop_map(Op::Conflict),
    ]
}

/// One WAL record.
#[derive(Clone, Debug)]
enum Rec {
    Change { top: u32, sub: u32, kind: Kind },
    SubAbort { top: u32, sub: u32 },
    Commit { top: u32 },
    Abort { top: u32 },
}

#[derive(Clone, Debug)]
enum Kind {
    Upsert { captured: bool, key: u8, val: u8 },
    Delete { captured: bool, key: u8 },
    Rewrite,
    Signal,
}

/// The plugin's output for one change: what it writes, if anything.
fn change_message(kind: &Kind) -> Option<Vec<u8>> {
    let mut b = Vec::new();
    match kind {
        Kind::Upsert {
            captured: false, ..
        }
        | Kind::Delete {
            captured: false, ..
        } => return None,
        Kind::Upsert { key, val, .. } => {
            let (k, v) = (key.to_string(), val.to_string());
            wire::encode(
                &Message::Insert {
                    relid: CAPTURED,
                    new: Tuple {
                        values: vec![Value::Text(&k), Value::Text(&v)],
                    },
                },
                &mut b,
            );
        }
        Kind::Delete { key, .. } => {
            let k = key.to_string();
            wire::encode(
                &Message::Delete {
                    relid: CAPTURED,
                    old_key: Tuple {
                        values: vec![Value::Text(&k)],
                    },
                },
                &mut b,
            );
        }
        Kind::Rewrite => wire::put_rewrite(&mut b, CAPTURED),
        Kind::Signal => wire::put_signal(&mut b, b"marker"),
    }
    Some(b)
}

/// The source: the log, and what its committed transactions did to the captured table.
#[derive(Default)]
struct Source {
    log: Vec<Rec>,
    next_xid: u32,
    /// Open transactions: top xid → its subtransaction stack (top first).
    open: Vec<(u32, Vec<u32>)>,
    /// Per transaction, (subxact, key, value) of its captured changes, for the final state.
    writes: HashMap<u32, Vec<(u32, u8, Option<u8>)>>,
    aborted_subs: HashSet<u32>,
    /// Transactions the decoder finds aborted whenever it streams them.
    doomed: HashSet<u32>,
    /// Committed transactions that wrote the captured table, in commit order.
    committed: Vec<u32>,
}

impl Source {
    fn xid(&mut self) -> u32 {
        self.next_xid += 1;
        self.next_xid
    }

    fn pick(&self, n: usize) -> Option<usize> {
        (!self.open.is_empty()).then(|| n % self.open.len())
    }

    fn change(&mut self, i: usize, kind: Kind) {
        let (top, subs) = &self.open[i];
        let (top, sub) = (*top, *subs.last().unwrap_or(top));
        if let Kind::Upsert {
            captured: true,
            key,
            val,
        } = kind
        {
            self.writes
                .entry(top)
                .or_default()
                .push((sub, key, Some(val)));
        }
        if let Kind::Delete {
            captured: true,
            key,
        } = kind
        {
            self.writes.entry(top).or_default().push((sub, key, None));
        }
        self.log.push(Rec::Change { top, sub, kind });
    }

    fn end(&mut self, i: usize, commit: bool) {
        let (top, _) = self.open.remove(i);
        if commit {
            self.log.push(Rec::Commit { top });
            let live = self
                .writes
                .get(&top)
                .is_some_and(|w| w.iter().any(|(s, _, _)| !self.aborted_subs.contains(s)));
            if live {
                self.committed.push(top);
            }
        } else {
            self.log.push(Rec::Abort { top });
        }
    }

    /// The captured table after every committed transaction, in commit order.
    fn state(&self) -> BTreeMap<u8, u8> {
        let mut t = BTreeMap::new();
        for x in &self.committed {
            for (sub, k, v) in &self.writes[x] {
                if self.aborted_subs.contains(sub) {
                    continue;
                }
                match v {
                    Some(v) => t.insert(*k, *v),
                    None => t.remove(k),
                };
            }
        }
        t
    }
}

/// A live (remote) transaction written while it runs, or one applied from the spool.
enum Entry {
    Live(Vec<Vec<u8>>),
    Fallback,
}

/// The worker and its target.
struct Worker {
    streams: Streams,
    out: SpillBuffer,
    pass_through: bool,
    broken: bool,
    entries: HashMap<u32, Entry>,
    current: Option<u32>,
    /// Committed: the target's rows and its applied position (the commit's log index).
    target: BTreeMap<u8, u8>,
    applied: usize,
    applied_txns: Vec<u32>,
    /// The transaction being received whole (Begin .. Commit).
    txn: Option<(u32, usize, Vec<Vec<u8>>)>,
}

impl Worker {
    fn new(dir: &PathBuf, spool_bytes: usize, pass_through: bool, broken: bool) -> Worker {
        let mut streams = Streams::new(dir, "s", spool_bytes);
        streams.pass_through = pass_through;
        Worker {
            streams,
            out: SpillBuffer::new(dir, "o", 256),
            pass_through,
            broken,
            entries: HashMap::new(),
            current: None,
            target: BTreeMap::new(),
            applied: 0,
            applied_txns: Vec::new(),
            txn: None,
        }
    }

    /// A new decoding session: everything of the old one is gone (live remote transactions
    /// rolled back with their connections, spools removed, unapplied output dropped).
    fn restart(&mut self, dir: &PathBuf, spool_bytes: usize) {
        let mut w = Worker::new(dir, spool_bytes, self.pass_through, self.broken);
        w.target = std::mem::take(&mut self.target);
        w.applied = self.applied;
        w.applied_txns = std::mem::take(&mut self.applied_txns);
        *self = w;
    }

    fn route(&mut self, msg: &[u8]) -> Result<(), String> {
        self.streams
            .route(msg, &mut self.out)
            .map_err(|e| format!("Streams refused a message: {e}"))
    }

    fn fall_back(&mut self, xid: u32) {
        if let Some(e) = self.entries.get_mut(&xid) {
            if matches!(e, Entry::Live(_)) {
                // The broken variant keeps writing it live from the next block on, having
                // forgotten what the rolled-back remote transaction held.
                *e = if self.broken {
                    Entry::Live(Vec::new())
                } else {
                    Entry::Fallback
                };
            }
        }
    }

    /// The reorder buffer holds no transaction: forget every spooled one and its live entry.
    fn forget_orphans(&mut self) {
        for x in self.streams.in_progress_xids() {
            self.entries.remove(&x);
        }
        self.streams.clear();
    }

    fn fall_back_all(&mut self) {
        let live: Vec<u32> = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Live(_)))
            .map(|(x, _)| *x)
            .collect();
        for x in live {
            self.fall_back(x);
        }
    }

    /// Apply everything routed so far (the applier's batch), then the target commits.
    fn apply(&mut self) -> Result<(), String> {
        let mut msgs = Vec::new();
        {
            let mut d = self.out.drain();
            while let Some(m) = d.next_message().map_err(|e| e.to_string())? {
                msgs.push(m.to_vec());
            }
        }
        for m in msgs {
            let decoded = wire::decode(&m).map_err(|e| format!("undecodable output: {e}"))?;
            self.dispatch(decoded, &m)?;
        }
        if self.txn.is_some() {
            return Err("the output ended inside a transaction".into());
        }
        Ok(())
    }

    fn dispatch(&mut self, msg: Message<'_>, raw: &[u8]) -> Result<(), String> {
        match msg {
            Message::StreamStart { xid, first } => {
                if first {
                    let live = self
                        .entries
                        .values()
                        .filter(|e| matches!(e, Entry::Live(_)))
                        .count();
                    let e = if live < LIVE {
                        Entry::Live(Vec::new())
                    } else {
                        Entry::Fallback
                    };
                    self.entries.insert(xid, e);
                }
                self.current = Some(xid);
            }
            Message::StreamStop => self.current = None,
            Message::StreamChange { body, .. } => {
                let Some(x) = self.current else {
                    return Err("a stream change outside a block reached the applier".into());
                };
                let inner = wire::decode(body).map_err(|e| e.to_string())?;
                if matches!(inner, Message::Rewrite { .. } | Message::Signal { .. }) {
                    // Not row changes: stream_apply makes the transaction fall back.
                    self.fall_back(x);
                } else if let Some(Entry::Live(v)) = self.entries.get_mut(&x) {
                    v.push(body.to_vec());
                }
            }
            Message::StreamAbort { xid, subxid } => {
                if xid == subxid {
                    self.entries.remove(&xid);
                } else {
                    self.fall_back(xid);
                }
            }
            Message::Begin { xid, final_lsn, .. } => {
                if self.txn.is_some() {
                    return Err("a Begin inside a transaction".into());
                }
                self.txn = Some((xid, final_lsn.0 as usize, Vec::new()));
            }
            Message::Commit { xid, .. } => {
                let Some((x, lsn, changes)) = self.txn.take() else {
                    return Err("a Commit outside a transaction".into());
                };
                if x != xid {
                    return Err(format!("Commit of {xid} ends transaction {x}"));
                }
                // Applied from its live remote transaction if it is one.
                let changes = match self.entries.remove(&x) {
                    Some(Entry::Live(v)) => {
                        seen(LIVE_COMMITS);
                        v
                    }
                    _ => changes,
                };
                self.commit(x, lsn, &changes)?;
            }
            _ => match &mut self.txn {
                Some((_, _, changes)) => changes.push(raw.to_vec()),
                None => return Err(format!("a change outside a transaction: {msg:?}")),
            },
        }
        Ok(())
    }

    fn commit(&mut self, xid: u32, lsn: usize, changes: &[Vec<u8>]) -> Result<(), String> {
        if lsn <= self.applied {
            seen(REPLAYS_SKIPPED);
            return Ok(()); // a replay: the target has it
        }
        let mut wrote = false;
        for c in changes {
            match wire::decode(c).map_err(|e| e.to_string())? {
                Message::Insert { new, .. } => {
                    let v: Vec<u8> = new
                        .values
                        .iter()
                        .map(|v| match v {
                            Value::Text(t) => t.parse().unwrap_or(255),
                            _ => 255,
                        })
                        .collect();
                    self.target.insert(v[0], v[1]);
                    wrote = true;
                }
                Message::Delete { old_key, .. } => {
                    if let Some(Value::Text(t)) = old_key.values.first() {
                        self.target.remove(&t.parse::<u8>().unwrap_or(255));
                    }
                    wrote = true;
                }
                _ => {}
            }
        }
        self.applied = lsn;
        if wrote {
            self.applied_txns.push(xid);
        }
        Ok(())
    }
}

/// The plugin's state for a committed transaction replayed whole (unused in a stream block).
#[derive(Default)]
struct Replay {
    /// Relations whose rewrite it reported.
    rewritten: HashSet<u32>,
    /// Its Begin was written.
    begun: bool,
    commit_lsn: usize,
}

/// The simulated PostgreSQL reorder buffer and pg_tide plugin of one decoding session.
struct Decoding {
    /// Per top-level transaction: its changes in memory (subxact, record), whether it was
    /// streamed in this session, the subtransactions whose changes were streamed.
    mem: BTreeMap<u32, Vec<(u32, Kind)>>,
    streamed: HashSet<u32>,
    streamed_subs: HashSet<u32>,
    blocks: StreamBlocks,
    /// The plugin's scratch buffer (emptied at each callback's entry, as `plugin::state` does).
    buf: Vec<u8>,
    /// Commits before this log index were applied: skipped; nothing is streamed before it.
    skip_before: usize,
    streaming: bool,
    /// Transactions whose concurrent abort the decoder meets at their next streamed change.
    doomed: HashSet<u32>,
    /// Transactions the reorder buffer holds (a record seen, no end yet).
    held: HashSet<u32>,
}

impl Decoding {
    fn new(skip_before: usize, streaming: bool, doomed: HashSet<u32>) -> Decoding {
        Decoding {
            mem: BTreeMap::new(),
            streamed: HashSet::new(),
            streamed_subs: HashSet::new(),
            blocks: StreamBlocks::default(),
            buf: Vec::new(),
            skip_before,
            streaming,
            doomed,
            held: HashSet::new(),
        }
    }

    fn emit(&mut self, w: &mut Worker) -> Result<(), String> {
        let m = std::mem::take(&mut self.buf);
        w.route(&m)
    }

    /// The plugin's `change`/`stream_change` for one change.
    fn plugin_change(
        &mut self,
        w: &mut Worker,
        top: u32,
        sub: u32,
        kind: &Kind,
        replay: &mut Replay,
    ) -> Result<(), String> {
        self.buf.clear();
        if matches!(kind, Kind::Rewrite) {
            let first = self
                .blocks
                .rewrite_first(CAPTURED)
                .unwrap_or_else(|| replay.rewritten.insert(top));
            if !first {
                return Ok(());
            }
        }
        let Some(body) = change_message(kind) else {
            return Ok(());
        };
        if self.blocks.block().is_some() {
            if let Some((x, first)) = self.blocks.open() {
                wire::put_stream_start(&mut self.buf, x, first);
                self.emit(w)?;
            }
            wire::put_stream_change_header(&mut self.buf, sub);
            if matches!(kind, Kind::Rewrite) {
                seen(REWRITES_STREAMED);
            }
            // A concurrent abort met half-way through writing the change: the ERROR leaves
            // part of it in the buffer, PostgreSQL catches it and stops the block.
            if self.doomed.contains(&top) {
                seen(CONCURRENT_ABORTS);
                self.buf.extend_from_slice(&body[..body.len() / 2]);
                return Err("concurrent abort".into());
            }
        } else if !replay.begun {
            wire::put_begin(&mut self.buf, top, Lsn(replay.commit_lsn as u64), 0);
            self.emit(w)?;
            replay.begun = true;
        }
        self.buf.extend_from_slice(&body);
        self.emit(w)
    }

    /// Stream the transaction with the most changes in memory.
    fn stream_largest(&mut self, w: &mut Worker) -> Result<(), String> {
        let Some((&top, _)) = self
            .mem
            .iter()
            .max_by_key(|(x, v)| (v.len(), u32::MAX - **x))
        else {
            return Ok(());
        };
        let changes = self.mem.remove(&top).unwrap_or_default();
        self.stream_block(w, top, changes)
    }

    fn stream_block(
        &mut self,
        w: &mut Worker,
        top: u32,
        changes: Vec<(u32, Kind)>,
    ) -> Result<(), String> {
        if changes.is_empty() {
            return Ok(());
        }
        self.buf.clear();
        self.blocks.start(top);
        let mut cut = false;
        for (sub, kind) in &changes {
            match self.plugin_change(w, top, *sub, kind, &mut Replay::default()) {
                Ok(()) => {}
                Err(e) if e == "concurrent abort" => {
                    cut = true;
                    break;
                }
                Err(e) => return Err(e),
            }
            self.streamed_subs.insert(*sub);
        }
        // PostgreSQL marks the transaction streamed whether or not the plugin wrote anything,
        // but (15) not a block it cut short at a concurrent abort: then no stream abort comes.
        if !cut {
            self.streamed.insert(top);
        }
        self.buf.clear();
        if self.blocks.stop() {
            wire::put_stream_stop(&mut self.buf);
            self.emit(w)?;
        }
        Ok(())
    }

    /// Decode record `i` of the log.
    fn record(&mut self, w: &mut Worker, i: usize, rec: &Rec) -> Result<(), String> {
        let lsn = i + 1;
        match rec {
            Rec::Change { top, .. } | Rec::SubAbort { top, .. } => {
                self.held.insert(*top);
            }
            Rec::Commit { top } | Rec::Abort { top } => {
                self.held.remove(top);
            }
        }
        match rec {
            Rec::Change { top, sub, kind } => {
                self.mem.entry(*top).or_default().push((*sub, kind.clone()));
                let size: usize = self.mem.values().map(Vec::len).sum();
                if size > LIMIT && self.streaming && lsn >= self.skip_before {
                    self.stream_largest(w)?;
                }
            }
            Rec::SubAbort { top, sub } => {
                if let Some(v) = self.mem.get_mut(top) {
                    v.retain(|(s, _)| s != sub);
                }
                if self.streamed_subs.contains(sub) {
                    self.buf.clear();
                    if self.blocks.abort(*top, *sub) {
                        wire::put_stream_abort(&mut self.buf, *top, *sub);
                        self.emit(w)?;
                    }
                }
            }
            Rec::Abort { top } => {
                self.mem.remove(top);
                if self.streamed.remove(top) {
                    self.buf.clear();
                    if self.blocks.abort(*top, *top) {
                        wire::put_stream_abort(&mut self.buf, *top, *top);
                        self.emit(w)?;
                    }
                }
            }
            Rec::Commit { top } => {
                let changes = self.mem.remove(top).unwrap_or_default();
                if lsn < self.skip_before {
                    return Ok(());
                }
                if self.streamed.remove(top) {
                    self.stream_block(w, *top, changes)?;
                    self.buf.clear();
                    if self.blocks.commit(*top) {
                        seen(STREAM_COMMITS);
                        wire::put_stream_commit(
                            &mut self.buf,
                            *top,
                            Lsn(lsn as u64),
                            Lsn(lsn as u64 + 1),
                            0,
                        );
                        self.emit(w)?;
                    }
                } else {
                    let mut replay = Replay {
                        commit_lsn: lsn,
                        ..Default::default()
                    };
                    for (sub, kind) in &changes {
                        self.plugin_change(w, *top, *sub, kind, &mut replay)?;
                    }
                    if replay.begun {
                        self.buf.clear();
                        wire::put_commit(
                            &mut self.buf,
                            *top,
                            Lsn(lsn as u64),
                            Lsn(lsn as u64 + 1),
                            0,
                        );
                        self.emit(w)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Build the log and the worker's events from a schedule.
fn build(ops: &[Op]) -> (Source, Vec<(usize, Op)>) {
    let mut s = Source::default();
    let mut events = Vec::new();
    for op in ops {
        match op {
            Op::Begin => {
                let x = s.xid();
                s.open.push((x, vec![x]));
                s.change(
                    s.open.len() - 1,
                    Kind::Upsert {
                        captured: false,
                        key: 0,
                        val: 0,
                    },
                );
            }
            Op::Change(n, k, v, captured) => {
                if let Some(i) = s.pick(*n) {
                    let kind = match v {
                        Some(v) => Kind::Upsert {
                            captured: *captured,
                            key: *k,
                            val: *v,
                        },
                        None => Kind::Delete {
                            captured: *captured,
                            key: *k,
                        },
                    };
                    s.change(i, kind);
                }
            }
            Op::Rewrite(n) => {
                if let Some(i) = s.pick(*n) {
                    s.change(i, Kind::Rewrite);
                }
            }
            Op::Savepoint(n) => {
                if let Some(i) = s.pick(*n) {
                    let x = s.xid();
                    s.open[i].1.push(x);
                }
            }
            Op::RollbackTo(n) => {
                if let Some(i) = s.pick(*n) {
                    let top = s.open[i].0;
                    if s.open[i].1.len() > 1 {
                        let sub = s.open[i].1.pop().unwrap_or(top);
                        s.aborted_subs.insert(sub);
                        s.log.push(Rec::SubAbort { top, sub });
                    }
                }
            }
            Op::Commit(n) | Op::Abort(n) => {
                if let Some(i) = s.pick(*n) {
                    s.end(i, matches!(op, Op::Commit(_)));
                }
            }
            Op::AbortedAhead(n) => {
                if let Some(i) = s.pick(*n) {
                    s.doomed.insert(s.open[i].0);
                    s.end(i, false);
                }
            }
            Op::Marker => {
                let x = s.xid();
                s.open.push((x, vec![x]));
                let i = s.open.len() - 1;
                s.change(i, Kind::Signal);
                s.end(i, true);
            }
            Op::Confirm | Op::Apply | Op::Restart(_) | Op::Chunk | Op::Conflict(_) => {
                events.push((s.log.len(), op.clone()))
            }
        }
    }
    while !s.open.is_empty() {
        s.end(0, true);
    }
    (s, events)
}

/// Run one schedule; `Err` on a violation.
fn run(ops: &[Op], pass_through: bool, spool_bytes: usize, broken: bool) -> Result<(), String> {
    let (src, events) = build(ops);
    let dir = std::env::temp_dir().join(format!(
        "tide_stream_model_{}_{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let mut w = Worker::new(&dir, spool_bytes, pass_through, broken);
    let mut dec = Decoding::new(0, true, src.doomed.clone());
    // The decoding session's start (restart point) and the confirmed position.
    let mut confirmed = 0usize;
    let mut next = 0usize;
    let mut ev = events.iter().peekable();
    loop {
        while let Some((at, op)) = ev.peek() {
            if *at > next {
                break;
            }
            match op {
                Op::Apply => w.apply()?,
                Op::Confirm => {
                    w.apply()?;
                    // Every transaction committed before `next` was handed out and applied.
                    confirmed = next;
                }
                Op::Restart(streaming) => {
                    if w.streams.in_progress() > 0 {
                        seen(RESTARTS_MID_STREAM);
                    }
                    w.restart(&dir, spool_bytes);
                    // PostgreSQL starts at the restart point: before the first record of every
                    // transaction still in progress at the confirmed position.
                    next = restart_point(&src.log, confirmed);
                    dec = Decoding::new(confirmed + 1, *streaming, src.doomed.clone());
                }
                Op::Chunk => w.fall_back_all(),
                Op::Conflict(n) => {
                    let mut live: Vec<u32> = w
                        .entries
                        .iter()
                        .filter(|(_, e)| matches!(e, Entry::Live(_)))
                        .map(|(x, _)| *x)
                        .collect();
                    live.sort();
                    if !live.is_empty() {
                        w.fall_back(live[n % live.len()]);
                    }
                }
                _ => {}
            }
            ev.next();
        }
        if next >= src.log.len() {
            break;
        }
        dec.record(&mut w, next, &src.log[next])?;
        next += 1;
        if dec.held.is_empty() {
            // `Decoder::forget_orphan_streams`: nothing more can come of what is spooled.
            w.forget_orphans();
        }
    }
    w.apply()?;
    let want = src.state();
    if w.target != want {
        return Err(format!("target {:?} != source {:?}", w.target, want));
    }
    if w.applied_txns != src.committed {
        return Err(format!(
            "applied {:?}, committed {:?}",
            w.applied_txns, src.committed
        ));
    }
    if w.streams.in_progress() != 0 {
        return Err("spools left".into());
    }
    drop(w);
    let left = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    let _ = std::fs::remove_dir_all(&dir);
    if left != 0 {
        return Err(format!("{left} spool files left"));
    }
    Ok(())
}

/// Where a decoding session restarts: the first record of the oldest transaction still in
/// progress at `confirmed` (begun before it, ended at or after it), else `confirmed`.
fn restart_point(log: &[Rec], confirmed: usize) -> usize {
    let mut first: HashMap<u32, usize> = HashMap::new();
    let mut ended: HashSet<u32> = HashSet::new();
    for (i, r) in log.iter().enumerate().take(confirmed) {
        match r {
            Rec::Change { top, .. } | Rec::SubAbort { top, .. } => {
                first.entry(*top).or_insert(i);
            }
            Rec::Commit { top } | Rec::Abort { top } => {
                ended.insert(*top);
            }
        }
    }
    first
        .iter()
        .filter(|(x, _)| !ended.contains(x))
        .map(|(_, i)| *i)
        .min()
        .unwrap_or(confirmed)
        .min(confirmed)
}

fn schedule() -> impl Strategy<Value = (Vec<Op>, bool, usize)> {
    (
        prop::collection::vec(op(), 1..120),
        any::<bool>(),
        prop_oneof![Just(64usize), Just(1 << 20)],
    )
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    })
}

#[test]
fn streamed_transactions_converge() {
    runner(3000)
        .run(&schedule(), |(ops, pass, spool)| {
            run(&ops, pass, spool, false).map_err(TestCaseError::fail)
        })
        .unwrap();
    for (what, n) in [
        ("streamed transactions committed", STREAM_COMMITS),
        ("live transactions committed", LIVE_COMMITS),
        ("concurrent aborts met", CONCURRENT_ABORTS),
        ("rewrites streamed", REWRITES_STREAMED),
        ("sessions ended mid-stream", RESTARTS_MID_STREAM),
        ("replays skipped", REPLAYS_SKIPPED),
    ] {
        let n = SEEN.with(|s| s[n].get());
        eprintln!("{what}: {n}");
        assert!(n > 0, "no schedule had {what}");
    }
}

/// The check catches a fallback that forgets the blocks received before it.
#[test]
fn a_fallback_that_forgets_a_block_is_caught() {
    let result = runner(3000).run(&schedule(), |(ops, _, spool)| {
        run(&ops, true, spool, true).map_err(TestCaseError::fail)
    });
    match result {
        Err(e) => eprintln!("the broken fallback is caught: {e}"),
        Ok(()) => panic!("no schedule showed the broken fallback"),
    }
}
