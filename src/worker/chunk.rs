//! Reading one backfill chunk (transaction 2 of the watermark algorithm; see
//! [`super::backfill`]): the keyset SELECT as the backfill's owner, in the chunk's snapshot,
//! under the table's lock, then the high watermark.
//!
//! Owns: the chunk's query, the snapshot facts the reconciliation needs (transactions in
//! progress), a repair's deletes, the rewrite check, and how the rows are held until the high
//! watermark: as JSON text (one event per row, for every target), or, for a target in this
//! database that has the table's columns with the same types, as row values of the source's
//! row type ([`RowValues`]: no text output, no JSON, one upsert), or, for a target in another
//! PostgreSQL that has them, as lines of COPY text (each column's text output, escaped:
//! `tide_core::copy`; no JSON, one COPY and one upsert at the target).


use super::estimate::Estimate;
use super::row_values::RowValues;
use super::tx;
use crate::catalog::backfills;
use crate::error::{TideError, TideResult};
use crate::sink::{KeyValues, RowFormat, Target};
use crate::sql;
use pgrx::prelude::*;
use tide_core::json;
use tide_core::model::OwnedColumn;
use tide_core::snapshot::InvisibleXids;
use tide_core::wire::{Tuple, Value};

/// What a chunk row carries to its high watermark (the reconciler's row type).
pub(super) enum Item {
    /// The row as a JSON object, emitted as a `read` event.
    Json(String),
    /// The same JSON object parsed into a `jsonb` datum (its bytes), for a target that takes
    /// it so ([`Holding::jsonb`]): parsed by the process that read the chunk (the reader, with
    /// read-ahead) instead of the worker.
    Jsonb(Vec<u8>),
    /// The row as each column's text output (NULL as `None`), emitted as a `read` event to a
    /// target that takes rows as text.
    Text(Vec<Option<String>>),
    /// The row is row value `n` of the chunk's [`RowValues`].
    Value(u32),
    /// The row as one line of COPY text (its columns in the chunk's order, newline included).
    Copy(String),
    /// A repair deletes the key (it no longer exists at the source): the key columns by name,
    /// with their text output.
    Delete(KeyValues),
}

/// The source table as the chunk reads it.
pub(super) struct TableMeta {
    /// Quoted and qualified.
    pub relation: String,
    /// How the chunk reads it: `ONLY relation`, or a partitioned table with its partitions.
    pub scan: String,
    pub partitioned: bool,
    /// Its name alone, quoted: a whole-row reference in the chunk's query.
    pub relname: String,
    pub row_type: pg_sys::Oid,
    /// Columns in attribute order, as the output plugin sends them (no dropped or generated
    /// columns), with their `format_type`.
    pub columns: Vec<(OwnedColumn, String)>,
    /// The attribute number of each column (a column dropped and added again under its name
    /// has another).
    pub attnums: Vec<i32>,
}

impl TableMeta {
    /// (name, format_type) of each column.
    pub fn shape(&self) -> Vec<(String, String)> {
        self.columns
            .iter()
            .map(|(c, ty)| (c.name.clone(), ty.clone()))
            .collect()
    }
}

/// The table `relid` as it is now (`None`: it no longer exists); `key_columns` marks the key.
pub(super) fn table_meta(relid: u32, key_columns: &[String]) -> TideResult<Option<TableMeta>> {
    let relid = relid.to_string();
    // Type names as a target's session writes them (see security::with_type_names).
    let meta = crate::security::with_type_names(|| {
        sql::text_rows(
            "SELECT pg_catalog.format('%I.%I', n.nspname, c.relname), pg_catalog.quote_ident(c.relname),
                    c.reltype::pg_catalog.int8, a.attname::pg_catalog.text, a.atttypid::pg_catalog.int8,
                    pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnum::pg_catalog.int4,
                    (c.relkind OPERATOR(pg_catalog.=) 'p')::pg_catalog.text
               FROM pg_catalog.pg_class c
               JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
               JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) c.oid
                AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
                AND a.attgenerated OPERATOR(pg_catalog.=) ''
              WHERE c.oid OPERATOR(pg_catalog.=) $1::pg_catalog.oid ORDER BY a.attnum",
            &[Some(&relid)],
            0,
            false,
        )
    })?;
    let Some(first) = meta.first() else {
        return Ok(None);
    };
    let incomplete =
        || TideError::internal(format!("the columns of table {relid} came back incomplete"));
    let text = |r: &Vec<Option<String>>, i: usize| r[i].clone().ok_or_else(incomplete);
    let oid = |r: &Vec<Option<String>>, i: usize| -> TideResult<u32> {
        r[i].as_deref()
            .and_then(|s| s.parse().ok())
            .ok_or_else(incomplete)
    };
    let mut columns = Vec::with_capacity(meta.len());
    let mut attnums = Vec::with_capacity(meta.len());
    for m in &meta {
        attnums.push(oid(m, 6)? as i32);
        let name = text(m, 3)?;
        columns.push((
            OwnedColumn {
                key: key_columns.contains(&name),
                type_oid: oid(m, 4)?,
                name,
            },
            text(m, 5)?,
        ));
    }
    let relation = text(first, 0)?;
    let partitioned = first[7].as_deref() == Some("true");
    Ok(Some(TableMeta {
        scan: if partitioned {
            relation.clone()
        } else {
            format!("ONLY {relation}")
        },
        partitioned,
        relation,
        relname: text(first, 1)?,
        row_type: pg_sys::Oid::from(oid(first, 2)?),
        columns,
        attnums,
    }))
}

pub(super) struct ChunkRow {
    pub key: String,
    pub key_values: Vec<String>,
    pub row: Item,
}

pub(super) struct ChunkRead {
    /// How the target wanted the rows held (what the next chunk asks for too).
    pub holding: Holding,
    pub invisible: InvisibleXids,
    /// The chunk's snapshot (`pg_current_snapshot()`), which `invisible` was parsed from.
    pub snapshot: String,
    pub estimate: Estimate,
    /// Keys a repair deletes at the high watermark: rendered, and by column.
    pub deletes: Vec<(String, KeyValues)>,
    pub relation: String,
    /// The chunk's columns, (name, `format_type`), in order.
    pub columns: Vec<(String, String)>,
    pub rows: Vec<ChunkRow>,
    /// The rows' values, when held as row values, with the attribute numbers of `columns`
    /// they were read with.
    pub values: Option<(RowValues, Vec<i32>)>,
    /// The attribute numbers of `columns` (what a high watermark compares for COPY text).
    pub attnums: Vec<i32>,
    pub is_last: bool,
    pub read_at: i64,
}

/// How a chunk's rows are held until their high watermark (see [`Item`]): what the target takes,
/// decided by the worker (which has the target) when the chunk is read in the worker, or when it
/// asks its reader for the next chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Holding {
    /// As row values (the target takes them for the chunk's columns).
    pub values: bool,
    /// As COPY text (the target takes it, and not row values).
    pub copy: bool,
    /// Otherwise as each column's text output (else as JSON).
    pub text: bool,
    /// JSON parsed into `jsonb` (else as JSON text).
    pub jsonb: bool,
}

impl Holding {
    /// What `sink` takes for a chunk of table `relid` with `shape` (name, `format_type`).
    pub(crate) fn for_target(
        sink: &mut dyn Target,
        relid: u32,
        shape: &[(String, String)],
    ) -> TideResult<Holding> {
        let values = sink.takes_row_values(relid, shape)?;
        // A remote target may have to be asked for its table's columns: if it cannot answer
        // now, read the chunk later (an error here would fail the backfill).
        let copy = !values
            && sink
                .takes_copy_text(relid, shape)
                .map_err(TideError::retry_later)?;
        Ok(Holding {
            values,
            copy,
            text: sink.row_format() == RowFormat::Text,
            jsonb: sink.takes_jsonb(),
        })
    }
}

/// Transaction 2: SELECT the chunk (snapshot taken after the LW commit) and write the HW. The
/// rows are held as `hold` says for the table as it is now (see [`Holding`]; row values also
/// need the table's name as its whole-row reference: not when a column has that name).
///
/// `writer` is the worker's iteration transaction when a reader reads the chunk while it runs
/// (see `read_ahead`): it is in the chunk's snapshot's list of transactions in progress, and may
/// commit before the check below, but it writes no source table, so it does not hold the chunk.
pub(super) fn read_chunk(
    pipeline: &str,
    job: &Job,
    hold: &mut dyn FnMut(&TableMeta) -> TideResult<Holding>,
    writer: Option<u32>,
) -> TideResult<ChunkRead> {
    let Some(meta) = table_meta(job.b.relid, &job.b.key_columns)? else {
        return Err(TideError::undefined(format!(
            "the table of backfill {} (OID {}) no longer exists",
            job.b.id, job.b.relid
        ))
        .hint("Remove it from the pipeline with tide.remove_table, or cancel the backfill."));
    };
    let relation = meta.relation.clone();
    let scan = meta.scan.clone();
    let shape = meta.shape();
    let holding = hold(&meta)?;
    let whole_row = !meta
        .columns
        .iter()
        .any(|(c, _)| quote(&c.name) == meta.relname);
    let as_values = whole_row && holding.values;
    let as_copy = !as_values && holding.copy;
    let as_text = holding.text;
    let as_jsonb = !as_values && !as_copy && !as_text && holding.jsonb;
    // jsonb's input function, for `as_jsonb`.
    let mut jsonb_in: pg_sys::FmgrInfo = unsafe { std::mem::zeroed() };
    let mut jsonb_param = pg_sys::InvalidOid;
    if as_jsonb {
        let mut f = pg_sys::InvalidOid;
        // SAFETY: a catalog lookup of a built-in type; fmgr_info fills the struct it is given
        // (in the current memory context, the transaction's).
        unsafe {
            pg_sys::getTypeInputInfo(pg_sys::JSONBOID, &mut f, &mut jsonb_param);
            pg_sys::fmgr_info(f, &mut jsonb_in);
        }
    }
    let columns: Vec<OwnedColumn> = meta.columns.iter().map(|(c, _)| c.clone()).collect();
    let mut key_types = Vec::new();
    for k in &job.b.key_columns {
        let Some((_, ty)) = meta.columns.iter().find(|(c, _)| &c.name == k) else {
            return Err(TideError::prerequisite(format!("key column \"{k}\" of {relation} no longer exists"))
                .hint(format!("Remove and re-add the table: SELECT tide.remove_table('{pipeline}', '{relation}'); SELECT tide.add_table('{pipeline}', '{relation}').")));
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
    // JSON: every column; row values: the key columns, then the whole row.
    let select_list = if as_values {
        format!("{key_list}, {}", meta.relname)
    } else {
        columns
            .iter()
            .map(|c| quote(&c.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut query = format!("SELECT {select_list} FROM {scan}");
    let mut clauses = Vec::new();
    let mut args: Vec<Option<&str>> = Vec::new();
    if let Some(last) = &job.b.last_key {
        let params = key_types
            .iter()
            .enumerate()
            .map(|(i, t)| format!("${}::{t}", i + 1))
            .collect::<Vec<_>>()
            .join(", ");
        clauses.push(format!("({key_list}) > ({params})"));
        args.extend(last.iter().map(|s| Some(s.as_str())));
    }
    if let Some(cond) = &job.b.condition {
        // On lines of its own: a trailing `--` comment in it ends before the `)`.
        clauses.push(format!("(\n{cond}\n)"));
    }
    if !clauses.is_empty() {
        query.push_str(" WHERE ");
        query.push_str(&clauses.join(" AND "));
    }
    query.push_str(&format!(" ORDER BY {key_list} LIMIT {}", job.b.chunk_size));

    let read_at = unsafe { pg_sys::GetCurrentTimestamp() };
    // The chunk's snapshot (the transaction's, like the SELECT below: both run read-only). Its
    // in-progress transactions may include one whose commit record is already in the WAL before
    // the low watermark (PostgreSQL makes a transaction visible only after writing its commit
    // record); such a transaction is invisible to the chunk although the stream delivers it
    // before the window opens, so its keys are dropped from the chunk wherever it appears.
    // Every xid at or after the snapshot's xmax is invisible too, without being listed: one
    // whose commit record just preceded the low watermark can be among them.
    let snapshot =
        sql::one::<String>("SELECT pg_current_snapshot()::text", &[])?.unwrap_or_default();
    let invisible = InvisibleXids::parse(&snapshot).ok_or_else(|| {
        TideError::internal(format!("cannot read the chunk's snapshot {snapshot:?}"))
    })?;
    // A transaction already committed in the log (and in the commit log) but not yet visible,
    // e.g. waiting for a synchronous standby: the stream may already have delivered it, so its
    // keys cannot be dropped from this chunk. Do not read the chunk now; try again shortly.
    // pg_xact_status() reports such a transaction as "in progress" (it asks the process array
    // first), so ask the commit log itself. For xids from xmax on (not listed), only those
    // still in the process array count (the others committed after the snapshot, inside the
    // window).
    let newest = unsafe { pg_sys::ReadNextFullTransactionId() }.value;
    let after_xmax = invisible.xmax_full.map_or(0..0, |x| x..newest.max(x));
    let committed_invisible = invisible
        .listed
        .iter()
        .filter(|&&x| Some(x) != writer)
        .filter(|&&x| unsafe { pg_sys::TransactionIdDidCommit(pg_sys::TransactionId::from(x)) })
        .count()
        // The range holds the xids assigned after the newest completed one: at most the
        // transactions running now (a few hundred on a busy server). The cap only bounds the
        // work should that ever not hold; past it, xids are not checked.
        + after_xmax
            .take(100_000)
            .filter(|&x| Some(x as u32) != writer)
            .filter(|&x| {
                let xid = pg_sys::TransactionId::from(x as u32);
                unsafe {
                    pg_sys::TransactionIdDidCommit(xid) && pg_sys::TransactionIdIsInProgress(xid)
                }
            })
            .count();
    if committed_invisible > 0 {
        return Err(TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("{committed_invisible} committed transaction(s) are not visible yet"),
        )
        .hint("A transaction has committed but is still waiting (for example for a synchronous standby); the chunk is read again once it is visible.")
        .retry_later());
    }
    // Read as the pipeline's owner (catalog::backfills::due gives it, whoever started the
    // backfill), in a security-restricted operation (`SET ROLE`/`RESET ROLE` fail there), under
    // a timeout: a slow condition fails its backfill instead of holding the stream. The owner
    // must still read every row: a revoked SELECT or a row-level security policy that applies
    // to it now fails the chunk with the reason instead of reading some rows only.
    let owner = crate::security::owner_oid(&job.b.owner, &format!("backfill {}", job.b.id))?;
    if let Some(e) = crate::security::read_problem(owner, pg_sys::Oid::from(job.b.relid), &relation)
    {
        return Err(e);
    }
    let timeout_ms = crate::gucs::CHUNK_TIMEOUT_MS.get().max(10);
    let nkeys = key_idx.len();
    let (rows, values) = crate::security::as_owner(owner, || {
        tx::arm_timeout(timeout_ms);
        let r = sql::with_rows(&query, &args, 0, false, |result| {
            let mut rows = Vec::with_capacity(result.len());
            for i in 0..result.len() {
                // Row values: the key columns come first (in key order) and are all that is
                // read as text; JSON: every column, in attribute order.
                let texts: Vec<Option<String>> = if as_values {
                    (1..=nkeys as i32).map(|col| result.text(i, col)).collect()
                } else {
                    (1..=result.columns())
                        .map(|col| result.text(i, col))
                        .collect()
                };
                let tuple = if as_values {
                    // Key columns at their places, the rest NULL: enough to render the key.
                    let mut values = vec![Value::Null; columns.len()];
                    for (k, &ci) in key_idx.iter().enumerate() {
                        values[ci] = value(&texts[k]);
                    }
                    Tuple { values }
                } else {
                    Tuple {
                        values: texts.iter().map(|v| value(v)).collect(),
                    }
                };
                let render_err = |e: json::RenderError| {
                    TideError::internal(format!("cannot render a chunk row: {e}"))
                };
                let mut key = String::new();
                json::render_key(&columns, &tuple, &mut key).map_err(render_err)?;
                let row = if as_values {
                    Item::Value(i as u32)
                } else if as_copy {
                    let mut line = String::new();
                    tide_core::copy::push_row(&mut line, texts.iter().map(Option::as_deref));
                    Item::Copy(line)
                } else if as_text {
                    Item::Text(texts.clone())
                } else {
                    let mut row = String::new();
                    json::render_row(&columns, &tuple, &mut row).map_err(render_err)?;
                    if as_jsonb {
                        Item::Jsonb(parse_jsonb(&mut jsonb_in, jsonb_param, row)?)
                    } else {
                        Item::Json(row)
                    }
                };
                let key_values = (0..key_idx.len())
                    .map(|k| {
                        let at = if as_values { k } else { key_idx[k] };
                        texts[at].clone().unwrap_or_default()
                    })
                    .collect();
                rows.push(ChunkRow {
                    key,
                    key_values,
                    row,
                });
            }
            let values = if as_values {
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
    })?;
    let is_last = (rows.len() as i64) < job.b.chunk_size;
    // A repair: keys to delete that lie in this chunk's key range and, in this same snapshot, no
    // longer exist at the source. They are emitted as deletes at the high watermark unless the
    // stream touches them in the window (then the stream carries the truth, as for rows).
    let mut deletes = Vec::new();
    if let Some(list) = &job.b.repair_deletes {
        let to: Option<Vec<String>> = if is_last {
            None
        } else {
            rows.last().map(|r: &ChunkRow| r.key_values.clone())
        };
        let elem = |i: usize, k: &str| -> String {
            let ty = &key_types[job.b.key_columns.iter().position(|c| c == k).unwrap_or(0)];
            format!("(k.v->>{i})::{ty}")
        };
        let elems: Vec<String> = job
            .b
            .key_columns
            .iter()
            .enumerate()
            .map(|(i, k)| elem(i, k))
            .collect();
        let mut clauses = vec![format!(
            "NOT EXISTS (SELECT 1 FROM {scan} s WHERE ({}) = ({}))",
            job.b
                .key_columns
                .iter()
                .map(|k| format!("s.{}", quote(k)))
                .collect::<Vec<_>>()
                .join(", "),
            elems.join(", ")
        )];
        let mut dargs: Vec<Option<&str>> = vec![Some(list.as_str())];
        let mut n = 2;
        for (bound, op) in [(job.b.last_key.as_ref(), ">"), (to.as_ref(), "<=")] {
            if let Some(vals) = bound {
                let ps: Vec<String> = key_types
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
        let q = format!(
            "SELECT {} FROM jsonb_array_elements($1::text::jsonb) AS k(v) WHERE {}",
            (0..job.b.key_columns.len())
                .map(|i| format!("k.v->>{i}"))
                .collect::<Vec<_>>()
                .join(", "),
            clauses.join(" AND ")
        );
        // As the backfill's owner, like the chunk: it reads the source (and casts to its key types).
        let found = crate::security::as_owner(owner, || sql::text_rows(&q, &dargs, 0, false))?;
        for r in found {
            let mut values = vec![Value::Null; columns.len()];
            for (ki, &ci) in key_idx.iter().enumerate() {
                values[ci] = r[ki].as_deref().map_or(Value::Null, Value::Text);
            }
            let mut key = String::new();
            json::render_key(&columns, &Tuple { values }, &mut key)
                .map_err(|e| TideError::internal(format!("cannot render a key to delete: {e}")))?;
            let by_name = job.b.key_columns.iter().cloned().zip(r).collect();
            deletes.push((key, by_name));
        }
    }
    // Defence in depth: the chunk must have read the relation file its snapshot knows. The lock
    // taken before the snapshot guarantees it; if it ever did not hold (a rewrite committed after
    // the snapshot, so the rows read — possibly none — come from a file the snapshot cannot see
    // into), a short chunk would end the backfill with rows never read. Read it again instead.
    // A partitioned table: each partition's file (it has none of its own); a partition attached
    // after the snapshot is not in the snapshot's catalog, and its rows come by a backfill of
    // their own (see `worker::partitions`).
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
    if seen != current {
        pgrx::log!(
            "pg_tide worker \"{pipeline}\": {relation} was rewritten while chunk {} of backfill {} was read (file {seen:?} in its snapshot, now {current:?}); reading the chunk again",
            job.b.chunk_no,
            job.b.id
        );
        return Err(TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
            format!("{relation} was rewritten while a chunk was read"),
        )
        .hint("The chunk is read again; nothing was emitted from it.")
        .retry_later());
    }
    let estimate = if is_last {
        Estimate::default()
    } else {
        // Whole-table backfills only: a condition or a repair reads part of the key range.
        let whole = job.b.condition.is_none() && job.b.repair_deletes.is_none();
        let last = rows.last().and_then(|r| r.key_values.first());
        Estimate::take(
            job.b.relid,
            &scan,
            &job.b.key_columns,
            &key_types,
            whole,
            last,
            owner,
        )?
    };
    backfills::write_high_watermark(pipeline, job.watermark, job.b.id, is_last)?;
    Ok(ChunkRead {
        holding,
        invisible,
        snapshot,
        estimate,
        deletes,
        relation,
        columns: shape,
        rows,
        values,
        attnums: meta.attnums.clone(),
        is_last,
        read_at,
    })
}

fn quote(ident: &str) -> String {
    pgrx::spi::quote_identifier(ident)
}

/// A text result value as a tuple value.
fn value(v: &Option<String>) -> Value<'_> {
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
