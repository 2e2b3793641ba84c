//! Targets: where a pipeline's events go.
//!
//! - [`outbox`]: rows in `tide.outbox` (events for consumers);
//! - [`table`]: ordered upserts and deletes into a table, local (same database, applied through
//!   SPI in the worker's transaction) or remote (another PostgreSQL, applied by the [`remote`]
//!   sink thread in one remote transaction per batch);
//! - [`kafka`]: messages in Kafka topics (Debezium's envelope), produced by the [`kafka`] sink
//!   thread and acknowledged by the broker before the slot moves.
//!
//! Each is a [`Target`] of five methods, taking every change through one entry point
//! ([`Target::apply`] of a [`Change`], `tide_core::change`'s vocabulary); a target in another
//! PostgreSQL is also a [`RemoteTarget`] (swept, streamed, leased), found with [`as_remote`].
//! The worker holds a `Box<dyn Target>` and knows no target's type; what the SQL API and the
//! worker must know of a kind of target before there is one is its module's [`Kind`]
//! ([`kind`]): no code outside `target` tells kinds apart. [`options`] types each kind's options;
//! [`wait`] is how the worker waits for a sink thread. Targets depend on `tide_core::model` and
//! `tide_core::change` (the stream model) and never on the worker.
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
use tide_core::change::At;
use tide_core::lsn::Lsn;
use tide_core::model::{ChunkWrite, TargetKind};

pub use tide_core::change::{Event, ResyncMark, SchemaEvent};
pub use tide_core::row::{KeyValues, Row, RowForm};

/// One change for a target (`tide_core::change::Change`), a chunk's rows as a [`Batch`].
pub type Change<'a> = tide_core::change::Change<'a, Batch<'a>>;

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

/// A backfill chunk's surviving rows in a batch form ([`Change::Chunk`]).
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

/// A target's refusal of a chunk's rows in a batch form it did not ask for.
pub(crate) fn refused_batch(b: &Batch<'_>) -> crate::error::TideError {
    crate::error::TideError::internal(format!(
        "this target cannot take a chunk's rows as {:?}",
        b.form()
    ))
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
    /// The end of a block of a streamed transaction written while it runs
    /// ([`RemoteTarget::open_stream`]): send what is buffered into the open transaction without
    /// committing it.
    Open,
}

/// A pipeline's target, kept by the worker across iterations (table targets cache the target
/// tables' shapes). The worker calls, per iteration: [`Target::begin`], then [`Target::apply`]
/// for each change in stream order (whole source transactions only), [`Target::commit`] at an
/// early point where a chunk's rows follow stream events and at the end, inside the worker's
/// transaction; [`Target::reset`] after a failed iteration. [`Target::row_form`] whenever it
/// renders rows. A target in another PostgreSQL has more to do ([`RemoteTarget`], found with
/// [`as_remote`]).
pub trait Target: std::any::Any {
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

    /// One change, at its place `at` in its source transaction, in stream order (see
    /// [`tide_core::change::Change`] for what each kind of change asks of a target). Returns how
    /// a [`Change::Chunk`]'s rows were written (a target whose [`Target::row_form`] never asks
    /// for a batch form refuses one); `None` for any other change.
    fn apply(
        &mut self,
        c: &mut SpiClient<'_>,
        at: At,
        change: Change<'_>,
    ) -> TideResult<Option<ChunkWrite>>;

    /// Write everything buffered and make it durable together with the applied position
    /// `applied` (end LSN of the last source transaction applied): at [`CommitPoint::End`],
    /// before the worker's transaction commits; at [`CommitPoint::Early`] only a target that
    /// commits on its own does anything; at [`CommitPoint::Open`] a streamed transaction's
    /// target sends what is buffered into its open transaction and commits nothing.
    fn commit(
        &mut self,
        c: &mut SpiClient<'_>,
        pipeline: &str,
        applied: Option<Lsn>,
        at: CommitPoint,
    ) -> TideResult<()>;

    /// Forget cached state after a failed iteration.
    fn reset(&mut self);
}

/// What only a target in another PostgreSQL (a `postgres` pipeline's table target) does
/// besides a [`Target`]'s work: it is swept over its own connection, writes streamed
/// transactions while they run, and is held by one server at a time with a lease (see
/// `table::fence`).
pub trait RemoteTarget {
    /// A resync's sweep: the key values (text, in `key_columns` order) of every row the target
    /// table of `relid` holds whose key lies after `lower` (exclusive; `None`: from the first)
    /// up to `upper` (inclusive; `None`: to the last), compared at the target. (A local table
    /// target is swept in the chunk's own snapshot, see `worker::backfill::chunk`; an outbox or kafka
    /// target has no rows to sweep.)
    fn sweep_keys(
        &mut self,
        relid: u32,
        key_columns: &[String],
        lower: Option<&[String]>,
        upper: Option<&[String]>,
    ) -> TideResult<Vec<Vec<Option<String>>>>;

    /// A target of its own for one streamed transaction written while it runs
    /// (`worker::stream_apply`): the same tables, on a connection of its own, into a
    /// transaction left open between blocks ([`CommitPoint::Open`]) and committed by
    /// [`Target::commit`] with the applied position. It refuses (an error) any change that would
    /// need DDL at the target. (Every other target applies streamed transactions at their
    /// commit only.)
    fn open_stream(&mut self) -> TideResult<Box<dyn Target>>;

    /// While the pipeline is paused: keep this server's hold on the target (renew its lease).
    fn keep_lease(&mut self, p: &PipelineRow) -> TideResult<()>;

    /// How often the worker must reach the target to keep its lease, whatever it is doing (a
    /// third of `tide.target_lease`).
    fn renew_every(&self) -> std::time::Duration;
}

/// The [`RemoteTarget`] side of `t`, if it is a target in another PostgreSQL.
pub fn as_remote(t: &mut dyn Target) -> Option<&mut dyn RemoteTarget> {
    let t: &mut dyn std::any::Any = t;
    t.downcast_mut::<table::TableTarget<table::remote::Remote>>()
        .map(|t| t as &mut dyn RemoteTarget)
}

/// The target of a pipeline.
pub fn for_pipeline(p: &PipelineRow) -> TideResult<Box<dyn Target>> {
    match p.target {
        TargetKind::Outbox => Ok(Box::new(outbox::OutboxTarget::new(&p.name))),
        TargetKind::Table | TargetKind::Postgres => table::for_pipeline(p),
        TargetKind::Kafka => kafka::for_pipeline(p),
    }
}

/// What differs by kind of target before there is one (the SQL API's checks, how the worker
/// opens its decoder), each kind's answered by its own module (its `KIND`).
pub struct Kind {
    /// The options `tide.alter_pipeline` may change.
    pub alterable: &'static [&'static str],
    /// `None`: the target writes tables (`target_table`, `truncate_target`, `tide.verify`, a
    /// column mask's effect on a target table). Otherwise what it writes to instead.
    pub tableless: Option<Tableless>,
    /// Its tables live in this database: none of them may be a table its pipeline captures.
    pub local_tables: bool,
    /// It lives in another PostgreSQL ([`RemoteTarget`]): one server holds it
    /// (`tide.claim_target`), `tide.verify` reaches it over a connection of its own, and
    /// streamed transactions are written on connections of their own.
    pub remote: bool,
    /// It is outside the source database: its pipeline reads only WAL the standbys have.
    pub outside: bool,
    /// Consumers read it (`tide.create_consumer`).
    pub consumers: bool,
    /// A keyless table's copy reaches it between `resync` marks sent as [`Change::Resync`] (the
    /// kafka target's resync messages) rather than as `resync` events.
    pub resync_marks: bool,
}

/// How a target that writes no tables is named in the SQL API's refusals.
pub struct Tableless {
    /// What it writes to ("the outbox", "Kafka topics").
    pub writes_to: &'static str,
    /// `tide.add_table`'s refusal of a `target_table`: the rest of the message after "pipeline
    /// \"p\" writes to {writes_to}", and the hint.
    pub target_table: (&'static str, &'static str),
    /// The hint of `tide.verify`'s refusal.
    pub verify_hint: &'static str,
}

/// What the kind `k` of target is ([`Kind`]).
pub fn kind(k: TargetKind) -> &'static Kind {
    match k {
        TargetKind::Outbox => &outbox::KIND,
        TargetKind::Table => &table::KIND_LOCAL,
        TargetKind::Postgres => &table::KIND_REMOTE,
        TargetKind::Kafka => &kafka::KIND,
    }
}
