//! Table targets: ordered upserts and deletes into a table in this database (`table`) or in a
//! remote PostgreSQL (`postgres`).
//!
//! Owns: turning events into set-based statements, keeping the target tables' shapes in step
//! with the source (schema changes), and the applied position of remote targets.
//!
//! Guarantees:
//! - Order: each table's events are applied in stream order, so per-key order is source
//!   commit order. Within one target transaction (a batch of whole source transactions) the
//!   statements are grouped per table: each table has at most one open run of upserts or of
//!   deletes. Upserts of one table with the same column set become one
//!   `INSERT ... SELECT FROM jsonb_populate_recordset ... ON CONFLICT (key) DO UPDATE` as long as
//!   no key repeats; deletes one `DELETE ... USING`. A repeated key, a delete after upserts of
//!   the same table or the other way round, or another column set, closes the table's run
//!   first. Every upsert is applied (none is merged into another; a key deleted twice in one
//!   run is deleted once). Tables are independent in a target transaction, so statements of
//!   different tables may run in another order than the source's: what a reader sees at commit
//!   is the same. (Constraints between target tables must therefore be `DEFERRABLE INITIALLY
//!   DEFERRED`.)
//! - Unchanged TOAST columns are left out of the statement: the target keeps its value.
//! - Least privilege: a local target's statements (writes and schema changes) run as the
//!   pipeline's owner in a security-restricted operation: a right revoked after `add_table`
//!   makes the pipeline fail with the permission error; nothing is written anyway.
//! - Atomicity: local targets are written in the worker's transaction; remote targets in one
//!   remote transaction per batch of whole source transactions (two when a backfill chunk's rows
//!   follow stream events in the batch: the events are committed first, see
//!   `Sink::commit_early`), each together with the applied position (`<schema>.tide_applied`).
//!   A reader of the target never sees half of a source transaction, across tables too.
//! - Schema changes: before the first event that needs it, a new source column is added to the
//!   target and a safe type widening is applied (`schema_changes = 'propagate'`, the default);
//!   anything else — or any change under `schema_changes = 'pause'` — pauses the pipeline with
//!   the reason and the remedy. Nothing is applied past the change until then.

use crate::catalog::PipelineRow;
use crate::error::{TideError, TideResult};
use crate::sink::remote::{conninfo_from_options, RemoteError, RemoteSink, RemoteStatement};
use crate::sink::Event;
use crate::sql;
use pgrx::spi::SpiClient;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tide_core::lsn::Lsn;
use tide_core::model::{Op, RelDesc, TargetKind};

/// Events per statement at most.
const RUN_ROWS: usize = 1000;
/// How long the worker waits for the remote to answer one batch.
const REMOTE_TIMEOUT: Duration = Duration::from_secs(60);

/// What to do when the source's shape changes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SchemaPolicy {
    Propagate,
    Pause,
}

impl SchemaPolicy {
    pub fn parse(s: &str) -> Option<SchemaPolicy> {
        match s {
            "propagate" => Some(SchemaPolicy::Propagate),
            "pause" => Some(SchemaPolicy::Pause),
            _ => None,
        }
    }
}

/// Where one source table goes.
#[derive(Clone, Debug)]
struct Target {
    schema: String,
    name: String,
    key: Vec<String>,
}

impl Target {
    fn qualified(&self) -> String {
        format!("{}.{}", quote(&self.schema), quote(&self.name))
    }
}

enum RunKind {
    Upsert { cols: Vec<String> },
    Delete,
}

struct Run {
    relid: u32,
    kind: RunKind,
    items: Vec<String>,
    /// The keys in `items` (a key appears once per run).
    keys: HashSet<String>,
}

/// A table target (local or remote).
pub struct TableSink {
    pipeline: String,
    /// The pipeline's owner: local target statements run as this role, security-restricted
    /// (`security::as_owner`), so a target is only ever written as its owner could by hand.
    owner: pgrx::pg_sys::Oid,
    policy: SchemaPolicy,
    remote_schema: String,
    remote: Option<RemoteSink>,
    targets: HashMap<u32, Target>,
    /// Target table (qualified) → its columns and types, as last read.
    shapes: HashMap<String, Vec<(String, String)>>,
    /// Source relations whose shape was checked against their target since the last reset.
    checked: HashSet<u32>,
    /// At most one open run per source table, in the order they were opened.
    runs: Vec<Run>,
    remote_stmts: Vec<RemoteStatement>,
    remote_applied: Option<Option<Lsn>>,
    remote_ready: bool,
}

fn quote(ident: &str) -> String {
    pgrx::spi::quote_identifier(ident)
}

fn remote_err(e: RemoteError) -> TideError {
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
            "The target is unreachable or restarting; the worker retries with back-off and nothing is lost meanwhile (the slot keeps the WAL).".to_string()
        } else {
            "Fix the target table (see the message), then the worker retries by itself.".to_string()
        }
    }))
}

/// Read the foreign server's and the user mapping's options and build a conninfo.
pub fn conninfo_for_server(server: &str, role: &str) -> TideResult<String> {
    let rows = sql::text_rows(
        "SELECT o.k, o.v FROM (
             SELECT split_part(x, '=', 1) AS k, substr(x, length(split_part(x, '=', 1)) + 2) AS v
               FROM pg_foreign_server s, unnest(s.srvoptions) x WHERE s.srvname = $1
             UNION ALL
             SELECT split_part(x, '=', 1), substr(x, length(split_part(x, '=', 1)) + 2)
               FROM pg_user_mappings m, unnest(m.umoptions) x
              WHERE m.srvname = $1 AND m.umid = (
                    SELECT m2.umid FROM pg_user_mappings m2
                     WHERE m2.srvname = $1 AND (m2.usename = $2 OR m2.usename = 'public')
                     ORDER BY m2.usename = 'public' LIMIT 1)
         ) o",
        &[Some(server), Some(role)],
        0,
        false,
    )?;
    let opts: Vec<(String, String)> = rows
        .into_iter()
        .map(|r| {
            (
                r[0].clone().unwrap_or_default(),
                r[1].clone().unwrap_or_default(),
            )
        })
        .collect();
    Ok(conninfo_from_options(&opts))
}

impl TableSink {
    pub fn new(p: &PipelineRow) -> TideResult<TableSink> {
        let opt = |k: &str| {
            p.options
                .get(k)
                .and_then(|v| v.as_str())
                .map(str::to_string)
        };
        let policy = SchemaPolicy::parse(opt("schema_changes").as_deref().unwrap_or("propagate"))
            .unwrap_or(SchemaPolicy::Propagate);
        let remote = if p.target == TargetKind::Postgres {
            let server = opt("server").ok_or_else(|| {
                TideError::invalid(format!("pipeline \"{}\" has no server option", p.name))
            })?;
            let conninfo = conninfo_for_server(&server, &p.owner)?;
            Some(RemoteSink::start(conninfo, &format!("pg_tide {}", p.name)))
        } else {
            None
        };
        let owner = crate::security::owner_oid(&p.owner, &format!("pipeline \"{}\"", p.name))?;
        Ok(TableSink {
            owner,
            pipeline: p.name.clone(),
            policy,
            remote_schema: opt("schema").unwrap_or_else(|| "public".to_string()),
            remote,
            targets: HashMap::new(),
            shapes: HashMap::new(),
            checked: HashSet::new(),
            runs: Vec::new(),
            remote_stmts: Vec::new(),
            remote_applied: None,
            remote_ready: false,
        })
    }

    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    pub fn reset(&mut self) {
        self.shapes.clear();
        self.checked.clear();
        self.runs.clear();
        self.remote_stmts.clear();
        self.remote_applied = None;
        self.remote_ready = false;
    }

    fn applied_table(&self) -> String {
        format!("{}.tide_applied", quote(&self.remote_schema))
    }

    pub fn begin(&mut self, c: &mut SpiClient<'_>, pipeline: &str) -> TideResult<()> {
        self.targets.clear();
        let rows = c.select(
            "SELECT relid::int8, target_schema, target_name, to_json(key_columns)::text
               FROM tide.pipeline_table WHERE pipeline = $1 AND target_name IS NOT NULL",
            None,
            &[pipeline.into()],
        )?;
        for r in rows {
            let relid = r.get::<i64>(1)?.unwrap_or(0) as u32;
            let key: Vec<String> =
                serde_json::from_str(&r.get::<String>(4)?.unwrap_or_default()).unwrap_or_default();
            self.targets.insert(
                relid,
                Target {
                    schema: r.get::<String>(2)?.unwrap_or_default(),
                    name: r.get::<String>(3)?.unwrap_or_default(),
                    key,
                },
            );
        }
        if let Some(remote) = &self.remote {
            if !self.remote_ready {
                remote
                    .query(
                        &format!("CREATE SCHEMA IF NOT EXISTS {}", quote(&self.remote_schema)),
                        vec![],
                        REMOTE_TIMEOUT,
                    )
                    .map_err(remote_err)?;
                remote
                    .query(
                        &format!(
                            "CREATE TABLE IF NOT EXISTS {} (pipeline text PRIMARY KEY, applied_lsn pg_lsn NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
                            self.applied_table()
                        ),
                        vec![],
                        REMOTE_TIMEOUT,
                    )
                    .map_err(remote_err)?;
                self.remote_ready = true;
            }
        }
        Ok(())
    }

    pub fn remote_applied(&mut self) -> TideResult<Option<Lsn>> {
        let Some(remote) = &self.remote else {
            return Ok(None);
        };
        if let Some(a) = self.remote_applied {
            return Ok(a);
        }
        let rows = remote
            .query(
                &format!(
                    "SELECT applied_lsn::text FROM {} WHERE pipeline = $1",
                    self.applied_table()
                ),
                vec![Some(self.pipeline.clone())],
                REMOTE_TIMEOUT,
            )
            .map_err(remote_err)?;
        let a = rows
            .first()
            .and_then(|r| r.first().cloned().flatten())
            .and_then(|s| s.parse::<Lsn>().ok());
        self.remote_applied = Some(a);
        Ok(a)
    }

    /// A new description of a source relation: check its target before any event uses it.
    pub fn relation(
        &mut self,
        c: &mut SpiClient<'_>,
        relid: u32,
        _rel: &RelDesc,
    ) -> TideResult<()> {
        self.checked.remove(&relid);
        if self.targets.contains_key(&relid) {
            self.ensure_shape(c, relid)?;
        }
        Ok(())
    }

    fn target_columns(
        &mut self,
        c: &mut SpiClient<'_>,
        t: &Target,
    ) -> TideResult<Vec<(String, String)>> {
        let q = t.qualified();
        if let Some(s) = self.shapes.get(&q) {
            return Ok(s.clone());
        }
        let sql_text = "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod)
                          FROM pg_attribute a
                         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
                         ORDER BY a.attnum";
        let rows = match &self.remote {
            Some(r) => r
                .query(sql_text, vec![Some(q.clone())], REMOTE_TIMEOUT)
                .map_err(remote_err)?,
            None => {
                let _ = c;
                sql::text_rows(sql_text, &[Some(&q)], 0, true)?
            }
        };
        let cols: Vec<(String, String)> = rows
            .into_iter()
            .map(|r| {
                (
                    r[0].clone().unwrap_or_default(),
                    r[1].clone().unwrap_or_default(),
                )
            })
            .collect();
        if cols.is_empty() {
            return Err(TideError::undefined(format!("target table {q} does not exist"))
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
        let relid_text = relid.to_string();
        // (name, type, value existing rows have for a column added with a default)
        let source: Vec<(String, String, Option<String>)> = sql::text_rows(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod),
                    CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END
               FROM pg_attribute a
              WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
              ORDER BY a.attnum",
            &[Some(&relid_text)],
            0,
            true,
        )?
        .into_iter()
        .map(|r| (r[0].clone().unwrap_or_default(), r[1].clone().unwrap_or_default(), r[2].clone()))
        .collect();
        let target = self.target_columns(c, &t)?;
        let mut ddl = Vec::new();
        let mut refused = Vec::new();
        for (name, ty, missing) in &source {
            match target.iter().find(|(n, _)| n == name) {
                None => {
                    // Rows that existed when the source column was added have its default
                    // without any change in the WAL; so do insert events decoded before the
                    // column existed and applied after it was added here. The target column
                    // keeps that value as its default, so both get it.
                    let stmts = match missing {
                        Some(v) => vec![format!(
                            "ALTER TABLE {} ADD COLUMN {} {ty} DEFAULT {}::{ty}",
                            t.qualified(),
                            quote(name),
                            pgrx::spi::quote_literal(v)
                        )],
                        None => vec![format!(
                            "ALTER TABLE {} ADD COLUMN {} {ty}",
                            t.qualified(),
                            quote(name)
                        )],
                    };
                    ddl.push((stmts, format!("add column {name} {ty}")))
                }
                Some((_, tty)) if tty == ty => {}
                Some((_, tty)) if holds(tty, ty) => {} // the target is already at least as wide
                Some((_, tty)) if holds(ty, tty) => ddl.push((
                    vec![format!(
                        "ALTER TABLE {} ALTER COLUMN {} TYPE {ty}",
                        t.qualified(),
                        quote(name)
                    )],
                    format!("widen column {name} from {tty} to {ty}"),
                )),
                Some((_, tty)) => refused.push(format!(
                    "column {name} changed from {tty} to {ty}, which is not a safe widening"
                )),
            }
        }
        if !refused.is_empty() || (self.policy == SchemaPolicy::Pause && !ddl.is_empty()) {
            let mut all: Vec<String> = ddl.iter().map(|(_, d)| d.clone()).collect();
            all.extend(refused);
            let mut e = TideError::prerequisite(format!(
                "the source of target {} changed shape: {}",
                t.qualified(),
                all.join("; ")
            ))
            .hint(format!(
                "The pipeline is paused before the first change that needs the new shape. Change {} to match the source, then SELECT tide.resume_pipeline('{}'); it resumes from the same place.",
                t.qualified(),
                self.pipeline
            ));
            e.pause_pipeline = true;
            return Err(e);
        }
        if !ddl.is_empty() {
            // The target's shape once the DDL below is applied (remote DDL only runs at the
            // batch's commit, so the cache must not be re-read before then).
            let mut shape = target.clone();
            for (name, ty, _) in &source {
                match shape.iter_mut().find(|(n, _)| n == name) {
                    Some(col) if holds(ty, &col.1) => col.1 = ty.clone(),
                    Some(_) => {}
                    None => shape.push((name.clone(), ty.clone())),
                }
            }
            self.shapes.insert(t.qualified(), shape);
        }
        for (stmts, _) in ddl {
            self.flush_all(c)?;
            for stmt in stmts {
                match &self.remote {
                    Some(_) => self.remote_stmts.push(RemoteStatement {
                        sql: stmt,
                        params: vec![],
                    }),
                    None => {
                        crate::security::as_owner(self.owner, || {
                            c.update(stmt.as_str(), None, &[])?;
                            Ok(())
                        })?;
                    }
                }
            }
        }
        self.checked.insert(relid);
        Ok(())
    }

    pub fn push(&mut self, c: &mut SpiClient<'_>, ev: Event) -> TideResult<()> {
        let Some(target) = self.targets.get(&ev.relid).cloned() else {
            // Not a table this pipeline writes (cannot happen for captured tables).
            return Ok(());
        };
        if !self.checked.contains(&ev.relid) {
            self.ensure_shape(c, ev.relid)?;
        }
        let relid = ev.relid;
        match ev.op {
            Op::Truncate => {
                // Whatever the batch holds for the table is wiped anyway; apply it first so the
                // statements stay in stream order for this table.
                self.flush_run(c, relid)?;
                self.exec(c, format!("TRUNCATE {}", target.qualified()), None)?;
            }
            Op::Delete => {
                let key = ev.key.unwrap_or_default();
                let fits = self
                    .runs
                    .iter()
                    .find(|r| r.relid == relid)
                    .is_none_or(|r| matches!(r.kind, RunKind::Delete));
                if !fits {
                    self.flush_run(c, relid)?;
                }
                let r = self.run_for(relid, RunKind::Delete);
                // Deleting a key twice in a row is deleting it once.
                if r.keys.insert(key.clone()) {
                    r.items.push(key);
                }
            }
            Op::Insert | Op::Update | Op::Read => {
                let key = ev.key.unwrap_or_default();
                let row = ev.row.unwrap_or_default();
                let cols = ev.columns;
                // One statement cannot write a key twice (ON CONFLICT DO UPDATE refuses to).
                let fits = self.runs.iter().find(|r| r.relid == relid).is_none_or(|r| {
                    matches!(&r.kind, RunKind::Upsert { cols: rc } if *rc == cols)
                        && !r.keys.contains(&key)
                });
                if !fits {
                    self.flush_run(c, relid)?;
                }
                let r = self.run_for(relid, RunKind::Upsert { cols });
                r.keys.insert(key);
                r.items.push(row);
            }
        }
        if self
            .runs
            .iter()
            .any(|r| r.relid == relid && r.items.len() >= RUN_ROWS)
        {
            self.flush_run(c, relid)?;
        }
        Ok(())
    }

    /// The open run of `relid`, opened with `kind` if there is none.
    fn run_for(&mut self, relid: u32, kind: RunKind) -> &mut Run {
        let i = match self.runs.iter().position(|r| r.relid == relid) {
            Some(i) => i,
            None => {
                self.runs.push(Run {
                    relid,
                    kind,
                    items: Vec::new(),
                    keys: HashSet::new(),
                });
                self.runs.len() - 1
            }
        };
        &mut self.runs[i]
    }

    /// Write every open run.
    fn flush_all(&mut self, c: &mut SpiClient<'_>) -> TideResult<()> {
        while let Some(relid) = self.runs.first().map(|r| r.relid) {
            self.flush_run(c, relid)?;
        }
        Ok(())
    }

    fn exec(
        &mut self,
        c: &mut SpiClient<'_>,
        stmt: String,
        param: Option<String>,
    ) -> TideResult<()> {
        match &self.remote {
            Some(_) => {
                self.remote_stmts.push(RemoteStatement {
                    sql: stmt,
                    params: param.into_iter().map(Some).collect(),
                });
            }
            None => {
                crate::security::as_owner(self.owner, || {
                    match param {
                        Some(p) => c.update(stmt.as_str(), None, &[p.into()])?,
                        None => c.update(stmt.as_str(), None, &[])?,
                    };
                    Ok(())
                })?;
            }
        }
        Ok(())
    }

    /// Write the open run of `relid`, if any.
    fn flush_run(&mut self, c: &mut SpiClient<'_>, relid: u32) -> TideResult<()> {
        let Some(i) = self.runs.iter().position(|r| r.relid == relid) else {
            return Ok(());
        };
        let run = self.runs.remove(i);
        if run.items.is_empty() {
            return Ok(());
        }
        let Some(t) = self.targets.get(&run.relid).cloned() else {
            return Ok(());
        };
        let tq = t.qualified();
        let mut json =
            String::with_capacity(run.items.iter().map(|s| s.len() + 1).sum::<usize>() + 2);
        json.push('[');
        for (i, item) in run.items.iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push_str(item);
        }
        json.push(']');
        let keys = t
            .key
            .iter()
            .map(|k| quote(k))
            .collect::<Vec<_>>()
            .join(", ");
        let stmt = match &run.kind {
            RunKind::Delete => {
                let on = t
                    .key
                    .iter()
                    .map(|k| format!("t.{0} = d.{0}", quote(k)))
                    .collect::<Vec<_>>()
                    .join(" AND ");
                format!("DELETE FROM {tq} t USING jsonb_populate_recordset(NULL::{tq}, $1::text::jsonb) d WHERE {on}")
            }
            RunKind::Upsert { cols } => {
                let list = cols.iter().map(|c| quote(c)).collect::<Vec<_>>().join(", ");
                let select = cols
                    .iter()
                    .map(|c| format!("r.{}", quote(c)))
                    .collect::<Vec<_>>()
                    .join(", ");
                let set: Vec<String> = cols
                    .iter()
                    .filter(|c| !t.key.contains(c))
                    .map(|c| format!("{0} = EXCLUDED.{0}", quote(c)))
                    .collect();
                let action = if set.is_empty() {
                    "NOTHING".to_string()
                } else {
                    format!("UPDATE SET {}", set.join(", "))
                };
                format!(
                    "INSERT INTO {tq} AS t ({list}) SELECT {select} FROM jsonb_populate_recordset(NULL::{tq}, $1::text::jsonb) r ON CONFLICT ({keys}) DO {action}"
                )
            }
        };
        self.exec(c, stmt, Some(json))
    }

    pub fn finish(
        &mut self,
        c: &mut SpiClient<'_>,
        pipeline: &str,
        applied: Option<Lsn>,
    ) -> TideResult<()> {
        self.flush_all(c)?;
        let Some(remote) = &self.remote else {
            return Ok(());
        };
        if self.remote_stmts.is_empty() && applied.is_none() {
            return Ok(());
        }
        let mut stmts = std::mem::take(&mut self.remote_stmts);
        if let Some(a) = applied {
            stmts.push(RemoteStatement {
                sql: format!(
                    "INSERT INTO {} AS a (pipeline, applied_lsn) VALUES ($1, $2::text::pg_lsn)
                     ON CONFLICT (pipeline) DO UPDATE SET applied_lsn = greatest(a.applied_lsn, excluded.applied_lsn), applied_at = now()",
                    self.applied_table()
                ),
                params: vec![Some(pipeline.to_string()), Some(a.to_string())],
            });
        }
        match remote.transaction(stmts, REMOTE_TIMEOUT) {
            Ok(_) => {
                if let Some(a) = applied {
                    self.remote_applied = Some(Some(a));
                }
                Ok(())
            }
            Err(e) => {
                self.remote_applied = None;
                self.shapes.clear();
                self.checked.clear();
                Err(remote_err(e))
            }
        }
    }
}

/// Whether type `wide` can hold every value of type `narrow` (so `narrow → wide` is a safe
/// widening). Types are `format_type` strings.
pub fn holds(wide: &str, narrow: &str) -> bool {
    if wide == narrow {
        return true;
    }
    let int_digits = |t: &str| match t {
        "smallint" => Some(5),
        "integer" => Some(10),
        "bigint" => Some(19),
        _ => None,
    };
    let numeric = |t: &str| -> Option<Option<(u32, u32)>> {
        if t == "numeric" {
            return Some(None);
        }
        let inner = t.strip_prefix("numeric(")?.strip_suffix(')')?;
        let mut it = inner.split(',');
        let p = it.next()?.trim().parse().ok()?;
        let s = it
            .next()
            .map(|s| s.trim().parse().ok())
            .unwrap_or(Some(0))?;
        Some(Some((p, s)))
    };
    let varchar = |t: &str| -> Option<Option<u32>> {
        if t == "character varying" {
            return Some(None);
        }
        t.strip_prefix("character varying(")?
            .strip_suffix(')')?
            .parse()
            .ok()
            .map(Some)
    };
    match (wide, narrow) {
        ("text", n) if n == "text" || varchar(n).is_some() || n.starts_with("character(") => true,
        ("double precision", "real") => true,
        ("double precision", n) if n == "smallint" || n == "integer" => true,
        (w, n) if int_digits(w).is_some() && int_digits(n).is_some() => {
            int_digits(w) >= int_digits(n)
        }
        (w, n) if numeric(w).is_some() => match (numeric(w), int_digits(n), numeric(n)) {
            (Some(None), Some(_), _) | (Some(None), _, Some(_)) => true,
            (Some(Some((p, s))), Some(d), _) => p.saturating_sub(s) >= d,
            (Some(Some((wp, ws))), _, Some(Some((np, ns)))) => {
                ws >= ns && wp.saturating_sub(ws) >= np.saturating_sub(ns)
            }
            _ => false,
        },
        (w, n) if varchar(w).is_some() && varchar(n).is_some() => match (varchar(w), varchar(n)) {
            (Some(None), _) => true,
            (Some(Some(a)), Some(Some(b))) => a >= b,
            _ => false,
        },
        _ => false,
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::holds;
    use pgrx::prelude::*;

    #[pg_test]
    fn widening_rules() {
        assert!(holds("bigint", "integer"));
        assert!(!holds("integer", "bigint"));
        assert!(holds("numeric(12,2)", "integer"));
        assert!(!holds("numeric(10,2)", "integer"));
        assert!(holds("numeric", "bigint"));
        assert!(holds("numeric(14,4)", "numeric(12,2)"));
        assert!(!holds("numeric(12,4)", "numeric(12,2)"));
        assert!(holds("text", "character varying(20)"));
        assert!(holds("character varying(30)", "character varying(20)"));
        assert!(!holds("character varying(10)", "character varying(20)"));
        assert!(holds("double precision", "real"));
        assert!(!holds("integer", "text"));
    }
}
