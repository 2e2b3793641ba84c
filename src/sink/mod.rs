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
//! [`options`] types each kind's options. Targets depend on `tide_core::model` (the stream
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

use crate::catalog::pipelines::PipelineRow;
use crate::error::TideResult;
use pgrx::spi::SpiClient;
use tide_core::lsn::Lsn;
use tide_core::model::{Op, RelDesc, TargetKind, Txn};

/// A row's key columns by name, with their text output (NULL as `None`).
pub type KeyValues = Vec<(String, Option<String>)>;

/// One change, rendered, on its way to a target.
pub struct Event {
    pub relid: u32,
    /// Source relation, schema-qualified and quoted where needed.
    pub relation: String,
    /// What the event does to its row.
    pub op: Op,
    /// JSON object of the key columns.
    pub key: Option<String>,
    /// JSON object of the row's sent columns (targets that take rows as JSON,
    /// [`RowFormat::Json`]).
    pub row: Option<String>,
    /// The row as a `jsonb` datum's bytes (its varlena, header included), instead of `row`:
    /// a backfilled row parsed from `row`'s JSON by `jsonb_in` where the chunk was read, for a
    /// target that [`Target::takes_jsonb`].
    pub row_jsonb: Option<Vec<u8>>,
    /// The text output of each column in `columns`, NULL as `None` (targets that take rows as
    /// text, [`RowFormat::Text`], instead of `row`).
    pub values: Option<Vec<Option<String>>>,
    /// The key columns by name with their text output, NULL as `None` (targets that take rows
    /// as text: what a delete deletes).
    pub key_values: Option<KeyValues>,
    /// Columns not sent (unchanged TOAST): leave them as they are.
    pub unchanged: Vec<String>,
    /// Names of the columns present in `row`, in order.
    pub columns: Vec<String>,
    /// (backfill id, chunk) of a `read` event.
    pub backfill: Option<(i64, i64)>,
    /// A truncate that emptied one partition of a partitioned table only: the partition's
    /// constraint (an SQL boolean expression on the table's columns), true for exactly the rows
    /// removed. `row` then says the same as JSON for the outbox.
    pub only_where: Option<String>,
}

/// How a target wants an event's row: as a JSON object (`Event::row`; the outbox), or as each
/// column's text output (`Event::values` and `Event::key_values`; table targets, which cast
/// each text to the target column's type, so every value arrives exactly).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowFormat {
    Json,
    Text,
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

/// The surviving rows of a backfill chunk as row values of the source table's row type (see
/// [`Target::takes_row_values`]), in the chunk's key order.
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

/// The surviving rows of a backfill chunk as lines of `COPY ... FROM STDIN`'s text format (see
/// [`Target::takes_copy_text`]), for a target in another PostgreSQL.
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

/// A pipeline's target, kept by the worker across iterations (table targets cache the target
/// tables' shapes). The worker calls, per iteration: [`Target::begin`], then
/// [`Target::applied`], then for each decoded message [`Target::relation`] or
/// [`Target::push`] (whole source transactions only), [`Target::commit_early`] where a chunk's
/// rows follow stream events, and [`Target::commit`] last, inside the worker's transaction;
/// [`Target::reset`] after a failed iteration.
pub trait Target {
    /// How this target wants events' rows (decided once: the worker renders each event's row
    /// only in this form).
    fn row_format(&self) -> RowFormat {
        RowFormat::Json
    }

    /// Whether backfilled rows may come as `jsonb` ([`Event::row_jsonb`]) instead of JSON text
    /// (the outbox: the chunk's reader parses them, so the worker does not).
    fn takes_jsonb(&self) -> bool {
        false
    }

    /// Start of an iteration: learn which tables go where, prepare the target.
    fn begin(&mut self, _c: &mut SpiClient<'_>, _pipeline: &str) -> TideResult<()> {
        Ok(())
    }

    /// Where the target says it has applied up to, when it keeps that itself (remote targets);
    /// replays at or below it are skipped.
    fn applied(&mut self) -> TideResult<Option<Lsn>> {
        Ok(None)
    }

    /// A relation's (new) description arrived in the stream: table targets check the target
    /// table's shape and apply or refuse the schema change before the first event that needs
    /// it.
    fn relation(&mut self, _c: &mut SpiClient<'_>, _relid: u32, _rel: &RelDesc) -> TideResult<()> {
        Ok(())
    }

    /// One event of the source transaction `t`, in stream order.
    fn push(&mut self, c: &mut SpiClient<'_>, t: &Txn, ev: Event) -> TideResult<()>;

    /// A schema change of a captured table, at its position in the stream (between the events
    /// of `t` before and after the `ALTER TABLE`): the outbox writes it as an event; table
    /// targets apply it or pause (see `table`).
    fn schema(&mut self, c: &mut SpiClient<'_>, t: &Txn, ev: SchemaEvent) -> TideResult<()>;

    /// Write everything buffered and make it durable together with the applied position
    /// `applied` (end LSN of the last source transaction applied), before the worker's
    /// transaction commits.
    fn commit(
        &mut self,
        c: &mut SpiClient<'_>,
        pipeline: &str,
        applied: Option<Lsn>,
    ) -> TideResult<()>;

    /// Where the target commits on its own (remote targets): commit what is buffered, which
    /// ends with the source transaction ending at `applied`, in a target transaction of its
    /// own, before more follows in this iteration. The applied position goes with it, so a
    /// later failure replays only what follows. A no-op for targets written in the worker's
    /// transaction.
    fn commit_early(
        &mut self,
        _c: &mut SpiClient<'_>,
        _pipeline: &str,
        _applied: Lsn,
    ) -> TideResult<()> {
        Ok(())
    }

    /// Whether a backfill chunk of source table `relid` with `columns` (name, `format_type`)
    /// can be handed over as row values ([`Target::push_row_values`]) instead of one event per
    /// row: only a target in this database whose table has each column with the same type.
    /// Asked when the chunk is read (in the chunk's transaction: reads only) and again at its
    /// high watermark; `false` (the default) means events.
    fn takes_row_values(&mut self, _relid: u32, _columns: &[(String, String)]) -> TideResult<bool> {
        Ok(false)
    }

    /// A backfill chunk's surviving rows as row values, in stream order (at the chunk's high
    /// watermark), for a target that said it takes them. Same effect as pushing each row as a
    /// `read` event. Says how they were written.
    fn push_row_values(
        &mut self,
        _c: &mut SpiClient<'_>,
        _t: &Txn,
        batch: RowBatch<'_>,
    ) -> TideResult<tide_core::model::ChunkWrite> {
        Err(crate::error::TideError::internal(format!(
            "this target cannot take the rows of a chunk of {} as row values",
            batch.relation
        )))
    }

    /// Whether a backfill chunk of source table `relid` with `columns` (name, `format_type`)
    /// can be handed over as COPY text ([`Target::push_copy_text`]) instead of one event per
    /// row: only a target in another PostgreSQL whose table has each column with the same
    /// type. Asked when the chunk is read and again at its high watermark, like
    /// [`Target::takes_row_values`]; `false` (the default) means events.
    fn takes_copy_text(&mut self, _relid: u32, _columns: &[(String, String)]) -> TideResult<bool> {
        Ok(false)
    }

    /// A backfill chunk's surviving rows as COPY text, in stream order (at the chunk's high
    /// watermark), for a target that said it takes them. Same effect as pushing each row as a
    /// `read` event.
    fn push_copy_text(
        &mut self,
        _c: &mut SpiClient<'_>,
        _t: &Txn,
        batch: CopyBatch<'_>,
    ) -> TideResult<()> {
        Err(crate::error::TideError::internal(format!(
            "this target cannot take the rows of a chunk of {} as COPY text",
            batch.relation
        )))
    }

    /// Forget cached state after a failed iteration.
    fn reset(&mut self) {}

    /// How a remote target connects (`None` for every other target).
    fn remote_access(&self) -> Option<crate::sink::remote::RemoteAccess> {
        None
    }
}

/// The target of a pipeline.
pub fn for_pipeline(p: &PipelineRow) -> TideResult<Box<dyn Target>> {
    match p.target {
        TargetKind::Outbox => Ok(Box::new(outbox::OutboxSink::new(&p.name))),
        TargetKind::Table | TargetKind::Postgres => table::for_pipeline(p),
        TargetKind::Kafka => kafka::for_pipeline(p),
    }
}
