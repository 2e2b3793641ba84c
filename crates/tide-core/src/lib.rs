//! Server-independent core of pg_tide: everything that can be specified and
//! tested without PostgreSQL.
//!
//! * [`applied`]: what a target that keeps its applied position itself knows of
//!   it, changed by its commits' outcomes.
//! * [`lsn`]: WAL positions and their `X/Y` text form.
//! * [`wire`]: the versioned binary format between the output plugin and the
//!   worker (documented in `docs/wire-format.md`).
//! * [`change`]: what the worker hands a target (row events, truncates, schema
//!   events, batch chunks, resync marks) and where each falls in its source transaction.
//! * [`copy`]: rows in `COPY ... FROM STDIN`'s text format, every value
//!   escaped (remote table targets' backfill chunks).
//! * [`kafka`]: the kafka target's messages (Debezium envelopes, transaction
//!   metadata, position records, topic names) and its guarded settings.
//! * [`json`]: rendering decoded rows as JSON for the outbox, exactly
//!   rebuildable with `jsonb_populate_record`.
//! * [`texts`]: decoded rows as their columns' text output, for table targets.
//! * [`model`]: the stream model the worker and the targets share (relation
//!   descriptors, transaction metadata, event ops, watermark kinds, backfill
//!   states, target kinds).
//! * [`plan`]: a table target's statements planned from its events (grouping,
//!   statement text, schema-change DDL, safe widenings, quoting).
//! * [`remote_auth`]: postgres_fdw's rules for a remote target's connection made
//!   for a non-superuser (password required and used, no server files).
//! * [`row`]: a row on its way to a target and the forms it can take (`RowForm`:
//!   JSON, `jsonb`, text, row values, COPY text), declared by each target per table.
//! * [`read_ahead`]: the read-ahead protocol's messages (a chunk request, a chunk
//!   or why not) and their encoding.
//! * [`reconcile`]: the DBLog watermark reconciler merging backfill chunks
//!   into the change stream.
//! * [`backfill_schedule`]: which backfill chunks a worker holds, when each is
//!   written (key order, holding), what is forgotten with one; caps and plans.
//! * [`worker_loop`]: the pipeline worker's main loop as a state machine (one
//!   pure `decide`).
//! * [`spill`]: the decoder's message buffer, which moves to a temporary file
//!   past a threshold.
//! * [`stream_spool`]: streamed (in-progress) transactions spooled one file each
//!   until their commit, then handed on whole.
//!
//! The crate uses only `std`, never panics while decoding untrusted input,
//! does no I/O except [`spill`]'s temporary files, and has no `unsafe` code
//! (`forbid(unsafe_code)` below: whatever needs `unsafe` talks to PostgreSQL
//! and lives in the pgrx crate).

#![forbid(unsafe_code)]

pub mod applied;
pub mod backfill_schedule;
pub mod change;
pub mod connect;
pub mod copy;
pub mod json;
pub mod kafka;
pub mod lsn;
pub mod mask;
pub mod model;
pub mod name_list;
pub mod plan;
pub mod read_ahead;
pub mod reconcile;
pub mod remote_auth;
pub mod row;
pub mod snapshot;
pub mod spill;
pub mod stream_blocks;
pub mod stream_spool;
pub mod texts;
pub mod wire;
pub mod worker_loop;

pub use lsn::Lsn;
