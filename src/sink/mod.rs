//! Targets: where a pipeline's events go.
//!
//! - [`outbox`]: rows in `tide.outbox` (events for consumers);
//! - [`table`]: ordered upserts and deletes into a table, local (same database, applied through
//!   SPI in the worker's transaction) or remote (another PostgreSQL, applied by the [`remote`]
//!   sink thread in one remote transaction per batch).
//!
//! Every target stores the applied position in the same transaction as the data, so a replay
//! after a crash is skipped (exactly once in effect), and receives whole source transactions
//! only: a target transaction never holds part of one.

pub mod outbox;
pub mod remote;
pub mod table;

use crate::catalog::PipelineRow;
use crate::error::TideResult;
use pgrx::spi::SpiClient;
use tide_core::lsn::Lsn;
use tide_core::model::{Op, RelDesc, TargetKind, Txn};

/// One change, rendered, on its way to a target.
pub struct Event {
    pub relid: u32,
    /// Source relation, schema-qualified and quoted where needed.
    pub relation: String,
    /// What the event does to its row.
    pub op: Op,
    /// JSON object of the key columns.
    pub key: Option<String>,
    /// JSON object of the row's sent columns.
    pub row: Option<String>,
    /// Columns not sent (unchanged TOAST): leave them as they are.
    pub unchanged: Vec<String>,
    /// Names of the columns present in `row`, in order.
    pub columns: Vec<String>,
    /// (backfill id, chunk) of a `read` event.
    pub backfill: Option<(i64, i64)>,
}

/// A pipeline's target, kept by the worker across iterations (table targets cache the
/// target tables' shapes).
#[allow(clippy::large_enum_variant)]
pub enum Sink {
    Outbox(outbox::OutboxSink),
    Table(Box<table::TableSink>),
}

impl Sink {
    /// The sink for a pipeline.
    pub fn for_pipeline(p: &PipelineRow) -> TideResult<Sink> {
        match p.target {
            TargetKind::Outbox => Ok(Sink::Outbox(outbox::OutboxSink::new(&p.name))),
            TargetKind::Table | TargetKind::Postgres => {
                Ok(Sink::Table(Box::new(table::TableSink::new(p)?)))
            }
        }
    }

    /// Called at the start of every iteration (table targets learn which tables go where).
    pub fn begin(&mut self, c: &mut SpiClient<'_>, pipeline: &str) -> TideResult<()> {
        match self {
            Sink::Outbox(_) => Ok(()),
            Sink::Table(t) => t.begin(c, pipeline),
        }
    }

    /// Where the target says it has applied up to, when it keeps that itself (remote targets);
    /// replays at or below it are skipped.
    pub fn applied(&mut self) -> TideResult<Option<Lsn>> {
        match self {
            Sink::Outbox(_) => Ok(None),
            Sink::Table(t) => t.remote_applied(),
        }
    }

    /// A relation's (new) description arrived in the stream: table targets check the target
    /// table's shape and apply or refuse the schema change before the first event that needs it.
    pub fn relation(&mut self, c: &mut SpiClient<'_>, relid: u32, rel: &RelDesc) -> TideResult<()> {
        match self {
            Sink::Outbox(_) => Ok(()),
            Sink::Table(t) => t.relation(c, relid, rel),
        }
    }

    pub fn push(&mut self, c: &mut SpiClient<'_>, t: &Txn, ev: Event) -> TideResult<()> {
        match self {
            Sink::Outbox(o) => o.push(c, t, ev),
            Sink::Table(s) => s.push(c, ev),
        }
    }

    /// Write everything buffered and make it durable together with the applied position
    /// `applied` (end LSN of the last source transaction applied), before the worker's
    /// transaction commits.
    pub fn finish(
        &mut self,
        c: &mut SpiClient<'_>,
        pipeline: &str,
        applied: Option<Lsn>,
    ) -> TideResult<()> {
        match self {
            Sink::Outbox(o) => o.flush(c),
            Sink::Table(s) => s.finish(c, pipeline, applied),
        }
    }

    /// Where the target commits on its own (remote targets): commit what is buffered, which
    /// ends with the source transaction ending at `applied`, in a target transaction of its own,
    /// before more follows in this iteration. The applied position goes with it, so a later
    /// failure replays only what follows. A no-op for targets written in the worker's
    /// transaction.
    pub fn commit_early(
        &mut self,
        c: &mut SpiClient<'_>,
        pipeline: &str,
        applied: Lsn,
    ) -> TideResult<()> {
        match self {
            Sink::Table(s) if s.is_remote() => s.finish(c, pipeline, Some(applied)),
            _ => Ok(()),
        }
    }

    /// Forget cached state after a failed iteration.
    pub fn reset(&mut self) {
        if let Sink::Table(s) = self {
            s.reset();
        }
    }
}
