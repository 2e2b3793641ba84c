//! Table-target e2e tests: pipelines whose target is a set of tables, in the same database
//! (`'table'`) or in another PostgreSQL server reached through a postgres_fdw foreign server
//! (`'postgres'`).
//!
//! What is checked, against the contract of `tide.create_pipeline` / `tide.add_table`:
//! - readers of the target never see half of a source transaction, during a backfill too
//!   (the wallet tests: a checker reads the target continuously in REPEATABLE READ);
//! - a remote target that goes down shows `state = 'error'`, then catches up by itself, with
//!   every event applied exactly once and in order (a target-side audit trigger);
//! - schema changes: ADD COLUMN and safe widenings are propagated; under `'pause'` (or for an
//!   unsafe change) the pipeline pauses with the reason and resumes from the same place;
//! - unchanged TOAST values are kept at the target;
//! - backfill + concurrent writes + kill -9 of the worker converge on a table target;
//! - target tables are created when missing and checked when present; option errors.
//!
//! Convergence is always checked the same way: the rows of the source and of the target
//! (rendered as text, explicit column lists) compared as multisets both ways: 0 differences.
//!
//! Needs pg_tide installed into the system PostgreSQL 15 (`scripts/install.sh`). Each test runs
//! on its own scratch cluster (pg_tide preloaded, `wal_level = logical`); remote tests add a
//! second scratch cluster (pg_tide not preloaded) as the target.
//!
//! Modules:
//! - `common`: the suite's prelude (the polling interval, LSNs parsed);
//! - `wallets`: no reader of the target ever sees half a transfer (local and remote);
//! - `remote`: a remote target goes down and comes back (error state, recovery, exactly once, in
//!   order); statements grouped per table per batch; a chunk failing after the events before it
//!   were committed;
//! - `schema`: schema changes propagated, and pause / fix / resume;
//! - `values`: json text kept exactly; unchanged TOAST values stay at the target;
//! - `types`: every common built-in type reaches local and remote targets exactly, through the
//!   backfill and the stream (JSON null, a bare JSON string, -0, NaN, BC dates...), and verify
//!   with a sample reports nothing;
//! - `remote_copy`: backfill chunks reach a remote target by COPY (JSON nulls, json text and
//!   values needing COPY escapes arrive exactly); a kill -9 between the COPY and the remote
//!   commit of a chunk loses and duplicates nothing, straight into the table or through the
//!   staging table; ordinary roles on both sides, and the remote role's TEMPORARY privilege
//!   (needed for the staging table only); a table added while an iteration is under way is
//!   backfilled by COPY too;
//! - `bulk`: chunks loaded in bulk into a local target where its key range is empty, upserted
//!   where it is not or where the table has triggers or row security (`tide.chunks.written_as`);
//!   a kill -9 inside a bulk load;
//! - `row_values`: backfill chunks reach a local target as row values (JSON nulls kept), or as
//!   text events when the target's types differ; JSON nulls exact either way;
//! - `convergence`: backfill convergence on a table target, with kill -9 of the worker
//!   mid-backfill;
//! - `checks`: target tables created and checked; option errors;
//! - `refused`: a chunk the target refuses (a CHECK only the target has) fails its backfill with
//!   the error, its SQLSTATE, the attempts and a remedy while the stream goes on, is not tried
//!   again, and the remedy as printed (fix the row, `tide.resume_backfill`) converges; local and
//!   remote.
//! - `keyless`: tables without a key (REPLICA IDENTITY FULL): an audit table with duplicates
//!   under pgbench at a local, a remote and an outbox target (replayed), equal as multisets;
//!   one of two equal rows updated or deleted; the refusals.
//! - `subscription`: scenarios of PostgreSQL's own subscription tests (`src/test/subscription`)
//!   that pg_tide failed (issue 45): a primary key with INCLUDE columns.

mod bulk;
mod checks;
mod common;
mod convergence;
mod keyless;
mod refused;
mod remote;
mod remote_copy;
mod row_values;
mod schema;
mod subscription;
mod types;
mod values;
mod wallets;
