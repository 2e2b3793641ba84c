//! `tide.verify` / `tide.repair` e2e tests: a table target (local `'table'` or remote
//! `'postgres'`) is compared with its source range by range while writes continue, corruption
//! made behind pg_tide's back is reported in exactly the ranges that hold it (and nowhere else),
//! a repair re-seeds those ranges and deletes the extra keys without ever deleting a key inserted
//! meanwhile, and heavy writes over the whole key space never produce a false alarm (rated at
//! `TIDE_VERIFY_HEAVY_RATE` writes/s, default 3000, plus one unthrottled burst). Also: `sample`
//! names the differing columns, bad inputs have SQLSTATEs, and a text key whose remote target
//! database has another default collation is not a false alarm.
//!
//! Convergence is checked independently of `tide.verify`: the rows of the source and of the
//! target (explicit column list rendered as text) compared as multisets both ways: 0 rows.
//!
//! Needs pg_tide installed into the system PostgreSQL 15 (`scripts/install.sh`). Each test runs
//! on its own scratch cluster (pg_tide preloaded, `wal_level = logical`); the remote test adds a
//! second scratch cluster (pg_tide not preloaded) as the target.
//!
//! Modules:
//! - `common`: the suite's helpers (`tide.verify` and `tide.repair` called and their rows read,
//!   `tide.verifications`, the writers);
//! - `corruption`: corruption behind pg_tide's back is found in exactly its ranges, and repaired
//!   (local and remote);
//! - `heavy`: no false alarms under heavy writes over the whole key space;
//! - `sample`: `sample => N` names the differing columns;
//! - `race`: a repair never deletes a key inserted at the source meanwhile;
//! - `collation`: a text key whose target database sorts differently;
//! - `keys`: every key type the capture supports (timestamptz, date, time, numeric, uuid, text
//!   under a collation, a composite key mixing them) verified and repaired, local and remote;
//! - `errors`: bad inputs.

mod collation;
mod common;
mod corruption;
mod errors;
mod heavy;
mod keys;
mod race;
mod sample;
