//! One writer per target (DESIGN, point 9): a remote target belongs to one server, and a pipeline
//! of the same name on any other server never commits a write there unless its owner's lease
//! lapsed or a DBA moved the target (`tide.claim_target`). As Kafka fences a zombie producer by
//! its transactional id's epoch.
//!
//! Production and a copy of it (a base backup, a restore, a clone started beside it, a standby
//! promoted while the primary still runs) share the system identifier, the timeline, the catalog
//! and the pipeline's name: nothing copied tells them apart. What differs is that each server
//! process started at its own time, and that production is alive. So:
//!
//! - **The writer** is the server's database: `<system identifier>:<postmaster start, µs since
//!   2000>:<database OID>:<timeline>` ([`writer_token`]). A worker restarted, the server's crash restart (the
//!   postmaster stays) and a lost slot's resync keep it; a server started again, a copy, a
//!   restore (into another server, or by `pg_restore` into another database of the same one)
//!   and a promoted standby each have a new one.
//! - **The row** `<schema>.tide_applied` (one per pipeline name) records, besides the applied
//!   position, the owning `writer`, its `epoch`, and its lease: `renewed_at` (the target's clock)
//!   and `lease` (the owner's `tide.target_lease`). A row without a writer (written before this
//!   version, or never owned) belongs to no one.
//! - **Taking** ([`Fence::acquire`], at the start of an iteration): one `UPDATE` that succeeds
//!   when the writer already owns the row at its epoch (a renewal), or the row has no writer, or
//!   is this server's (a new worker process of it: same epoch), or the owner's lease lapsed (a
//!   takeover: epoch + 1). Otherwise the pipeline fails with SQLSTATE 55006 and the owner in the
//!   message, and retries: a promoted standby or a restore whose old primary is gone takes over
//!   after at most the lease, with no manual step; a copy beside a running production never does.
//!   A takeover by a pipeline that is resyncing (its slot was lost: a failover, a restore) sets
//!   the row's applied position to 0/0: the old owner's position is in another WAL history, and
//!   the resync reads every table again anyway. A takeover by a pipeline whose slot came with it
//!   (a failover slot synchronised to a promoted standby, PostgreSQL 17 and later) keeps the
//!   position when this server's history holds it: the writer token names the timeline it
//!   wrote on, and the position is at or before the point where this server's timeline left
//!   that one (`diverged`; with `synchronized_standby_slots` on the old primary, nothing
//!   reached the target before the standby had it, so it always is). Otherwise the position is
//!   reset and the pipeline marks its slot lost and resyncs.
//! - **Every write is fenced** ([`Fence::commit_step`]): the last statement of every remote
//!   transaction is `UPDATE ... WHERE writer = me AND epoch = mine RETURNING`, which also raises
//!   the applied position and renews the lease; no row back rolls the transaction back
//!   (`RemoteStep::Fence`). The row lock it takes orders it with a takeover or a claim: whichever
//!   commits first wins, and a writer whose epoch moved never commits a write.
//! - **A writer that lost the target** (its fence or renewal found another owner or epoch)
//!   pauses its pipeline with the error (55006) and the remedy; it forgets its epoch, so a resume
//!   after `tide.claim_target` takes the target again.
//! - **Renewals**: every commit; at an iteration's start when a third of the lease has passed;
//!   while paused ([`Fence::keep`], the paused worker looks every third of the lease); a failing
//!   worker retries at least that often. An iteration that runs longer than the lease without a
//!   commit (a very large source transaction applied at its commit) can let a running copy take
//!   the target: production then pauses, fenced, and nothing of the copy's or production's is
//!   committed twice; a DBA claims it back.
//!
//! What is not fenced: tables in the source database (outbox, `table` targets) belong to that
//! database and move with it; a kafka target is fenced by Kafka itself (its transactional id,
//! `target::kafka::client`), with no lease (README, Limitations).

use crate::catalog::pipelines::PipelineRow;
use crate::error::{TideError, TideResult};
use crate::target::remote::{RemoteSink, RemoteStatement, RemoteStep};
use pgrx::pg_sys;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use std::time::{Duration, Instant};
use tide_core::lsn::Lsn;

/// The columns ownership adds to `tide_applied` (tables made before this version get them).
pub const COLUMNS: &[(&str, &str)] = &[
    ("writer", "text"),
    ("epoch", "bigint NOT NULL DEFAULT 0"),
    ("renewed_at", "timestamptz"),
    ("lease", "interval"),
];

/// This server's writer token for this database: its system identifier, its postmaster's start
/// time (µs since 2000-01-01) and the database's OID, the same in every process of the server
/// connected to the database until the server is started again. The database is part of it
/// because a `pg_dump` of the database restored into another database of the same server (a new
/// OID) is a copy too, and must not write where the original does.
pub fn writer_token() -> String {
    // SAFETY: GetSystemIdentifier reads the control file's copy in shared memory, set before
    // any backend starts; PgStartTime is set once by the postmaster before it forks any child
    // and never written again (a crash restart keeps it); MyDatabaseId is set once this process
    // connected to its database, before any pipeline code runs.
    let (sysid, started, db) = unsafe {
        (
            pg_sys::GetSystemIdentifier(),
            pg_sys::PgStartTime,
            pg_sys::MyDatabaseId.to_u32(),
        )
    };
    format!("{sysid}:{started}:{db}:{}", timeline())
}

/// The timeline this server writes WAL on (0 while in recovery).
fn timeline() -> u32 {
    // SAFETY: reads shared state set at the end of recovery; not called before it is over.
    unsafe {
        if pg_sys::RecoveryInProgress() {
            0
        } else {
            pg_sys::GetWALInsertionTimeLine()
        }
    }
}

/// PostgreSQL's timeline history (`access/timeline.h`), which pgrx does not bind.
mod c {
    use pgrx::pg_sys;
    #[repr(C)]
    pub struct TimeLineHistoryEntry {
        pub tli: pg_sys::TimeLineID,
        pub begin: pg_sys::XLogRecPtr,
        pub end: pg_sys::XLogRecPtr,
    }
    // SAFETY: the signature of `readTimeLineHistory` in access/timeline.h, the same in 15-18;
    // it may raise an ERROR, so it is only called through `pg_guard_ffi_boundary`.
    unsafe extern "C-unwind" {
        pub fn readTimeLineHistory(target: pg_sys::TimeLineID) -> *mut pg_sys::List;
    }
}

/// Where this server's history (its current timeline's) left timeline `tli`: the position up to
/// which its WAL and timeline `tli`'s are the same; None when `tli` is not in its history.
fn timeline_end(tli: u32) -> Option<u64> {
    let current = timeline();
    if current == 0 {
        return None;
    }
    // SAFETY: reads the timeline history files of pg_wal into a list in the current memory
    // context (an ERROR becomes a Rust panic at the boundary); the entries are read at once.
    unsafe {
        let history = pg_sys::ffi::pg_guard_ffi_boundary(move || c::readTimeLineHistory(current));
        let len = if history.is_null() {
            0
        } else {
            (*history).length
        };
        for i in 0..len {
            let e = pg_sys::list_nth(history, i) as *const c::TimeLineHistoryEntry;
            if !e.is_null() && (*e).tli == tli {
                // The current timeline's entry ends at "infinity" (0).
                return Some(if (*e).end == 0 { u64::MAX } else { (*e).end });
            }
        }
        None
    }
}

/// Whether the target's applied position, written by `old` (another writer of this system),
/// may count WAL this server never had: `old` wrote on a timeline this server left (a
/// failover) and the position is past the point where this server's history left it, or on a
/// timeline outside this server's history. The reason, if so. A writer of another system, or
/// of a token without a timeline (before 0.4.0), or of this same timeline (the server started
/// again), is left as before (README, Concepts > One writer per target).
fn diverged(mine: &str, old: &str, applied: Lsn) -> Option<String> {
    let old_parts: Vec<&str> = old.split(':').collect();
    let my_parts: Vec<&str> = mine.split(':').collect();
    if old_parts.len() < 4 || my_parts.len() < 4 || old_parts[0] != my_parts[0] {
        return None;
    }
    let old_tli = old_parts[3].parse::<u32>().ok()?;
    let my_tli = my_parts[3].parse::<u32>().ok()?;
    if old_tli == 0 || my_tli == 0 || old_tli >= my_tli || applied.0 == 0 {
        return None;
    }
    match timeline_end(old_tli) {
        Some(end) if applied.0 <= end => None,
        Some(end) => Some(format!(
            "the remote target's applied position {applied} (written on timeline {old_tli}) is past {}, where this server's history left timeline {old_tli}: the target may hold changes this server never had (a failover to a standby that had not received them)",
            Lsn(end)
        )),
        None => Some(format!(
            "the remote target's applied position {applied} was written on timeline {old_tli}, which is not in this server's history (timeline {my_tli})"
        )),
    }
}

/// The lease as an interval's text.
fn lease_text(lease: Duration) -> String {
    format!("{} seconds", lease.as_secs())
}

/// A writer token as a message shows it, from SQL: `system identifier X, server started T`.
fn shown_writer_sql(column: &str) -> String {
    format!(
        "CASE WHEN {column} IS NULL THEN 'no writer' ELSE 'the server with system identifier ' OPERATOR(pg_catalog.||) pg_catalog.split_part({column}, ':', 1)
              OPERATOR(pg_catalog.||) ' started at ' OPERATOR(pg_catalog.||) (pg_catalog.to_timestamp(pg_catalog.split_part({column}, ':', 2)::pg_catalog.float8 OPERATOR(pg_catalog./) 1000000 OPERATOR(pg_catalog.+) 946684800))::pg_catalog.text
              OPERATOR(pg_catalog.||) CASE WHEN pg_catalog.split_part({column}, ':', 3) OPERATOR(pg_catalog.<>) '' THEN ', database OID ' OPERATOR(pg_catalog.||) pg_catalog.split_part({column}, ':', 3) ELSE '' END END"
    )
}

/// `ALTER TABLE` adding the ownership columns to an older `tide_applied` (`table`, quoted).
pub fn add_columns_sql(table: &str) -> String {
    let adds = COLUMNS
        .iter()
        .map(|(name, ty)| format!("ADD COLUMN IF NOT EXISTS {name} {ty}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("ALTER TABLE {table} {adds}")
}

/// How many of the ownership columns `table` (its text, for `regclass`) has.
pub const COUNT_COLUMNS_SQL: &str =
    "SELECT pg_catalog.count(*)::pg_catalog.text FROM pg_catalog.pg_attribute
  WHERE attrelid OPERATOR(pg_catalog.=) $1::pg_catalog.regclass AND NOT attisdropped
    AND attname OPERATOR(pg_catalog.=) ANY ('{writer,epoch,renewed_at,lease}'::pg_catalog.name[])";

/// The row of a pipeline, created without a writer if missing.
fn insert_sql(table: &str) -> String {
    format!(
        "INSERT INTO {table} (pipeline, applied_lsn) VALUES ($1, '0/0') ON CONFLICT (pipeline) DO NOTHING"
    )
}

/// The owner of the row as a message shows it, its epoch, its lease's end, and whether the
/// lease still runs (by the target's clock).
fn owner_sql(table: &str) -> String {
    format!(
        "SELECT {}, epoch::pg_catalog.text, (renewed_at OPERATOR(pg_catalog.+) lease)::pg_catalog.text, writer
           FROM {table} WHERE pipeline OPERATOR(pg_catalog.=) $1",
        shown_writer_sql("writer")
    )
}

/// A pipeline's hold on its remote target (one per [`super::remote::Remote`], copied to its
/// streamed transactions' connections).
#[derive(Clone, Debug)]
pub struct Fence {
    /// This server ([`writer_token`]).
    writer: String,
    /// The epoch this writer holds, once it took or renewed the target.
    epoch: Option<i64>,
    /// When this writer last renewed its lease (here, by the worker's clock).
    renewed: Option<Instant>,
}

/// What [`Fence::acquire`] found.
pub struct Held {
    /// The applied position the row holds now.
    pub applied: Option<Lsn>,
}

impl Fence {
    pub fn new() -> Fence {
        Fence {
            writer: writer_token(),
            epoch: None,
            renewed: None,
        }
    }

    /// Whether the lease is to be renewed (or the target taken) before this iteration writes.
    pub fn due(&self) -> bool {
        match (self.epoch, self.renewed) {
            (Some(_), Some(at)) => at.elapsed() >= renew_every(),
            _ => true,
        }
    }

    /// Take the target or renew the lease (see the module doc), in a statement of its own;
    /// `resyncing`: the pipeline's slot was lost and every table is being read again.
    pub fn acquire(
        &mut self,
        sink: &RemoteSink,
        table: &str,
        p: &PipelineRow,
        timeout: Duration,
    ) -> TideResult<Held> {
        let remote = |e| super::remote_err(e);
        sink.query(&insert_sql(table), vec![Some(p.name.clone())], timeout)
            .map_err(remote)?;
        // A takeover after a failover keeps the target's applied position only when this
        // server's history holds it (see `diverged`); else the position is reset and the
        // pipeline resyncs, as after a lost slot.
        let divergence = if p.resync.is_some() || self.epoch.is_some() {
            None
        } else {
            let rows = sink
                .query(
                    &format!(
                        "SELECT writer, applied_lsn::pg_catalog.text FROM {table} WHERE pipeline OPERATOR(pg_catalog.=) $1"
                    ),
                    vec![Some(p.name.clone())],
                    timeout,
                )
                .map_err(remote)?;
            rows.into_iter().next().and_then(|r| {
                let mut r = r.into_iter();
                let old = r.next().flatten()?;
                let applied = r.next().flatten()?.parse::<Lsn>().ok()?;
                if old == self.writer {
                    return None;
                }
                diverged(&self.writer, &old, applied)
            })
        };
        let sql = format!(
            "UPDATE {table} AS a SET writer = $2,
                    epoch = CASE WHEN a.writer IS NOT DISTINCT FROM $2 THEN a.epoch ELSE a.epoch + 1 END,
                    applied_lsn = CASE WHEN a.writer IS DISTINCT FROM $2 AND $5::boolean THEN '0/0'::pg_lsn ELSE a.applied_lsn END,
                    renewed_at = pg_catalog.now(), lease = $3::interval
              WHERE a.pipeline = $1
                AND CASE WHEN $4::int8 IS NOT NULL THEN a.writer IS NULL OR (a.writer = $2 AND a.epoch = $4::int8)
                         ELSE a.writer IS NULL OR a.writer = $2 OR a.renewed_at IS NULL OR a.lease IS NULL
                              OR a.renewed_at + a.lease < pg_catalog.now() END
             RETURNING a.epoch::text, a.applied_lsn::text"
        );
        let rows = sink
            .query(
                &sql,
                vec![
                    Some(p.name.clone()),
                    Some(self.writer.clone()),
                    Some(lease_text(crate::gucs::target_lease())),
                    self.epoch.map(|e| e.to_string()),
                    Some((p.resync.is_some() || divergence.is_some()).to_string()),
                ],
                timeout,
            )
            .map_err(remote)?;
        let Some(row) = rows.into_iter().next() else {
            let lost = self.epoch.is_some();
            return Err(self.refused(sink, table, &p.name, lost, timeout));
        };
        let mut row = row.into_iter();
        let epoch = row
            .next()
            .flatten()
            .and_then(|e| e.parse::<i64>().ok())
            .ok_or_else(|| TideError::internal("the target's tide_applied returned no epoch"))?;
        let applied = row.next().flatten().and_then(|a| a.parse::<Lsn>().ok());
        self.epoch = Some(epoch);
        self.renewed = Some(Instant::now());
        if let Some(reason) = divergence {
            // Taken, with the applied position reset: every table is read again.
            let mut e = TideError::new(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("pipeline \"{}\" took its remote target over, and {reason}", p.name),
            )
            .detail(reason)
            .hint("Nothing to do: the pipeline marks its slot lost and reads every table again (a resync). To resume failovers without one, set synchronized_standby_slots on the primary (docs/high-availability.md).");
            e.slot_lost = true;
            return Err(e);
        }
        Ok(Held { applied })
    }

    /// Renew the lease of a target this writer holds (a paused pipeline's worker); nothing when
    /// it holds none. A refusal means the target was taken meanwhile: the epoch is forgotten.
    pub fn keep(
        &mut self,
        sink: &RemoteSink,
        table: &str,
        p: &PipelineRow,
        timeout: Duration,
    ) -> TideResult<()> {
        if self.epoch.is_none() || !self.due() {
            return Ok(());
        }
        self.acquire(sink, table, p, timeout).map(|_| ())
    }

    /// The last step of every remote transaction (see the module doc): raises the applied
    /// position to `applied` (when given) and renews the lease, only while this writer holds the
    /// target at its epoch.
    pub fn commit_step(
        &self,
        table: &str,
        pipeline: &str,
        applied: Option<Lsn>,
    ) -> TideResult<RemoteStep> {
        let Some(epoch) = self.epoch else {
            return Err(TideError::internal(
                "a remote transaction was about to commit before the worker took its target",
            ));
        };
        Ok(RemoteStep::Fence(RemoteStatement {
            sql: format!(
                "UPDATE {table} SET applied_lsn = greatest(applied_lsn, $4::pg_lsn),
                        applied_at = CASE WHEN $4 IS NULL THEN applied_at ELSE pg_catalog.now() END,
                        renewed_at = pg_catalog.now()
                  WHERE pipeline = $1 AND writer = $2 AND epoch = $3::int8
                 RETURNING epoch::text"
            ),
            params: vec![
                Some(pipeline.to_string()),
                Some(self.writer.clone()),
                Some(epoch.to_string()),
                applied.map(|a| a.to_string()),
            ],
        }))
    }

    /// A transaction of this writer committed: the lease was renewed with it.
    pub fn committed(&mut self) {
        self.renewed = Some(Instant::now());
    }

    /// The error of a writer that found its target taken (its fence rolled back a
    /// transaction): the pipeline pauses (see [`Fence::refused`]).
    pub fn lost(
        &mut self,
        sink: &RemoteSink,
        table: &str,
        pipeline: &str,
        timeout: Duration,
    ) -> TideError {
        self.refused(sink, table, pipeline, true, timeout)
    }

    /// Why this writer may not write the target: `lost`, it held the target and another writer
    /// took it (the pipeline pauses, and the epoch is forgotten); else another writer's lease
    /// runs (the worker retries). The owner is read again for the message.
    fn refused(
        &mut self,
        sink: &RemoteSink,
        table: &str,
        pipeline: &str,
        lost: bool,
        timeout: Duration,
    ) -> TideError {
        let owner = sink
            .query(&owner_sql(table), vec![Some(pipeline.to_string())], timeout)
            .ok()
            .and_then(|rows| rows.into_iter().next());
        let (who, epoch, until, token) = match owner {
            Some(r) => {
                let mut r = r.into_iter();
                (
                    r.next().flatten().unwrap_or_else(|| "no writer".into()),
                    r.next().flatten().unwrap_or_else(|| "?".into()),
                    r.next().flatten().unwrap_or_else(|| "now".into()),
                    r.next().flatten(),
                )
            }
            None => (
                "an unknown writer".into(),
                "?".into(),
                "unknown".into(),
                None,
            ),
        };
        let quoted = pipeline.replace('\'', "''");
        let detail = format!(
            "This server is writer \"{}\"; the target's row in {table} names writer \"{}\" at epoch {epoch}.",
            self.writer,
            token.unwrap_or_default()
        );
        self.epoch = None;
        self.renewed = None;
        if lost {
            let mut e = TideError::new(
                PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
                format!("pipeline \"{pipeline}\" was fenced: its remote target now belongs to {who} (epoch {epoch}), so nothing more of this server's is written there"),
            )
            .detail(detail)
            .hint(format!("Another server writes this target now (it called tide.claim_target, or took over after this server's lease lapsed); the pipeline is paused. If this server is the one the target must follow: SELECT tide.claim_target('{quoted}'); then SELECT tide.resume_pipeline('{quoted}'); (the other server's pipeline is then fenced). Otherwise drop this pipeline, or point it at another target."));
            e.pause_pipeline = true;
            return e;
        }
        TideError::new(
            PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
            format!("the remote target of pipeline \"{pipeline}\" belongs to {who}, whose lease runs until {until}: this server writes nothing there"),
        )
        .detail(detail)
        .hint(format!("This server is not the one that writes this target: a copy of the source (a base backup, a restore, a clone), or a standby promoted while the old primary still runs. It takes the target over by itself once the owner stops renewing its lease (tide.target_lease), as after a failover. To move the target to this server now (the other server's pipeline is then fenced): SELECT tide.claim_target('{quoted}');"))
    }
}

impl Default for Fence {
    fn default() -> Self {
        Fence::new()
    }
}

/// How often a writer renews its lease: a third of `tide.target_lease`.
pub fn renew_every() -> Duration {
    crate::gucs::target_lease() / 3
}

/// Take the target of pipeline `p` for this server at once, whatever its owner (the claim of
/// `tide.claim_target`): the epoch moves on unless this server owns it already, so the old
/// owner's next write is refused. A pipeline that is resyncing resets the applied position, as
/// a takeover does. Returns (the previous owner as a message shows it, the new epoch).
pub fn claim(
    sink: &RemoteSink,
    table: &str,
    p: &PipelineRow,
    timeout: Duration,
) -> TideResult<(String, i64)> {
    let remote = |e| super::remote_err(e);
    let writer = writer_token();
    let results = sink
        .transaction(
            vec![
                RemoteStatement {
                    sql: insert_sql(table),
                    params: vec![Some(p.name.clone())],
                },
                RemoteStatement {
                    sql: format!(
                        "SELECT {} FROM {table} WHERE pipeline = $1 FOR UPDATE",
                        shown_writer_sql("writer")
                    ),
                    params: vec![Some(p.name.clone())],
                },
                RemoteStatement {
                    sql: format!(
                        "UPDATE {table} AS a SET writer = $2,
                                epoch = CASE WHEN a.writer IS NOT DISTINCT FROM $2 THEN a.epoch ELSE a.epoch + 1 END,
                                applied_lsn = CASE WHEN a.writer IS DISTINCT FROM $2 AND $4::boolean THEN '0/0'::pg_lsn ELSE a.applied_lsn END,
                                renewed_at = pg_catalog.now(), lease = $3::interval
                          WHERE a.pipeline = $1
                         RETURNING a.epoch::text"
                    ),
                    params: vec![
                        Some(p.name.clone()),
                        Some(writer),
                        Some(lease_text(crate::gucs::target_lease())),
                        Some(p.resync.is_some().to_string()),
                    ],
                },
            ],
            timeout,
        )
        .map_err(remote)?;
    let first = |i: usize| {
        results
            .get(i)
            .and_then(|rows| rows.first())
            .and_then(|r| r.first().cloned().flatten())
    };
    let before = first(1).unwrap_or_else(|| "no writer".into());
    let epoch = first(2)
        .and_then(|e| e.parse::<i64>().ok())
        .ok_or_else(|| TideError::internal("the target's tide_applied returned no epoch"))?;
    Ok((before, epoch))
}
