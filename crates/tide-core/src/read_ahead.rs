//! The read-ahead protocol's messages: what a pipeline worker asks its reader process for (the
//! next chunk of a backfill) and what the reader sends back (the chunk, or why not).
//!
//! Owns: the messages' content ([`Due`], [`Chunk`], [`Failure`]) and their binary encoding.
//! The processes, the queues and when a request is sent are the pgrx crate's
//! (`worker::backfill::read_ahead`); this module is pure, so it is tested here, with round trips of any
//! message and every truncation of one.
//!
//! Encoding: a sequence of fields, numbers little-endian, lengths `u32`, strings UTF-8 bytes
//! with their length, an option one byte (0 none, 1 some) before its value, a row's form one
//! byte ([`crate::row::RowForm::tag`]). A message is decoded whole or not at all: a short,
//! long or malformed one is a [`Malformed`] error, never a default.

use crate::row::{KeyValues, Row, RowForm};
use crate::snapshot::InvisibleXids;

/// A backfill as the chunk reader needs it (a row of `tide.backfill` joined with its pipeline).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    pub id: i64,
    pub relid: u32,
    pub chunk_size: i64,
    pub rows_per_second: Option<i64>,
    /// The SQL condition (`tide.start_backfill(condition => ...)`, or a repair's key ranges).
    pub condition: Option<String>,
    /// The role the chunks are read as.
    pub owner: String,
    pub key_columns: Vec<String>,
    /// Key (text per key column) of the last row emitted; `None` before the first chunk.
    pub last_key: Option<Vec<String>>,
    /// The number of the next chunk (from 1).
    pub chunk_no: i64,
    /// JSON array of key value arrays a repair deletes (see `tide.repair`).
    pub repair_deletes: Option<String>,
    /// A resync's backfill at a local table target (after a lost slot): that table, quoted and
    /// qualified, whose rows in each chunk's key range that the source no longer has are deleted
    /// at the chunk's high watermark.
    pub sweep: Option<String>,
    /// A resync's backfill (after a lost slot), whatever the target: a target in another
    /// PostgreSQL is swept by the worker once the chunk is read (`RemoteTarget::sweep_keys`).
    pub resync: bool,
    /// The chunk's planned upper bound (text per key column, inclusive), when the worker
    /// planned several chunks of the backfill ahead for several readers: the chunk reads the
    /// keys after `last_key` up to this one and ends there. `None`: the chunk reads the next
    /// `chunk_size` keys (the catalog's backfill rows always have `None`).
    pub to_key: Option<Vec<String>>,
    /// At most this many rows per chunk, whatever `chunk_size` says: the worker caps a
    /// backfill's chunks while its stream applies source changes (`tide.streaming_chunk_size`),
    /// so that the stream's events wait behind shorter chunk writes. `None`: no cap (the
    /// catalog's backfill rows always have `None`).
    pub chunk_cap: Option<i64>,
}

impl Due {
    /// The rows a chunk of this backfill reads (bounded chunks: up to twice that): `chunk_size`,
    /// capped by `chunk_cap`, at least 1.
    pub fn rows_per_chunk(&self) -> i64 {
        match self.chunk_cap {
            Some(cap) if cap > 0 => self.chunk_size.min(cap),
            _ => self.chunk_size,
        }
        .max(1)
    }
}

/// What a chunk read tells about the backfill's total (turned into `estimated_rows` at the
/// chunk's high watermark).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// The planner's estimate of the table's rows now.
    pub table_rows: Option<i64>,
    /// For a whole-table backfill: the share of the table's rows up to the chunk's last key,
    /// in (0, 1].
    pub key_fraction: Option<f64>,
}

/// One row of a chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkRow {
    /// The key as a JSON object (what the reconciler matches stream events by).
    pub key: String,
    /// The key columns' text output, in key order (a chunk's bounds).
    pub key_values: Vec<String>,
    pub row: Row,
}

/// A chunk read under its watermarks, with its rows in the form the target asked for. `V` holds
/// the rows' values when the form is [`RowForm::RowValues`] (PostgreSQL memory in the worker,
/// [`RawValues`] when just decoded).
#[derive(Debug)]
pub struct Chunk<V> {
    /// How the rows are held.
    pub form: RowForm,
    /// Transactions the chunk's snapshot could not see.
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
    /// The rows' values, when held as row values, with the attribute numbers of `columns` they
    /// were read with.
    pub values: Option<(V, Vec<i32>)>,
    /// The attribute numbers of `columns` (what a high watermark compares for COPY text).
    pub attnums: Vec<i32>,
    pub is_last: bool,
    /// When the chunk was read (PostgreSQL's timestamp, microseconds).
    pub read_at: i64,
}

impl<V> Chunk<V> {
    /// The same chunk with its row values turned by `f`.
    pub fn map_values<W, E>(self, f: impl FnOnce(V) -> Result<W, E>) -> Result<Chunk<W>, E> {
        let values = match self.values {
            Some((v, attnums)) => Some((f(v)?, attnums)),
            None => None,
        };
        Ok(Chunk {
            form: self.form,
            invisible: self.invisible,
            snapshot: self.snapshot,
            estimate: self.estimate,
            deletes: self.deletes,
            relation: self.relation,
            columns: self.columns,
            rows: self.rows,
            values,
            attnums: self.attnums,
            is_last: self.is_last,
            read_at: self.read_at,
        })
    }
}

/// Row values as the protocol carries them: the row type's OID and each row's bytes.
pub trait RowBytes {
    fn row_type(&self) -> u32;
    /// Each row's bytes, in order.
    fn each_row(&self, f: &mut dyn FnMut(&[u8]));
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Row values just decoded: slices of the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawValues<'a> {
    pub row_type: u32,
    pub rows: Vec<&'a [u8]>,
}

impl RowBytes for RawValues<'_> {
    fn row_type(&self) -> u32 {
        self.row_type
    }
    fn each_row(&self, f: &mut dyn FnMut(&[u8])) {
        for r in &self.rows {
            f(r)
        }
    }
    fn len(&self) -> usize {
        self.rows.len()
    }
}

/// Why a chunk was not read: an error as the reader raised it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The SQLSTATE, as PostgreSQL encodes it (`MAKE_SQLSTATE`).
    pub code: i32,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
    /// The chunk is to be read again later (not a failure of the backfill).
    pub retry: bool,
}

/// A message that is not what the protocol encodes (cut short, too long, an unknown tag, bytes
/// that are not UTF-8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Malformed;

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a malformed message between a pipeline worker and its reader")
    }
}

/// A request: read the next chunk of `job`, rows held as `form`, while the worker's transaction
/// `writer` runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub pipeline: String,
    pub job: Due,
    pub form: RowForm,
    pub writer: u32,
}

/// The reader's answer: the chunk read under watermark `.0` for the backfill as it was then
/// (its chunk size and throttle may have changed since the request), or why not.
pub type Response<V> = Result<(u64, Due, Chunk<V>), Failure>;

// ------------------------------------------------------------------------------ encoding

#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_bits().to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        // Nothing the worker sends comes near 4 GiB (a queue holds 4 MiB at a time, a chunk is
        // bounded by tide.chunk_size); a longer field would be cut, and decoding then fails.
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    fn opt<T>(&mut self, v: Option<T>, f: impl FnOnce(&mut Self, T)) {
        match v {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                f(self, v)
            }
        }
    }
    fn strs(&mut self, v: &[String]) {
        self.len(v.len());
        for s in v {
            self.str(s);
        }
    }
    fn opt_strs(&mut self, v: &[Option<String>]) {
        self.len(v.len());
        for s in v {
            self.opt(s.as_deref(), |e, s| e.str(s));
        }
    }
    fn key_values(&mut self, v: &KeyValues) {
        self.len(v.len());
        for (n, v) in v {
            self.str(n);
            self.opt(v.as_deref(), |e, v| e.str(v));
        }
    }
    fn i32s(&mut self, v: &[i32]) {
        self.len(v.len());
        for a in v {
            self.i32(*a);
        }
    }
    fn due(&mut self, b: &Due) {
        self.i64(b.id);
        self.u32(b.relid);
        self.i64(b.chunk_size);
        self.opt(b.rows_per_second, |e, v| e.i64(v));
        self.opt(b.condition.as_deref(), |e, v| e.str(v));
        self.str(&b.owner);
        self.strs(&b.key_columns);
        self.opt(b.last_key.as_deref(), |e, v| e.strs(v));
        self.i64(b.chunk_no);
        self.opt(b.repair_deletes.as_deref(), |e, v| e.str(v));
        self.opt(b.sweep.as_deref(), |e, v| e.str(v));
        self.bool(b.resync);
        self.opt(b.to_key.as_deref(), |e, v| e.strs(v));
        self.opt(b.chunk_cap, |e, v| e.i64(v));
    }
    fn row(&mut self, r: &Row) {
        match r {
            Row::None => self.u8(0),
            Row::Json(s) => {
                self.u8(1);
                self.str(s);
            }
            Row::Jsonb(b) => {
                self.u8(2);
                self.bytes(b);
            }
            Row::Text(v) => {
                self.u8(3);
                self.opt_strs(v);
            }
            Row::Key(k) => {
                self.u8(4);
                self.key_values(k);
            }
            Row::Value(i) => {
                self.u8(5);
                self.u32(*i);
            }
            Row::Copy(s) => {
                self.u8(6);
                self.str(s);
            }
        }
    }
}

struct Dec<'a> {
    buf: &'a [u8],
    at: usize,
}

type D<T> = Result<T, Malformed>;

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> D<&'a [u8]> {
        let end = self.at.checked_add(n).ok_or(Malformed)?;
        let s = self.buf.get(self.at..end).ok_or(Malformed)?;
        self.at = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> D<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> D<u8> {
        Ok(self.take(1)?[0])
    }
    fn bool(&mut self) -> D<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Malformed),
        }
    }
    fn u32(&mut self) -> D<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn i32(&mut self) -> D<i32> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    fn i64(&mut self) -> D<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    fn f64(&mut self) -> D<f64> {
        Ok(f64::from_bits(u64::from_le_bytes(self.array()?)))
    }
    fn len(&mut self) -> D<usize> {
        let n = self.u32()? as usize;
        // Every element takes at least one byte: a length beyond what is left is malformed
        // (and never allocates for it).
        if n > self.buf.len() - self.at {
            return Err(Malformed);
        }
        Ok(n)
    }
    fn bytes(&mut self) -> D<&'a [u8]> {
        let n = self.len()?;
        self.take(n)
    }
    fn str(&mut self) -> D<String> {
        std::str::from_utf8(self.bytes()?)
            .map(str::to_string)
            .map_err(|_| Malformed)
    }
    fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> D<T>) -> D<Option<T>> {
        match self.u8()? {
            0 => Ok(None),
            1 => f(self).map(Some),
            _ => Err(Malformed),
        }
    }
    fn many<T>(&mut self, mut f: impl FnMut(&mut Self) -> D<T>) -> D<Vec<T>> {
        let n = self.len()?;
        let mut v = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            v.push(f(self)?);
        }
        Ok(v)
    }
    fn strs(&mut self) -> D<Vec<String>> {
        self.many(|d| d.str())
    }
    fn opt_strs(&mut self) -> D<Vec<Option<String>>> {
        self.many(|d| d.opt(|d| d.str()))
    }
    fn key_values(&mut self) -> D<KeyValues> {
        self.many(|d| Ok((d.str()?, d.opt(|d| d.str())?)))
    }
    fn i32s(&mut self) -> D<Vec<i32>> {
        self.many(|d| d.i32())
    }
    fn due(&mut self) -> D<Due> {
        Ok(Due {
            id: self.i64()?,
            relid: self.u32()?,
            chunk_size: self.i64()?,
            rows_per_second: self.opt(|d| d.i64())?,
            condition: self.opt(|d| d.str())?,
            owner: self.str()?,
            key_columns: self.strs()?,
            last_key: self.opt(|d| d.strs())?,
            chunk_no: self.i64()?,
            repair_deletes: self.opt(|d| d.str())?,
            sweep: self.opt(|d| d.str())?,
            resync: self.bool()?,
            to_key: self.opt(|d| d.strs())?,
            chunk_cap: self.opt(|d| d.i64())?,
        })
    }
    fn form(&mut self) -> D<RowForm> {
        RowForm::from_tag(self.u8()?).ok_or(Malformed)
    }
    fn row(&mut self) -> D<Row> {
        Ok(match self.u8()? {
            0 => Row::None,
            1 => Row::Json(self.str()?),
            2 => Row::Jsonb(self.bytes()?.to_vec()),
            3 => Row::Text(self.opt_strs()?),
            4 => Row::Key(self.key_values()?),
            5 => Row::Value(self.u32()?),
            6 => Row::Copy(self.str()?),
            _ => return Err(Malformed),
        })
    }
    fn end(&self) -> D<()> {
        if self.at == self.buf.len() {
            Ok(())
        } else {
            Err(Malformed)
        }
    }
}

/// A request's bytes.
pub fn encode_request(r: &Request) -> Vec<u8> {
    let mut e = Enc::default();
    e.str(&r.pipeline);
    e.due(&r.job);
    e.u8(r.form.tag());
    e.u32(r.writer);
    e.0
}

/// The request `buf` holds.
pub fn decode_request(buf: &[u8]) -> D<Request> {
    let mut d = Dec { buf, at: 0 };
    let r = Request {
        pipeline: d.str()?,
        job: d.due()?,
        form: d.form()?,
        writer: d.u32()?,
    };
    d.end()?;
    Ok(r)
}

/// A response's bytes.
pub fn encode_response<V: RowBytes>(r: &Response<V>) -> Vec<u8> {
    match r {
        Err(f) => encode_failure(f),
        Ok((watermark, job, c)) => encode_chunk(*watermark, job, c),
    }
}

/// The bytes of a response that says why no chunk was read.
pub fn encode_failure(f: &Failure) -> Vec<u8> {
    let mut e = Enc::default();
    e.u8(0);
    e.i32(f.code);
    e.str(&f.message);
    e.opt(f.detail.as_deref(), |e, v| e.str(v));
    e.opt(f.hint.as_deref(), |e, v| e.str(v));
    e.bool(f.retry);
    e.0
}

/// The bytes of a response carrying chunk `c`, read under watermark `watermark` for `job`.
pub fn encode_chunk<V: RowBytes>(watermark: u64, job: &Due, c: &Chunk<V>) -> Vec<u8> {
    let mut e = Enc::default();
    e.u8(1);
    e.i64(watermark as i64);
    e.due(job);
    e.u8(c.form.tag());
    e.str(&c.snapshot);
    e.opt(c.estimate.table_rows, |e, v| e.i64(v));
    e.opt(c.estimate.key_fraction, |e, v| e.f64(v));
    e.len(c.deletes.len());
    for (key, by_name) in &c.deletes {
        e.str(key);
        e.key_values(by_name);
    }
    e.str(&c.relation);
    e.len(c.columns.len());
    for (n, t) in &c.columns {
        e.str(n);
        e.str(t);
    }
    e.len(c.rows.len());
    for r in &c.rows {
        e.str(&r.key);
        e.strs(&r.key_values);
        e.row(&r.row);
    }
    e.opt(c.values.as_ref(), |e, (values, attnums)| {
        e.u32(values.row_type());
        e.len(values.len());
        values.each_row(&mut |r| e.bytes(r));
        e.i32s(attnums);
    });
    e.i32s(&c.attnums);
    e.bool(c.is_last);
    e.i64(c.read_at);
    e.0
}

/// The response `buf` holds; its row values are slices of `buf`.
pub fn decode_response(buf: &[u8]) -> D<Response<RawValues<'_>>> {
    let mut d = Dec { buf, at: 0 };
    let out = match d.u8()? {
        0 => Err(Failure {
            code: d.i32()?,
            message: d.str()?,
            detail: d.opt(|d| d.str())?,
            hint: d.opt(|d| d.str())?,
            retry: d.bool()?,
        }),
        1 => {
            let watermark = d.i64()? as u64;
            let job = d.due()?;
            let form = d.form()?;
            let snapshot = d.str()?;
            let invisible = InvisibleXids::parse(&snapshot).ok_or(Malformed)?;
            let estimate = Estimate {
                table_rows: d.opt(|d| d.i64())?,
                key_fraction: d.opt(|d| d.f64())?,
            };
            let deletes = d.many(|d| Ok((d.str()?, d.key_values()?)))?;
            let relation = d.str()?;
            let columns = d.many(|d| Ok((d.str()?, d.str()?)))?;
            let rows = d.many(|d| {
                Ok(ChunkRow {
                    key: d.str()?,
                    key_values: d.strs()?,
                    row: d.row()?,
                })
            })?;
            let values = d.opt(|d| {
                let row_type = d.u32()?;
                let rows = d.many(|d| d.bytes())?;
                Ok((RawValues { row_type, rows }, d.i32s()?))
            })?;
            Ok((
                watermark,
                job,
                Chunk {
                    form,
                    invisible,
                    snapshot,
                    estimate,
                    deletes,
                    relation,
                    columns,
                    rows,
                    values,
                    attnums: d.i32s()?,
                    is_last: d.bool()?,
                    read_at: d.i64()?,
                },
            ))
        }
        _ => return Err(Malformed),
    };
    d.end()?;
    Ok(out)
}

#[cfg(test)]
#[path = "read_ahead_tests.rs"]
mod tests;
