//! `tide.outbox`: the outbox target's rows (one per event). Written by the worker only, in its
//! iteration's transaction, so together with the applied position; read and trimmed by
//! consumers under the table's row security.

use crate::error::TideResult;
use pgrx::spi::SpiClient;

/// Outbox rows, column by column (one element per event).
#[derive(Default)]
pub struct Rows {
    /// Commit LSN of the source transaction.
    pub lsn: Vec<u64>,
    pub xid: Vec<i64>,
    /// Commit time (PostgreSQL timestamp: microseconds since 2000-01-01).
    pub time: Vec<i64>,
    /// Position in the source transaction, from 1.
    pub pos: Vec<i32>,
    pub rel: Vec<String>,
    /// `tide_core::model::Op`'s text.
    pub op: Vec<&'static str>,
    /// JSON objects.
    pub key: Vec<Option<String>>,
    pub row: Vec<Option<String>>,
    /// A `jsonb` datum's bytes, for rows given as such instead of `row` (`Event::row_jsonb`).
    pub row_jsonb: Vec<Option<Vec<u8>>>,
    /// Column names.
    pub unchanged: Vec<Option<Vec<String>>>,
    pub backfill: Vec<Option<i64>>,
    pub chunk: Vec<Option<i64>>,
}

impl Rows {
    pub fn len(&self) -> usize {
        self.lsn.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lsn.is_empty()
    }
}

/// The columns [`insert`] writes, in the order its rows give them (`id` is the identity's).
const COLUMNS: [&str; 12] = [
    "pipeline",
    "commit_lsn",
    "xid",
    "commit_time",
    "position",
    "relation",
    "op",
    "key",
    "row",
    "unchanged",
    "backfill_id",
    "chunk",
];

/// Insert `rows` for `pipeline`, in bulk (`crate::bulk::insert`: the table access method's
/// multi-insert, as COPY does; `key` and `row` read by jsonb's input function, the rest taken
/// as binary values). Called by the worker (the outbox target), in its iteration's transaction.
/// The rows take their ids in event order (the identity is drawn per row, in order), and a
/// pipeline's transactions are serial: so its ids increase in stream order, which consumers'
/// committed positions rely on (`catalog::consumers`). Its row security does not apply to the
/// worker (pg_tide itself); when a user gave the table a trigger or a rule (to notify
/// consumers, say), the rows go through one `INSERT` statement instead, so that it runs.
pub(crate) fn insert(c: &mut SpiClient<'_>, pipeline: &str, rows: Rows) -> TideResult<()> {
    use pgrx::pg_sys;
    let columns: Vec<String> = COLUMNS.iter().map(|c| c.to_string()).collect();
    // SAFETY: catalog lookups by name and OID; fmgr_info fills the FmgrInfo it is given. Every
    // datum below is made in the memory context `bulk::insert` makes current for the row, from
    // Rust strings that outlive the call (copied by cstring_to_text_with_len / jsonb's input
    // function / construct_array).
    unsafe {
        let ns = pg_sys::get_namespace_oid(c"tide".as_ptr(), false);
        let outbox = pg_sys::get_relname_relid(c"outbox".as_ptr(), ns);
        if outbox == pg_sys::InvalidOid {
            return Err(crate::error::TideError::internal(
                "tide.outbox does not exist",
            ));
        }
        if crate::bulk::bypasses(outbox).is_some() {
            return insert_sql(c, pipeline, rows);
        }
        let (mut jsonb_in, mut jsonb_param) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
        pg_sys::getTypeInputInfo(pg_sys::JSONBOID, &mut jsonb_in, &mut jsonb_param);
        let mut flinfo: pg_sys::FmgrInfo = std::mem::zeroed();
        pg_sys::fmgr_info(jsonb_in, &mut flinfo);
        let text = |s: &str| -> pg_sys::Datum {
            pg_sys::Datum::from(pg_sys::cstring_to_text_with_len(
                s.as_ptr() as *const std::ffi::c_char,
                s.len() as i32,
            ))
        };
        let mut jsonb = |s: &str| -> TideResult<pg_sys::Datum> {
            let c = std::ffi::CString::new(s).map_err(|_| {
                crate::error::TideError::internal("an outbox event's JSON has a NUL byte")
            })?;
            Ok(pg_sys::InputFunctionCall(
                &mut flinfo,
                c.as_ptr() as *mut std::ffi::c_char,
                jsonb_param,
                -1,
            ))
        };
        crate::bulk::insert(outbox, &columns, rows.len(), &mut |i, v, nulls| {
            nulls.fill(false);
            v[0] = text(pipeline);
            v[1] = pg_sys::Datum::from(rows.lsn[i]);
            v[2] = pg_sys::Datum::from(rows.xid[i]);
            v[3] = pg_sys::Datum::from(rows.time[i]);
            v[4] = pg_sys::Datum::from(rows.pos[i]);
            v[5] = text(&rows.rel[i]);
            v[6] = text(rows.op[i]);
            for (k, j) in [(7, &rows.key[i]), (8, &rows.row[i])] {
                match j {
                    Some(j) => v[k] = jsonb(j)?,
                    None => nulls[k] = true,
                }
            }
            if let Some(bytes) = &rows.row_jsonb[i] {
                v[8] = jsonb_datum(bytes)?;
                nulls[8] = false;
            }
            match &rows.unchanged[i] {
                Some(names) => {
                    let mut elems: Vec<pg_sys::Datum> = names.iter().map(|n| text(n)).collect();
                    v[9] = pg_sys::Datum::from(pg_sys::construct_array(
                        elems.as_mut_ptr(),
                        elems.len() as i32,
                        pg_sys::TEXTOID,
                        -1,
                        false,
                        pg_sys::TYPALIGN_INT as std::ffi::c_char,
                    ));
                }
                None => nulls[9] = true,
            }
            for (k, b) in [(10, rows.backfill[i]), (11, rows.chunk[i])] {
                match b {
                    Some(b) => v[k] = pg_sys::Datum::from(b),
                    None => nulls[k] = true,
                }
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// [`insert`] through SQL: one `INSERT ... SELECT FROM unnest(...)` (the rows in event order, so
/// their ids increase in it), which fires the table's triggers and applies its rules.
fn insert_sql(c: &mut SpiClient<'_>, pipeline: &str, mut rows: Rows) -> TideResult<()> {
    // Rows given as jsonb go in as their text (jsonb_out), parsed back by the statement.
    for i in 0..rows.len() {
        if let Some(bytes) = rows.row_jsonb[i].take() {
            rows.row[i] = Some(jsonb_text(&bytes)?);
        }
    }
    let lsn: Vec<String> = rows
        .lsn
        .iter()
        .map(|l| format!("{:X}/{:X}", l >> 32, l & 0xFFFF_FFFF))
        .collect();
    let op: Vec<String> = rows.op.iter().map(|o| o.to_string()).collect();
    let unchanged: Vec<Option<String>> = rows
        .unchanged
        .iter()
        .map(|u| u.as_ref().map(|names| serde_json::json!(names).to_string()))
        .collect();
    crate::sql::update(
        c,
        "INSERT INTO tide.outbox (pipeline, commit_lsn, xid, commit_time, position, relation, op, key, \"row\", unchanged, backfill_id, chunk)
         SELECT $1, u.l::pg_lsn, u.x, '2000-01-01 00:00:00+00'::timestamptz + u.t * interval '1 microsecond',
                u.p, u.r, u.o, u.k::jsonb, u.w::jsonb,
                CASE WHEN u.n IS NULL THEN NULL ELSE ARRAY(SELECT jsonb_array_elements_text(u.n::jsonb)) END,
                u.b, u.c
           FROM unnest($2::text[], $3::int8[], $4::int8[], $5::int4[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[],
                       $11::int8[], $12::int8[]) WITH ORDINALITY
                AS u(l, x, t, p, r, o, k, w, n, b, c, i)
          ORDER BY u.i",
        None,
        &[
            pipeline.into(),
            lsn.into(),
            rows.xid.into(),
            rows.time.into(),
            rows.pos.into(),
            rows.rel.into(),
            op.into(),
            rows.key.into(),
            rows.row.into(),
            unchanged.into(),
            rows.backfill.into(),
            rows.chunk.into(),
        ],
    )?;
    Ok(())
}

/// A `jsonb` datum (palloc'd in the current memory context) from its varlena's bytes, as
/// `Event::row_jsonb` carries them. Checked to be one whole varlena (4-byte header) of that size.
fn jsonb_datum(bytes: &[u8]) -> TideResult<pgrx::pg_sys::Datum> {
    use pgrx::pg_sys;
    if bytes.len() < 4 {
        return Err(crate::error::TideError::internal(
            "a backfilled row's jsonb is not one whole value",
        ));
    }
    // SAFETY: a palloc'd (so aligned) copy of the bytes, whose header is read only after the
    // copy and checked against their length: a 4-byte-header varlena (jsonb_in's result, as
    // the chunk's reader copied it) of exactly that size, or an error.
    unsafe {
        let p = pg_sys::palloc(bytes.len()) as *mut u8;
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
        let v = p as *const pg_sys::varlena;
        if !pgrx::varlena::varatt_is_4b_u(v) || pgrx::varlena::varsize_4b(v) != bytes.len() {
            pg_sys::pfree(p as *mut std::ffi::c_void);
            return Err(crate::error::TideError::internal(
                "a backfilled row's jsonb is not one whole value",
            ));
        }
        Ok(pg_sys::Datum::from(p))
    }
}

/// The text of a jsonb given as its bytes (`jsonb_out`).
fn jsonb_text(bytes: &[u8]) -> TideResult<String> {
    use pgrx::pg_sys;
    let d = jsonb_datum(bytes)?;
    // SAFETY: `d` is a jsonb datum; jsonb's output function returns a palloc'd C string.
    unsafe {
        let (mut out, mut varlena) = (pg_sys::InvalidOid, false);
        pg_sys::getTypeOutputInfo(pg_sys::JSONBOID, &mut out, &mut varlena);
        let s = pg_sys::OidOutputFunctionCall(out, d);
        let text = std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned();
        pg_sys::pfree(s as *mut std::ffi::c_void);
        pg_sys::pfree(d.cast_mut_ptr());
        Ok(text)
    }
}

/// Whether `tide.outbox` holds events of a pipeline named `pipeline`. Called by the SQL API
/// (`tide.create_pipeline`: an older version's leftovers), inside its `as_tide` block.
pub(crate) fn has_events(pipeline: &str) -> TideResult<bool> {
    Ok(crate::sql::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM tide.outbox WHERE pipeline = $1)",
        &[pipeline.into()],
    )?
    .unwrap_or(false))
}

/// Delete every event of the pipeline (`tide.drop_pipeline`, inside its `as_tide` block).
pub(crate) fn delete_events(pipeline: &str) -> TideResult<()> {
    crate::sql::exec(
        "DELETE FROM tide.outbox WHERE pipeline = $1",
        &[pipeline.into()],
    )
}
