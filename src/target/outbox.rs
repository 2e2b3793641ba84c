//! The outbox target: one row per event in `tide.outbox`, written in the worker's transaction
//! (so together with the applied position), in bulk, [`FLUSH_ROWS`] events at a time
//! (`catalog::outbox::insert`).

use crate::catalog::outbox::{self, Rows};
use crate::catalog::pipelines::PipelineRow;
use crate::error::TideError;
use crate::error::TideResult;
use crate::target::{
    refused_batch, Change, CommitPoint, Event, Kind, Row, RowForm, SchemaEvent, Tableless, Target,
};
use pgrx::spi::SpiClient;
use tide_core::change::At;
use tide_core::lsn::Lsn;
use tide_core::model::ChunkWrite;

/// The outbox, as the SQL API and the worker tell kinds of target apart.
pub const KIND: Kind = Kind {
    alterable: &[],
    tableless: Some(Tableless {
        writes_to: "the outbox",
        target_table: (
            ", which has no target tables",
            "Omit target_table for outbox pipelines.",
        ),
        verify_hint: "tide.verify compares table targets ('table' or 'postgres'). For the outbox, replay it onto a copy and compare that.",
    }),
    local_tables: false,
    remote: false,
    outside: false,
    consumers: true,
    resync_marks: false,
};

/// Events per bulk insert.
const FLUSH_ROWS: usize = 1000;

/// Buffers outbox rows and writes them in bulk, [`FLUSH_ROWS`] at a time.
pub struct OutboxTarget {
    pipeline: String,
    rows: Rows,
}

impl OutboxTarget {
    /// An empty buffer for a pipeline.
    pub fn new(pipeline: &str) -> Self {
        OutboxTarget {
            pipeline: pipeline.to_string(),
            rows: Rows::default(),
        }
    }
}

impl Target for OutboxTarget {
    /// JSON; backfilled rows come parsed (`jsonb` bytes) from the chunk's reader.
    fn row_form(&mut self, _relid: u32, chunk: Option<&[(String, String)]>) -> TideResult<RowForm> {
        Ok(if chunk.is_some() {
            RowForm::Jsonb
        } else {
            RowForm::Json
        })
    }

    fn begin(&mut self, _c: &mut SpiClient<'_>, _p: &PipelineRow) -> TideResult<Option<Lsn>> {
        Ok(None)
    }

    /// After a failed iteration: the events buffered and not yet written belong to it (the
    /// next iteration decodes them again); written ones were rolled back with it.
    fn reset(&mut self) {
        self.rows = Rows::default();
    }

    /// Buffer events (flushes every [`FLUSH_ROWS`]): a row event; each truncate event of a
    /// `TRUNCATE`, one after the other; a schema event (op `schema`, no key, the change in `row`:
    /// the marker's payload and `"rewrite"`, whether the rows are read again after it; README
    /// "Outbox format"). A resync's events are written by `catalog::slots` in SQL.
    fn apply(
        &mut self,
        c: &mut SpiClient<'_>,
        at: At,
        change: Change<'_>,
    ) -> TideResult<Option<ChunkWrite>> {
        match change {
            Change::Row(ev) => self.push(c, at, ev)?,
            Change::Truncate { events, .. } => {
                for (i, ev) in events.into_iter().enumerate() {
                    self.push(c, at.after(i), ev)?;
                }
            }
            Change::Schema(ev) => self.schema(c, at, ev)?,
            Change::Relation { .. } | Change::Resync(_) => {}
            Change::Chunk(b) => return Err(refused_batch(&b)),
        }
        Ok(None)
    }

    /// Write the buffered events (the worker's transaction commits them, with the pipeline
    /// row's applied position).
    fn commit(
        &mut self,
        c: &mut SpiClient<'_>,
        _pipeline: &str,
        _applied: Option<Lsn>,
        at: CommitPoint,
    ) -> TideResult<()> {
        match at {
            CommitPoint::End => self.flush(c),
            // Written in the worker's transaction: nothing commits before it.
            CommitPoint::Early | CommitPoint::Open => Ok(()),
        }
    }
}

impl OutboxTarget {
    /// Buffer one event (flushes every [`FLUSH_ROWS`]).
    fn push(&mut self, c: &mut SpiClient<'_>, t: At, ev: Event) -> TideResult<()> {
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
        let (row, row_jsonb) = match ev.row {
            Row::None => (None, None),
            Row::Json(s) => (Some(s), None),
            Row::Jsonb(b) => (None, Some(b)),
            other => {
                return Err(TideError::internal(format!(
                    "the outbox was handed a row it did not ask for: {}",
                    row_kind(&other)
                )))
            }
        };
        r.row.push(row);
        r.row_jsonb.push(row_jsonb);
        r.unchanged.push(unchanged);
        if r.len() >= FLUSH_ROWS {
            self.flush(c)?;
        }
        Ok(())
    }

    /// A schema event: op `schema`, no key, the change in `row` (the marker's payload and
    /// `"rewrite"`: whether the rows are read again after it; README "Outbox format").
    fn schema(&mut self, c: &mut SpiClient<'_>, t: At, ev: SchemaEvent) -> TideResult<()> {
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
                row: Row::Json(row.to_string()),
                ..Event::bare(ev.relid, ev.relation, tide_core::model::Op::Schema, None)
            },
        )
    }

    /// Write the buffered events.
    fn flush(&mut self, c: &mut SpiClient<'_>) -> TideResult<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        outbox::insert(c, &self.pipeline, std::mem::take(&mut self.rows))
    }
}

/// A row form's name, for messages.
fn row_kind(r: &Row) -> &'static str {
    match r {
        Row::None => "none",
        Row::Json(_) => "JSON",
        Row::Jsonb(_) => "jsonb",
        Row::Text(_) => "text",
        Row::Key(_) => "key values",
        Row::Value(_) => "a row value",
        Row::Copy(_) => "COPY text",
    }
}
