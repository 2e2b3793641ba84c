//! Model check of the watermark backfill: a deterministic simulator of the
//! source database, its commit-ordered change log, the worker (stream
//! consumer + backfills + [`Reconciler`]) and the target, with crashes.
//!
//! Several backfills run at once, each with its own chunks in flight: one per
//! *lane*, a disjoint key range of a table (`RANGES` per table: a backfill of a
//! whole table is one lane; several lanes of one table are several readers of
//! it). A chunk's low watermark (`Op::Open`) and its read and high watermark
//! (`Op::Read`) are separate steps, so any lanes' windows may overlap or nest
//! in the log, of different tables and of the same table. The one rule the
//! worker keeps: a chunk is registered before the stream reaches its low
//! watermark (the consumer waits for it, as the worker receives its reader's
//! chunk before decoding further).
//!
//! Property, for every schedule: once every backfill has finished and the
//! stream is drained, target == source, and no key was ever set at the
//! target to a version older than one it had already applied (versions grow
//! per key at the source, deletes included). The same schedules with a
//! consumer that skips reconciliation, or that reconciles a change against
//! one window only (the latest opened) instead of every open window of its
//! table, must violate it.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngAlgorithm, TestError, TestRng, TestRunner,
};
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use tide_core::reconcile::{ChunkId, Reconciler};

const TABLES: usize = 2;
const KEYS: i64 = 16;
/// Disjoint key ranges per table, each backfilled as a lane of its own.
const RANGES: usize = 2;
const LANES: usize = TABLES * RANGES;

/// The table of lane `lane`, and its key range `[from, to)`.
fn lane_range(lane: usize) -> (usize, i64, i64) {
    let width = KEYS / RANGES as i64;
    let r = (lane % RANGES) as i64;
    (
        lane / RANGES,
        r * width,
        if r as usize == RANGES - 1 {
            KEYS
        } else {
            (r + 1) * width
        },
    )
}

/// One committed source transaction touching one row.
#[derive(Clone, Copy, Debug)]
struct Write {
    table: usize,
    key: i64,
    /// Delete the key (a no-op if absent); otherwise insert or update it.
    delete: bool,
}

#[derive(Clone, Debug)]
enum Op {
    Write(Write),
    /// The next chunk of lane `lane % LANES`, at once: LW, `before_read` commits,
    /// chunk read, `after_read` commits, HW.
    Backfill {
        lane: usize,
        before_read: Vec<Write>,
        after_read: Vec<Write>,
    },
    /// The LW of lane `% LANES`'s next chunk (if it has none in flight).
    Open(usize),
    /// Lane `lane % LANES`'s opened chunk is read, `after_read` commits, then its HW.
    Read {
        lane: usize,
        after_read: Vec<Write>,
    },
    /// Deliver up to this many log entries to the consumer.
    Deliver(usize),
    /// Lose all worker memory; resume from durable state.
    Crash,
}

#[derive(Clone, Debug)]
struct Schedule {
    /// Rows present before the slot existed (never in the log).
    initial: Vec<(usize, i64)>,
    chunk_size: usize,
    ops: Vec<Op>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The real consumer: rows go through the reconciler, applied at HW.
    Reconciled,
    /// Broken: chunk rows applied to the target when read.
    ApplyAtRead,
    /// Broken: all chunk rows applied at HW, none dropped.
    ApplyAtHighWithoutDrop,
    /// Broken: a change drops its key only from the chunk whose window opened
    /// last (if it is of the change's table), as a worker that tracks one
    /// "current" window would; right whenever windows never overlap.
    LatestWindowOnly,
}

#[derive(Clone, Copy, Debug)]
enum Entry {
    Change {
        table: usize,
        key: i64,
        version: u64,
        deleted: bool,
    },
    Low(ChunkId),
    High(ChunkId),
}

/// A lane's backfill position: its next chunk reads after key `after`
/// (from the start of its range when `None`); `done` once its last chunk is
/// emitted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Progress {
    after: Option<i64>,
    done: bool,
}

struct InFlight {
    lane: usize,
    table: usize,
    /// Where the chunk starts (the lane's progress when it was read).
    from: Progress,
    /// Durable progress once this chunk's HW is processed.
    next: Progress,
    /// Copy of the rows, used only by the broken modes.
    rows: Vec<(i64, u64)>,
}

/// A lane's chunk in the worker's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lane {
    Idle,
    /// LW written, not read yet: the stream must not pass the LW.
    Opened(ChunkId),
    /// Read and registered, waiting for its HW.
    Read(ChunkId),
}

#[derive(Debug, PartialEq, Eq)]
struct Diff {
    table: usize,
    key: i64,
    source: Option<u64>,
    target: Option<u64>,
}

#[derive(Debug)]
struct Outcome {
    /// Reversals and protocol errors, in the order they happened.
    violations: Vec<String>,
    /// Rows where target and source differ at the end.
    diff: Vec<Diff>,
    stats: Stats,
}

type Table = BTreeMap<i64, u64>;

struct World {
    mode: Mode,
    chunk_size: usize,
    // The source database and its commit-ordered log; position p is log[p - 1].
    source: [Table; TABLES],
    version: u64,
    log: Vec<Entry>,
    /// A database sequence: survives crashes, so chunk ids are never reused.
    next_chunk: ChunkId,
    // The target, durable.
    target: [Table; TABLES],
    /// Highest version ever applied per key, deletes included.
    newest: [Table; TABLES],
    /// Last log position applied to the target; replays at or below are skipped.
    applied: usize,
    violations: Vec<String>,
    // Worker durable state.
    restart: usize,
    progress: [Progress; LANES],
    // Worker memory, lost on crash.
    delivered: usize,
    cursor: [Progress; LANES],
    lanes: [Lane; LANES],
    reconciler: Reconciler<usize, i64, u64>,
    chunks: HashMap<ChunkId, InFlight>,
    /// Chunks whose window is open, in the order their LW was reached.
    open: Vec<ChunkId>,
    stats: Stats,
}

/// What a run exercised, to show the generator is not vacuous.
#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    chunks_emitted: usize,
    rows_dropped: usize,
    stale_watermarks: usize,
    replays_skipped: usize,
    /// Chunks whose window was open while another lane's opened (of the same
    /// table: `overlaps_same_table`).
    overlaps: usize,
    overlaps_same_table: usize,
}

impl World {
    fn new(mode: Mode, s: &Schedule) -> World {
        let mut w = World {
            mode,
            chunk_size: s.chunk_size,
            source: Default::default(),
            version: 0,
            log: Vec::new(),
            next_chunk: 1,
            target: Default::default(),
            newest: Default::default(),
            applied: 0,
            violations: Vec::new(),
            restart: 0,
            progress: Default::default(),
            delivered: 0,
            cursor: Default::default(),
            lanes: [Lane::Idle; LANES],
            reconciler: Reconciler::new(),
            chunks: HashMap::new(),
            open: Vec::new(),
            stats: Stats::default(),
        };
        for &(table, key) in &s.initial {
            w.version += 1;
            w.source[table].insert(key, w.version);
        }
        w
    }

    /// Commits one write at the source and appends it to the log.
    fn write(&mut self, Write { table, key, delete }: Write) {
        if delete && !self.source[table].contains_key(&key) {
            return;
        }
        self.version += 1;
        if delete {
            self.source[table].remove(&key);
        } else {
            self.source[table].insert(key, self.version);
        }
        self.log.push(Entry::Change {
            table,
            key,
            version: self.version,
            deleted: delete,
        });
    }

    /// Sets (or deletes) a key at the target, recording any reversal.
    fn apply(&mut self, table: usize, key: i64, version: u64, deleted: bool) {
        let newest = self.newest[table].entry(key).or_insert(0);
        if version < *newest {
            self.violations.push(format!(
                "reversal: table {table} key {key} set to v{version} after v{newest}"
            ));
        }
        *newest = version.max(*newest);
        if deleted {
            self.target[table].remove(&key);
        } else {
            self.target[table].insert(key, version);
        }
    }

    /// The LW of `lane`'s next chunk, unless it has one in flight or is done.
    fn open(&mut self, lane: usize) -> bool {
        if self.lanes[lane] != Lane::Idle || self.cursor[lane].done {
            return false;
        }
        let id = self.next_chunk;
        self.next_chunk += 1;
        self.log.push(Entry::Low(id));
        self.lanes[lane] = Lane::Opened(id);
        true
    }

    /// `lane`'s opened chunk: read it (in a snapshot after its LW), commit
    /// `after_read`, then its HW; registered with the reconciler.
    fn read(&mut self, lane: usize, after_read: &[Write]) {
        let Lane::Opened(id) = self.lanes[lane] else {
            return;
        };
        let (table, start, end) = lane_range(lane);
        let from = self.cursor[lane];
        let lower = from.after.map_or(Bound::Included(start), Bound::Excluded);
        let rows: Vec<(i64, u64)> = self.source[table]
            .range((lower, Bound::Excluded(end)))
            .take(self.chunk_size)
            .map(|(k, v)| (*k, *v))
            .collect();
        let next = match rows.last() {
            Some(&(last, _)) if rows.len() == self.chunk_size => Progress {
                after: Some(last),
                done: false,
            },
            _ => Progress {
                after: from.after,
                done: true,
            },
        };
        self.cursor[lane] = next;
        if self.mode == Mode::ApplyAtRead {
            for &(k, v) in &rows {
                self.apply(table, k, v, false);
            }
        }
        for w in after_read {
            self.write(*w);
        }
        self.log.push(Entry::High(id));
        self.chunks.insert(
            id,
            InFlight {
                lane,
                table,
                from,
                next,
                rows: rows.clone(),
            },
        );
        self.reconciler.add_chunk(id, table, rows);
        self.lanes[lane] = Lane::Read(id);
    }

    fn backfill(&mut self, lane: usize, before_read: &[Write], after_read: &[Write]) {
        if !self.open(lane) {
            return;
        }
        for w in before_read {
            self.write(*w);
        }
        self.read(lane, after_read);
    }

    /// A change in the stream, as the worker's consumer hands it to the
    /// reconciler (or, in the broken mode, to the latest window only).
    fn reconcile_change(&mut self, table: usize, key: i64) {
        if self.mode != Mode::LatestWindowOnly {
            self.reconciler.on_change(&table, &key);
            return;
        }
        if let Some(&id) = self.open.last() {
            if self.chunks.get(&id).is_some_and(|c| c.table == table) {
                self.reconciler.drop_key(id, &key);
            }
        }
    }

    fn deliver(&mut self, n: usize) {
        for _ in 0..n {
            let Some(&entry) = self.log.get(self.delivered) else {
                return;
            };
            if let Entry::Low(id) = entry {
                if self.lanes.contains(&Lane::Opened(id)) {
                    // Not registered yet: the consumer waits for the chunk.
                    return;
                }
            }
            self.delivered += 1;
            let pos = self.delivered;
            match entry {
                Entry::Change {
                    table,
                    key,
                    version,
                    deleted,
                } => {
                    self.reconcile_change(table, key);
                    if pos > self.applied {
                        self.apply(table, key, version, deleted);
                    } else {
                        self.stats.replays_skipped += 1;
                    }
                }
                Entry::Low(id) => {
                    if self.reconciler.on_low_watermark(id) {
                        self.note_overlaps(id);
                        self.open.push(id);
                    } else {
                        self.stats.stale_watermarks += 1;
                    }
                }
                Entry::High(id) => self.high_watermark(id, pos),
            }
            self.applied = self.applied.max(pos);
        }
    }

    /// Counts the windows open when `id`'s opens.
    fn note_overlaps(&mut self, id: ChunkId) {
        let Some(table) = self.chunks.get(&id).map(|c| c.table) else {
            return;
        };
        for other in &self.open {
            self.stats.overlaps += 1;
            if self.chunks.get(other).is_some_and(|c| c.table == table) {
                self.stats.overlaps_same_table += 1;
            }
        }
    }

    fn high_watermark(&mut self, id: ChunkId, pos: usize) {
        let result = self.reconciler.on_high_watermark(id);
        self.open.retain(|&o| o != id);
        let Some(chunk) = self.chunks.remove(&id) else {
            if result.is_some() {
                self.violations
                    .push(format!("chunk {id}: result for a chunk the worker forgot"));
            }
            self.stats.stale_watermarks += 1;
            return; // read before a crash: ignored
        };
        if pos <= self.applied {
            self.violations
                .push(format!("chunk {id}: HW at {pos} already applied"));
        }
        self.lanes[chunk.lane] = Lane::Idle;
        if chunk.from != self.progress[chunk.lane] {
            // The worker's record_progress refuses such a chunk; the model must
            // never produce one.
            self.violations.push(format!(
                "chunk {id}: starts at {:?}, lane {} stands at {:?}",
                chunk.from, chunk.lane, self.progress[chunk.lane]
            ));
            return;
        }
        let rows = match (self.mode, result) {
            (Mode::Reconciled | Mode::LatestWindowOnly, Some(r)) => {
                self.stats.rows_dropped += r.dropped;
                r.rows
            }
            (Mode::Reconciled | Mode::LatestWindowOnly, None) => {
                self.violations.push(format!("chunk {id}: no result at HW"));
                return;
            }
            (Mode::ApplyAtRead, _) => Vec::new(),
            (Mode::ApplyAtHighWithoutDrop, _) => chunk.rows,
        };
        for (k, v) in rows {
            self.apply(chunk.table, k, v, false);
        }
        // Durable together with the rows: progress and the restart position.
        self.applied = pos;
        self.restart = pos;
        self.progress[chunk.lane] = chunk.next;
        self.stats.chunks_emitted += 1;
    }

    fn crash(&mut self) {
        self.reconciler.forget_all();
        self.chunks.clear();
        self.open.clear();
        self.lanes = [Lane::Idle; LANES];
        self.delivered = self.restart;
        self.cursor = self.progress;
    }

    fn run(mut self, s: &Schedule) -> Outcome {
        for op in &s.ops {
            match op {
                Op::Write(w) => self.write(*w),
                Op::Backfill {
                    lane,
                    before_read,
                    after_read,
                } => self.backfill(lane % LANES, before_read, after_read),
                Op::Open(lane) => {
                    self.open(lane % LANES);
                }
                Op::Read { lane, after_read } => self.read(lane % LANES, after_read),
                Op::Deliver(n) => self.deliver(*n),
                Op::Crash => self.crash(),
            }
            assert_eq!(self.reconciler.pending(), self.chunks.len());
        }
        // Finish every backfill without further writes (reading the chunks
        // opened, then a chunk of every lane at once), then drain.
        for lane in 0..LANES {
            self.read(lane, &[]);
        }
        loop {
            self.deliver(usize::MAX);
            if self.progress.iter().all(|p| p.done) {
                break;
            }
            for lane in 0..LANES {
                self.open(lane);
            }
            for lane in 0..LANES {
                self.read(lane, &[]);
            }
        }
        let mut diff = Vec::new();
        for table in 0..TABLES {
            for key in 0..KEYS {
                let (source, target) = (self.source[table].get(&key), self.target[table].get(&key));
                if source != target {
                    diff.push(Diff {
                        table,
                        key,
                        source: source.copied(),
                        target: target.copied(),
                    });
                }
            }
        }
        Outcome {
            violations: self.violations,
            diff,
            stats: self.stats,
        }
    }
}

fn check(s: &Schedule, mode: Mode) -> Result<(), String> {
    let out = World::new(mode, s).run(s);
    if out.violations.is_empty() && out.diff.is_empty() {
        Ok(())
    } else {
        Err(format!("{out:?}"))
    }
}

// ------------------------------------------------------------- generator

fn write() -> impl Strategy<Value = Write> {
    (0..TABLES, 0..KEYS, prop::bool::weighted(0.3)).prop_map(|(table, key, delete)| Write {
        table,
        key,
        delete,
    })
}

fn op() -> impl Strategy<Value = Op> {
    let writes = || prop::collection::vec(write(), 0..4);
    prop_oneof![
        4 => write().prop_map(Op::Write),
        1 => (0..LANES, writes(), writes()).prop_map(|(lane, before_read, after_read)| Op::Backfill { lane, before_read, after_read }),
        2 => (0..LANES).prop_map(Op::Open),
        2 => (0..LANES, writes()).prop_map(|(lane, after_read)| Op::Read { lane, after_read }),
        3 => (1..8usize).prop_map(Op::Deliver),
        1 => Just(Op::Crash),
    ]
}

fn schedule() -> impl Strategy<Value = Schedule> {
    (
        prop::collection::vec((0..TABLES, 0..KEYS), 0..30),
        1..6usize,
        prop::collection::vec(op(), 0..60),
    )
        .prop_map(|(initial, chunk_size, ops)| Schedule {
            initial,
            chunk_size,
            ops,
        })
}

// ------------------------------------------------------------- tests

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 4096,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn reconciled_backfill_converges_without_reversal(s in schedule()) {
        if let Err(e) = check(&s, Mode::Reconciled) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// The generator reaches the interesting cases: rows dropped by a window,
/// watermarks of chunks lost in a crash, replays skipped by the target.
#[test]
fn generator_exercises_the_hard_cases() {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let mut total = Stats::default();
    for _ in 0..256 {
        let s = schedule()
            .new_tree(&mut runner)
            .expect("schedule strategy never rejects")
            .current();
        let stats = World::new(Mode::Reconciled, &s).run(&s).stats;
        total.chunks_emitted += stats.chunks_emitted;
        total.rows_dropped += stats.rows_dropped;
        total.stale_watermarks += stats.stale_watermarks;
        total.replays_skipped += stats.replays_skipped;
        total.overlaps += stats.overlaps;
        total.overlaps_same_table += stats.overlaps_same_table;
    }
    eprintln!("{total:?}");
    assert!(
        total.chunks_emitted > 0 && total.rows_dropped > 0,
        "{total:?}"
    );
    assert!(
        total.stale_watermarks > 0 && total.replays_skipped > 0,
        "{total:?}"
    );
    assert!(
        total.overlaps > 0 && total.overlaps_same_table > 0,
        "{total:?}"
    );
}

/// Runs the generator (fixed seed, so deterministic) against `mode` and
/// returns the shrunk counterexample it must find.
fn find_counterexample(mode: Mode) -> Schedule {
    let config = Config {
        cases: 256,
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    match runner.run(&schedule(), |s| {
        check(&s, mode).map_err(TestCaseError::fail)
    }) {
        Err(TestError::Fail(why, minimal)) => {
            eprintln!("{mode:?} counterexample: {minimal:?}\n  {why}");
            check(&minimal, Mode::Reconciled).expect("the real consumer passes the counterexample");
            minimal
        }
        other => panic!("{mode:?}: expected a counterexample, got {other:?}"),
    }
}

#[test]
fn applying_chunks_at_read_time_is_caught() {
    find_counterexample(Mode::ApplyAtRead);
}

#[test]
fn applying_chunks_at_hw_without_dropping_is_caught() {
    find_counterexample(Mode::ApplyAtHighWithoutDrop);
}

/// Reconciling a change against the latest window only is right while
/// windows never overlap; the counterexample has two open at once.
#[test]
fn reconciling_against_the_latest_window_only_is_caught() {
    let s = find_counterexample(Mode::LatestWindowOnly);
    let stats = World::new(Mode::Reconciled, &s).run(&s).stats;
    assert!(stats.overlaps > 0, "{stats:?}");
}

/// Two tables' windows overlapping in the log: both chunks' LWs, then table
/// 0's chunk read, its key 1 updated (v5) and its HW, then table 1's chunk
/// read, its key 2 updated (v6) and its HW. Table 0's change comes while
/// table 1's window is the latest opened: it must still drop the key from
/// table 0's chunk, whose window is open too.
#[test]
fn hand_written_overlapping_windows_of_two_tables() {
    let upd = |table, key| Write {
        table,
        key,
        delete: false,
    };
    // Lanes 0 and RANGES: the first range of table 0 and of table 1 (v1..v4).
    let s = Schedule {
        initial: vec![(0, 1), (0, 2), (1, 1), (1, 2)],
        chunk_size: 4,
        ops: vec![
            Op::Open(0),
            Op::Open(RANGES),
            Op::Read {
                lane: 0,
                after_read: vec![upd(0, 1)],
            },
            Op::Read {
                lane: RANGES,
                after_read: vec![upd(1, 2)],
            },
        ],
    };
    let out = World::new(Mode::Reconciled, &s).run(&s);
    assert!(out.violations.is_empty() && out.diff.is_empty(), "{out:?}");
    assert_eq!(out.stats.rows_dropped, 2, "{:?}", out.stats);
    assert!(out.stats.overlaps >= 1, "{:?}", out.stats);
    // Against the latest window only, table 0's row read as v1 overwrites v5.
    let out = World::new(Mode::LatestWindowOnly, &s).run(&s);
    assert_eq!(
        out.violations,
        ["reversal: table 0 key 1 set to v1 after v5"],
        "{out:?}"
    );
    assert_eq!(
        out.diff,
        [Diff {
            table: 0,
            key: 1,
            source: Some(5),
            target: Some(1)
        }]
    );
}

/// Table 0 starts as {1: v1, 2: v2, 3: v3}. Key 1 is updated twice (v4, v5)
/// before the chunk; after the read of {1: v5, 2: v2, 3: v3} key 1 is updated
/// (v6) and key 2 deleted (v7), both before the HW.
#[test]
fn hand_written_stale_row_and_resurrected_delete() {
    let upd = |key| Write {
        table: 0,
        key,
        delete: false,
    };
    let s = Schedule {
        initial: vec![(0, 1), (0, 2), (0, 3)],
        chunk_size: 3,
        ops: vec![
            Op::Write(upd(1)),
            Op::Write(upd(1)),
            Op::Backfill {
                lane: 0,
                before_read: vec![],
                after_read: vec![
                    upd(1),
                    Write {
                        table: 0,
                        key: 2,
                        delete: true,
                    },
                ],
            },
        ],
    };
    check(&s, Mode::Reconciled).unwrap();

    // Without dropping, the HW re-applies what the stream already superseded.
    let out = World::new(Mode::ApplyAtHighWithoutDrop, &s).run(&s);
    assert_eq!(
        out.diff,
        [
            Diff {
                table: 0,
                key: 1,
                source: Some(6),
                target: Some(5)
            }, // stale row
            Diff {
                table: 0,
                key: 2,
                source: None,
                target: Some(2)
            }, // resurrected delete
        ]
    );
    assert_eq!(
        out.violations,
        [
            "reversal: table 0 key 1 set to v5 after v6",
            "reversal: table 0 key 2 set to v2 after v7"
        ]
    );

    // Applied at read time, the row is overtaken by the stream's older v4.
    let out = World::new(Mode::ApplyAtRead, &s).run(&s);
    assert_eq!(
        out.violations,
        ["reversal: table 0 key 1 set to v4 after v5"]
    );
    assert!(out.diff.is_empty());
}
