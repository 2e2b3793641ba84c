//! Table targets: ordered upserts and deletes into a table in this database (`table`) or in a
//! remote PostgreSQL (`postgres`).
//!
//! Owns: which source table goes to which target table, keeping the target tables' shapes in
//! step with the source (schema changes), and handing the statements that
//! `tide_core::plan` plans from the events to a [`Backend`]: [`local::Local`] runs them through
//! SPI, [`remote::Remote`] on another PostgreSQL. The planning (grouping, statement text, DDL)
//! is pure and lives in tide-core; this module decides nothing a backend could do differently.
//!
//! Guarantees:
//! - Order: each table's events are applied in stream order, so per-key order is source
//!   commit order. Within one target transaction (a batch of whole source transactions) the
//!   statements are grouped per table: each table has at most one open run of upserts or of
//!   deletes. Upserts of one table with the same column set become one
//!   `INSERT ... SELECT FROM unnest(...) ... ON CONFLICT (key) DO UPDATE` as long as no key
//!   repeats; deletes one `DELETE ... USING unnest(...)`. Rows arrive as each column's text
//!   output ([`RowForm::Text`]) and travel as one `text[]` per column,
//!   cast to the target column's type: every value exactly as the source has it. A repeated key, a delete after upserts of
//!   the same table or the other way round, or another column set, closes the table's run
//!   first. Every upsert is applied (none is merged into another; a key deleted twice in one
//!   run is deleted once). Tables are independent in a target transaction, so statements of
//!   different tables may run in another order than the source's: what a reader sees at commit
//!   is the same. (Constraints between target tables must therefore be `DEFERRABLE INITIALLY
//!   DEFERRED`.)
//! - A backfill chunk can arrive as row values instead of events ([`RowForm::RowValues`], see
//!   [`Target::row_form`] and [`Change::Chunk`]):
//!   a local backend whose target table has each of the chunk's columns with the source's type
//!   takes them, after this batch's statements so far: loaded in bulk ([`crate::bulk`]: the table
//!   access method's `multi_insert`, as COPY FROM) when none of their keys is at the target and
//!   the table has nothing a plain insert would bypass, else as one `INSERT ... SELECT FROM
//!   unnest($1) ON CONFLICT` ([`tide_core::plan::upsert_rows`]); the same effect as the chunk's
//!   `read` events, without JSON. A remote backend whose target table has them takes them as
//!   COPY text instead ([`RowForm::CopyText`]), in the batch's remote transaction:
//!   `COPY ... FROM STDIN` straight into the table when none of the chunk's keys is there, else
//!   into a temporary staging table and one `INSERT ... SELECT FROM` it `ON CONFLICT`
//!   ([`tide_core::plan::staged_upsert`]).
//! - A source `TRUNCATE` of several captured tables empties their target tables in one
//!   `TRUNCATE` ([`Change::Truncate`]), never one at a time: a foreign key between two of them
//!   at the target would refuse that (0A000). Never `CASCADE` (a target table pg_tide does not
//!   write is not emptied because the source cascaded); `RESTART IDENTITY` as the source said.
//! - Triggers: with the option `session_replication_role = 'replica'` a local target's
//!   statements run with that setting (only `ENABLE REPLICA` / `ALWAYS` triggers fire, as under
//!   PostgreSQL's apply worker; refused where it would skip another role's foreign key, see
//!   `local::Local`), a remote one's session is started with it; `'origin'` (the default) writes
//!   as any session.
//! - Unchanged TOAST columns are left out of the statement: the target keeps its value.
//! - Least privilege: a local target's statements (writes and schema changes) run as the
//!   pipeline's owner in a security-restricted operation: a right revoked after `add_table`
//!   makes the pipeline fail with the permission error; nothing is written anyway.
//! - Atomicity: local targets are written in the worker's transaction; remote targets in one
//!   remote transaction per batch of whole source transactions (two when a backfill chunk's rows
//!   follow stream events in the batch: the events are committed first, see
//!   `CommitPoint::Early`), each together with the applied position (`<schema>.tide_applied`).
//!   A reader of the target never sees half of a source transaction, across tables too. A
//!   streamed transaction written while it runs (`worker::stream_apply`) has a remote
//!   transaction of its own, on a connection of its own ([`crate::target::RemoteTarget::open_stream`]), committed
//!   with the applied position at the source's commit, after the batch before it.
//! - Schema changes: at a schema event ([`Change::Schema`], the position of the `ALTER TABLE`)
//!   a renamed column is renamed, a dropped column dropped (not a key column: that pauses), a
//!   new source column added (with the value the source's existing rows got) and a safe type
//!   widening applied (`tide_core::plan::plan_schema_change`); a shape check before the first
//!   event after a new relation description does the same for what it can see (new columns,
//!   widenings: [`plan_shape`]). That is `schema_changes = 'propagate'`, the default; anything
//!   else — or any change under `schema_changes = 'pause'` — pauses the pipeline with the
//!   reason and the remedy. Nothing is applied past the change until then.

use crate::catalog::pipelines::PipelineRow;
use crate::error::{TideError, TideResult};
use crate::target::options::{Options, ReplicationRole, SchemaPolicy};
use crate::target::remote::{remote_access, watch_remote_options, RemoteAccess, RemoteSink};
use crate::target::{
    Batch, Change, CommitPoint, Event, Kind, Row, RowBatch, RowForm, SchemaEvent, Target,
};
use pgrx::spi::SpiClient;
use std::collections::{HashMap, HashSet};
use tide_core::change::At;
use tide_core::lsn::Lsn;
use tide_core::model::{ChunkWrite, Op, TargetKind};
use tide_core::plan::{
    plan_schema_change, plan_shape, staged_upsert, upsert_rows, Change as Planned, Planner,
    ShapePlan, SourceColumn, Staged, Statement, TableRef, TypedColumn,
};

pub mod fence;
pub mod local;
pub mod remote;

pub use remote::{remote_err, replica_refused};

/// A table target in this database, as the SQL API and the worker tell kinds of target apart.
pub const KIND_LOCAL: Kind = Kind {
    alterable: &["schema_changes", "session_replication_role"],
    tableless: None,
    local_tables: true,
    remote: false,
    outside: false,
    consumers: false,
    resync_marks: false,
};

/// A table target in another PostgreSQL ([`crate::target::RemoteTarget`]).
pub const KIND_REMOTE: Kind = Kind {
    remote: true,
    local_tables: false,
    outside: true,
    ..KIND_LOCAL
};

/// Where a table target's statements run. The [`TableTarget`] plans; the backend executes.
pub trait Backend {
    /// Once per iteration, before anything else (remote: the connection settings are still
    /// allowed, the schema and `tide_applied` exist). `true`: the backend connected anew (to
    /// what may be another server), so nothing cached about the target tables holds.
    fn prepare(&mut self, p: &PipelineRow) -> TideResult<bool>;
    /// Rows of a read-only catalog query, run where the target tables live (parameters text).
    fn query(&mut self, sql: &str, params: &[&str]) -> TideResult<Vec<Vec<Option<String>>>>;
    /// Run a planned statement, now (local) or at [`Backend::commit`] (remote).
    fn exec(&mut self, c: &mut SpiClient<'_>, st: Statement) -> TideResult<()>;
    /// Make what was executed durable together with the applied position (at
    /// [`CommitPoint::Open`]: send it into the open transaction, commit nothing). Local: nothing
    /// to do (the worker's transaction commits it, with the pipeline row's applied position).
    fn commit(&mut self, pipeline: &str, applied: Option<Lsn>, at: CommitPoint) -> TideResult<()>;
    /// The applied position the target keeps itself (remote), if any.
    fn applied(&mut self) -> TideResult<Option<Lsn>>;
    /// Forget cached state after a failed iteration.
    fn reset(&mut self);
    /// Whether the target tables live in this database, so a chunk's rows can reach them as
    /// row values ([`Backend::exec_rows`]); otherwise they live in another PostgreSQL, which a
    /// chunk's rows reach by COPY ([`Backend::exec_copy`]) and whose [`Backend::commit`]
    /// commits on its own (outside the worker's transaction).
    fn in_this_database(&self) -> bool;
    /// Run `sql`, whose parameter `$1` is `rows`, an array of type `array_type` (row values of
    /// a source table: [`tide_core::plan::upsert_rows`]).
    fn exec_rows(
        &mut self,
        _c: &mut SpiClient<'_>,
        _sql: &str,
        _rows: pgrx::pg_sys::Datum,
        _array_type: pgrx::pg_sys::Oid,
    ) -> TideResult<()> {
        Err(TideError::internal(
            "row values can only be written to tables in this database",
        ))
    }
    /// Load a chunk's rows into `target` in bulk, with no `ON CONFLICT`, when none of their keys
    /// is at the target and the table allows it (local: [`crate::bulk`]). `false`: not done, the
    /// caller upserts them.
    fn load_rows(
        &mut self,
        _c: &mut SpiClient<'_>,
        _target: &TableRef,
        _batch: &RowBatch<'_>,
    ) -> TideResult<bool> {
        Ok(false)
    }
    /// Load a chunk's rows (`data`, COPY text of `staged.copy`'s columns) in the batch's
    /// transaction, after what was executed before: straight into the table when none of the
    /// chunk's keys is there (`staged.probe` with `bounds`, the key range's values), else
    /// through the staging table of `staged`.
    fn exec_copy(
        &mut self,
        _staged: Staged,
        _bounds: Vec<Option<String>>,
        _data: String,
    ) -> TideResult<()> {
        Err(TideError::internal(
            "COPY text can only be written to tables in another PostgreSQL",
        ))
    }
}

/// A target table's identifier as messages show it (quoted only where needed).
fn shown(t: &TableRef) -> String {
    format!(
        "{}.{}",
        pgrx::spi::quote_identifier(&t.schema),
        pgrx::spi::quote_identifier(&t.name)
    )
}

/// A table target (local or remote, by its backend).
pub struct TableTarget<B: Backend> {
    pipeline: String,
    policy: SchemaPolicy,
    backend: B,
    targets: HashMap<u32, TableRef>,
    /// Target table (qualified) → its columns and types, as last read (or as the DDL planned
    /// in this batch leaves them).
    shapes: HashMap<String, Vec<(String, String)>>,
    /// Source relations whose shape was checked against their target since the last reset.
    checked: HashSet<u32>,
    planner: Planner,
    /// A streamed transaction's target ([`crate::target::RemoteTarget::open_stream`]): a change that needs DDL at the
    /// target is refused (the transaction is then applied at its commit, by the main target).
    streamed: bool,
}

/// The target of a `table` or `postgres` pipeline.
pub fn for_pipeline(p: &PipelineRow) -> TideResult<Box<dyn Target>> {
    let opts = Options::parse(p.target, &p.options).map_err(|e| {
        TideError::internal(format!(
            "pipeline \"{}\" has options pg_tide cannot read: {}",
            p.name, e.message
        ))
        .hint("Drop the pipeline and create it again.")
    })?;
    let policy = opts.schema_changes();
    if p.target == TargetKind::Postgres {
        let access = pipeline_access(p, &opts)?;
        let sink = RemoteSink::start_with(access, &format!("pg_tide {}", p.name));
        let backend = remote::Remote::new(&p.name, opts.schema(), sink);
        return Ok(Box::new(TableTarget::new(&p.name, policy, backend)));
    }
    let owner = crate::security::owner_oid(&p.owner, &format!("pipeline \"{}\"", p.name))?;
    Ok(Box::new(TableTarget::new(
        &p.name,
        policy,
        local::Local {
            owner,
            pipeline: p.name.clone(),
            replica: opts.replication_role() == ReplicationRole::Replica,
        },
    )))
}

/// How a `postgres` pipeline connects now: its server's and the owner's user mapping's options,
/// through the rules of [`remote_access`]. Foreign servers, user mappings and roles are watched
/// from then on ([`crate::target::remote::take_options_changed`]): watching starts before the
/// options are read, so no later change is missed.
fn pipeline_access(p: &PipelineRow, opts: &Options) -> TideResult<RemoteAccess> {
    let server = opts.server().ok_or_else(|| {
        TideError::invalid(format!("pipeline \"{}\" has no server option", p.name))
    })?;
    watch_remote_options();
    let access = remote_access(server, &p.owner)?;
    Ok(match opts.replication_role() {
        // Set for the remote session when it starts: a remote user that may not set it cannot
        // connect (42501, see `remote_err`).
        ReplicationRole::Replica => crate::target::remote::with_session_setting(
            access,
            "session_replication_role",
            "replica",
        ),
        ReplicationRole::Origin => access,
    })
}

/// How a `postgres` pipeline's target connects now (after a foreign server, user mapping or
/// role changed), or why it may not connect at all (the error, e.g. "password is required").
fn current_access(p: &PipelineRow) -> TideResult<RemoteAccess> {
    let opts = Options::parse(p.target, &p.options).map_err(|e| {
        TideError::internal(format!(
            "pipeline \"{}\" has options pg_tide cannot read: {}",
            p.name, e.message
        ))
    })?;
    pipeline_access(p, &opts)
}

impl<B: Backend + 'static> TableTarget<B> {
    /// `names`, each with the target table's type for it (what its text is cast to).
    fn typed(&mut self, t: &TableRef, names: &[String]) -> TideResult<Vec<TypedColumn>> {
        self.target_columns(t)?;
        let shape = self
            .shapes
            .get(&t.qualified())
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        names
            .iter()
            .map(|n| {
                shape
                    .iter()
                    .find(|(c, _)| c == n)
                    .cloned()
                    .ok_or_else(|| {
                        TideError::internal(format!(
                            "target table {} has no column \"{n}\" (its shape changed behind the worker)",
                            shown(t)
                        ))
                        .hint("The worker retries and checks the table again.")
                    })
            })
            .collect()
    }

    /// Whether the target table of `relid` has each of `columns` (name, `format_type`); a table
    /// not among the targets read at [`Target::begin`] is looked up again ([`Self::reload_targets`]).
    fn has_columns(&mut self, relid: u32, columns: &[(String, String)]) -> TideResult<bool> {
        if !self.targets.contains_key(&relid) {
            self.reload_targets()?;
        }
        let Some(t) = self.targets.get(&relid).cloned() else {
            return Ok(false);
        };
        let target = self.target_columns(&t)?;
        Ok(columns
            .iter()
            .all(|col| target.iter().any(|have| have == col)))
    }

    /// The target tables read again from the catalog, for a source table added since
    /// [`Target::begin`] read them: its backfill becomes due in the iteration that decodes its
    /// `add_table` marker, which may be after that iteration's `begin` (the table committed
    /// meanwhile), and its first chunk is read before the next iteration. Without this, that
    /// chunk would be held as text events, and so every later chunk of the backfill (the next
    /// chunks are read ahead in the form of the one before).
    fn reload_targets(&mut self) -> TideResult<()> {
        let pipeline = self.pipeline.clone();
        self.targets =
            pgrx::Spi::connect_mut(|c| crate::catalog::tables::target_tables(c, &pipeline))?
                .into_iter()
                .collect();
        Ok(())
    }

    /// Before a chunk's `count` rows of `relid` are written in bulk: the target's shape is
    /// checked, the target must still want the chunk's columns in `form` (else an error: the worker reads
    /// the chunk again), and the table's events so far in this batch are written first. The
    /// target, or `None` when there is nothing to write.
    fn before_bulk(
        &mut self,
        c: &mut SpiClient<'_>,
        relid: u32,
        relation: &str,
        columns: &[(String, String)],
        count: usize,
        form: RowForm,
    ) -> TideResult<Option<TableRef>> {
        if !self.checked.contains(&relid) {
            self.ensure_shape(c, relid)?;
        }
        if self.row_form(relid, Some(columns))? != form {
            return Err(TideError::internal(format!(
                "the target of {relation} no longer has the chunk's columns with the same types"
            ))
            .hint("The worker retries; the chunk is read again."));
        }
        let Some(target) = self.targets.get(&relid).cloned() else {
            return Ok(None);
        };
        // The table's events so far in this batch come first, as with events.
        let pending = self.planner.finish();
        self.run(c, pending)?;
        Ok((count > 0).then_some(target))
    }

    fn new(pipeline: &str, policy: SchemaPolicy, backend: B) -> TableTarget<B> {
        TableTarget {
            pipeline: pipeline.to_string(),
            policy,
            backend,
            targets: HashMap::new(),
            shapes: HashMap::new(),
            checked: HashSet::new(),
            planner: Planner::new(),
            streamed: false,
        }
    }

    fn run(&mut self, c: &mut SpiClient<'_>, stmts: Vec<Statement>) -> TideResult<()> {
        for st in stmts {
            self.backend.exec(c, st)?;
        }
        Ok(())
    }

    fn target_columns(&mut self, t: &TableRef) -> TideResult<Vec<(String, String)>> {
        let q = t.qualified();
        if let Some(s) = self.shapes.get(&q) {
            return Ok(s.clone());
        }
        let rows = self.backend.query(
            "SELECT a.attname::pg_catalog.text, pg_catalog.format_type(a.atttypid, a.atttypmod)
               FROM pg_catalog.pg_attribute a
              WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1)
                AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
              ORDER BY a.attnum",
            &[&q],
        )?;
        let mut cols = Vec::with_capacity(rows.len());
        for r in rows {
            match (r.first().cloned().flatten(), r.get(1).cloned().flatten()) {
                (Some(n), Some(ty)) => cols.push((n, ty)),
                _ => {
                    return Err(TideError::internal(format!(
                        "the columns of target table {} came back incomplete",
                        shown(t)
                    )))
                }
            }
        }
        if cols.is_empty() {
            return Err(TideError::undefined(format!("target table {} does not exist", shown(t)))
                .hint("Re-add the table (tide.remove_table, then tide.add_table) to create it, or create it with the source's columns and key."));
        }
        self.shapes.insert(q, cols.clone());
        Ok(cols)
    }

    /// Compare the source's current columns with the target's; propagate or pause.
    fn ensure_shape(&mut self, c: &mut SpiClient<'_>, relid: u32) -> TideResult<()> {
        if self.checked.contains(&relid) {
            return Ok(());
        }
        let Some(t) = self.targets.get(&relid).cloned() else {
            return Ok(());
        };
        let mut source = Vec::new();
        // Type names as the target's session writes them (see security::with_type_names).
        let rows = crate::security::with_type_names(|| {
            crate::catalog::tables::source_columns(&self.pipeline, relid)
        })?;
        for r in rows {
            let mut r = r.into_iter();
            match (r.next().flatten(), r.next().flatten(), r.next().flatten()) {
                (Some(name), Some(ty), missing) => source.push(SourceColumn { name, ty, missing }),
                _ => {
                    return Err(TideError::internal(format!(
                        "the columns of source relation {relid} came back incomplete"
                    )))
                }
            }
        }
        let target = self.target_columns(&t)?;
        let plan = plan_shape(&t.qualified(), &source, &target);
        self.apply_plan(c, relid, &t, plan)
    }

    /// The error that pauses the pipeline before a shape change of target `t` (source `relid`)
    /// it will not or may not make: what changed, and a remedy to run as printed (the planned
    /// DDL itself, with the value existing rows have for an added column). When an added column
    /// has such a value, the table is also read again after the resume
    /// (`reread_after_resume`): rows that existed before the column carry its value only at the
    /// source, and a target fixed any other way (the column added without its default) would
    /// otherwise differ from it silently.
    fn paused_for_shape(&self, relid: u32, t: &TableRef, plan: ShapePlan) -> TideError {
        let mut all: Vec<String> = plan.ddl.iter().map(|(_, d)| d.clone()).collect();
        all.extend(plan.refused.iter().cloned());
        let mut steps = Vec::new();
        if !plan.ddl.is_empty() {
            let ddl: Vec<&str> = plan.ddl.iter().map(|(sql, _)| sql.as_str()).collect();
            steps.push(format!("Run at the target: {};", ddl.join("; ")));
        }
        if !plan.refused.is_empty() {
            steps.push(format!(
                "Change {} by hand so that it holds the source's values ({}).",
                shown(t),
                plan.refused.join("; ")
            ));
        }
        let reread = if plan.adds_existing_values {
            " Once it resumes, pg_tide reads the source table again (a backfill, shown in tide.backfills), so the rows that existed before the new column hold its value at the target whichever way the column was added."
        } else {
            ""
        };
        let mut e = TideError::prerequisite(format!(
            "the source of target {} changed shape: {}",
            shown(t),
            all.join("; ")
        ))
        .hint(format!(
            "The pipeline is paused before the first change that needs the new shape. {} Then SELECT tide.resume_pipeline('{}'); it resumes from the same place.{reread}",
            steps.join(" "),
            self.pipeline.replace('\'', "''")
        ));
        e.pause_pipeline = true;
        if plan.adds_existing_values {
            e.reread_after_resume.push(relid);
        }
        e
    }

    /// Apply a planned shape change to target `t` of source `relid`, or pause the pipeline
    /// when it refuses something or the policy is `pause`.
    fn apply_plan(
        &mut self,
        c: &mut SpiClient<'_>,
        relid: u32,
        t: &TableRef,
        plan: ShapePlan,
    ) -> TideResult<()> {
        if !plan.refused.is_empty() || (self.policy == SchemaPolicy::Pause && !plan.ddl.is_empty())
        {
            return Err(self.paused_for_shape(relid, t, plan));
        }
        if self.streamed && !plan.ddl.is_empty() {
            return Err(TideError::prerequisite(format!(
                "target {} needs a change of shape, which a streamed transaction does not make before its commit",
                shown(t)
            )));
        }
        if !plan.ddl.is_empty() {
            // The target's shape once the DDL is applied (remote DDL only runs at the batch's
            // commit, so the cache must not be re-read before then). Whatever is planned for
            // any table runs first: the DDL may change what those statements mean.
            self.shapes.insert(t.qualified(), plan.shape);
            let pending = self.planner.finish();
            self.run(c, pending)?;
            let ddl = plan
                .ddl
                .into_iter()
                .map(|(sql, _)| Statement {
                    sql,
                    params: Vec::new(),
                })
                .collect();
            self.run(c, ddl)?;
        }
        self.checked.insert(relid);
        Ok(())
    }
}

impl<B: Backend + 'static> Target for TableTarget<B> {
    /// Text for events; a chunk as row values (a table in this database) or COPY text (another
    /// PostgreSQL) when the target table has each of its columns with the same type, else as
    /// text events.
    fn row_form(&mut self, relid: u32, chunk: Option<&[(String, String)]>) -> TideResult<RowForm> {
        let Some(columns) = chunk else {
            return Ok(RowForm::Text);
        };
        if self.backend.in_this_database() && self.has_columns(relid, columns)? {
            Ok(RowForm::RowValues)
        } else if !self.backend.in_this_database() && self.has_columns(relid, columns)? {
            Ok(RowForm::CopyText)
        } else {
            Ok(RowForm::Text)
        }
    }

    fn begin(&mut self, c: &mut SpiClient<'_>, p: &PipelineRow) -> TideResult<Option<Lsn>> {
        self.targets = crate::catalog::tables::target_tables(c, &p.name)?
            .into_iter()
            .collect();
        if self.backend.prepare(p)? {
            self.shapes.clear();
            self.checked.clear();
        }
        self.backend.applied()
    }

    /// A change: events planned into statements (one source `TRUNCATE` as one `TRUNCATE` of
    /// its target tables), a schema change applied or refused, a chunk's rows in bulk; a
    /// relation's new description checks its target table. Positions are not kept (a target
    /// table holds rows, not events); a resync has no events here.
    fn apply(
        &mut self,
        c: &mut SpiClient<'_>,
        _at: At,
        change: Change<'_>,
    ) -> TideResult<Option<ChunkWrite>> {
        match change {
            Change::Relation { relid, .. } => self.relation(c, relid)?,
            Change::Row(ev) => self.push(c, ev)?,
            Change::Truncate {
                events,
                restart_identity,
            } => self.truncate(c, events, restart_identity)?,
            Change::Schema(ev) => self.schema(c, ev)?,
            Change::Chunk(batch) => return self.write_chunk(c, batch).map(Some),
            Change::Resync(_) => {}
        }
        Ok(None)
    }

    fn commit(
        &mut self,
        c: &mut SpiClient<'_>,
        pipeline: &str,
        applied: Option<Lsn>,
        at: CommitPoint,
    ) -> TideResult<()> {
        if at == CommitPoint::Early && self.backend.in_this_database() {
            return Ok(());
        }
        let pending = self.planner.finish();
        self.run(c, pending)?;
        let r = self.backend.commit(pipeline, applied, at);
        if r.is_err() && at != CommitPoint::Open {
            // The remote rolled back: DDL planned in this batch did not happen.
            self.shapes.clear();
            self.checked.clear();
        }
        r
    }

    fn reset(&mut self) {
        self.shapes.clear();
        self.checked.clear();
        self.planner.clear();
        self.backend.reset();
    }
}

impl<B: Backend + 'static> TableTarget<B> {
    /// A new description of a source relation: check its target before any event uses it.
    fn relation(&mut self, c: &mut SpiClient<'_>, relid: u32) -> TideResult<()> {
        self.checked.remove(&relid);
        if self.targets.contains_key(&relid) {
            self.ensure_shape(c, relid)?;
        }
        Ok(())
    }

    /// One event: a statement planned (and run, or buffered by the planner).
    fn push(&mut self, c: &mut SpiClient<'_>, ev: Event) -> TideResult<()> {
        if !self.targets.contains_key(&ev.relid) {
            // Not a table this pipeline writes (cannot happen for captured tables).
            return Ok(());
        }
        if !self.checked.contains(&ev.relid) {
            self.ensure_shape(c, ev.relid)?;
        }
        let Event {
            relid,
            relation,
            op,
            key,
            row,
            columns,
            only_where,
            old,
            ..
        } = ev;
        let Some(target) = self.targets.get(&relid).cloned() else {
            return Ok(());
        };
        let missing = |what: &str| {
            TideError::internal(format!(
                "a {} event of {relation} has no {what}",
                op.as_str()
            ))
        };
        let change = match op {
            Op::Truncate => match only_where {
                Some(predicate) => Planned::TruncateWhere { predicate },
                None => Planned::Truncate,
            },
            // Schema changes arrive through `schema`, never as an event; resync events are the
            // outbox's only.
            Op::Schema | Op::Resync => return Ok(()),
            Op::Insert | Op::Read if target.key.is_empty() => Planned::Insert {
                values: match row {
                    Row::Text(values) => values,
                    _ => return Err(missing("row as text")),
                },
                cols: self.typed(&target, &columns)?,
            },
            Op::Update | Op::Delete if target.key.is_empty() => {
                let Row::Key(old) = old else {
                    return Err(missing("old row"));
                };
                let names: Vec<String> = old.iter().map(|(n, _)| n.clone()).collect();
                let new = match (op, row) {
                    (Op::Delete, _) => None,
                    (_, Row::Text(values)) => Some((values, self.typed(&target, &columns)?)),
                    _ => return Err(missing("row as text")),
                };
                Planned::RowMatch {
                    old: old.into_iter().map(|(_, v)| v).collect(),
                    old_cols: self.typed(&target, &names)?,
                    new,
                }
            }
            Op::Delete => {
                let Row::Key(mut key_values) = row else {
                    return Err(missing("key values"));
                };
                // In the target's key order.
                let mut ordered = Vec::with_capacity(target.key.len());
                for k in &target.key {
                    let i = key_values
                        .iter()
                        .position(|(n, _)| n == k)
                        .ok_or_else(|| missing(&format!("value of key column \"{k}\"")))?;
                    ordered.push(key_values.swap_remove(i).1);
                }
                let types = self.typed(&target, &target.key)?;
                Planned::Delete {
                    key: key.ok_or_else(|| missing("key"))?,
                    values: ordered,
                    types: types.into_iter().map(|(_, ty)| ty).collect(),
                }
            }
            Op::Insert | Op::Update | Op::Read => Planned::Upsert {
                key: key.ok_or_else(|| missing("key"))?,
                values: match row {
                    Row::Text(values) => values,
                    _ => return Err(missing("row as text")),
                },
                cols: self.typed(&target, &columns)?,
            },
        };
        let stmts = self.planner.push(relid, &target, change);
        self.run(c, stmts)
    }

    /// One source `TRUNCATE` of several tables: their target tables are emptied by one
    /// `TRUNCATE` (RESTRICT, `RESTART IDENTITY` as the source said; see
    /// `tide_core::plan::Planner::truncate`), so a foreign key between two of them at the
    /// target holds, as PostgreSQL's apply worker truncates a TRUNCATE message's relations
    /// together. A partition truncated alone (`only_where`) is a `DELETE` of its own.
    fn truncate(
        &mut self,
        c: &mut SpiClient<'_>,
        events: Vec<Event>,
        restart_identity: bool,
    ) -> TideResult<()> {
        let mut tables: Vec<(u32, TableRef)> = Vec::new();
        for ev in events {
            if ev.only_where.is_some() {
                self.push(c, ev)?;
                continue;
            }
            if !self.targets.contains_key(&ev.relid) {
                continue;
            }
            if !self.checked.contains(&ev.relid) {
                self.ensure_shape(c, ev.relid)?;
            }
            if let Some(target) = self.targets.get(&ev.relid) {
                tables.push((ev.relid, target.clone()));
            }
        }
        let stmts = self.planner.truncate(&tables, restart_identity);
        self.run(c, stmts)
    }

    /// A schema event: apply the change at this position (renames, drops of dropped columns,
    /// added columns with their existing rows' value, safe widenings) or pause; a key change
    /// only arrives here for a table being removed, whose changes stop there; a dropped source
    /// table leaves its copy as it is.
    fn schema(&mut self, c: &mut SpiClient<'_>, ev: SchemaEvent) -> TideResult<()> {
        let Some(t) = self.targets.get(&ev.relid).cloned() else {
            return Ok(());
        };
        if ev.change.key_changed() || ev.dropped {
            return Ok(());
        }
        let target = self.target_columns(&t)?;
        let plan = plan_schema_change(&t.qualified(), &ev.change, &target, &t.key);
        self.checked.remove(&ev.relid);
        self.apply_plan(c, ev.relid, &t, plan)
    }

    /// A chunk's rows in a batch form: row values (this database) or COPY text (another
    /// PostgreSQL), in bulk where the target holds none of their keys.
    fn write_chunk(&mut self, c: &mut SpiClient<'_>, batch: Batch<'_>) -> TideResult<ChunkWrite> {
        match batch {
            Batch::Values(batch) => {
                let Some(target) = self.before_bulk(
                    c,
                    batch.relid,
                    batch.relation,
                    batch.columns,
                    batch.rows.len(),
                    RowForm::RowValues,
                )?
                else {
                    return Ok(ChunkWrite::Upsert);
                };
                if self.backend.load_rows(c, &target, &batch)? {
                    return Ok(ChunkWrite::Bulk);
                }
                let cols: Vec<String> = batch.columns.iter().map(|(n, _)| n.clone()).collect();
                let sql = upsert_rows(&target, &cols);
                let (rows, array_type) = batch.array()?;
                self.backend.exec_rows(c, &sql, rows, array_type)?;
                Ok(ChunkWrite::Upsert)
            }
            Batch::Copy(batch) => {
                let Some(target) = self.before_bulk(
                    c,
                    batch.relid,
                    batch.relation,
                    batch.columns,
                    batch.count,
                    RowForm::CopyText,
                )?
                else {
                    return Ok(ChunkWrite::Copy);
                };
                let bounds: Vec<Option<String>> = batch
                    .lower
                    .into_iter()
                    .flatten()
                    .chain(batch.upper)
                    .map(|v| Some(v.clone()))
                    .collect();
                self.backend.exec_copy(
                    staged_upsert(&target, batch.columns, batch.lower.is_some()),
                    bounds,
                    batch.data,
                )?;
                Ok(ChunkWrite::Copy)
            }
        }
    }
}
