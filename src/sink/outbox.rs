//! The outbox target: one row per event in `tide.outbox`, written in the worker's transaction
//! (so together with the applied position) with one multi-row INSERT per [`FLUSH_ROWS`] events.

use crate::error::TideResult;
use crate::sink::{Event, Target};
use pgrx::spi::SpiClient;
use tide_core::lsn::Lsn;
use tide_core::model::Txn;

/// Rows per outbox INSERT statement.
const FLUSH_ROWS: usize = 1000;

/// Buffers outbox rows and writes them with one multi-row INSERT per [`FLUSH_ROWS`].
pub struct OutboxSink {
    pipeline: String,
    lsn: Vec<String>,
    xid: Vec<i64>,
    time: Vec<i64>,
    pos: Vec<i32>,
    rel: Vec<String>,
    op: Vec<String>,
    key: Vec<Option<String>>,
    row: Vec<Option<String>>,
    unchanged: Vec<Option<String>>,
    backfill: Vec<Option<i64>>,
    chunk: Vec<Option<i64>>,
}

impl OutboxSink {
    /// An empty buffer for a pipeline.
    pub fn new(pipeline: &str) -> Self {
        OutboxSink {
            pipeline: pipeline.to_string(),
            lsn: Vec::new(),
            xid: Vec::new(),
            time: Vec::new(),
            pos: Vec::new(),
            rel: Vec::new(),
            op: Vec::new(),
            key: Vec::new(),
            row: Vec::new(),
            unchanged: Vec::new(),
            backfill: Vec::new(),
            chunk: Vec::new(),
        }
    }
}

impl Target for OutboxSink {
    /// Buffer one event (flushes every [`FLUSH_ROWS`]).
    fn push(&mut self, c: &mut SpiClient<'_>, t: &Txn, ev: Event) -> TideResult<()> {
        let unchanged = if ev.unchanged.is_empty() {
            None
        } else {
            let mut s = String::from("[");
            for (i, name) in ev.unchanged.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                tide_core::json::push_string(&mut s, name);
            }
            s.push(']');
            Some(s)
        };
        self.backfill.push(ev.backfill.map(|b| b.0));
        self.chunk.push(ev.backfill.map(|b| b.1));
        self.lsn.push(t.lsn.to_string());
        self.xid.push(t.xid as i64);
        self.time.push(t.commit_time);
        self.pos.push(t.position);
        self.rel.push(ev.relation);
        self.op.push(ev.op.as_str().to_string());
        self.key.push(ev.key);
        self.row.push(ev.row);
        self.unchanged.push(unchanged);
        if self.lsn.len() >= FLUSH_ROWS {
            self.flush(c)?;
        }
        Ok(())
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
        if self.lsn.is_empty() {
            return Ok(());
        }
        c.update(
            "INSERT INTO tide.outbox (pipeline, commit_lsn, xid, commit_time, position, relation, op, key, \"row\", unchanged, backfill_id, chunk)
             SELECT $1, u.l::pg_lsn, u.x, '2000-01-01 00:00:00+00'::timestamptz + u.t * interval '1 microsecond',
                    u.p, u.r, u.o, u.k::jsonb, u.w::jsonb,
                    CASE WHEN u.n IS NULL THEN NULL ELSE ARRAY(SELECT jsonb_array_elements_text(u.n::jsonb)) END,
                    u.b, u.c
               FROM unnest($2::text[], $3::int8[], $4::int8[], $5::int4[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[],
                           $11::int8[], $12::int8[])
                    AS u(l, x, t, p, r, o, k, w, n, b, c)",
            None,
            &[
                self.pipeline.clone().into(),
                std::mem::take(&mut self.lsn).into(),
                std::mem::take(&mut self.xid).into(),
                std::mem::take(&mut self.time).into(),
                std::mem::take(&mut self.pos).into(),
                std::mem::take(&mut self.rel).into(),
                std::mem::take(&mut self.op).into(),
                std::mem::take(&mut self.key).into(),
                std::mem::take(&mut self.row).into(),
                std::mem::take(&mut self.unchanged).into(),
                std::mem::take(&mut self.backfill).into(),
                std::mem::take(&mut self.chunk).into(),
            ],
        )?;
        Ok(())
    }
}
