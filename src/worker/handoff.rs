//! How the worker hands changes to its target ([`Target::apply`]).
//!
//! Owns: counting each change's place in its source transaction. The worker's [`Txn`] carries
//! its bookkeeping (replays it skips, decoder barriers, the events counted so far); a target
//! sees only where a change falls ([`At`]). Guarantees: the events of a source transaction
//! take consecutive positions from 1, in stream order, one per event (a `TRUNCATE` of several
//! tables, a resync's marks and a chunk's rows one per table, mark or row).

use crate::error::{TideError, TideResult};
use crate::target::{Batch, Change, Event, Target};
use pgrx::spi::SpiClient;
use tide_core::change::At;
use tide_core::model::{ChunkWrite, RelDesc, Txn};

impl dyn Target {
    /// `change` as the next event(s) of `t`: they take the positions after `t.position`, which
    /// moves past them. Returns what [`Target::apply`] says of a chunk.
    pub(crate) fn send(
        &mut self,
        c: &mut SpiClient<'_>,
        t: &mut Txn,
        change: Change<'_>,
    ) -> TideResult<Option<ChunkWrite>> {
        let events = match &change {
            Change::Relation { .. } => 0,
            Change::Row(_) | Change::Schema(_) => 1,
            Change::Truncate { events, .. } => events.len(),
            Change::Resync(marks) => marks.len(),
            Change::Chunk(Batch::Values(b)) => b.rows.len(),
            Change::Chunk(Batch::Copy(b)) => b.count,
        };
        let at = At::count(t, events);
        self.apply(c, at, change)
    }

    /// A relation's (new) description, outside any event's place.
    pub(crate) fn describe(
        &mut self,
        c: &mut SpiClient<'_>,
        relid: u32,
        rel: &RelDesc,
    ) -> TideResult<()> {
        let nowhere = At {
            xid: 0,
            lsn: tide_core::lsn::Lsn(0),
            commit_time: 0,
            position: 0,
        };
        self.apply(c, nowhere, Change::Relation { relid, rel })?;
        Ok(())
    }

    /// One event at the position `t` has counted for it already (the backfill's rows: see
    /// `worker::backfill`, which counts its own).
    pub(crate) fn push(&mut self, c: &mut SpiClient<'_>, t: &Txn, ev: Event) -> TideResult<()> {
        self.apply(c, At::of(t), Change::Row(ev))?;
        Ok(())
    }

    /// A chunk's rows in a batch form, at the positions after `t.position` (the caller counts
    /// them: `worker::backfill`). How the target wrote them.
    pub(crate) fn write_chunk(
        &mut self,
        c: &mut SpiClient<'_>,
        t: &Txn,
        batch: Batch<'_>,
    ) -> TideResult<ChunkWrite> {
        self.apply(c, At::of(t).after(1), Change::Chunk(batch))?
            .ok_or_else(|| TideError::internal("the target did not say how it wrote a chunk"))
    }

    /// The keys a target in another PostgreSQL holds in a range
    /// ([`crate::target::RemoteTarget::sweep_keys`]); `None` for every other target (a local
    /// table target is swept in the chunk's own snapshot, see `worker::backfill::chunk`; an outbox or
    /// kafka target has no rows to sweep).
    pub(crate) fn sweep_keys(
        &mut self,
        relid: u32,
        key_columns: &[String],
        lower: Option<&[String]>,
        upper: Option<&[String]>,
    ) -> TideResult<Option<Vec<Vec<Option<String>>>>> {
        match crate::target::as_remote(self) {
            Some(r) => r.sweep_keys(relid, key_columns, lower, upper).map(Some),
            None => Ok(None),
        }
    }
}
