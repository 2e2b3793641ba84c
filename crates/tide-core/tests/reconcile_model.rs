//! Model check of the watermark backfill: a deterministic simulator of the
//! source database, its commit-ordered change log, the worker (stream
//! consumer + backfill + [`Reconciler`]) and the target, with crashes.
//!
//! Property, for every schedule: once the backfill has finished and the
//! stream is drained, target == source, and no key was ever set at the
//! target to a version older than one it had already applied (versions grow
//! per key at the source, deletes included). The same schedules with a
//! consumer that skips reconciliation must violate it.

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
    /// LW, `before_read` commits, chunk read, `after_read` commits, HW.
    Backfill {
        before_read: Vec<Write>,
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

/// Backfill position: the next chunk reads `table` after key `after`;
/// `table == TABLES` means every table has been read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Progress {
    table: usize,
    after: Option<i64>,
}

struct InFlight {
    table: usize,
    /// Durable progress once this chunk's HW is processed.
    next: Progress,
    /// Copy of the rows, used only by the broken modes.
    rows: Vec<(i64, u64)>,
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
    progress: Progress,
    // Worker memory, lost on crash.
    delivered: usize,
    cursor: Progress,
    reconciler: Reconciler<usize, i64, u64>,
    chunks: HashMap<ChunkId, InFlight>,
    stats: Stats,
}

/// What a run exercised, to show the generator is not vacuous.
#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    chunks_emitted: usize,
    rows_dropped: usize,
    stale_watermarks: usize,
    replays_skipped: usize,
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
            progress: Progress::default(),
            delivered: 0,
            cursor: Progress::default(),
            reconciler: Reconciler::new(),
            chunks: HashMap::new(),
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

    fn backfill(&mut self, before_read: &[Write], after_read: &[Write]) {
        let Progress { table, after } = self.cursor;
        if table == TABLES {
            return; // everything read; waiting for the last HW
        }
        let id = self.next_chunk;
        self.next_chunk += 1;
        self.log.push(Entry::Low(id));
        for w in before_read {
            self.write(*w);
        }
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        let rows: Vec<(i64, u64)> = self.source[table]
            .range((lower, Bound::Unbounded))
            .take(self.chunk_size)
            .map(|(k, v)| (*k, *v))
            .collect();
        let next = match rows.last() {
            Some(&(last, _)) if rows.len() == self.chunk_size => Progress {
                table,
                after: Some(last),
            },
            _ => Progress {
                table: table + 1,
                after: None,
            },
        };
        self.cursor = next;
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
                table,
                next,
                rows: rows.clone(),
            },
        );
        self.reconciler.add_chunk(id, table, rows);
    }

    fn deliver(&mut self, n: usize) {
        for _ in 0..n {
            let Some(&entry) = self.log.get(self.delivered) else {
                return;
            };
            self.delivered += 1;
            let pos = self.delivered;
            match entry {
                Entry::Change {
                    table,
                    key,
                    version,
                    deleted,
                } => {
                    self.reconciler.on_change(&table, &key);
                    if pos > self.applied {
                        self.apply(table, key, version, deleted);
                    } else {
                        self.stats.replays_skipped += 1;
                    }
                }
                Entry::Low(id) => {
                    if !self.reconciler.on_low_watermark(id) {
                        self.stats.stale_watermarks += 1;
                    }
                }
                Entry::High(id) => self.high_watermark(id, pos),
            }
            self.applied = self.applied.max(pos);
        }
    }

    fn high_watermark(&mut self, id: ChunkId, pos: usize) {
        let result = self.reconciler.on_high_watermark(id);
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
        let rows = match (self.mode, result) {
            (Mode::Reconciled, Some(r)) => {
                self.stats.rows_dropped += r.dropped;
                r.rows
            }
            (Mode::Reconciled, None) => {
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
        self.progress = chunk.next;
        self.stats.chunks_emitted += 1;
    }

    fn crash(&mut self) {
        self.reconciler.forget_all();
        self.chunks.clear();
        self.delivered = self.restart;
        self.cursor = self.progress;
    }

    fn run(mut self, s: &Schedule) -> Outcome {
        for op in &s.ops {
            match op {
                Op::Write(w) => self.write(*w),
                Op::Backfill {
                    before_read,
                    after_read,
                } => self.backfill(before_read, after_read),
                Op::Deliver(n) => self.deliver(*n),
                Op::Crash => self.crash(),
            }
            assert_eq!(self.reconciler.pending(), self.chunks.len());
        }
        // Finish the backfill without further writes, then drain.
        loop {
            self.deliver(usize::MAX);
            if self.progress.table == TABLES {
                break;
            }
            self.backfill(&[], &[]);
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
        2 => (writes(), writes()).prop_map(|(before_read, after_read)| Op::Backfill { before_read, after_read }),
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
