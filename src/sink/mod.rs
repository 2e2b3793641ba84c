//! Targets: where a pipeline's events go.
//!
//! - [`outbox`]: rows in `tide.outbox` (events for consumers);
//! - [`table`]: ordered upserts and deletes into a table, local (same database, applied through
//!   SPI in the worker's transaction) or remote (another PostgreSQL, applied by the [`remote`]
//!   sink thread in one remote transaction per batch);
//! - [`kafka`]: messages in Kafka topics (Debezium's envelope), produced by the [`kafka`] sink
//!   thread and acknowledged by the broker before the slot moves.
//!
//! Each is a [`Target`]; the worker holds a `Box<dyn Target>` and knows no target's type.
//! [`options`] types each kind's options; [`wait`] is how the worker waits for a sink thread. Targets depend on `tide_core::model` (the stream
//! model) and never on the worker.
//!
//! Every target stores the applied position in the same transaction as the data, so a replay
//! after a crash is skipped (exactly once in effect), and receives whole source transactions
//! only: a target transaction never holds part of one.

pub mod kafka;
pub mod options;
pub mod outbox;
pub mod remote;
pub mod table;
pub mod wait;

use crate::catalog::pipelines::PipelineRow;
use crate::error::TideResult;
use pgrx::spi::SpiClient;
use tide_core::lsn::Lsn;
use tide_core::model::{Op, RelDesc, TargetKind, Txn};

pub use tide_core::row::{KeyValues, Row, RowForm};

/// One change, rendered, on its way to a target.
pub struct Event {
    pub relid: u32,
    /// Source relation, schema-qualified and quoted where needed.
    pub relation: String,
    /// What the event does to its row.
    pub op: Op,
    /// JSON object of the key columns (every target: the outbox writes it, table targets group
    /// statements by it).
    pub key: Option<String>,
    /// The row, in the form the target asked for ([`Target::row_form`]): a per-row form
    /// (`Json`, `Jsonb`, `Text`), `Key` for a delete to a target that takes text, `None` for a
    /// truncate or a JSON delete. Never `Value` or `Copy` (those reach a target as a [`Batch`]).
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
pub struct SchemaEvent {
    pub relid: u32,
    /// Source relation, as in [`Event::relation`].
    pub relation: String,
    /// The marker's payload (JSON), as `tide._schema_change` wrote it.
    pub payload: String,
    /// The payload, parsed.
    pub change: tide_core::model::SchemaChange,
    /// The same transaction rewrote the table (its rows are read again after it).
    pub rewrite: bool,
    /// The table was dropped: its changes end here (`change` is empty; `payload` says
    /// `"table_dropped": true`). A table target keeps its copy as it is.
    pub dropped: bool,
}

/// The surviving rows of a backfill chunk as row values of the source table's row type
/// ([`RowForm::RowValues`]), in the chunk's key order.
pub struct RowBatch<'a> {
    pub relid: u32,
    /// Source relation, as in [`Event::relation`].
    pub relation: &'a str,
    /// The source columns of each row to write, by name, with their `format_type`.
    pub columns: &'a [(String, String)],
    /// The rows, each a composite datum of `row_type` (alive while the batch is).
    pub rows: Vec<pgrx::pg_sys::Datum>,
    /// The source table's row type.
    pub row_type: pgrx::pg_sys::Oid,
}

impl RowBatch<'_> {
    /// The rows as one array of the row type (in the current memory context), with the array's
    /// type: the parameter of an upsert of them (`tide_core::plan::upsert_rows`).
    pub fn array(&self) -> TideResult<(pgrx::pg_sys::Datum, pgrx::pg_sys::Oid)> {
        use pgrx::pg_sys;
        let n = i32::try_from(self.rows.len())
            .map_err(|_| crate::error::TideError::internal("a chunk of more than 2^31 rows"))?;
        // SAFETY: catalog lookups by OID (they ereport for an unknown type); every element is a
        // composite datum of `row_type`, alive while `self` is; construct_array copies them into
        // a new array in the current memory context.
        unsafe {
            let array_type = pg_sys::get_array_type(self.row_type);
            if array_type == pg_sys::InvalidOid {
                return Err(crate::error::TideError::internal(format!(
                    "the row type {} has no array type",
                    self.row_type.to_u32()
                )));
            }
            let (mut len, mut byval, mut align) = (0i16, false, 0 as std::ffi::c_char);
            pg_sys::get_typlenbyvalalign(self.row_type, &mut len, &mut byval, &mut align);
            let mut elems = self.rows.clone();
            let array = pg_sys::construct_array(
                elems.as_mut_ptr(),
                n,
                self.row_type,
                i32::from(len),
                byval,
                align,
            );
            Ok((pg_sys::Datum::from(array), array_type))
        }
    }
}

/// The surviving rows of a backfill chunk as lines of `COPY ... FROM STDIN`'s text format
/// ([`RowForm::CopyText`]), for a target in another PostgreSQL.
pub struct CopyBatch<'a> {
    pub relid: u32,
    /// Source relation, as in [`Event::relation`].
    pub relation: &'a str,
    /// The source columns of each row, by name, with their `format_type`, in the rows' order.
    pub columns: &'a [(String, String)],
    /// The rows (`tide_core::copy`: each column's text output, escaped; one line per row).
    pub data: String,
    /// How many rows it holds (none: nothing to write).
    pub count: usize,
    /// The chunk's key range: the key values (text output, in key order) of its lower bound
    /// (exclusive; `None` for a table's first chunk) and upper bound (inclusive). Every row's
    /// key lies in it.
    pub lower: Option<&'a [String]>,
    pub upper: &'a [String],
}

/// A backfill chunk's surviving rows in a batch form, for [`Target::write_chunk`].
pub enum Batch<'a> {
    /// [`RowForm::RowValues`].
    Values(RowBatch<'a>),
    /// [`RowForm::CopyText`].
    Copy(CopyBatch<'a>),
}

impl Batch<'_> {
    /// The form the batch is in.
    pub fn form(&self) -> RowForm {
        match self {
            Batch::Values(_) => RowForm::RowValues,
            Batch::Copy(_) => RowForm::CopyText,
        }
    }
}

/// Where a target's commit falls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitPoint {
    /// The end of an iteration, inside the worker's transaction, which commits next.
    End,
    /// Between a source transaction and more that follows in the same iteration (before a
    /// chunk's rows that follow stream events): a target that commits on its own (remote)
    /// commits what is buffered there, in a transaction of its own, with the applied position,
    /// so a later failure replays only what follows; every other target does nothing.
    Early,
}

/// A pipeline's target, kept by the worker across iterations (table targets cache the target
/// tables' shapes). The worker calls, per iteration: [`Target::begin`], then for each decoded
/// message [`Target::relation`], [`Target::push`] or [`Target::schema`] (whole source
/// transactions only), [`Target::write_chunk`] for a chunk's rows in a batch form,
/// [`Target::commit`] at an early point where a chunk's rows follow stream events and at the
/// end, inside the worker's transaction; [`Target::reset`] after a failed iteration.
/// [`Target::row_form`] whenever it renders rows.
pub trait Target {
    /// How this target wants rows of table `relid`: of stream events (`chunk` is `None`: a
    /// per-row form), or of a backfill chunk with `chunk`'s columns (name, `format_type`; any
    /// form: a batch form only where the target table has each column with the same type).
    /// Asked when a chunk is read (in the chunk's transaction: reads only) and again at its high
    /// watermark, where a changed answer means the chunk is read again.
    fn row_form(&mut self, relid: u32, chunk: Option<&[(String, String)]>) -> TideResult<RowForm>;

    /// Start of an iteration: learn which tables go where, prepare the target (a remote one
    /// reconnects when its connection settings changed). Returns where the target says it has
    /// applied up to, when it keeps that itself (remote targets); replays at or below it are
    /// skipped.
    fn begin(&mut self, c: &mut SpiClient<'_>, p: &PipelineRow) -> TideResult<Option<Lsn>>;

    /// A relation's (new) description arrived in the stream: table targets check the target
    /// table's shape and apply or refuse the schema change before the first event that needs
    /// it.
    fn relation(&mut self, _c: &mut SpiClient<'_>, _relid: u32, _rel: &RelDesc) -> TideResult<()> {
        Ok(())
    }

    /// One event of the source transaction `t`, in stream order.
    fn push(&mut self, c: &mut SpiClient<'_>, t: &Txn, ev: Event) -> TideResult<()>;

    /// The truncate events of one source `TRUNCATE` statement (one per captured table it
    /// emptied, in the statement's order; `restart_identity`: it said `RESTART IDENTITY`). The
    /// outbox and Kafka take them as events, one after the other (the default); table targets
    /// empty their target tables in one `TRUNCATE`, so a foreign key between two of them at
    /// the target does not refuse it (see `table`). Each event takes the next position of `t`.
    fn truncate(
        &mut self,
        c: &mut SpiClient<'_>,
        t: &mut Txn,
        events: Vec<Event>,
        _restart_identity: bool,
    ) -> TideResult<()> {
        for ev in events {
            t.position += 1;
            self.push(c, t, ev)?;
        }
        Ok(())
    }

    /// A schema change of a captured table, at its position in the stream (between the events
    /// of `t` before and after the `ALTER TABLE`): the outbox writes it as an event; table
    /// targets apply it or pause (see `table`).
    fn schema(&mut self, c: &mut SpiClient<'_>, t: &Txn, ev: SchemaEvent) -> TideResult<()>;

    /// A backfill chunk's surviving rows in a batch form, in stream order (at the chunk's high
    /// watermark), for a target whose [`Target::row_form`] asked for that form. Same effect as
    /// pushing each row as a `read` event. Says how they were written.
    fn write_chunk(
        &mut self,
        _c: &mut SpiClient<'_>,
        _t: &Txn,
        batch: Batch<'_>,
    ) -> TideResult<tide_core::model::ChunkWrite> {
        Err(crate::error::TideError::internal(format!(
            "this target cannot take a chunk's rows as {:?}",
            batch.form()
        )))
    }

    /// Write everything buffered and make it durable together with the applied position
    /// `applied` (end LSN of the last source transaction applied): at [`CommitPoint::End`],
    /// before the worker's transaction commits; at [`CommitPoint::Early`] only a target that
    /// commits on its own does anything.
    fn commit(
        &mut self,
        c: &mut SpiClient<'_>,
        pipeline: &str,
        applied: Option<Lsn>,
        at: CommitPoint,
    ) -> TideResult<()>;

    /// A resync's `resync` events (see `catalog::slots`), one per table, as one pseudo source
    /// transaction `t` (xid 0): the start events before any event of the new slot, the end
    /// events once every table was read again. Only the kafka target writes them here (the
    /// outbox's are written by `catalog::slots` in SQL; table targets have no such events).
    fn resync(
        &mut self,
        _c: &mut SpiClient<'_>,
        _t: &mut Txn,
        _marks: &[ResyncMark],
    ) -> TideResult<()> {
        Ok(())
    }

    /// A resync's sweep at a target in another PostgreSQL: the key values (text, in
    /// `key_columns` order) of every row the target table of `relid` holds whose key lies after
    /// `lower` (exclusive; `None`: from the first) up to `upper` (inclusive; `None`: to the
    /// last), compared at the target. `None`: this target is not swept so (a local table target
    /// is swept in the chunk's own snapshot, see `worker::chunk`; an outbox or kafka target has
    /// no rows to sweep).
    fn sweep_keys(
        &mut self,
        _relid: u32,
        _key_columns: &[String],
        _lower: Option<&[String]>,
        _upper: Option<&[String]>,
    ) -> TideResult<Option<Vec<Vec<Option<String>>>>> {
        Ok(None)
    }

    /// A target of its own for one streamed transaction written while it runs
    /// (`worker::stream_apply`): the same tables, on a connection of its own, into a
    /// transaction left open between blocks ([`Target::flush_open`]) and committed by
    /// [`Target::commit`] with the applied position. It refuses (an error) any change that would
    /// need DDL at the target. `None` (the default): this target applies streamed transactions
    /// at their commit only.
    fn open_stream(&mut self) -> TideResult<Option<Box<dyn Target>>> {
        Ok(None)
    }

    /// Send what is buffered into the target's open transaction, without committing it (a
    /// streamed transaction's target, at the end of each block).
    fn flush_open(&mut self, _c: &mut SpiClient<'_>) -> TideResult<()> {
        Ok(())
    }

    /// Forget cached state after a failed iteration.
    fn reset(&mut self) {}

    /// While the pipeline is paused: keep this server's hold on the target (a remote table
    /// target renews its lease, see `table::fence`). Nothing for the other targets.
    fn keep_lease(&mut self, _p: &PipelineRow) -> TideResult<()> {
        Ok(())
    }

    /// How often the worker must reach the target to keep its lease, whatever it is doing
    /// (remote table target: a third of `tide.target_lease`); `None`: no lease.
    fn renew_every(&self) -> Option<std::time::Duration> {
        None
    }
}

/// One table's `resync` event (see [`Target::resync`]).
#[derive(Clone, Debug)]
pub struct ResyncMark {
    pub relid: u32,
    /// The source table, qualified and quoted, as events name it.
    pub relation: String,
    /// The event's content, a JSON object: `{"phase": "start", "reason", "slot_lost_at"}` or
    /// `{"phase": "end", "complete"}`, as the outbox's `row`.
    pub payload: String,
}

/// The target of a pipeline.
pub fn for_pipeline(p: &PipelineRow) -> TideResult<Box<dyn Target>> {
    match p.target {
        TargetKind::Outbox => Ok(Box::new(outbox::OutboxSink::new(&p.name))),
        TargetKind::Table | TargetKind::Postgres => table::for_pipeline(p),
        TargetKind::Kafka => kafka::for_pipeline(p),
    }
}
