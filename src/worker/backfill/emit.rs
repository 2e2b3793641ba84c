//! Writing chunks: at a high watermark in the stream, the chunks the schedule hands out
//! (`tide_core::backfill_schedule`: key order, held chunks after the earlier one) are written
//! through the target with their backfill's progress, and their backfill's next chunks asked of
//! the readers.

use super::meta::ChunkMeta;
use super::*;

impl Backfiller {
    /// A write to `tide.signal` by this pipeline, in stream order. At a high watermark, the
    /// surviving rows are written through `sink` at the current position, with the progress;
    /// a chunk whose backfill has an earlier chunk still waiting is held (its window stays open)
    /// and written right after that one, at that one's high watermark: its rows are those of
    /// its snapshot for every key the stream did not change from its low watermark to there.
    pub(crate) fn on_signal(
        &mut self,
        c: &mut SpiClient<'_>,
        sink: &mut dyn Target,
        t: &mut Txn,
        watermark: u64,
        kind: WatermarkKind,
    ) -> TideResult<Option<Emitted>> {
        if kind == WatermarkKind::Low {
            if self.sched.on_low_watermark(watermark) {
                if let Some(p) = self.sched.chunk_mut(watermark) {
                    p.low_lsn = Some(t.lsn);
                }
            }
            return Ok(None);
        }
        let Some(id) = self.sched.chunk(watermark).map(|p| p.backfill_id) else {
            return Ok(None);
        };
        if self.sched.on_high_watermark(watermark) != Action::Emit {
            // Held: an earlier chunk of its backfill still waits.
            return Ok(None);
        }
        let mut rows = None;
        // The chunk, then the held chunks of its backfill after it, in key order.
        while let Some(ready) = self.sched.next_ready(id) {
            let Some(n) = self.emit(c, sink, t, ready)? else {
                // Not written: nor are the chunks of its backfill after it.
                self.forget_backfill(id);
                break;
            };
            rows = Some(rows.unwrap_or(0) + n);
        }
        Ok(rows.map(|rows| Emitted { rows }))
    }

    /// Write chunk `p` (its high watermark is reached, and every earlier chunk of its backfill
    /// was written): the rows written, or `None` when it was not written (read again). Once its
    /// progress is recorded and before its rows are written, its backfill's next chunks are
    /// asked of the readers ([`Self::read_ahead`]), so that they are read while it is written.
    fn emit(
        &mut self,
        c: &mut SpiClient<'_>,
        sink: &mut dyn Target,
        t: &mut Txn,
        ready: Ready<String, Row, PendingChunk>,
    ) -> TideResult<Option<u64>> {
        let p = &ready.chunk;
        let Some(result) = ready.result else {
            // LW never seen (cannot happen for a chunk read after its LW committed): read again.
            return Ok(None);
        };
        let rows = if p.truncated { Vec::new() } else { result.rows };
        let dropped = if p.truncated {
            result.read
        } else {
            result.dropped
        };
        if rows.iter().any(|(_, r)| r.batched()) && !still_in_form(&self.pipeline, sink, p)? {
            return Ok(None);
        }
        // Progress first: if the backfill was cancelled meanwhile, nothing is emitted.
        let mut done = chunks::ChunkDone {
            backfill_id: p.backfill_id,
            chunk_no: p.chunk_no,
            key_from: p.key_from.clone(),
            key_to: p.key_to.clone(),
            low_lsn: p.low_lsn,
            high_lsn: t.lsn,
            rows_read: p.rows_read,
            rows_dropped: dropped,
            rows_emitted: rows.len(),
            is_last: p.is_last,
            read_at: p.read_at,
            table_rows: p.estimate.table_rows,
            key_fraction: p.estimate.key_fraction,
            written_as: None,
        };
        let Some((state, throttle)) = chunks::record_progress(c, &done)? else {
            return Ok(None);
        };
        if state == BackfillState::Running && !p.is_last && throttle.is_none() {
            self.read_ahead(p);
        }
        if p.chunk_no % 100 == 0 {
            chunks::trim_chunks(c, p.backfill_id, p.chunk_no)?;
        }
        let n = rows.len() as u64;
        self.written.push(Written {
            backfill_id: p.backfill_id,
            chunk_no: p.chunk_no,
            relation: p.relation.clone(),
            high_lsn: t.lsn,
        });
        write_rows(c, sink, t, p, rows, &mut done)?;
        chunks::record_chunk(c, &done)?;
        self.chunk_failures = 0;
        Ok(Some(n))
    }

    /// Read ahead (see `read_ahead`): after chunk `p` was written, its backfill's next chunks
    /// are asked of the idle readers, unless some are asked already, to be read while the
    /// iteration goes on: one chunk after the last in memory, or, with several idle readers and
    /// a plan ([`ranges::plan`]) from there, one chunk per planned range and one after the
    /// last bound. Called inside the iteration's transaction (after the progress was written):
    /// the iteration decodes nothing the readers write, and the next step receives their chunks
    /// before the next iteration. Not for a throttled backfill (the worker spaces its chunks
    /// itself).
    fn read_ahead(&mut self, p: &PendingChunk) {
        let id = p.backfill_id;
        if self.readers.iter().any(|r| r.asks_for(id)) {
            return;
        }
        // The next unread chunk: after the backfill's last one in memory, else after `p`.
        let last = self.sched.last_of(id).unwrap_or(p);
        if last.is_last {
            return;
        }
        let (from, last_no) = (last.key_to.clone(), last.chunk_no);
        let idle: Vec<usize> = (0..self.readers.len())
            .filter(|&i| !self.readers[i].in_flight())
            .collect();
        if idle.is_empty() {
            return;
        }
        let cap = self.chunk_cap();
        let mut bounds = self.plans.take(id, &from, cap);
        if !step::plannable(&p.job) {
            bounds.clear();
        }
        // SAFETY: reads this transaction's xid (it has one: it just wrote the progress).
        let writer = unsafe { pg_sys::GetTopTransactionIdIfAny() }.into_inner();
        let mut next = p.job.clone();
        next.chunk_cap = cap;
        next.last_key = from;
        next.chunk_no = last_no + 1;
        // The planned ranges, then the chunk after the last bound used (or the only one); no
        // more than tops the backfill's chunks in memory up to two per reader (its memory bound:
        // nothing of it is in flight now; one iteration usually writes all of them, but one cut
        // short by its batch size under a backlog would otherwise ask again at each).
        let in_memory = self.sched.count_of(id);
        let m = schedule::read_ahead_count(idle.len(), bounds.len(), self.readers.len(), in_memory);
        if m == 0 {
            return;
        }
        let mut gone = Vec::new();
        for (k, &i) in idle.iter().enumerate().take(m) {
            next.to_key = if k + 1 < m {
                bounds.get(k).cloned()
            } else {
                None
            };
            if let Err(e) = self.readers[i].request(&next, p.form, writer) {
                // Gone: the next step reads the chunk itself (or asks another reader).
                pgrx::log!("pg_tide worker: {e}; it reads the chunks itself");
                gone.push(i);
                break;
            }
            if next.to_key.is_none() {
                break;
            }
            next.last_key = next.to_key.take();
            next.chunk_no += 1;
        }
        for i in gone.into_iter().rev() {
            self.readers.remove(i);
        }
    }
}

/// Whether a chunk held in a batch form can still be written so: row values are read with the
/// row type the chunk was read with, so only while the table still has the same columns (no DDL
/// since the read), and the target still takes them (its table has those columns with the same
/// types); COPY text likewise (the target's staging table and upsert are made from the chunk's
/// columns). Otherwise the chunk is read again.
fn still_in_form(pipeline: &str, sink: &mut dyn Target, p: &PendingChunk) -> TideResult<bool> {
    let attnums = match &p.values {
        Some((_, attnums)) => attnums,
        None => &p.attnums,
    };
    let same_source = ChunkMeta::gather(pipeline, p.relid, &[])?
        .is_some_and(|m| m.table.shape() == p.columns && &m.table.attnums == attnums);
    if same_source && sink.row_form(p.relid, Some(&p.columns))? == p.form {
        return Ok(true);
    }
    pgrx::log!(
        "pg_tide: {} or its target changed shape while chunk {} of backfill {} waited for its high watermark; reading the chunk again",
        p.relation,
        p.chunk_no,
        p.backfill_id
    );
    Ok(false)
}

/// Write a chunk's surviving `rows` at the current position of `t`: the per-row forms as `read`
/// events (a repair's [`Row::Key`] as a delete), the batch forms as one batch each. Records how
/// they were written in `done`.
fn write_rows(
    c: &mut SpiClient<'_>,
    sink: &mut dyn Target,
    t: &mut Txn,
    p: &PendingChunk,
    rows: Vec<(String, Row)>,
    done: &mut chunks::ChunkDone,
) -> TideResult<()> {
    let mut as_values = Vec::new();
    let (mut copy_text, mut copy_rows) = (String::new(), 0usize);
    for (key, row) in rows {
        let op = match row {
            Row::Value(i) => {
                as_values.push(i);
                continue;
            }
            Row::Copy(line) => {
                copy_text.push_str(&line);
                copy_rows += 1;
                continue;
            }
            // A repair's delete of a key gone at the source.
            Row::Key(_) => Op::Delete,
            Row::None | Row::Json(_) | Row::Jsonb(_) | Row::Text(_) => Op::Read,
        };
        t.position += 1;
        done.written_as = Some(ChunkWrite::Events);
        sink.push(
            c,
            t,
            Event {
                relid: p.relid,
                relation: p.relation.clone(),
                op,
                key: Some(key),
                columns: if op == Op::Read {
                    p.columns.iter().map(|(name, _)| name.clone()).collect()
                } else {
                    Vec::new()
                },
                row,
                unchanged: Vec::new(),
                old: Row::None,
                backfill: Some((p.backfill_id, p.chunk_no)),
                only_where: None,
            },
        )?;
    }
    if let (Some((values, _)), false) = (&p.values, as_values.is_empty()) {
        t.position += i32::try_from(as_values.len()).unwrap_or(i32::MAX);
        done.written_as = Some(sink.write_chunk(
            c,
            t,
            Batch::Values(RowBatch {
                relid: p.relid,
                relation: &p.relation,
                columns: &p.columns,
                rows: values.rows_at(&as_values)?,
                row_type: values.row_type(),
            }),
        )?);
    }
    if copy_rows > 0 {
        let upper = done.key_to.as_deref().ok_or_else(|| {
            TideError::internal(format!(
                "chunk {} of backfill {} has rows but no last key",
                p.chunk_no, p.backfill_id
            ))
        })?;
        t.position += i32::try_from(copy_rows).unwrap_or(i32::MAX);
        done.written_as = Some(sink.write_chunk(
            c,
            t,
            Batch::Copy(CopyBatch {
                relid: p.relid,
                relation: &p.relation,
                columns: &p.columns,
                data: copy_text,
                count: copy_rows,
                lower: done.key_from.as_deref(),
                upper,
            }),
        )?);
    }
    Ok(())
}
