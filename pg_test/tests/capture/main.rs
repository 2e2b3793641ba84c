//! Capture e2e tests: what a pipeline delivers to `tide.outbox`, exactly once and in order,
//! through worker crashes and server crashes, DDL, TOAST, table membership changes, pause and
//! resume, errors and bad input.
//!
//! Needs pg_tide installed into the system PostgreSQL 15 (`scripts/install.sh`).
//! Each test runs on its own scratch cluster (pg_tide preloaded, `wal_level = logical`).
//!
//! These tests are about the change stream: tables are added with
//! `tide.add_table(pipeline, table, backfill => false)`, so the rows a table already holds are
//! not read, and changes committed before add_table are not delivered.
//!
//! Modules:
//! - `common`: the suite's helpers (outbox pipelines created and waited for, the events of a
//!   table as "op:id", the ordering and exactly-once invariants of a stream);
//! - `chaos`: kill -9 of the worker and an immediate shutdown under concurrent load;
//! - `values`: types round trip; an unchanged TOAST value is listed, never a placeholder;
//! - `tables`: DDL while streaming; add_table / remove_table boundaries;
//! - `lifecycle`: pause, resume and drop (two pipelines on one table), drop racing the worker,
//!   a failing target visible in `tide.pipelines` and recovering by itself;
//! - `errors`: bad input, a specific SQLSTATE (and hint) each;
//! - `decoder`: one decoding session per worker: WAL read once, its own writes not decoded, a
//!   huge transaction spilled.

mod chaos;
mod common;
mod decoder;
mod errors;
mod lifecycle;
mod tables;
mod values;
