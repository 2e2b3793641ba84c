//! `tide.outbox`: the outbox target's rows (one per event). Written by the worker only, in its
//! iteration's transaction, so together with the applied position; read and trimmed by
//! consumers under the table's row security.

use crate::error::TideResult;
use pgrx::spi::SpiClient;

/// Outbox rows, column by column (one element per event): the arrays of one multi-row INSERT.
#[derive(Default)]
pub struct Rows {
    /// Commit LSN of the source transaction, as text.
    pub lsn: Vec<String>,
    pub xid: Vec<i64>,
    /// Commit time (PostgreSQL timestamp: microseconds since 2000-01-01).
    pub time: Vec<i64>,
    /// Position in the source transaction, from 1.
    pub pos: Vec<i32>,
    pub rel: Vec<String>,
    /// `tide_core::model::Op`'s text.
    pub op: Vec<String>,
    /// JSON objects.
    pub key: Vec<Option<String>>,
    pub row: Vec<Option<String>>,
    /// JSON arrays of column names.
    pub unchanged: Vec<Option<String>>,
    pub backfill: Vec<Option<i64>>,
    pub chunk: Vec<Option<i64>>,
}

impl Rows {
    pub fn len(&self) -> usize {
        self.lsn.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lsn.is_empty()
    }
}

/// Insert `rows` for `pipeline` in one statement. Called by the worker (the outbox target), in
/// its iteration's transaction. The rows take their ids in event order (`unnest` yields the
/// arrays in order and the identity is drawn per row as the INSERT receives it), and a
/// pipeline's transactions are serial: so its ids increase in stream order, which consumers'
/// committed positions rely on (`catalog::consumers`).
pub(crate) fn insert(c: &mut SpiClient<'_>, pipeline: &str, rows: Rows) -> TideResult<()> {
    crate::sql::update(
        c,
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
            pipeline.into(),
            rows.lsn.into(),
            rows.xid.into(),
            rows.time.into(),
            rows.pos.into(),
            rows.rel.into(),
            rows.op.into(),
            rows.key.into(),
            rows.row.into(),
            rows.unchanged.into(),
            rows.backfill.into(),
            rows.chunk.into(),
        ],
    )?;
    Ok(())
}
