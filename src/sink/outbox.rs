//! The outbox target: one row per event in `tide.outbox`, written in the worker's transaction
//! (so together with the applied position), in bulk, [`FLUSH_ROWS`] events at a time
//! (`catalog::outbox::insert`).

use crate::catalog::outbox::{self, Rows};
use crate::error::TideError;
use crate::error::TideResult;
use crate::sink::{Event, SchemaEvent, Target};
use pgrx::spi::SpiClient;
use tide_core::lsn::Lsn;
use tide_core::model::Txn;

/// Events per bulk insert.
const FLUSH_ROWS: usize = 1000;

/// Buffers outbox rows and writes them in bulk, [`FLUSH_ROWS`] at a time.
pub struct OutboxSink {
    pipeline: String,
    rows: Rows,
}

impl OutboxSink {
    /// An empty buffer for a pipeline.
    pub fn new(pipeline: &str) -> Self {
        OutboxSink {
            pipeline: pipeline.to_string(),
            rows: Rows::default(),
        }
    }
}

impl Target for OutboxSink {
    /// Backfilled rows come parsed (`jsonb` bytes) from the chunk's reader.
    fn takes_jsonb(&self) -> bool {
        true
    }

    /// After a failed iteration: the events buffered and not yet written belong to it (the
    /// next iteration decodes them again); written ones were rolled back with it.
    fn reset(&mut self) {
        self.rows = Rows::default();
    }

    /// Buffer one event (flushes every [`FLUSH_ROWS`]).
    fn push(&mut self, c: &mut SpiClient<'_>, t: &Txn, ev: Event) -> TideResult<()> {
        let unchanged = (!ev.unchanged.is_empty()).then_some(ev.unchanged);
        let r = &mut self.rows;
        r.backfill.push(ev.backfill.map(|b| b.0));
        r.chunk.push(ev.backfill.map(|b| b.1));
        r.lsn.push(t.lsn.0);
        r.xid.push(t.xid as i64);
        r.time.push(t.commit_time);
        r.pos.push(t.position);
        r.rel.push(ev.relation);
        r.op.push(ev.op.as_str());
        r.key.push(ev.key);
        r.row.push(ev.row);
        r.row_jsonb.push(ev.row_jsonb);
        r.unchanged.push(unchanged);
        if r.len() >= FLUSH_ROWS {
            self.flush(c)?;
        }
        Ok(())
    }

    /// A schema event: op `schema`, no key, the change in `row` (the marker's payload and
    /// `"rewrite"`: whether the rows are read again after it; README "Outbox format").
    fn schema(&mut self, c: &mut SpiClient<'_>, t: &Txn, ev: SchemaEvent) -> TideResult<()> {
        let mut row: serde_json::Value = serde_json::from_str(&ev.payload).map_err(|e| {
            TideError::internal(format!("a schema marker's payload is not JSON: {e}"))
        })?;
        if let Some(o) = row.as_object_mut() {
            o.insert("rewrite".to_string(), serde_json::Value::Bool(ev.rewrite));
        }
        self.push(
            c,
            t,
            Event {
                relid: ev.relid,
                relation: ev.relation,
                op: tide_core::model::Op::Schema,
                key: None,
                row: Some(row.to_string()),
                row_jsonb: None,
                values: None,
                key_values: None,
                unchanged: Vec::new(),
                columns: Vec::new(),
                backfill: None,
                only_where: None,
            },
        )
    }

    /// Write the buffered events (the worker's transaction commits them, with the pipeline
    /// row's applied position).
    fn commit(
        &mut self,
        c: &mut SpiClient<'_>,
        _pipeline: &str,
        _applied: Option<Lsn>,
    ) -> TideResult<()> {
        self.flush(c)
    }
}

impl OutboxSink {
    /// Write the buffered events.
    fn flush(&mut self, c: &mut SpiClient<'_>) -> TideResult<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        outbox::insert(c, &self.pipeline, std::mem::take(&mut self.rows))
    }
}
