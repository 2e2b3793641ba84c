//! Reading one backfill chunk (transaction 2 of the watermark algorithm; see
//! [`super`]): the keyset SELECT as the backfill's owner, in the chunk's snapshot,
//! under the table's lock, then the high watermark.
//!
//! Owns: the chunk's query, the snapshot facts the reconciliation needs (transactions in
//! progress), a repair's and a resync's deletes (a remote target's from the keys it holds:
//! [`sweep_deletes`]), the rewrite check, and how the rows are held until the high
//! watermark: as JSON text (one event per row, for every target), or, for a target in this
//! database that has the table's columns with the same types, as row values of the source's
//! row type ([`RowValues`]: no text output, no JSON, one upsert), or, for a target in another
//! PostgreSQL that has them, as lines of COPY text (each column's text output, escaped:
//! `tide_core::copy`; no JSON, one COPY and one upsert at the target). The form is a
//! `RowForm` the target chose ([`form_for`]); each is rendered by one arm of [`Renderer::row`].
//! A table with column masks is read as text and every row masked as it is read
//! ([`ChunkQuery::mask_row`], the stream's function: `tide_core::mask`), never as row values.

use super::estimate::Estimate;

use super::meta::{reader, table_meta, ChunkMeta, TableMeta};
use super::row_values::RowValues;
use crate::catalog::{backfills, chunks};
use crate::error::{TideError, TideResult};
use crate::sql;
use crate::target::{KeyValues, Row, RowForm};
use crate::worker::tx;
use pgrx::prelude::*;
use tide_core::json;
use tide_core::mask::Mask;
use tide_core::model::OwnedColumn;
use tide_core::read_ahead::{Chunk, ChunkRow};
use tide_core::snapshot::InvisibleXids;
use tide_core::wire::{Tuple, Value};

/// A chunk as read: its rows in the form the target asked for, with what the reconciliation
/// needs (`tide_core::read_ahead::Chunk`, the same value a reader process sends), its row
/// values in this process's memory.
pub(super) type ChunkRead = Chunk<RowValues>;

/// The chunk's SELECT, and what its rows are rendered with.
struct ChunkQuery {
    sql: String,
    /// Its parameters: the previous chunk's last key.
    args: Vec<String>,
    /// The source's columns, in attribute order.
    columns: Vec<OwnedColumn>,
    /// Each key column's place in `columns`, in key order.
    key_idx: Vec<usize>,
    /// Each key column's `format_type`, in key order.
    key_types: Vec<String>,
    /// The table's row filter: a row it does not pass is not at the source as the pipeline
    /// sees it (a repair or a resync sweep deletes it at the target).
    row_filter: Option<String>,
    /// Each column's mask (empty: none), and the pipeline's salt.
    masks: Vec<Option<Mask>>,
    salt: Vec<u8>,
}

impl ChunkQuery {
    /// Mask a row read as text (every column, in order): the same function as the stream's.
    fn mask_row(&self, texts: &mut [Option<String>]) {
        for (t, m) in texts.iter_mut().zip(&self.masks) {
            if let Some(m) = m {
                *t = m.apply(&self.salt, t.as_deref());
            }
        }
    }
}

impl ChunkQuery {
    /// The keyset SELECT of `job`'s next chunk of `meta` for rows held as `form`: every column
    /// in attribute order, or, for row values, the key columns then the whole row.
    fn new(
        pipeline: &str,
        job: &Job,
        meta: &TableMeta,
        form: RowForm,
        row_filter: Option<&str>,
    ) -> TideResult<ChunkQuery> {
        let relation = &meta.relation;
        let columns: Vec<OwnedColumn> = meta.columns.iter().map(|(c, _)| c.clone()).collect();
        let mut key_types = Vec::new();
        for k in &job.b.key_columns {
            let Some((_, ty)) = meta.columns.iter().find(|(c, _)| &c.name == k) else {
                return Err(TideError::prerequisite(format!("key column \"{k}\" of {relation} no longer exists"))
                    .hint(format!("Remove and re-add the table: SELECT tide.remove_table('{pipeline}', {r}); SELECT tide.add_table('{pipeline}', {r}).", r = tide_core::plan::quote_literal(relation))));
            };
            key_types.push(ty.clone());
        }
        let key_idx: Vec<usize> = job
            .b
            .key_columns
            .iter()
            .filter_map(|k| columns.iter().position(|c| &c.name == k))
            .collect();
        let key_list = job
            .b
            .key_columns
            .iter()
            .map(|k| quote(k))
            .collect::<Vec<_>>()
            .join(", ");
        let select_list = if form == RowForm::RowValues {
            format!("{key_list}, {}", meta.relname)
        } else {
            columns
                .iter()
                .map(|c| quote(&c.name))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut sql = format!("SELECT {select_list} FROM {}", meta.scan);
        let mut clauses = Vec::new();
        let mut args = Vec::new();
        if let Some(last) = &job.b.last_key {
            let params = key_types
                .iter()
                .enumerate()
                .map(|(i, t)| format!("${}::{t}", i + 1))
                .collect::<Vec<_>>()
                .join(", ");
            clauses.push(format!("({key_list}) > ({params})"));
            args.extend(last.iter().cloned());
        }
        if let Some(to) = &job.b.to_key {
            // A planned chunk (several readers of the table): up to its planned bound.
            let params = key_types
                .iter()
                .enumerate()
                .map(|(i, t)| format!("${}::{t}", args.len() + i + 1))
                .collect::<Vec<_>>()
                .join(", ");
            clauses.push(format!("({key_list}) <= ({params})"));
            args.extend(to.iter().cloned());
        }
        if let Some(cond) = &job.b.condition {
            // On lines of its own: a trailing `--` comment in it ends before the `)`.
            clauses.push(format!("(\n{cond}\n)"));
        }
        if let Some(f) = row_filter {
            // The table's row filter (checked by `row_filter::check_text` before every chunk):
            // the same one expression the output plugin filters the stream with.
            clauses.push(format!("(\n{f}\n)"));
        }
        if !clauses.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&clauses.join(" AND "));
        }
        sql.push_str(&format!(" ORDER BY {key_list} LIMIT {}", row_limit(&job.b)));
        Ok(ChunkQuery {
            sql,
            args,
            columns,
            key_idx,
            key_types,
            row_filter: row_filter.map(str::to_string),
            masks: Vec::new(),
            salt: Vec::new(),
        })
    }
}

/// The most rows a chunk of `b` reads: its chunk size (capped while the stream is busy:
/// [`backfills::Due::rows_per_chunk`]), or, for a planned chunk (a key range planned to hold
/// that many, [`backfills::Due::to_key`]), twice that: keys inserted into the range since it
/// was planned are read too, up to that many (then the chunk ends at its last row read, see
/// [`chunk_end`]).
fn row_limit(b: &backfills::Due) -> i64 {
    if b.to_key.is_some() {
        b.rows_per_chunk().saturating_mul(2)
    } else {
        b.rows_per_chunk()
    }
}

/// Where a chunk of `b` that read `rows` ends (its key range is after `b.last_key` up to this
/// key, inclusive): its planned bound when it read its whole range, else its last row's key
/// (`b.last_key` when it read none). The next chunk of the backfill starts after it.
pub(super) fn chunk_end(b: &backfills::Due, rows: &[ChunkRow]) -> Option<Vec<String>> {
    match &b.to_key {
        Some(to) if (rows.len() as i64) < row_limit(b) => Some(to.clone()),
        _ => rows
            .last()
            .map(|r| r.key_values.clone())
            .or_else(|| b.last_key.clone()),
    }
}

/// Transaction 2: SELECT the chunk (snapshot taken after the LW commit) and write the HW. The
/// rows are held in the form `hold` says for the table as it is now (row values also need the
/// table's name as its whole-row reference: when a column has that name, they are held as text
/// instead).
///
/// `writer` is the worker's iteration transaction when a reader reads the chunk while it runs
/// (see `read_ahead`): it is in the chunk's snapshot's list of transactions in progress, and may
/// commit before the check below, but it writes no source table, so it does not hold the chunk.
pub(super) fn read_chunk(
    pipeline: &str,
    job: &Job,
    hold: &mut dyn FnMut(&TableMeta) -> TideResult<RowForm>,
    writer: Option<u32>,
) -> TideResult<ChunkRead> {
    let Some(ChunkMeta {
        table: meta,
        row_filter,
        listed,
        masks,
    }) = ChunkMeta::gather(pipeline, job.b.relid, &job.b.key_columns)?
    else {
        return Err(TideError::undefined(format!(
            "the table of backfill {} (OID {}) no longer exists",
            job.b.id, job.b.relid
        ))
        .hint("Remove it from the pipeline with tide.remove_table, or cancel the backfill."));
    };
    // A column list: only those columns are read, held and written (row values, a whole-row
    // reference, would carry them all: such a chunk is held as text). Masks: applied to each
    // row read, as text (row values would carry the clear values).
    let mut form = hold(&meta)?;
    if form == RowForm::RowValues
        && (listed
            || masks.is_some()
            || meta
                .columns
                .iter()
                .any(|(c, _)| quote(&c.name) == meta.relname))
    {
        form = RowForm::Text;
    }
    let mut q = ChunkQuery::new(pipeline, job, &meta, form, row_filter.as_deref())?;
    if let Some((layout, salt)) = masks {
        q.masks = layout;
        q.salt = salt;
    }
    // SAFETY: reads the clock; no pointer; main thread.
    let read_at = unsafe { pg_sys::GetCurrentTimestamp() };
    let (snapshot, invisible) = chunk_snapshot(writer)?;
    let owner = reader(&job.b, &meta, row_filter.as_deref())?;
    let (rows, values) = read_rows(&q, &meta, form, owner)?;
    // A planned chunk is never the last: the chunk after its bound decides that.
    let is_last = job.b.to_key.is_none() && (rows.len() as i64) < job.b.rows_per_chunk();
    let candidates = match (&job.b.repair_deletes, &job.b.sweep) {
        (Some(list), _) => Some(Candidates::Listed(list)),
        (None, Some(target)) => Some(Candidates::Target(target)),
        (None, None) => None,
    };
    let deletes = match candidates {
        Some(candidates) => {
            let to = if is_last {
                None
            } else {
                chunk_end(&job.b, &rows)
            };
            repair_deletes(job, &meta, &q, candidates, to.as_deref(), owner)?
        }
        None => Vec::new(),
    };
    check_not_rewritten(pipeline, job, &meta)?;
    let estimate = if is_last {
        Estimate::default()
    } else {
        // Whole-table backfills only: a condition or a repair reads part of the key range.
        let whole =
            job.b.condition.is_none() && job.b.repair_deletes.is_none() && row_filter.is_none();
        let last = rows.last().and_then(|r| r.key_values.first());
        super::estimate::take(
            job.b.relid,
            &meta.scan,
            &job.b.key_columns,
            &q.key_types,
            whole,
            last,
            owner,
        )?
    };
    chunks::write_high_watermark(pipeline, job.watermark, job.b.id, job.b.chunk_no, is_last)?;
    Ok(Chunk {
        form,
        invisible,
        snapshot,
        estimate,
        deletes,
        relation: meta.relation.clone(),
        columns: meta.shape(),
        rows,
        values,
        attnums: meta.attnums.clone(),
        is_last,
        read_at,
    })
}

/// The chunk's snapshot (the transaction's, like the SELECT: both run read-only), and the
/// transactions it cannot see; an error to retry when one of those has already committed.
///
/// Its in-progress transactions may include one whose commit record is already in the WAL before
/// the low watermark (PostgreSQL makes a transaction visible only after writing its commit
/// record); such a transaction is invisible to the chunk although the stream delivers it before
/// the window opens, so its keys are dropped from the chunk wherever it appears. Every xid at or
/// after the snapshot's xmax is invisible too, without being listed: one whose commit record
/// just preceded the low watermark can be among them.
fn chunk_snapshot(writer: Option<u32>) -> TideResult<(String, InvisibleXids)> {
    let snapshot =
        sql::one::<String>("SELECT pg_current_snapshot()::text", &[])?.unwrap_or_default();
    let invisible = InvisibleXids::parse(&snapshot).ok_or_else(|| {
        TideError::internal(format!("cannot read the chunk's snapshot {snapshot:?}"))
    })?;
    // A transaction already committed in the log (and in the commit log) but not yet visible,
    // e.g. waiting for a synchronous standby: the stream may already have delivered it, so its
    // keys cannot be dropped from this chunk. Do not read the chunk now; try again shortly.
    let committed_invisible = committed_invisible(&invisible, writer, false);
    if committed_invisible > 0 {
        return Err(TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("{committed_invisible} {NOT_VISIBLE_YET}"),
        )
        .hint("A transaction has committed but is still waiting (for example for a synchronous standby); the chunk is read again once it is visible.")
        .retry_later());
    }
    Ok((snapshot, invisible))
}

/// How many transactions a snapshot with `invisible` treats as in progress although the commit
/// log already says they committed (their commit record is in the WAL, so the stream may have
/// delivered them: e.g. one waiting for a synchronous standby), `writer` (the worker's own
/// iteration, see [`read_chunk`]) aside. pg_xact_status() reports such a transaction as "in
/// progress" (it asks the process array first), so this asks the commit log itself. For xids
/// from xmax on (not listed), only those still in the process array count (the others
/// committed after the snapshot). `running`: listed ones only when still in the process array
/// too (the keyless copy's retake check, `worker::backfill::keyless`, looks after its whole read, when
/// listed ones that committed after the snapshot are no sign of a gap).
pub(super) fn committed_invisible(
    invisible: &InvisibleXids,
    writer: Option<u32>,
    running: bool,
) -> usize {
    // SAFETY: reads the shared next transaction id under its own lock; main thread.
    let newest = unsafe { pg_sys::ReadNextFullTransactionId() }.value;
    let after_xmax = invisible.xmax_full.map_or(0..0, |x| x..newest.max(x));
    invisible
        .listed
        .iter()
        .filter(|&&x| Some(x) != writer)
        .filter(|&&x| {
            let xid = pg_sys::TransactionId::from(x);
            // SAFETY: TransactionIdDidCommit and TransactionIdIsInProgress take any xid and read
            // the commit log and the process array under their own locks (an xid whose commit-log
            // page is gone is an ERROR, not UB); these are the snapshot's in-progress xids, newer
            // than its xmin; main thread.
            unsafe {
                pg_sys::TransactionIdDidCommit(xid)
                    && (!running || pg_sys::TransactionIdIsInProgress(xid))
            }
        })
        .count()
        // The range holds the xids assigned after the newest completed one: at most the
        // transactions running now (a few hundred on a busy server). The cap only bounds the
        // work should that ever not hold; past it, xids are not checked.
        + after_xmax
            .take(100_000)
            .filter(|&x| Some(x as u32) != writer)
            .filter(|&x| {
                let xid = pg_sys::TransactionId::from(x as u32);
                // SAFETY: as above; these xids lie between the snapshot's xmax and the next
                // transaction id, so each was assigned; main thread.
                unsafe {
                    pg_sys::TransactionIdDidCommit(xid) && pg_sys::TransactionIdIsInProgress(xid)
                }
            })
            .count()
}

/// A chunk's rows, and their values when held as row values (with the attribute numbers they
/// were read with).
type ReadRows = (Vec<ChunkRow>, Option<(RowValues, Vec<i32>)>);

/// The chunk's rows, read as `owner` under the chunk timeout, each rendered in `form` (and the
/// row values, for [`RowForm::RowValues`]).
fn read_rows(
    q: &ChunkQuery,
    meta: &TableMeta,
    form: RowForm,
    owner: pg_sys::Oid,
) -> TideResult<ReadRows> {
    let mut render = Renderer::new(form)?;
    let timeout_ms = crate::gucs::CHUNK_TIMEOUT_MS.get().max(10);
    let nkeys = q.key_idx.len();
    let args: Vec<Option<&str>> = q.args.iter().map(|a| Some(a.as_str())).collect();
    crate::security::as_owner(owner, || {
        tx::arm_timeout(timeout_ms);
        let r = sql::with_rows(&q.sql, &args, 0, false, |result| {
            let mut rows = Vec::with_capacity(result.len());
            for i in 0..result.len() {
                // Row values: the key columns come first (in key order) and are all that is
                // read as text; otherwise every column, in attribute order.
                let ncols = if form == RowForm::RowValues {
                    nkeys as i32
                } else {
                    result.columns()
                };
                let mut texts: Vec<Option<String>> =
                    (1..=ncols).map(|col| result.text(i, col)).collect();
                if form != RowForm::RowValues {
                    q.mask_row(&mut texts);
                }
                rows.push(render.row(q, &texts, i as u32)?);
            }
            let values = if form == RowForm::RowValues {
                Some((
                    RowValues::copy(result, nkeys as i32 + 1, meta.row_type)?,
                    meta.attnums.clone(),
                ))
            } else {
                None
            };
            Ok((rows, values))
        });
        tx::disarm_timeout();
        r
    })
}

/// Renders a chunk's rows in one form.
struct Renderer {
    form: RowForm,
    /// jsonb's input function and its parameter, for [`RowForm::Jsonb`].
    jsonb_in: Option<(pg_sys::FmgrInfo, pg_sys::Oid)>,
}

impl Renderer {
    fn new(form: RowForm) -> TideResult<Renderer> {
        let jsonb_in = (form == RowForm::Jsonb).then(|| {
            let mut f = pg_sys::InvalidOid;
            let mut param = pg_sys::InvalidOid;
            // SAFETY: a catalog lookup of a built-in type; fmgr_info fills the struct it is
            // given (in the current memory context, the transaction's).
            unsafe {
                let mut info: pg_sys::FmgrInfo = std::mem::zeroed();
                pg_sys::getTypeInputInfo(pg_sys::JSONBOID, &mut f, &mut param);
                pg_sys::fmgr_info(f, &mut info);
                (info, param)
            }
        });
        Ok(Renderer { form, jsonb_in })
    }

    /// Row `i` of the chunk, read as `texts` (every column, or the key columns only for row
    /// values).
    fn row(&mut self, q: &ChunkQuery, texts: &[Option<String>], i: u32) -> TideResult<ChunkRow> {
        let render_err =
            |e: json::RenderError| TideError::internal(format!("cannot render a chunk row: {e}"));
        let by_key = self.form == RowForm::RowValues;
        let tuple = if by_key {
            // Key columns at their places, the rest NULL: enough to render the key.
            let mut values = vec![Value::Null; q.columns.len()];
            for (k, &ci) in q.key_idx.iter().enumerate() {
                values[ci] = value(&texts[k]);
            }
            Tuple { values }
        } else {
            Tuple {
                values: texts.iter().map(value).collect(),
            }
        };
        let mut key = String::new();
        json::render_key(&q.columns, &tuple, &mut key).map_err(render_err)?;
        let row = match self.form {
            RowForm::RowValues => Row::Value(i),
            RowForm::CopyText => {
                let mut line = String::new();
                tide_core::copy::push_row(&mut line, texts.iter().map(Option::as_deref));
                Row::Copy(line)
            }
            RowForm::Text => Row::Text(texts.to_vec()),
            RowForm::Json | RowForm::Jsonb => {
                let mut row = String::new();
                json::render_row(&q.columns, &tuple, &mut row).map_err(render_err)?;
                match self.jsonb_in.as_mut() {
                    Some((f, param)) => Row::Jsonb(parse_jsonb(f, *param, row)?),
                    None => Row::Json(row),
                }
            }
        };
        let key_values = (0..q.key_idx.len())
            .map(|k| {
                let at = if by_key { k } else { q.key_idx[k] };
                texts[at].clone().unwrap_or_default()
            })
            .collect();
        Ok(ChunkRow {
            key,
            key_values,
            row,
        })
    }
}

/// The keys a chunk may delete (see [`repair_deletes`]).
enum Candidates<'a> {
    /// A repair's: a JSON array of key value arrays.
    Listed(&'a str),
    /// A resync's sweep at a local table target: every key that table (quoted, qualified)
    /// holds. Read in the chunk's snapshot too: the target is written only by this pipeline, so a
    /// stale row (its delete was in the WAL of a lost slot) is there in every snapshot until it
    /// is deleted, and a key the target got after the snapshot is not read.
    Target(&'a str),
}

/// A repair or a resync: keys of `candidates` to delete that lie in this chunk's key range
/// (after the previous chunk's last key, up to `to`) and, in this same snapshot, no longer exist
/// at the source. They are emitted as deletes at the high watermark unless the stream touches
/// them in the window (then the stream carries the truth, as for rows).
fn repair_deletes(
    job: &Job,
    meta: &TableMeta,
    q: &ChunkQuery,
    candidates: Candidates<'_>,
    to: Option<&[String]>,
    owner: pg_sys::Oid,
) -> TideResult<Vec<(String, KeyValues)>> {
    let keys = &job.b.key_columns;
    let (from, list) = match candidates {
        Candidates::Listed(list) => (
            "jsonb_array_elements($1::text::jsonb) AS k(v)".to_string(),
            Some(list),
        ),
        Candidates::Target(target) => (format!("{target} AS k"), None),
    };
    let elems: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| match list {
            Some(_) => format!("(k.v->>{i})::{}", q.key_types[i]),
            None => format!("(k.{})::{}", quote(k), q.key_types[i]),
        })
        .collect();
    // (The row filter on lines of its own, as in the chunk's query; its unqualified columns are
    // the source's, the innermost scope.)
    let passes = q
        .row_filter
        .as_ref()
        .map(|f| format!(" AND (\n{f}\n)"))
        .unwrap_or_default();
    let mut clauses = vec![format!(
        "NOT EXISTS (SELECT 1 FROM {} s WHERE ({}) = ({}){passes})",
        meta.scan,
        keys.iter()
            .map(|k| format!("s.{}", quote(k)))
            .collect::<Vec<_>>()
            .join(", "),
        elems.join(", ")
    )];
    let mut dargs: Vec<Option<&str>> = list.into_iter().map(Some).collect();
    let mut n = dargs.len() + 1;
    for (bound, op) in [(job.b.last_key.as_deref(), ">"), (to, "<=")] {
        if let Some(vals) = bound {
            let ps: Vec<String> = q
                .key_types
                .iter()
                .map(|t| {
                    let p = format!("${n}::{t}");
                    n += 1;
                    p
                })
                .collect();
            clauses.push(format!("({}) {op} ({})", elems.join(", "), ps.join(", ")));
            dargs.extend(vals.iter().map(|s| Some(s.as_str())));
        }
    }
    let selected = match list {
        Some(_) => (0..keys.len())
            .map(|i| format!("k.v->>{i}"))
            .collect::<Vec<_>>(),
        None => elems.clone(),
    };
    let sql = format!(
        "SELECT {} FROM {from} WHERE {}",
        selected.join(", "),
        clauses.join(" AND ")
    );
    // As the backfill's owner, like the chunk: it reads the source (and casts to its key
    // types), and a sweep the target's keys (which its writes need anyway).
    let found = crate::security::as_owner(owner, || sql::text_rows(&sql, &dargs, 0, false))?;
    render_deletes(&q.columns, &q.key_idx, keys, found)
}

/// Keys to delete (`found`: key values, text in key order) as the reconciler holds them: the
/// key rendered as the stream renders it (by `columns`, whose key columns are at `key_idx`),
/// with the values by name.
fn render_deletes(
    columns: &[OwnedColumn],
    key_idx: &[usize],
    keys: &[String],
    found: Vec<Vec<Option<String>>>,
) -> TideResult<Vec<(String, KeyValues)>> {
    let mut deletes = Vec::with_capacity(found.len());
    for r in found {
        let mut values = vec![Value::Null; columns.len()];
        for (ki, &ci) in key_idx.iter().enumerate() {
            values[ci] = r
                .get(ki)
                .and_then(|v| v.as_deref())
                .map_or(Value::Null, Value::Text);
        }
        let mut key = String::new();
        json::render_key(columns, &Tuple { values }, &mut key)
            .map_err(|e| TideError::internal(format!("cannot render a key to delete: {e}")))?;
        deletes.push((key, keys.iter().cloned().zip(r).collect()));
    }
    Ok(deletes)
}

/// A resync's sweep at a target in another PostgreSQL (`RemoteTarget::sweep_keys`): of `found`, the
/// keys that target holds in `read`'s key range as the target compares keys, those that lie in
/// the chunk's key range as the source orders keys (after the backfill's last key, up to the
/// chunk's last row, or to the end for the table's last chunk) and that the chunk did not
/// read. The chunk read every row of that range in its snapshot, so these are exactly the keys
/// its snapshot does not find at the source (compared with the source's key types, in SQL:
/// keys equal for the type are the same key, whatever their text). They are deleted at the
/// high watermark unless the stream touches them in the window, as for a local target
/// ([`repair_deletes`]). Called by the worker once the chunk is read, in a transaction of its
/// own (expressions only: no table is read).
pub(super) fn sweep_deletes(
    job: &Job,
    read: &ChunkRead,
    found: Vec<Vec<Option<String>>>,
) -> TideResult<Vec<(String, KeyValues)>> {
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let keys = &job.b.key_columns;
    let Some(meta) = table_meta(job.b.relid, keys)? else {
        return Err(TideError::undefined(format!(
            "the table of backfill {} (OID {}) no longer exists",
            job.b.id, job.b.relid
        ))
        .retry_later());
    };
    let columns: Vec<OwnedColumn> = meta.columns.iter().map(|(c, _)| c.clone()).collect();
    let mut key_idx = Vec::with_capacity(keys.len());
    let mut types = Vec::with_capacity(keys.len());
    for k in keys {
        let Some(i) = columns.iter().position(|c| &c.name == k) else {
            return Err(TideError::prerequisite(format!(
                "key column \"{k}\" of {} no longer exists",
                meta.relation
            )));
        };
        key_idx.push(i);
        types.push(meta.columns[i].1.clone());
    }
    let elems = |alias: &str| -> String {
        types
            .iter()
            .enumerate()
            .map(|(i, ty)| format!("({alias}.v->>{i})::{ty} AS k{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let names = |alias: &str, text: bool| -> String {
        (0..types.len())
            .map(|i| {
                if text {
                    format!("{alias}k{i}::pg_catalog.text")
                } else {
                    format!("{alias}k{i}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut clauses = Vec::new();
    let mut args: Vec<Option<String>> = Vec::new();
    let upper = if read.is_last {
        None
    } else {
        read.rows.last().map(|r| r.key_values.clone())
    };
    for (bound, op) in [(job.b.last_key.clone(), ">"), (upper, "<=")] {
        if let Some(values) = bound {
            let ps = types
                .iter()
                .enumerate()
                .map(|(i, ty)| format!("${}::{ty}", args.len() + i + 3))
                .collect::<Vec<_>>()
                .join(", ");
            args.extend(values.into_iter().map(Some));
            clauses.push(format!("({}) {op} ({ps})", names("d.", false)));
        }
    }
    let json_err = |e: serde_json::Error| TideError::internal(format!("cannot encode keys: {e}"));
    let target_keys = serde_json::to_string(&found).map_err(json_err)?;
    let chunk_keys =
        serde_json::to_string(&read.rows.iter().map(|r| &r.key_values).collect::<Vec<_>>())
            .map_err(json_err)?;
    let sql = format!(
        "SELECT {} FROM (SELECT {} FROM pg_catalog.jsonb_array_elements($1::pg_catalog.text::pg_catalog.jsonb) AS t(v)
                          EXCEPT
                          SELECT {} FROM pg_catalog.jsonb_array_elements($2::pg_catalog.text::pg_catalog.jsonb) AS c(v)) d{}",
        names("d.", true),
        elems("t"),
        elems("c"),
        if clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", clauses.join(" AND "))
        }
    );
    let mut params: Vec<Option<&str>> = vec![Some(&target_keys), Some(&chunk_keys)];
    params.extend(args.iter().map(|a| a.as_deref()));
    // As the backfill's owner, like the chunk (the casts to the key types run its domains'
    // checks).
    let owner = crate::security::owner_oid(&job.b.owner, &format!("backfill {}", job.b.id))?;
    let gone = crate::security::as_owner(owner, || sql::text_rows(&sql, &params, 0, true))?;
    render_deletes(&columns, &key_idx, keys, gone)
}

/// Defence in depth: the chunk must have read the relation file its snapshot knows. The lock
/// taken before the snapshot guarantees it; if it ever did not hold (a rewrite committed after
/// the snapshot, so the rows read — possibly none — come from a file the snapshot cannot see
/// into), a short chunk would end the backfill with rows never read. Read it again instead. A
/// partitioned table: each partition's file (it has none of its own); a partition attached after
/// the snapshot is not in the snapshot's catalog, and its rows come by a backfill of their own
/// (see `worker::partitions`).
fn check_not_rewritten(pipeline: &str, job: &Job, meta: &TableMeta) -> TideResult<()> {
    let (seen, current) = if meta.partitioned {
        sql::two::<i64, i64>(
            "SELECT count(*)::int8, count(*) FILTER (WHERE c.relfilenode = pg_relation_filenode(c.oid))::int8
               FROM pg_partition_tree($1::int8::oid) t JOIN pg_class c ON c.oid = t.relid
              WHERE t.isleaf AND c.relkind = 'r'",
            &[(job.b.relid as i64).into()],
        )?
    } else {
        sql::two::<i64, i64>(
            "SELECT relfilenode::int8, pg_relation_filenode(oid)::int8 FROM pg_class WHERE oid = $1::int8::oid",
            &[(job.b.relid as i64).into()],
        )?
    };
    if seen == current {
        return Ok(());
    }
    pgrx::log!(
        "pg_tide worker \"{pipeline}\": {} was rewritten while chunk {} of backfill {} was read (file {seen:?} in its snapshot, now {current:?}); reading the chunk again",
        meta.relation,
        job.b.chunk_no,
        job.b.id
    );
    Err(TideError::new(
        pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        format!("{} was rewritten while a chunk was read", meta.relation),
    )
    .hint("The chunk is read again; nothing was emitted from it.")
    .retry_later())
}

pub(super) fn quote(ident: &str) -> String {
    pgrx::spi::quote_identifier(ident)
}

/// A text result value as a tuple value.
pub(super) fn value(v: &Option<String>) -> Value<'_> {
    v.as_deref().map_or(Value::Null, Value::Text)
}

/// `row` (rendered JSON) parsed by jsonb's input function `f`: the datum's bytes (a 4-byte
/// header varlena), copied out and the datum freed.
fn parse_jsonb(f: &mut pg_sys::FmgrInfo, param: pg_sys::Oid, row: String) -> TideResult<Vec<u8>> {
    let c = std::ffi::CString::new(row)
        .map_err(|_| TideError::internal("a chunk row's JSON has a NUL byte"))?;
    // SAFETY: jsonb_in returns a palloc'd, uncompressed jsonb varlena; its size is read from
    // its header and the bytes are copied before it is freed.
    unsafe {
        let d = pg_sys::InputFunctionCall(f, c.as_ptr() as *mut std::ffi::c_char, param, -1);
        let v = d.cast_mut_ptr::<pg_sys::varlena>();
        let n = pgrx::varlena::varsize_any(v);
        let bytes = std::slice::from_raw_parts(v as *const u8, n).to_vec();
        pg_sys::pfree(v as *mut std::ffi::c_void);
        Ok(bytes)
    }
}

/// Why a chunk is not read now: its table is locked (see `tx::run_locked`).
/// How [`chunk_snapshot`]'s error ends.
const NOT_VISIBLE_YET: &str = "committed transaction(s) are not visible yet";

/// Transaction 2 under the table's lock ([`tx::run_locked`], then [`read_chunk`]), read again at
/// once (up to three times) when its snapshot missed a transaction that committed meanwhile
/// (`chunk_snapshot`): with several readers, that is mostly another reader's watermark
/// transaction, whose commit fell between this one's snapshot and its check; a new snapshot,
/// still after the chunk's low watermark, does not miss it. Other errors, and a table locked by
/// another transaction ([`table_locked`]), are returned.
pub(super) fn read_chunk_locked(
    pipeline: &str,
    job: &Job,
    hold: &mut dyn FnMut(&TableMeta) -> TideResult<RowForm>,
    writer: Option<u32>,
) -> TideResult<ChunkRead> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let r = match tx::run_locked(pg_sys::Oid::from(job.b.relid), || {
            read_chunk(pipeline, job, hold, writer)
        }) {
            Ok(tx::Locked::Ran(r)) => Ok(r),
            Ok(tx::Locked::Busy) => Err(table_locked()),
            Err(e) => Err(e),
        };
        match r {
            Err(e) if attempts < 3 && e.retry && e.message.ends_with(NOT_VISIBLE_YET) => {}
            r => return r,
        }
    }
}

pub(super) fn table_locked() -> TideError {
    TideError::new(
        pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
        "the table is locked by another transaction (for example a table-rewriting ALTER TABLE, TRUNCATE, VACUUM FULL or CLUSTER, or a statement waiting for such a lock)",
    )
    .hint("The chunk is read once the lock is released; the stream keeps flowing meanwhile. Nothing is lost.")
    .retry_later()
}

/// The next chunk to read, after its low watermark committed.
pub(super) struct Job {
    pub(super) watermark: u64,
    /// The backfill, as the catalog holds it.
    pub(super) b: backfills::Due,
}
