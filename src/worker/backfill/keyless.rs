//! The backfill of a table without a key (`REPLICA IDENTITY FULL`, README "Tables without a
//! key"): one copy of the whole table, applied at one point of the stream.
//!
//! Such a table has no key to read it by in chunks, nor to drop changed rows by, so the watermark
//! algorithm ([`super`]) does not apply. Instead, at the start of an iteration (an
//! iteration boundary: every source transaction committed before the applied position `P` has
//! been applied, none after), the worker reads the whole table in **one statement**, whose
//! snapshot `S` it reads in the same statement (`pg_current_snapshot()`), with the WAL insert
//! position after it (`until`), under the table's `AccessShareLock` taken before the snapshot
//! (`tx::run_locked`'s MVCC caveat). Then:
//!
//! 1. **The retake check.** A transaction whose commit record precedes `P` can still show as
//!    running in `S` (its commit has not left the process array yet; long under synchronous
//!    replication): the stream applied it, the copy misses it, and the copy replaces the
//!    table: it would be lost. So the copy is taken only when no transaction the stream
//!    delivered for the table in this process is in progress for `S`
//!    (`tide_core::snapshot::copy_misses`), and no transaction `S` treats as in progress is
//!    committed in the commit log and still in the process array (`chunk::committed_invisible`;
//!    it covers the transactions decoded before the table was captured or by an earlier worker
//!    process). Otherwise nothing is written, `tide.backfills` says it waits, and the next
//!    iteration reads the copy again with a new snapshot.
//! 2. **The copy.** In the iteration's transaction (the target's, for a table target in this
//!    database or the outbox; a remote target commits it in its own transaction with the applied
//!    position, before the worker's): the backfill is marked done with `S` and `until`
//!    (`catalog::backfills::keyless_copied`), then the target's rows of the table are replaced:
//!    a table target gets a `DELETE` of the table's rows and an insert per row; the outbox a `resync`
//!    start event, a `read` event per row and a `resync` end event, at position `P` (xid 0); a
//!    kafka target the same as messages (the `resync` ones on every partition of the topic).
//! 3. **The stream after it** skips the table's changes in every transaction the copy holds:
//!    committed before `until` and seen by `S` (`tide_core::snapshot::KeylessCopy::holds`, by
//!    top-level xid), for as long as the applied position is before `until`
//!    (`catalog::backfills::keyless_copies`, read at each iteration).
//!
//! Every backfill of such a table is this copy: `tide.add_table`'s and `tide.start_backfill`'s,
//! the resync after a lost slot (it replaces the target's rows, which is what a resync needs)
//! and `tide.repair`'s (`api::verify`); one with a condition or a keyed repair's deletes cannot
//! be, and fails (`catalog::backfills`).
//!
//! Guarantees: a crash or a failed iteration before the worker's commit leaves neither the copy
//! nor its record (the copy is read again, with a new snapshot, at the next boundary); after it,
//! the record and the copy are both there and the replayed stream skips what the copy holds. A
//! remote target that committed the copy while the worker's transaction then failed gets the copy
//! again at the next iteration (it replaces the table: nothing twice). Cost: the copy is read in
//! one statement, held in the worker's memory and written in one iteration; the stream waits
//! meanwhile, and the snapshot holds back the server's xmin (vacuum) for the read's duration.
//! The residual gap the check cannot see: a transaction committed before the table's add marker
//! (or decoded by an earlier worker process) that is still between its commit record and its
//! commit-log update when the copy is read, and leaves the process array before the check.

use super::chunk::{committed_invisible, value};
use super::meta::table_meta;
use super::Backfiller;
use crate::catalog::backfills::{self, KeylessDue};
use crate::catalog::pipelines::PipelineRow;
use crate::catalog::tables::TableRow;
use crate::error::{TideError, TideResult};
use crate::sql;
use crate::target::{Change, Event, Kind, ResyncMark, Row, RowForm, Target};
use crate::worker::stream_apply::StreamApply;
use pgrx::pg_sys;
use pgrx::spi::SpiClient;
use std::collections::HashMap;
use std::time::Duration;
use tide_core::json;
use tide_core::lsn::Lsn;
use tide_core::model::{Op, OwnedColumn, RelDesc, Txn};
use tide_core::snapshot::{InvisibleXids, KeylessCopy};
use tide_core::wire::Tuple;

/// At an iteration's start, before anything is decoded (everything before `applied` is applied,
/// nothing after): copy the pipeline's next due table without a key ([`copy_due`]), then the
/// copies whose transactions the stream skips in this iteration, by table. A pipeline none of
/// whose `tables` (the captured ones) is without a key has neither: not looked for (three
/// statements an iteration saved).
pub(crate) fn at_start(
    c: &mut SpiClient<'_>,
    (p, tables): (&PipelineRow, &[TableRow]),
    bf: &mut Backfiller,
    sink: &mut dyn Target,
    decoder: &mut crate::worker::decoder::Decoder,
    applied: Lsn,
    notes: &mut Vec<String>,
) -> TideResult<HashMap<u32, KeylessCopy>> {
    if !tables.iter().any(|t| t.keyless) {
        return Ok(HashMap::new());
    }
    notes.extend(copy_due(c, p, bf, sink, &mut decoder.streams, applied)?);
    Ok(backfills::keyless_copies(&p.name, applied)?
        .into_iter()
        .collect())
}

/// Copy the pipeline's next due table without a key, if any, at position `at` (the applied
/// position: the iteration has not decoded anything yet). Notes for the log.
fn copy_due(
    c: &mut SpiClient<'_>,
    p: &PipelineRow,
    bf: &mut Backfiller,
    sink: &mut dyn Target,
    streams: &mut StreamApply,
    at: Lsn,
) -> TideResult<Vec<String>> {
    let Some(due) = backfills::keyless_due(&p.name)? else {
        return Ok(Vec::new());
    };
    if bf.copy_held(due.id) {
        return Ok(Vec::new());
    }
    // SAFETY: takes a lock in the iteration's transaction, held to its end; only tried.
    let locked = unsafe {
        pg_sys::ConditionalLockRelationOid(
            pg_sys::Oid::from(due.relid),
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
        )
    };
    if !locked {
        bf.hold_copy(due.id, Duration::from_millis(200));
        return Ok(Vec::new());
    }
    let Some(read) = read_copy(&p.name, &due)? else {
        return Ok(Vec::new());
    };
    // The retake check (see the module header).
    let delivered = bf.copy_missed(due.relid, &read.invisible);
    let running = committed_invisible(&read.invisible, None, true);
    if delivered.is_some() || running > 0 {
        let why = match delivered {
            Some(x) => format!("transaction {x}, which the stream already applied"),
            None => format!("{running} transaction(s) committed in the log"),
        };
        let waiting = format!(
            "waiting: the copy's snapshot does not yet see {why}; the table is copied again with a new snapshot"
        );
        if !bf.hold_copy(due.id, Duration::from_millis(50)) {
            return Ok(Vec::new());
        }
        backfills::note_waiting(due.id, &waiting, "A transaction has committed but is still waiting (for example for a synchronous standby); the copy is taken once it is visible.")?;
        return Ok(vec![format!(
            "the copy of {} (backfill {}) is read again: its snapshot does not yet see {why}",
            read.relation, due.id
        )]);
    }
    let n = read.rows.len();
    if !backfills::keyless_copied(due.id, n as i64, &read.snapshot, read.until, at)? {
        return Ok(Vec::new());
    }
    bf.copy_taken(due.id);
    // The delete below would wait for the row locks a streamed transaction holds at a remote.
    streams.fall_back_all();
    write_copy(
        c,
        sink,
        crate::target::kind(p.target),
        due.id,
        due.relid,
        read,
        at,
    )?;
    Ok(vec![format!(
        "copied {n} rows of a table without a key (backfill {}) at {at}",
        due.id
    )])
}

/// A keyless table read whole in one statement.
struct CopyRead {
    relation: String,
    columns: Vec<OwnedColumn>,
    /// Each row's columns as text output, masked as the stream masks them.
    rows: Vec<Vec<Option<String>>>,
    snapshot: String,
    invisible: InvisibleXids,
    until: Lsn,
}

/// Read the table of `due` in one statement, as the pipeline's owner: its rows (row filter and
/// masks applied, as the stream applies them), the statement's snapshot and the WAL insert
/// position after it. `None` when the table is gone (the backfill fails, with the reason).
fn read_copy(pipeline: &str, due: &KeylessDue) -> TideResult<Option<CopyRead>> {
    let Some(mut meta) = table_meta(due.relid, &[])? else {
        let e = TideError::undefined(format!(
            "the table of backfill {} (OID {}) no longer exists",
            due.id, due.relid
        ))
        .hint("Remove it from the pipeline with tide.remove_table, or cancel the backfill.");
        backfills::fail(
            due.id,
            &e.message,
            &e.sqlstate(),
            e.hint.as_deref().unwrap_or(""),
        )?;
        return Ok(None);
    };
    let (row_filter, _) = crate::catalog::tables::shaping(pipeline, due.relid)?;
    let masks = crate::catalog::masks::of_table(pipeline, due.relid)?;
    let layout = masks.as_ref().map(|(m, _)| meta.mask(m));
    let owner = crate::security::owner_oid(&due.owner, &format!("backfill {}", due.id))?;
    if let Some(e) =
        crate::security::read_problem(owner, pg_sys::Oid::from(due.relid), &meta.relation)
    {
        return Err(e);
    }
    if let Some(f) = &row_filter {
        crate::row_filter::check_text(pg_sys::Oid::from(due.relid), &meta.relation, f, owner)?;
    }
    let cols = meta
        .columns
        .iter()
        .map(|(c, _)| super::chunk::quote(&c.name))
        .collect::<Vec<_>>()
        .join(", ");
    let filter = row_filter
        .as_deref()
        .map(|f| format!(" WHERE (\n{f}\n)"))
        .unwrap_or_default();
    // One statement, one snapshot: its text and the WAL position come with the rows (one row
    // of NULLs, `present` NULL, when the table has none).
    let query = format!(
        "SELECT pg_catalog.pg_current_snapshot()::pg_catalog.text, pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text, r.*
           FROM (SELECT) AS one LEFT JOIN (SELECT true AS present, {cols} FROM {}{filter}) AS r ON true",
        meta.scan
    );
    let ncols = meta.columns.len() as i32;
    let (snapshot, until, rows) = crate::security::as_owner(owner, || {
        sql::with_rows(&query, &[], 0, true, |result| {
            let mut rows = Vec::with_capacity(result.len());
            let (mut snapshot, mut until) = (None, None);
            for i in 0..result.len() {
                if snapshot.is_none() {
                    snapshot = result.text(i, 1);
                    until = result.text(i, 2);
                }
                if result.text(i, 3).is_none() {
                    continue;
                }
                rows.push((4..4 + ncols).map(|col| result.text(i, col)).collect());
            }
            Ok((snapshot, until, rows))
        })
    })?;
    let mut rows: Vec<Vec<Option<String>>> = rows;
    if let (Some(layout), Some((_, salt))) = (&layout, &masks) {
        for r in &mut rows {
            for (t, m) in r.iter_mut().zip(layout) {
                if let Some(m) = m {
                    *t = m.apply(salt, t.as_deref());
                }
            }
        }
    }
    let snapshot = snapshot.unwrap_or_default();
    let invisible = InvisibleXids::parse(&snapshot).ok_or_else(|| {
        TideError::internal(format!("cannot read the copy's snapshot {snapshot:?}"))
    })?;
    let until = until
        .and_then(|u| u.parse::<Lsn>().ok())
        .ok_or_else(|| TideError::internal("cannot read the WAL position after the copy"))?;
    Ok(Some(CopyRead {
        relation: meta.relation.clone(),
        columns: meta.columns.into_iter().map(|(c, _)| c).collect(),
        rows,
        snapshot,
        invisible,
        until,
    }))
}

/// Replace the target's rows of table `relid` by the copy, at position `at` (xid 0): a table
/// target's by a `DELETE` and inserts; the outbox and a kafka target get a `resync` start (drop
/// the rows of the table you hold), the rows as `read` events and a `resync` end.
fn write_copy(
    c: &mut SpiClient<'_>,
    sink: &mut dyn Target,
    kind: &'static Kind,
    id: i64,
    relid: u32,
    read: CopyRead,
    at: Lsn,
) -> TideResult<()> {
    let rel = RelDesc {
        qualified: read.relation.clone(),
        columns: read.columns.clone(),
    };
    sink.describe(c, relid, &rel)?;
    let mut t = Txn {
        xid: 0,
        lsn: at,
        // SAFETY: reads the clock.
        commit_time: unsafe { pg_sys::GetCurrentTimestamp() },
        skip: false,
        position: 0,
        barrier: false,
    };
    let names: Vec<String> = read.columns.iter().map(|c| c.name.clone()).collect();
    let form = sink.row_form(relid, None)?.per_row();
    let render_err =
        |e: json::RenderError| TideError::internal(format!("cannot render a copied row: {e}"));
    if kind.tableless.is_none() {
        // A table target: empty the table, then one insert per row (duplicates stay). A
        // `DELETE` (a truncate with a predicate that holds for every row), not a `TRUNCATE`:
        // rows inserted after a `TRUNCATE` in the same transaction were seen landing in the
        // relation's old file, dropped at the commit, when the worker had just started
        // (`pg_test/tests/table_target/keyless.rs`, the copy killed midway).
        t.position += 1;
        let ev = Event {
            only_where: Some("true".to_string()),
            ..Event::bare(relid, read.relation.clone(), Op::Truncate, None)
        };
        sink.push(c, &t, ev)?;
        for texts in read.rows {
            t.position += 1;
            let ev = Event {
                row: Row::Text(texts),
                columns: names.clone(),
                ..Event::bare(relid, read.relation.clone(), Op::Insert, None)
            };
            sink.push(c, &t, ev)?;
        }
        return Ok(());
    }
    // The outbox and kafka: `resync` start (drop the rows you hold), the rows as `read`, `resync`
    // end. The outbox takes them as events; kafka as its resync messages (on every partition
    // of the table's topic) around the rows (which, without a key, all go to one partition).
    let mark = |start| CopyMark {
        kind,
        id,
        relid,
        relation: &read.relation,
        start,
    };
    mark(true).push(c, sink, &mut t)?;
    for texts in read.rows {
        let row = if form == RowForm::Text {
            Row::Text(texts)
        } else {
            let tuple = Tuple {
                values: texts.iter().map(value).collect(),
            };
            let mut row = String::new();
            json::render_row(&read.columns, &tuple, &mut row).map_err(render_err)?;
            Row::Json(row)
        };
        t.position += 1;
        let ev = Event {
            row,
            columns: names.clone(),
            backfill: Some((id, 1)),
            ..Event::bare(relid, read.relation.clone(), Op::Read, None)
        };
        sink.push(c, &t, ev)?;
    }
    mark(false).push(c, sink, &mut t)?;
    Ok(())
}

/// A `resync` start or end around the rows of a keyless table's copy (outbox or kafka).
struct CopyMark<'a> {
    kind: &'static Kind,
    id: i64,
    relid: u32,
    relation: &'a str,
    start: bool,
}

impl CopyMark<'_> {
    fn push(&self, c: &mut SpiClient<'_>, sink: &mut dyn Target, t: &mut Txn) -> TideResult<()> {
        let payload = if self.start {
            serde_json::json!({
                "phase": "start",
                "reason": "backfill of a table without a key: drop the rows of the table you hold, its rows follow as read events",
            })
        } else {
            serde_json::json!({"phase": "end", "complete": true})
        }
        .to_string();
        if self.kind.resync_marks {
            // Kafka's resync messages, on every partition of the table's topic.
            let m = ResyncMark {
                relid: self.relid,
                relation: self.relation.to_string(),
                payload,
            };
            sink.send(c, t, Change::Resync(&[m]))?;
            return Ok(());
        }
        t.position += 1;
        let ev = Event {
            row: Row::Json(payload),
            backfill: Some((self.id, 1)),
            ..Event::bare(self.relid, self.relation.to_string(), Op::Resync, None)
        };
        sink.push(c, t, ev)
    }
}
