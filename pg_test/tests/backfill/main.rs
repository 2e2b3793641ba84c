//! Backfill e2e tests: the watermark backfill (DBLog) of existing rows, interleaved with the change
//! stream, converges under concurrent writes and worker crashes, resumes where it stopped, keeps
//! memory and snapshot age bounded, honours conditions and throttles, reports readiness, and
//! rejects bad input with clear SQLSTATEs.
//!
//! The convergence check used throughout: replay the outbox in `id` order onto an EMPTY copy of
//! each source table (`read`/`insert`/`update` = upsert of `jsonb_populate_record(NULL::copy,
//! row)` by key, `delete` = delete by key, `truncate` = empty the copy), then compare the copy
//! with the source both ways (`EXCEPT ALL`); 0 rows either way means the stream plus the backfill
//! rebuilt the table exactly.
//!
//! Needs pg_tide installed into the system PostgreSQL 15 (`scripts/install.sh`).
//! Each test runs on its own scratch cluster (pg_tide preloaded, `wal_level = logical`).
//!
//! Modules:
//! - `common`: the suite's helpers (tables added and waited for, `tide.backfills` read, the
//!   replay onto a copy and its comparison, the invariants of a finished backfill);
//! - `convergence`: convergence under concurrent writes with kill -9 of the worker mid-backfill,
//!   and a broken replay that the check must catch;
//! - `memory`: bounded memory and snapshot age; the stream stays live during a big backfill;
//! - `resume`: pause, immediate restart and resume; then a re-seed;
//! - `conditions`: conditions, throttle and chunk size changes, queued backfills (at most
//!   `tide.max_parallel_backfills` running);
//! - `parallel`: several backfills of a pipeline at once under writes, deletes, key updates and
//!   a kill -9, converging; many small tables with a pause, a throttle and a cancel among them;
//!   several readers of one table (`tide.max_backfill_readers`) with several tables at once,
//!   through the same, to the outbox, a local table and a remote target;
//! - `streaming_cap`: chunks capped at `tide.streaming_chunk_size` rows while the stream is
//!   busy, the full chunk size once it is quiet, converging under writers;
//! - `readiness`: the readiness states of a table, in order;
//! - `errors`: bad input and wrong states have clear SQLSTATEs;
//! - `keys`: text, timestamp and composite keys under concurrent updates;
//! - `visibility`: a commit that becomes visible after the low watermark is not overwritten;
//! - `read_ahead`: the reader process reads the next chunk (present while a backfill runs, gone
//!   after); a kill -9 of it; the worker reading alone (setting off, no free worker slot).

mod common;
mod conditions;
mod convergence;
mod errors;
mod keys;
mod memory;
mod parallel;
mod read_ahead;
mod readiness;
mod resume;
mod streaming_cap;
mod visibility;
