//! The remote backend of a table target: statements buffered and run on another PostgreSQL in
//! one remote transaction per batch, through the [`RemoteSink`] thread.
//!
//! A backfill chunk's rows arrive as COPY text ([`Backend::exec_copy`]), loaded in the same
//! remote transaction: `COPY ... FROM STDIN` straight into the table when a probe finds none of
//! the chunk's keys there (as PostgreSQL's initial sync loads a table), else into a temporary
//! staging table and one upsert from it.
//!
//! Guarantees: a batch's statements (and COPY loads) and the applied position (`<schema>.tide_applied`, one row
//! per pipeline, only ever raised with `greatest`) commit in the same remote transaction, fenced
//! by the row's owner and epoch (`super::fence`: a server that does not own the target never
//! commits a write there), so a
//! reader of the target never sees half of a source transaction and a replay after a crash is
//! skipped; every wait for the remote is bounded by [`REMOTE_TIMEOUT`] and checks interrupts
//! (see `target::remote`); a failed commit forgets the cached applied position, so it is read
//! again before anything is replayed.

use super::fence::Fence;
use super::{Backend, TableTarget};
use crate::catalog::pipelines::PipelineRow;
use crate::error::{TideError, TideResult};
use crate::target::remote::{Part, RemoteSink, RemoteStatement, RemoteStep};
use crate::target::CommitPoint;
use crate::target::{RemoteTarget, Target};
use pgrx::spi::SpiClient;
use std::time::Duration;
use tide_core::applied::KnownApplied;
use tide_core::lsn::Lsn;
use tide_core::plan::{quote_ident, Staged, Statement, TableRef, TypedColumn};

/// How long the worker waits for the remote to answer one batch.
pub const REMOTE_TIMEOUT: Duration = Duration::from_secs(60);

/// Bytes of statements (SQL and parameters, COPY data) buffered before they are sent into the
/// batch's remote transaction, which stays open until the batch commits: the worker's memory
/// for a source transaction of any size is about this much.
pub const FLUSH_BYTES: usize = 4 << 20;

/// How long a streamed transaction's remote statement waits for a row lock before it fails
/// (and the transaction is applied at its commit instead): what it waits for is another
/// connection of the same worker, which cannot go on while it waits.
pub const STREAM_LOCK_TIMEOUT_MS: u32 = 2000;

/// Writes a table target's statements to a remote PostgreSQL.
pub struct Remote {
    pipeline: String,
    /// The remote schema that holds the target tables and `tide_applied`.
    schema: String,
    /// The connection (its thread); `None` after its connection settings were refused, until
    /// they are allowed again.
    sink: Option<RemoteSink>,
    /// A foreign server, user mapping or role changed since the connection was checked: check
    /// it at the next [`Backend::prepare`] (again after a refusal).
    recheck: bool,
    /// Steps of the open batch not sent yet.
    stmts: Vec<RemoteStep>,
    /// Their size (SQL, parameters, COPY data), to send them at [`FLUSH_BYTES`].
    buffered: usize,
    /// The batch's remote transaction, once a part of it was sent and left open (its id).
    open: Option<u64>,
    /// The id of the next remote transaction sent in parts.
    next_part: u64,
    /// The remote's applied position, once read.
    applied: KnownApplied,
    /// The schema and `tide_applied` exist on the remote (checked once per connection).
    ready: bool,
    /// The open batch loads a chunk straight into its table if the range is empty.
    has_direct: bool,
    /// A chunk loaded straight into its table met a unique violation: the probe said its key
    /// range was empty, yet a key was there (the remote column compares keys in another
    /// collation than the source, or another writer inserted one meanwhile). From then on this
    /// worker loads every chunk through the staging table, which upserts.
    direct_refused: bool,
    /// A streamed transaction's backend ([`Remote::fork`]): its remote transaction begins with
    /// `SET LOCAL lock_timeout` ([`STREAM_LOCK_TIMEOUT_MS`]).
    stream: bool,
    /// This server's hold on the target (`super::fence`).
    fence: Fence,
}

impl Remote {
    pub fn new(pipeline: &str, schema: &str, sink: RemoteSink) -> Remote {
        Remote {
            pipeline: pipeline.to_string(),
            schema: schema.to_string(),
            sink: Some(sink),
            recheck: false,
            stmts: Vec::new(),
            buffered: 0,
            open: None,
            next_part: 0,
            applied: KnownApplied::default(),
            ready: false,
            has_direct: false,
            direct_refused: false,
            stream: false,
            fence: Fence::new(),
        }
    }

    /// The applied position `tide_applied` holds for the pipeline.
    fn read_applied(&mut self) -> TideResult<Option<Lsn>> {
        let table = self.applied_table();
        let pipeline = self.pipeline.clone();
        let rows = self
            .sink()?
            .query(
                &format!("SELECT applied_lsn::text FROM {table} WHERE pipeline = $1"),
                vec![Some(pipeline)],
                REMOTE_TIMEOUT,
            )
            .map_err(remote_err)?;
        let a = match rows.first().and_then(|r| r.first().cloned().flatten()) {
            None => None,
            Some(s) => Some(s.parse::<Lsn>().map_err(|_| {
                TideError::internal(format!(
                    "remote target: {} holds \"{s}\" for pipeline \"{}\", which is not an LSN",
                    self.applied_table(),
                    self.pipeline
                ))
            })?),
        };
        Ok(a)
    }

    /// While the pipeline is paused: renew the lease on the target this server holds (see
    /// [`super::fence`]).
    pub(super) fn keep_lease(&mut self, p: &PipelineRow) -> TideResult<()> {
        self.check_access(p)?;
        if !self.ready {
            self.make_applied_table()?;
            self.ready = true;
        }
        let table = self.applied_table();
        let sink = self.sink.as_ref().ok_or_else(no_connection)?;
        self.fence.keep(sink, &table, p, REMOTE_TIMEOUT)
    }

    /// How often the worker must look at the target to keep its lease (a third of
    /// `tide.target_lease`).
    pub(super) fn renew_every(&self) -> Duration {
        super::fence::renew_every()
    }

    /// A backend of its own, on a connection of its own, for one streamed transaction written
    /// while it runs ([`crate::target::RemoteTarget::open_stream`]).
    pub(super) fn fork(&self) -> TideResult<Remote> {
        let sink = self.sink.as_ref().ok_or_else(no_connection)?;
        let mut r = Remote::new(
            &self.pipeline,
            &self.schema,
            RemoteSink::start_with(sink.access(), &format!("pg_tide {} stream", self.pipeline)),
        );
        // The main connection made the schema and `tide_applied`, and holds the target; a chunk
        // never comes here.
        r.ready = true;
        r.stream = true;
        r.fence = self.fence.clone();
        Ok(r)
    }

    /// Send what is buffered into the open transaction without committing it.
    fn flush(&mut self) -> TideResult<()> {
        if self.stmts.is_empty() {
            return Ok(());
        }
        self.send_part()
    }

    /// The connection, or why there is none.
    fn sink(&mut self) -> TideResult<&mut RemoteSink> {
        self.sink.as_mut().ok_or_else(no_connection)
    }

    /// After a foreign server, user mapping or role changed (watched from when the connection
    /// was first made: `target::table::pipeline_access`): go on when what the connection uses is
    /// unchanged and still allowed; connect again when it changed (`Ok(true)`: nothing cached
    /// about the remote holds any more); or close the connection and refuse (the error, e.g.
    /// "password is required"), checking again at the next attempt.
    fn check_access(&mut self, p: &PipelineRow) -> TideResult<bool> {
        if crate::target::remote::take_options_changed() {
            self.recheck = true;
        }
        if !self.recheck {
            return Ok(false);
        }
        let access = match super::current_access(p) {
            Ok(a) => a,
            Err(e) => {
                self.sink = None;
                return Err(e);
            }
        };
        self.recheck = false;
        if self.sink.as_ref().is_some_and(|s| s.access() == access) {
            return Ok(false);
        }
        self.sink = Some(RemoteSink::start_with(
            access,
            &format!("pg_tide {}", p.name),
        ));
        self.reset();
        self.direct_refused = false;
        Ok(true)
    }

    fn applied_table(&self) -> String {
        format!("{}.tide_applied", quote_ident(&self.schema))
    }

    /// The schema and `tide_applied` on the remote, with the ownership columns (added to a table
    /// an older version made: `super::fence`).
    fn make_applied_table(&mut self) -> TideResult<()> {
        let table = self.applied_table();
        let schema = quote_ident(&self.schema);
        let sink = self.sink()?;
        sink.query(
            &format!("CREATE SCHEMA IF NOT EXISTS {schema}"),
            vec![],
            REMOTE_TIMEOUT,
        )
        .map_err(remote_err)?;
        sink.query(
                &format!(
                    "CREATE TABLE IF NOT EXISTS {table} (pipeline text PRIMARY KEY, applied_lsn pg_lsn NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), writer text, epoch bigint NOT NULL DEFAULT 0, renewed_at timestamptz, lease interval)"
                ),
                vec![],
                REMOTE_TIMEOUT,
            )
            .map_err(remote_err)?;
        let have = sink
            .query(
                super::fence::COUNT_COLUMNS_SQL,
                vec![Some(table.clone())],
                REMOTE_TIMEOUT,
            )
            .map_err(remote_err)?
            .first()
            .and_then(|r| r.first().cloned().flatten())
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
        if have < super::fence::COLUMNS.len() {
            sink.query(
                &super::fence::add_columns_sql(&table),
                vec![],
                REMOTE_TIMEOUT,
            )
            .map_err(remote_err)?;
        }
        Ok(())
    }

    /// Buffer a step; past [`FLUSH_BYTES`], send what is buffered into the batch's remote
    /// transaction (begun by the first such part), which stays open until [`Backend::commit`].
    fn add(&mut self, step: RemoteStep) -> TideResult<()> {
        if self.stream && self.open.is_none() && self.stmts.is_empty() {
            self.stmts.push(RemoteStep::Simple(format!(
                "SET LOCAL lock_timeout = {STREAM_LOCK_TIMEOUT_MS}"
            )));
        }
        self.buffered += step_size(&step);
        self.stmts.push(step);
        if self.buffered < FLUSH_BYTES {
            return Ok(());
        }
        self.send_part()
    }

    /// Send what is buffered into the batch's remote transaction (begun by the first such
    /// part), leaving it open.
    fn send_part(&mut self) -> TideResult<()> {
        let part = match self.open {
            Some(id) => Part {
                id,
                continues: true,
                commit: false,
            },
            None => {
                self.next_part += 1;
                Part {
                    id: self.next_part,
                    continues: false,
                    commit: false,
                }
            }
        };
        let stmts = std::mem::take(&mut self.stmts);
        self.buffered = 0;
        let sent = self.sink()?.transaction_part(stmts, part, REMOTE_TIMEOUT);
        // Not a commit: nothing to remember, but a failure forgets the position.
        self.open = None;
        self.applied.committed(None, sent).map_err(remote_err)?;
        self.open = Some(part.id);
        Ok(())
    }
}

/// Why a [`Remote`] has no connection.
fn no_connection() -> TideError {
    TideError::prerequisite("the remote target's connection settings were refused").hint(
        "See the error before this one; the worker checks the settings again at each attempt.",
    )
}

/// Bytes a step holds (what buffering it costs).
fn step_size(step: &RemoteStep) -> usize {
    let stmt = |s: &RemoteStatement| {
        s.sql.len()
            + s.params
                .iter()
                .map(|p| p.as_ref().map_or(0, String::len))
                .sum::<usize>()
    };
    match step {
        RemoteStep::Statement(s) | RemoteStep::Fence(s) => stmt(s),
        RemoteStep::Simple(sql) => sql.len(),
        RemoteStep::CopyIn { sql, data } => sql.len() + data.len(),
        RemoteStep::LoadChunk {
            probe,
            direct,
            staged,
            data,
        } => stmt(probe) + direct.len() + staged.iter().map(step_size).sum::<usize>() + data.len(),
    }
}

impl Backend for Remote {
    fn prepare(&mut self, p: &PipelineRow) -> TideResult<bool> {
        let reconnected = self.check_access(p)?;
        if !self.ready {
            self.make_applied_table()?;
            self.ready = true;
        }
        // Take the target, or renew the lease, before anything of this iteration is written
        // (every commit is fenced as well).
        if self.fence.due() || self.applied.get().is_none() {
            let table = self.applied_table();
            let sink = self.sink.as_ref().ok_or_else(no_connection)?;
            let held = self.fence.acquire(sink, &table, p, REMOTE_TIMEOUT)?;
            self.applied.set(held.applied);
        }
        Ok(reconnected)
    }

    fn in_this_database(&self) -> bool {
        false
    }

    fn query(&mut self, sql: &str, params: &[&str]) -> TideResult<Vec<Vec<Option<String>>>> {
        self.sink()?
            .query(
                sql,
                params.iter().map(|p| Some(p.to_string())).collect(),
                REMOTE_TIMEOUT,
            )
            .map_err(remote_err)
    }

    fn exec(&mut self, _c: &mut SpiClient<'_>, st: Statement) -> TideResult<()> {
        self.add(RemoteStep::Statement(RemoteStatement {
            sql: st.sql,
            params: st.params.into_iter().map(Some).collect(),
        }))
    }

    fn exec_copy(
        &mut self,
        staged: Staged,
        bounds: Vec<Option<String>>,
        data: String,
    ) -> TideResult<()> {
        let steps = vec![
            RemoteStep::Simple(staged.create),
            RemoteStep::CopyIn {
                sql: staged.copy,
                data: Vec::new(),
            },
            RemoteStep::Simple(staged.upsert),
        ];
        if self.direct_refused {
            // Always through the staging table (see `direct_refused`).
            for step in steps {
                self.add(match step {
                    RemoteStep::CopyIn { sql, .. } => RemoteStep::CopyIn {
                        sql,
                        data: data.clone().into_bytes(),
                    },
                    other => other,
                })?;
            }
            return Ok(());
        }
        self.has_direct = true;
        self.add(RemoteStep::LoadChunk {
            probe: RemoteStatement {
                sql: staged.probe,
                params: bounds,
            },
            direct: staged.direct,
            staged: steps,
            data: data.into_bytes(),
        })
    }

    fn commit(&mut self, pipeline: &str, applied: Option<Lsn>, at: CommitPoint) -> TideResult<()> {
        if at == CommitPoint::Open {
            return self.flush();
        }
        if self.stmts.is_empty() && applied.is_none() && self.open.is_none() {
            return Ok(());
        }
        // The fence last: this writer still owns the target at its epoch, or nothing commits.
        let fence = self
            .fence
            .commit_step(&self.applied_table(), pipeline, applied)?;
        let mut stmts = std::mem::take(&mut self.stmts);
        self.buffered = 0;
        stmts.push(fence);
        let direct = std::mem::take(&mut self.has_direct);
        let sent = match self.open.take() {
            Some(id) => self.sink()?.transaction_part(
                stmts,
                Part {
                    id,
                    continues: true,
                    commit: true,
                },
                REMOTE_TIMEOUT,
            ),
            None => self.sink()?.transaction_steps(stmts, REMOTE_TIMEOUT),
        };
        match self.applied.committed(applied, sent) {
            Ok(_) => {
                self.fence.committed();
                Ok(())
            }
            Err(e) if e.is_fenced() => {
                let table = self.applied_table();
                let pipeline = self.pipeline.clone();
                let sink = self.sink.as_ref().ok_or_else(no_connection)?;
                Err(self.fence.lost(sink, &table, &pipeline, REMOTE_TIMEOUT))
            }
            Err(e) => {
                if direct && e.sqlstate.as_deref() == Some("23505") {
                    self.direct_refused = true;
                }
                Err(remote_err(e))
            }
        }
    }

    fn applied(&mut self) -> TideResult<Option<Lsn>> {
        if let Some(a) = self.applied.get() {
            return Ok(a);
        }
        let a = self.read_applied()?;
        self.applied.set(a);
        Ok(a)
    }

    fn reset(&mut self) {
        self.stmts.clear();
        self.buffered = 0;
        // The remote transaction a failed batch left open holds its rows' locks: end it now
        // (the worker may wait a while before it retries). Should this fail (the remote is
        // unreachable), the sink thread rolls it back before the next transaction begins.
        if self.open.take().is_some() {
            if let Some(sink) = self.sink.as_ref() {
                let _ = sink.query("ROLLBACK", vec![], Duration::from_secs(5));
            }
        }
        self.applied.forget();
        self.ready = false;
        self.has_direct = false;
    }
}

/// A remote failure as the pipeline's error: transient ones (the target unreachable) are
/// retried by the worker with back-off, the others wait for the user.
pub fn remote_err(e: crate::target::remote::RemoteError) -> TideError {
    if let Some(refused) = crate::target::remote::refusal_error(&e) {
        return refused;
    }
    if e.sqlstate.as_deref() == Some("42501") && e.message.contains("session_replication_role") {
        return replica_refused("the pipeline's server", &e.message, Some("42501"));
    }
    let code = if e.transient {
        pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE
    } else {
        pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_FDW_ERROR
    };
    let mut err = TideError::new(code, format!("remote target: {}", e.message));
    if let Some(s) = &e.sqlstate {
        err = err.detail(format!("remote SQLSTATE {s}"));
    }
    err.hint(e.hint.unwrap_or_else(|| {
        if e.transient {
            "The target is unreachable or restarting; the worker retries with back-off, and the slot keeps the WAL meanwhile (unless max_slot_wal_keep_size invalidates it first: see slot_warning and safe_wal_size in tide.pipelines).".to_string()
        } else {
            "Fix the target table (see the message), then the worker retries by itself.".to_string()
        }
    }))
}

/// The remote user of `server` (as messages name it) may not set `session_replication_role`
/// (`message`, with the remote's SQLSTATE): 42501 with what to do.
pub fn replica_refused(server: &str, message: &str, sqlstate: Option<&str>) -> TideError {
    TideError::privilege(format!(
        "the remote user of {server} may not set session_replication_role: {message}{}",
        sqlstate.map(|s| format!(" (remote SQLSTATE {s})")).unwrap_or_default()
    ))
    .hint("The option session_replication_role = 'replica' sets it in the remote session, which PostgreSQL allows a superuser and, from PostgreSQL 15 on, a role granted it: at the target, GRANT SET ON PARAMETER session_replication_role TO <the user mapping's user>. Or leave the option out ('origin', the default).")
}

/// A table target in another PostgreSQL.
impl RemoteTarget for TableTarget<Remote> {
    /// A target in another PostgreSQL: the keys its table holds in the range, read there with
    /// the bounds cast to the target's key types (its rows only this pipeline writes).
    fn sweep_keys(
        &mut self,
        relid: u32,
        key_columns: &[String],
        lower: Option<&[String]>,
        upper: Option<&[String]>,
    ) -> TideResult<Vec<Vec<Option<String>>>> {
        let Some(t) = self.targets.get(&relid).cloned() else {
            // Not a table this pipeline writes: nothing there to sweep.
            return Ok(Vec::new());
        };
        let types = self.typed(&t, key_columns)?;
        let (sql, params) = sweep_query(&t, &types, lower, upper);
        let params: Vec<&str> = params.iter().map(String::as_str).collect();
        self.backend.query(&sql, &params)
    }

    fn open_stream(&mut self) -> TideResult<Box<dyn Target>> {
        let backend = self.backend.fork()?;
        let mut t = TableTarget::new(&self.pipeline, self.policy, backend);
        t.streamed = true;
        t.targets = self.targets.clone();
        t.shapes = self.shapes.clone();
        Ok(Box::new(t))
    }

    fn keep_lease(&mut self, p: &PipelineRow) -> TideResult<()> {
        self.backend.keep_lease(p)
    }

    fn renew_every(&self) -> std::time::Duration {
        self.backend.renew_every()
    }
}

/// The keys (`types`: each key column with the target's type for it) of target table `t` after
/// `lower` up to `upper`, each key column as text, with the bounds as parameters.
fn sweep_query(
    t: &TableRef,
    types: &[TypedColumn],
    lower: Option<&[String]>,
    upper: Option<&[String]>,
) -> (String, Vec<String>) {
    let key = types
        .iter()
        .map(|(k, _)| format!("t.{}", tide_core::plan::quote_ident(k)))
        .collect::<Vec<_>>()
        .join(", ");
    let texts = types
        .iter()
        .map(|(k, _)| format!("t.{}::pg_catalog.text", tide_core::plan::quote_ident(k)))
        .collect::<Vec<_>>()
        .join(", ");
    let mut clauses = Vec::new();
    let mut params = Vec::new();
    for (bound, op) in [(lower, ">"), (upper, "<=")] {
        if let Some(values) = bound {
            let ps = types
                .iter()
                .enumerate()
                .map(|(i, (_, ty))| format!("${}::{ty}", params.len() + i + 1))
                .collect::<Vec<_>>()
                .join(", ");
            params.extend(values.iter().cloned());
            clauses.push(format!("({key}) {op} ({ps})"));
        }
    }
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    (
        format!("SELECT {texts} FROM {} t{filter}", t.qualified()),
        params,
    )
}
