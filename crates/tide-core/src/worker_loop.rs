//! The pipeline worker's main loop as a state machine: what it does next, decided by one pure
//! function, [`decide`], from where it is ([`Phase`]) and what it can see cheaply ([`Facts`]).
//! `src/worker/pipeline.rs` performs the [`Action`] and reports back with [`Phase`]'s
//! transition functions; this header is the specification, in the manner of PostgreSQL's
//! `tablesync.c`.
//!
//! # States
//!
//! Who sets each: the loop, through the transition functions below. None is persisted: after a
//! restart the worker begins in [`Phase::Iterate`], and everything it needs is in the catalog
//! and the slot. (What `tide.pipelines` shows is the worker's shared-memory state, which the
//! loop writes after each iteration.)
//!
//! ```text
//!                 +--------------------------- Sleep (back-off) ----------------+
//!                 v                                                             |
//!   start --> Iterate --ok--> Applied --ReadChunk / Sleep(poll)--> Quiet   Failing
//!              ^  |  \                 \                            |  ^      ^
//!              |  |   \-- error ---------\----------------------------------->+
//!              |  |    \                  \-- chunk due or more WAL --> Iterate
//!              |  |     \-- disabled --> Paused --Sleep(10 s)--> Iterate
//!              |  \-- pipeline dropped --> Gone --> Exit
//!              +-- WAL ahead of the decoder, a chunk waiting, SIGHUP, or 1 s since the last
//!                  iteration (Quiet)
//! ```
//!
//! # Rules
//!
//! - **A chunk in flight** (asked of the worker's reader by the iteration that wrote the chunk
//!   before it) is received first, whatever the phase but Paused, Failing and Gone: it must be
//!   registered before an iteration decodes past its low watermark.
//! - **Iterate**: run one iteration (one transaction: decode, apply, record the position).
//! - **Applied** (the iteration succeeded): read the next backfill chunk if none waits and the
//!   iteration did not just write one: what committed while a chunk was written goes first
//!   (one more, short, iteration), so the stream waits for at most one of the two, never both
//!   back to back. Then, if the iteration reached the end of the WAL and neither wrote nor read
//!   a chunk, sleep one poll interval: woken by a commit when nothing waits (then **Quiet**),
//!   else simply (then **Iterate**). Otherwise iterate at once: a chunk's high watermark is in
//!   the WAL, or there is more WAL.
//! - **Quiet** (caught up, decoder open): a full iteration is due after SIGHUP, without a
//!   decoder, or [`FULL_ITERATION_EVERY`] after the last one (it notices a pause or a due
//!   chunk even when nothing writes WAL). Otherwise read a due chunk once per poll, and sleep
//!   while nothing is new: no chunk waits and the server's flush position is not past the
//!   decoder's. A quiet server costs a comparison per poll, not a transaction.
//! - **Paused**: sleep `Settings::paused_recheck` (at most [`PAUSED_RECHECK`]; shorter for a
//!   remote target, whose paused worker renews its lease on the target), then iterate (which
//!   sees whether it was resumed).
//! - **Failing**: sleep `250 ms × 2^n` (n failures in a row, at most 10 doublings), capped by
//!   `tide.max_retry_delay`, then iterate. A success resets n.
//! - **Gone**: the pipeline was dropped: exit.

use std::time::Duration;

/// A quiet worker still runs a full iteration this often.
pub const FULL_ITERATION_EVERY: Duration = Duration::from_secs(1);
/// How often a paused pipeline's worker looks whether it was resumed.
pub const PAUSED_RECHECK: Duration = Duration::from_secs(10);

/// Where the worker's loop is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Run an iteration now.
    Iterate,
    /// The last iteration succeeded.
    Applied {
        /// It consumed everything the slot had when it started.
        drained: bool,
        /// It wrote the backfill chunk that was waiting.
        chunk_written: bool,
        /// A chunk was read since (so its high watermark is in the WAL).
        chunk_read: bool,
    },
    /// Caught up, decoder open: poll cheaply.
    Quiet {
        /// A chunk read was tried since the last sleep.
        chunk_tried: bool,
    },
    /// The pipeline is disabled.
    Paused,
    /// The last `failures` iterations failed.
    Failing { failures: u32 },
    /// The pipeline was dropped.
    Gone,
}

/// What the loop can see without a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts {
    /// A SIGHUP arrived since the last look (the configuration was reloaded).
    pub sighup: bool,
    /// Time since the last iteration started.
    pub since_iteration: Duration,
    /// A backfill chunk is in memory, waiting for its high watermark in the stream.
    pub chunk_waiting: bool,
    /// A backfill chunk was asked of the worker's reader and has not been received.
    pub chunk_in_flight: bool,
    /// The worker has an open decoder.
    pub decoder_open: bool,
    /// The server's WAL flush position is past the decoder's position (or there is no decoder).
    pub wal_ahead: bool,
}

/// Settings [`decide`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `tide.poll_interval`.
    pub poll: Duration,
    /// `tide.max_retry_delay` (for a remote target at most a third of `tide.target_lease`, so a
    /// failing worker still renews its lease on the target).
    pub max_retry_delay: Duration,
    /// How long a paused pipeline's worker sleeps between looks: [`PAUSED_RECHECK`], or less
    /// for a remote target (a third of `tide.target_lease`).
    pub paused_recheck: Duration,
}

/// What the loop does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Run one iteration.
    Iterate,
    /// Read the next backfill chunk, if one is due, or receive the one in flight (between
    /// iterations, its own transactions).
    ReadChunk,
    /// Wait on the latch; `wake_on_commit`: a commit elsewhere cuts the wait short.
    Sleep {
        wait: Duration,
        wake_on_commit: bool,
    },
    /// End the worker.
    Exit,
}

/// The back-off after `failures` failed iterations in a row.
pub fn backoff(failures: u32, max: Duration) -> Duration {
    Duration::from_millis(250u64 << failures.min(10)).min(max)
}

/// Whether a write of a backfill chunk that failed with `sqlstate` (in an iteration that wrote
/// nothing else) is the target refusing the chunk's rows — a constraint or trigger of the
/// target, a value it cannot store, a permission it does not give: the backfill fails with the
/// error until someone fixes the row or the target — rather than a passing condition the same
/// write may get past when tried again: class 08 (connection), 40 (serialization failure,
/// deadlock), 53 (insufficient resources), 57 (operator intervention: a shutdown, a cancel), 58
/// (system error), 55P03 (lock not available), 55006 (object in use), 25P03 (idle in
/// transaction timeout). A remote target's refusal arrives as HV000 (its own SQLSTATE in the
/// detail), its passing failures as 08006.
pub fn chunk_refused(sqlstate: &str) -> bool {
    let passing = ["08", "40", "53", "57", "58"]
        .iter()
        .any(|class| sqlstate.starts_with(class))
        || matches!(sqlstate, "55P03" | "55006" | "25P03");
    !passing
}

/// The next action. Pure: the same phase and facts always give the same action.
pub fn decide(phase: Phase, f: Facts, s: Settings) -> Action {
    if f.chunk_in_flight
        && matches!(
            phase,
            Phase::Iterate | Phase::Applied { .. } | Phase::Quiet { .. }
        )
    {
        return Action::ReadChunk;
    }
    match phase {
        Phase::Iterate => Action::Iterate,
        Phase::Gone => Action::Exit,
        Phase::Paused => Action::Sleep {
            wait: s.paused_recheck,
            wake_on_commit: false,
        },
        Phase::Failing { failures } => Action::Sleep {
            wait: backoff(failures, s.max_retry_delay),
            wake_on_commit: false,
        },
        Phase::Applied {
            drained,
            chunk_written,
            chunk_read,
        } => {
            if !f.chunk_waiting && !chunk_written && !chunk_read {
                Action::ReadChunk
            } else if drained && !chunk_written && !(chunk_read && f.chunk_waiting) {
                Action::Sleep {
                    wait: s.poll,
                    wake_on_commit: !f.chunk_waiting && f.decoder_open,
                }
            } else {
                Action::Iterate
            }
        }
        Phase::Quiet { chunk_tried } => {
            if f.sighup || !f.decoder_open || f.since_iteration >= FULL_ITERATION_EVERY {
                Action::Iterate
            } else if !f.chunk_waiting && !chunk_tried {
                Action::ReadChunk
            } else if !f.chunk_waiting && !f.wal_ahead {
                Action::Sleep {
                    wait: s.poll,
                    wake_on_commit: true,
                }
            } else {
                Action::Iterate
            }
        }
    }
}

/// How an iteration ended, as the loop reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Iteration {
    /// The pipeline no longer exists.
    Gone,
    /// The pipeline is disabled.
    Paused,
    /// Applied; `drained`: it reached the end of the WAL.
    Done { drained: bool },
    /// It failed (rolled back).
    Failed,
}

impl Phase {
    /// After an iteration that ended as `it`; `chunk_was_waiting`/`chunk_waiting`: whether a
    /// chunk waited before and after it; `failures`: the failure count before it.
    pub fn after_iteration(
        it: Iteration,
        chunk_was_waiting: bool,
        chunk_waiting: bool,
        failures: u32,
    ) -> Phase {
        match it {
            Iteration::Gone => Phase::Gone,
            Iteration::Paused => Phase::Paused,
            Iteration::Done { drained } => Phase::Applied {
                drained,
                chunk_written: chunk_was_waiting && !chunk_waiting,
                chunk_read: false,
            },
            Iteration::Failed => Phase::Failing {
                failures: (failures + 1).min(16),
            },
        }
    }

    /// After [`Action::ReadChunk`].
    pub fn after_read_chunk(self) -> Phase {
        match self {
            Phase::Applied {
                drained,
                chunk_written,
                ..
            } => Phase::Applied {
                drained,
                chunk_written,
                chunk_read: true,
            },
            Phase::Quiet { .. } => Phase::Quiet { chunk_tried: true },
            other => other,
        }
    }

    /// After an [`Action::Sleep`] of this phase (`woke_on_commit`: the sleep was one that a
    /// commit could cut short, i.e. the worker was quiet).
    pub fn after_sleep(self, wake_on_commit: bool) -> Phase {
        match self {
            Phase::Applied { .. } | Phase::Quiet { .. } if wake_on_commit => {
                Phase::Quiet { chunk_tried: false }
            }
            _ => Phase::Iterate,
        }
    }

    /// The failure count this phase carries (a success resets it).
    pub fn failures(self) -> u32 {
        match self {
            Phase::Failing { failures } => failures,
            _ => 0,
        }
    }
}

#[cfg(test)]
#[path = "worker_loop_tests.rs"]
mod tests;
