//! What the worker hands a target: one vocabulary for every change of a pipeline's stream.
//!
//! Owns: [`Change`] (a relation's description, a row event, one `TRUNCATE`'s events, a schema
//! event, a backfill chunk's rows in a batch form, a resync's marks) and [`At`], the place of a
//! change in its source transaction. A target takes each change through one entry point
//! (`Target::apply` in the pgrx crate) and matches on it; adding a kind of change is a variant
//! here and an arm in each target.
//!
//! Guarantees: nothing here is PostgreSQL's (the batch forms, which hold datums, are the
//! parameter `B`); what a target sees of its source transaction is [`At`] only: the worker's
//! bookkeeping (replays it skips, decoder barriers, its running count of events) stays in
//! [`crate::model::Txn`], which targets never receive.

use crate::lsn::Lsn;
use crate::model::{Op, RelDesc, SchemaChange, Txn};
use crate::row::Row;

/// Where a change falls: its source transaction and the position of its (first) event in it.
/// Events of one change that holds several (a `TRUNCATE` of several tables, a resync's marks,
/// a chunk's rows) take the positions that follow, one each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    pub xid: u32,
    /// The commit LSN: with `position`, the identity of each event.
    pub lsn: Lsn,
    pub commit_time: i64,
    pub position: i32,
}

impl At {
    /// The place of the event `t` counted last (`t.position`).
    pub fn of(t: &Txn) -> At {
        At {
            xid: t.xid,
            lsn: t.lsn,
            commit_time: t.commit_time,
            position: t.position,
        }
    }

    /// The place of the next `n` events of `t` (that of the first): `t` counts them, its
    /// position moves past them.
    pub fn count(t: &mut Txn, n: usize) -> At {
        let at = At::of(t).after(1);
        t.position = at.after(n).position.saturating_sub(1);
        at
    }

    /// The place `n` events after this one.
    pub fn after(self, n: usize) -> At {
        At {
            position: self
                .position
                .saturating_add(i32::try_from(n).unwrap_or(i32::MAX)),
            ..self
        }
    }
}

/// One change, rendered, on its way to a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub relid: u32,
    /// Source relation, schema-qualified and quoted where needed.
    pub relation: String,
    /// What the event does to its row.
    pub op: Op,
    /// JSON object of the key columns (every target: the outbox writes it, table targets group
    /// statements by it).
    pub key: Option<String>,
    /// The row, in the form the target asked for (`Target::row_form`): a per-row form
    /// (`Json`, `Jsonb`, `Text`), `Key` for a delete to a target that takes text, `None` for a
    /// truncate or a JSON delete. Never `Value` or `Copy` (those reach a target as a
    /// [`Change::Chunk`]).
    pub row: Row,
    /// Columns not sent (unchanged TOAST): leave them as they are.
    pub unchanged: Vec<String>,
    /// Names of the columns present in `row`, in order.
    pub columns: Vec<String>,
    /// The old row of an update or a delete of a table captured without a key (`REPLICA
    /// IDENTITY FULL`), every column: for a target that takes text `Row::Key` (each column's
    /// name and text, in column order; a table target matches the row to change by it), for one
    /// that takes JSON `Row::Json` (the same JSON as `key`, where the outbox takes it; the kafka
    /// target writes it as `before` and sends the message without a key). `Row::None` for
    /// every other event (see `worker::apply`).
    pub old: Row,
    /// (backfill id, chunk) of a `read` event.
    pub backfill: Option<(i64, i64)>,
    /// A truncate that emptied one partition of a partitioned table only: the partition's
    /// constraint (an SQL boolean expression on the table's columns), true for exactly the rows
    /// removed. `row` then says the same as JSON for the outbox.
    pub only_where: Option<String>,
}

impl Event {
    /// An event of `op` on `relation` with no row and no columns (a delete by key, a truncate, a
    /// schema event's row set after).
    pub fn bare(relid: u32, relation: String, op: Op, key: Option<String>) -> Event {
        Event {
            relid,
            relation,
            op,
            key,
            row: Row::None,
            unchanged: Vec::new(),
            columns: Vec::new(),
            old: Row::None,
            backfill: None,
            only_where: None,
        }
    }
}

/// A schema change of a captured table, at the position of the `ALTER TABLE` that made it (a
/// `schema` marker; see `worker::apply`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaEvent {
    pub relid: u32,
    /// Source relation, as in [`Event::relation`].
    pub relation: String,
    /// The marker's payload (JSON), as `tide._schema_change` wrote it.
    pub payload: String,
    /// The payload, parsed.
    pub change: SchemaChange,
    /// The same transaction rewrote the table (its rows are read again after it).
    pub rewrite: bool,
    /// The table was dropped: its changes end here (`change` is empty; `payload` says
    /// `"table_dropped": true`). A table target keeps its copy as it is.
    pub dropped: bool,
}

/// One table's `resync` event (see [`Change::Resync`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResyncMark {
    pub relid: u32,
    /// The source table, qualified and quoted, as events name it.
    pub relation: String,
    /// The event's content, a JSON object: `{"phase": "start", "reason", "slot_lost_at"}` or
    /// `{"phase": "end", "complete"}`, as the outbox's `row`.
    pub payload: String,
}

/// One change for a target, at an [`At`]. `B` is a backfill chunk's rows in a batch form (the
/// pgrx crate's `target::Batch`: row values are datums).
pub enum Change<'a, B> {
    /// A relation's (new) description arrived in the stream (no position of its own): table
    /// targets check the target table's shape and apply or refuse the schema change before the
    /// first event that needs it.
    Relation { relid: u32, rel: &'a RelDesc },
    /// One event, at the place's position.
    Row(Event),
    /// The truncate events of one source `TRUNCATE` statement, one per captured table it
    /// emptied, in the statement's order, at the place's position and those that follow
    /// (`restart_identity`: it said `RESTART IDENTITY`). The outbox and Kafka take them as
    /// events, one after the other; table targets empty their tables in one `TRUNCATE`, so a
    /// foreign key between two of them at the target does not refuse it.
    Truncate {
        events: Vec<Event>,
        restart_identity: bool,
    },
    /// A schema change of a captured table, between the events of its source transaction before
    /// and after the `ALTER TABLE`: the outbox and Kafka write it as an event; table targets
    /// apply it or pause.
    Schema(SchemaEvent),
    /// A backfill chunk's surviving rows in a batch form, at its high watermark, for a target
    /// whose row form asked for that form: the same effect as each row as a `read` event.
    Chunk(B),
    /// A resync's events, one per table, as one pseudo source transaction (xid 0; see
    /// `catalog::slots`), at the place's position and those that follow: the start events
    /// before any event of the new slot, the end events once every table was read again. Only
    /// the kafka target writes them (the outbox's are written in SQL; table targets have no
    /// such events).
    Resync(&'a [ResyncMark]),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_the_transaction_and_a_position() {
        let t = Txn {
            xid: 7,
            lsn: Lsn(0x10),
            commit_time: 3,
            skip: true,
            position: 4,
            barrier: true,
        };
        let at = At::of(&t);
        assert_eq!(
            (at.xid, at.lsn, at.commit_time, at.position),
            (7, Lsn(0x10), 3, 4)
        );
        assert_eq!(at.after(2).position, 6);
        assert_eq!(at.after(usize::MAX).position, i32::MAX);
        let mut t = t;
        // Three events take positions 5, 6 and 7; the next one, 8.
        assert_eq!(At::count(&mut t, 3).position, 5);
        assert_eq!(t.position, 7);
        // A change of no event (a relation's description) counts none.
        assert_eq!(At::count(&mut t, 0).position, 8);
        assert_eq!(t.position, 7);
        assert_eq!(At::count(&mut t, 1).position, 8);
        assert_eq!(t.position, 8);
        assert_eq!((t.skip, t.barrier), (true, true));
    }
}
