//! The binary format between the output plugin and the worker.
//!
//! Owns the version-4 encoding of one logical-decoding message (see
//! `docs/wire-format.md`, which this module implements). Guarantees:
//!
//! * the `put_*` functions are the only encoder; [`encode`] is built from
//!   them, so a plugin writing piecewise produces exactly what [`encode`]
//!   would, and the round-trip tests cover both;
//! * [`decode`] is zero-copy (strings and values borrow the input), never
//!   panics on any input, rejects invalid UTF-8, unknown tags or kinds, short
//!   input and trailing bytes, and checks every length and count against
//!   the remaining input before allocating anything sized by it.

use crate::lsn::Lsn;
use std::fmt;

/// The format version implemented here; the plugin option `proto_version`
/// must be exactly this number.
pub const PROTO_VERSION: u32 = 4;

/// [`Column::flags`] bit: the column is part of the replica-identity key.
pub const COLUMN_KEY: u8 = 0x01;
/// [`Message::Truncate`] flags bit: `TRUNCATE ... CASCADE`.
pub const TRUNCATE_CASCADE: u8 = 0x01;
/// [`Message::Truncate`] flags bit: `TRUNCATE ... RESTART IDENTITY`.
pub const TRUNCATE_RESTART_IDENTITY: u8 = 0x02;

const TAG_BEGIN: u8 = b'B';
const TAG_COMMIT: u8 = b'C';
const TAG_RELATION: u8 = b'R';
const TAG_INSERT: u8 = b'I';
const TAG_UPDATE: u8 = b'U';
const TAG_DELETE: u8 = b'D';
const TAG_TRUNCATE: u8 = b'T';
const TAG_SIGNAL: u8 = b'M';
const TAG_KEEPALIVE: u8 = b'K';
const TAG_REWRITE: u8 = b'W';
const TAG_TRUNCATE_PARTITION: u8 = b'P';
const TAG_STREAM_START: u8 = b'S';
const TAG_STREAM_STOP: u8 = b'E';
const TAG_STREAM_CHANGE: u8 = b'X';
const TAG_STREAM_ABORT: u8 = b'A';
const TAG_STREAM_COMMIT: u8 = b'F';
const KIND_NULL: u8 = b'n';
const KIND_UNCHANGED: u8 = b'u';
const KIND_TEXT: u8 = b't';

/// Smallest encoding of one column description (empty name).
const MIN_COLUMN_LEN: usize = 4 + 4 + 4 + 1;
/// Smallest encoding of one tuple value (a kind byte).
const MIN_VALUE_LEN: usize = 1;

/// One decoded logical-decoding message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// Start of a committed transaction.
    Begin {
        /// Transaction id.
        xid: u32,
        /// LSN of the transaction's commit record.
        final_lsn: Lsn,
        /// Commit time, microseconds since 2000-01-01 00:00 UTC (`TimestampTz`).
        commit_time: i64,
    },
    /// End of the transaction opened by the preceding [`Message::Begin`].
    Commit {
        /// Transaction id.
        xid: u32,
        /// LSN of the commit record.
        commit_lsn: Lsn,
        /// LSN just past the commit record.
        end_lsn: Lsn,
        /// Commit time, microseconds since 2000-01-01 00:00 UTC (`TimestampTz`).
        commit_time: i64,
    },
    /// Description of a relation; replaces any earlier one for `relid`.
    Relation {
        /// Relation OID.
        relid: u32,
        /// Schema name.
        namespace: &'a str,
        /// Relation name.
        name: &'a str,
        /// The columns every tuple of this relation carries, in order.
        columns: Vec<Column<'a>>,
    },
    /// A row was inserted.
    Insert {
        /// Relation OID.
        relid: u32,
        /// The new row.
        new: Tuple<'a>,
    },
    /// A row was updated.
    Update {
        /// Relation OID.
        relid: u32,
        /// The old key (or whole old row under `REPLICA IDENTITY FULL`);
        /// present only if the server logged it: the key changed, a key
        /// column is stored out of line, or the identity is full. Take the
        /// key from here when present (the new tuple may then have
        /// [`Value::Unchanged`] in a key column).
        old_key: Option<Tuple<'a>>,
        /// The new row.
        new: Tuple<'a>,
    },
    /// A row was deleted.
    Delete {
        /// Relation OID.
        relid: u32,
        /// The old key (or whole old row under `REPLICA IDENTITY FULL`).
        old_key: Tuple<'a>,
    },
    /// One `TRUNCATE` statement.
    Truncate {
        /// [`TRUNCATE_CASCADE`] | [`TRUNCATE_RESTART_IDENTITY`].
        flags: u8,
        /// OIDs of all truncated relations.
        relids: Vec<u32>,
    },
    /// The body of a transactional logical message with prefix `pg_tide`
    /// (`pg_logical_emit_message(true, 'pg_tide', ...)`), at its position in
    /// its transaction. pg_tide's control markers (add_table, remove_table).
    Signal {
        /// The message body, uninterpreted.
        body: &'a [u8],
    },
    /// Outside any transaction: every transaction that committed before
    /// `end_lsn` has been decoded and had nothing to emit. The reader may
    /// advance its slot to `end_lsn` once everything before it is applied.
    Keepalive {
        /// End of the last skipped transaction's commit record.
        end_lsn: Lsn,
    },
    /// Inside a transaction: the transaction rewrote the relation's heap
    /// (a table-rewriting `ALTER TABLE`: `ALTER COLUMN ... TYPE`, `ADD
    /// COLUMN` with a volatile default, ...), which may have changed every
    /// row's values without any row change being decoded. Sent once per
    /// relation and transaction, at the position of its first rewritten row.
    Rewrite {
        /// Relation OID of the rewritten table.
        relid: u32,
    },
    /// Inside a transaction: a `TRUNCATE` emptied one partition of the
    /// emitted partitioned table `relid`, not all of it (a `TRUNCATE` of
    /// the whole table is a [`Message::Truncate`] of `relid`). The rows it
    /// removed are exactly those `predicate` is true for: the partition's
    /// constraint, a boolean SQL expression on `relid`'s columns.
    TruncatePartition {
        /// Relation OID of the partitioned table.
        relid: u32,
        /// The partition, schema-qualified and quoted where needed.
        partition: &'a str,
        /// The partition constraint as PostgreSQL deparses it.
        predicate: &'a str,
    },
    /// Outside any transaction: a block of changes of the in-progress
    /// transaction `xid` follows, up to the next [`Message::StreamStop`]
    /// (only [`Message::StreamChange`] in between).
    StreamStart {
        /// Top-level transaction id.
        xid: u32,
        /// The first block of `xid` in this decoding session.
        first: bool,
    },
    /// End of the block opened by the preceding [`Message::StreamStart`].
    StreamStop,
    /// Inside a stream block: one message of the in-progress transaction.
    StreamChange {
        /// The (sub)transaction the message belongs to: the subtransaction
        /// that made a change or truncate, the top-level transaction for a
        /// Relation or Rewrite message.
        xid: u32,
        /// The message: one complete Relation, Insert, Update, Delete,
        /// Truncate, Rewrite or TruncatePartition message, as [`decode`]
        /// reads it (which checked it is one).
        body: &'a [u8],
    },
    /// Outside any block: the streamed transaction `xid` aborted
    /// (`subxid == xid`), or its subtransaction `subxid` did: its messages
    /// (and those of its subtransactions, which abort with it and are
    /// announced each) are to be forgotten.
    StreamAbort {
        /// Top-level transaction id.
        xid: u32,
        /// The aborted (sub)transaction.
        subxid: u32,
    },
    /// Outside any block: the streamed transaction `xid` committed; its
    /// messages not aborted make one committed transaction, as if between a
    /// [`Message::Begin`] and a [`Message::Commit`] with these positions.
    StreamCommit {
        /// Top-level transaction id.
        xid: u32,
        /// LSN of the commit record.
        commit_lsn: Lsn,
        /// LSN just past the commit record.
        end_lsn: Lsn,
        /// Commit time, microseconds since 2000-01-01 00:00 UTC (`TimestampTz`).
        commit_time: i64,
    },
}

/// One column of a [`Message::Relation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column<'a> {
    /// Column name.
    pub name: &'a str,
    /// Type OID (`pg_attribute.atttypid`).
    pub type_oid: u32,
    /// Type modifier (`pg_attribute.atttypmod`, -1 if none).
    pub typmod: i32,
    /// Bit set; see [`COLUMN_KEY`].
    pub flags: u8,
}

/// A row image: one value per column of the relation's latest description.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tuple<'a> {
    /// The values, in column order.
    pub values: Vec<Value<'a>>,
}

/// One column value of a [`Tuple`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value<'a> {
    /// SQL NULL.
    Null,
    /// An unchanged out-of-line (TOAST) value that was not sent.
    Unchanged,
    /// The type's text output.
    Text(&'a str),
}

// ---------------------------------------------------------------- encoding

fn put_u8(buf: &mut Vec<u8>, v: u8) {
    buf.push(v);
}
fn put_u16(buf: &mut Vec<u8>, v: u16) {
    buf.extend_from_slice(&v.to_be_bytes());
}
fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_be_bytes());
}
fn put_u64(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(&v.to_be_bytes());
}

/// Writes a u32 length and the bytes.
///
/// Panics if `b` is longer than `u32::MAX`: PostgreSQL limits any datum to
/// 1 GB and names to 63 bytes, so a longer input is a caller bug, not data.
fn put_bytes(buf: &mut Vec<u8>, b: &[u8]) {
    let len = u32::try_from(b.len()).expect("wire: field longer than u32::MAX bytes");
    put_u32(buf, len);
    buf.extend_from_slice(b);
}

/// Writes a [`Message::Begin`].
pub fn put_begin(buf: &mut Vec<u8>, xid: u32, final_lsn: Lsn, commit_time: i64) {
    put_u8(buf, TAG_BEGIN);
    put_u32(buf, xid);
    put_u64(buf, final_lsn.0);
    buf.extend_from_slice(&commit_time.to_be_bytes());
}

/// Writes a [`Message::Commit`].
pub fn put_commit(buf: &mut Vec<u8>, xid: u32, commit_lsn: Lsn, end_lsn: Lsn, commit_time: i64) {
    put_u8(buf, TAG_COMMIT);
    put_u32(buf, xid);
    put_u64(buf, commit_lsn.0);
    put_u64(buf, end_lsn.0);
    buf.extend_from_slice(&commit_time.to_be_bytes());
}

/// Starts a [`Message::Relation`]; exactly `ncols` [`put_column`] calls must follow.
///
/// # Panics
/// If a name is longer than `u32::MAX` bytes (PostgreSQL names are at most 63).
pub fn put_relation_header(buf: &mut Vec<u8>, relid: u32, namespace: &str, name: &str, ncols: u16) {
    put_u8(buf, TAG_RELATION);
    put_u32(buf, relid);
    put_bytes(buf, namespace.as_bytes());
    put_bytes(buf, name.as_bytes());
    put_u16(buf, ncols);
}

/// Writes one column description of a [`Message::Relation`].
///
/// # Panics
/// If `name` is longer than `u32::MAX` bytes.
pub fn put_column(buf: &mut Vec<u8>, name: &str, type_oid: u32, typmod: i32, flags: u8) {
    put_bytes(buf, name.as_bytes());
    put_u32(buf, type_oid);
    buf.extend_from_slice(&typmod.to_be_bytes());
    put_u8(buf, flags);
}

/// Starts a [`Message::Insert`]; the new tuple must follow.
pub fn put_insert_header(buf: &mut Vec<u8>, relid: u32) {
    put_u8(buf, TAG_INSERT);
    put_u32(buf, relid);
}

/// Starts a [`Message::Update`]; the old-key tuple follows if `has_old_key`,
/// then the new tuple.
pub fn put_update_header(buf: &mut Vec<u8>, relid: u32, has_old_key: bool) {
    put_u8(buf, TAG_UPDATE);
    put_u32(buf, relid);
    put_u8(buf, u8::from(has_old_key));
}

/// Starts a [`Message::Delete`]; the old-key tuple must follow.
pub fn put_delete_header(buf: &mut Vec<u8>, relid: u32) {
    put_u8(buf, TAG_DELETE);
    put_u32(buf, relid);
}

/// Writes a [`Message::Truncate`].
///
/// # Panics
/// If `relids` has more than `u32::MAX` entries.
pub fn put_truncate(buf: &mut Vec<u8>, flags: u8, relids: &[u32]) {
    put_u8(buf, TAG_TRUNCATE);
    put_u8(buf, flags);
    let n = u32::try_from(relids.len()).expect("wire: more than u32::MAX truncated relations");
    put_u32(buf, n);
    for &r in relids {
        put_u32(buf, r);
    }
}

/// Writes a [`Message::Signal`].
///
/// # Panics
/// If `body` is longer than `u32::MAX` bytes.
pub fn put_signal(buf: &mut Vec<u8>, body: &[u8]) {
    put_u8(buf, TAG_SIGNAL);
    put_bytes(buf, body);
}

/// Writes a [`Message::Keepalive`].
pub fn put_keepalive(buf: &mut Vec<u8>, end_lsn: Lsn) {
    put_u8(buf, TAG_KEEPALIVE);
    put_u64(buf, end_lsn.0);
}

/// Writes a [`Message::Rewrite`].
pub fn put_rewrite(buf: &mut Vec<u8>, relid: u32) {
    put_u8(buf, TAG_REWRITE);
    put_u32(buf, relid);
}

/// Writes a [`Message::TruncatePartition`].
///
/// # Panics
/// If a string is longer than `u32::MAX` bytes.
pub fn put_truncate_partition(buf: &mut Vec<u8>, relid: u32, partition: &str, predicate: &str) {
    put_u8(buf, TAG_TRUNCATE_PARTITION);
    put_u32(buf, relid);
    put_bytes(buf, partition.as_bytes());
    put_bytes(buf, predicate.as_bytes());
}

/// Writes a [`Message::StreamStart`].
pub fn put_stream_start(buf: &mut Vec<u8>, xid: u32, first: bool) {
    put_u8(buf, TAG_STREAM_START);
    put_u32(buf, xid);
    put_u8(buf, u8::from(first));
}

/// Writes a [`Message::StreamStop`].
pub fn put_stream_stop(buf: &mut Vec<u8>) {
    put_u8(buf, TAG_STREAM_STOP);
}

/// Starts a [`Message::StreamChange`]; exactly one complete message (written
/// with the `put_*` functions) must follow.
pub fn put_stream_change_header(buf: &mut Vec<u8>, xid: u32) {
    put_u8(buf, TAG_STREAM_CHANGE);
    put_u32(buf, xid);
}

/// Writes a [`Message::StreamAbort`].
pub fn put_stream_abort(buf: &mut Vec<u8>, xid: u32, subxid: u32) {
    put_u8(buf, TAG_STREAM_ABORT);
    put_u32(buf, xid);
    put_u32(buf, subxid);
}

/// Writes a [`Message::StreamCommit`].
pub fn put_stream_commit(
    buf: &mut Vec<u8>,
    xid: u32,
    commit_lsn: Lsn,
    end_lsn: Lsn,
    commit_time: i64,
) {
    put_u8(buf, TAG_STREAM_COMMIT);
    put_u32(buf, xid);
    put_u64(buf, commit_lsn.0);
    put_u64(buf, end_lsn.0);
    buf.extend_from_slice(&commit_time.to_be_bytes());
}

/// Whether a message starting with `tag` may be the body of a
/// [`Message::StreamChange`].
fn streamable(tag: u8) -> bool {
    matches!(
        tag,
        TAG_RELATION
            | TAG_INSERT
            | TAG_UPDATE
            | TAG_DELETE
            | TAG_TRUNCATE
            | TAG_REWRITE
            | TAG_TRUNCATE_PARTITION
    )
}

/// Starts a tuple; exactly `ncols` values ([`put_null`], [`put_unchanged`],
/// [`put_text`]) must follow.
pub fn put_tuple_header(buf: &mut Vec<u8>, ncols: u16) {
    put_u16(buf, ncols);
}

/// Writes a NULL tuple value.
pub fn put_null(buf: &mut Vec<u8>) {
    put_u8(buf, KIND_NULL);
}

/// Writes an unchanged-TOAST tuple value (the value itself is not sent).
pub fn put_unchanged(buf: &mut Vec<u8>) {
    put_u8(buf, KIND_UNCHANGED);
}

/// Writes a text tuple value: the type output function's bytes, which must
/// be UTF-8 for the reader to accept the message.
///
/// # Panics
/// If `text` is longer than `u32::MAX` bytes (a datum is at most 1 GB).
pub fn put_text(buf: &mut Vec<u8>, text: &[u8]) {
    put_u8(buf, KIND_TEXT);
    put_bytes(buf, text);
}

fn put_tuple(buf: &mut Vec<u8>, t: &Tuple<'_>) {
    put_tuple_header(buf, count_u16(t.values.len()));
    for v in &t.values {
        match v {
            Value::Null => put_null(buf),
            Value::Unchanged => put_unchanged(buf),
            Value::Text(s) => put_text(buf, s.as_bytes()),
        }
    }
}

/// Column counts are u16 on the wire; PostgreSQL allows at most 1664.
fn count_u16(n: usize) -> u16 {
    u16::try_from(n).expect("wire: more than u16::MAX columns")
}

/// Appends the encoding of `msg` to `buf`, using the `put_*` functions.
///
/// # Panics
/// If the message cannot be represented: more than `u16::MAX` columns in a
/// relation or tuple, or a string or value longer than `u32::MAX` bytes.
/// Neither can come from PostgreSQL.
pub fn encode(msg: &Message<'_>, buf: &mut Vec<u8>) {
    match msg {
        Message::Begin {
            xid,
            final_lsn,
            commit_time,
        } => put_begin(buf, *xid, *final_lsn, *commit_time),
        Message::Commit {
            xid,
            commit_lsn,
            end_lsn,
            commit_time,
        } => put_commit(buf, *xid, *commit_lsn, *end_lsn, *commit_time),
        Message::Relation {
            relid,
            namespace,
            name,
            columns,
        } => {
            put_relation_header(buf, *relid, namespace, name, count_u16(columns.len()));
            for c in columns {
                put_column(buf, c.name, c.type_oid, c.typmod, c.flags);
            }
        }
        Message::Insert { relid, new } => {
            put_insert_header(buf, *relid);
            put_tuple(buf, new);
        }
        Message::Update {
            relid,
            old_key,
            new,
        } => {
            put_update_header(buf, *relid, old_key.is_some());
            if let Some(old) = old_key {
                put_tuple(buf, old);
            }
            put_tuple(buf, new);
        }
        Message::Delete { relid, old_key } => {
            put_delete_header(buf, *relid);
            put_tuple(buf, old_key);
        }
        Message::Truncate { flags, relids } => put_truncate(buf, *flags, relids),
        Message::Signal { body } => put_signal(buf, body),
        Message::Keepalive { end_lsn } => put_keepalive(buf, *end_lsn),
        Message::Rewrite { relid } => put_rewrite(buf, *relid),
        Message::TruncatePartition {
            relid,
            partition,
            predicate,
        } => put_truncate_partition(buf, *relid, partition, predicate),
        Message::StreamStart { xid, first } => put_stream_start(buf, *xid, *first),
        Message::StreamStop => put_stream_stop(buf),
        Message::StreamChange { xid, body } => {
            put_stream_change_header(buf, *xid);
            buf.extend_from_slice(body);
        }
        Message::StreamAbort { xid, subxid } => put_stream_abort(buf, *xid, *subxid),
        Message::StreamCommit {
            xid,
            commit_lsn,
            end_lsn,
            commit_time,
        } => put_stream_commit(buf, *xid, *commit_lsn, *end_lsn, *commit_time),
    }
}

// ---------------------------------------------------------------- decoding

/// Why a buffer is not a valid message. Offsets are from the buffer start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ended (or a length or count exceeds what is left) where
    /// `needed` bytes of `expected` had to start at `offset`.
    Truncated {
        /// What was being read.
        expected: &'static str,
        /// Where it starts.
        offset: usize,
        /// Bytes it needs (at least).
        needed: usize,
        /// Bytes left at `offset`.
        available: usize,
    },
    /// The first byte is not a message tag.
    UnknownTag {
        /// The byte found.
        tag: u8,
    },
    /// A tuple value's kind byte is not `n`, `u` or `t`.
    UnknownValueKind {
        /// The byte found.
        kind: u8,
        /// Its offset.
        offset: usize,
    },
    /// The body of a stream change is not a change, truncate, relation or
    /// rewrite message.
    NotStreamable {
        /// The body's first byte.
        tag: u8,
    },
    /// A flag byte is not 0 or 1 (the first-block flag of a stream start).
    InvalidFlag {
        /// The byte found.
        value: u8,
        /// Its offset.
        offset: usize,
    },
    /// The old-key presence byte of an update is not 0 or 1.
    InvalidOldKeyFlag {
        /// The byte found.
        value: u8,
        /// Its offset.
        offset: usize,
    },
    /// A string or text value is not valid UTF-8.
    InvalidUtf8 {
        /// Which field.
        expected: &'static str,
        /// Offset of the field's first byte (after its length).
        offset: usize,
    },
    /// Bytes remain after a complete message.
    TrailingBytes {
        /// Where the message ended.
        offset: usize,
        /// How many bytes follow it.
        count: usize,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { expected, offset, needed, available } => write!(
                f,
                "expected {expected} ({needed} bytes) at offset {offset}, only {available} bytes left"
            ),
            DecodeError::UnknownTag { tag } => {
                write!(f, "expected a message tag at offset 0, found byte 0x{tag:02X}")
            }
            DecodeError::UnknownValueKind { kind, offset } => write!(
                f,
                "expected a value kind (n, u or t) at offset {offset}, found byte 0x{kind:02X}"
            ),
            DecodeError::NotStreamable { tag } => write!(
                f,
                "expected a change, truncate, relation or rewrite message after a stream change header (offset 5), found tag 0x{tag:02X}"
            ),
            DecodeError::InvalidFlag { value, offset } => write!(
                f,
                "expected flag 0 or 1 at offset {offset}, found {value}"
            ),
            DecodeError::InvalidOldKeyFlag { value, offset } => write!(
                f,
                "expected old-key flag 0 or 1 at offset {offset}, found {value}"
            ),
            DecodeError::InvalidUtf8 { expected, offset } => {
                write!(f, "expected UTF-8 {expected} at offset {offset}, found invalid bytes")
            }
            DecodeError::TrailingBytes { offset, count } => write!(
                f,
                "expected end of message at offset {offset}, found {count} more bytes"
            ),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Cursor over the input; every read is bounds-checked.
struct Reader<'a> {
    rest: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    fn truncated(&self, expected: &'static str, needed: usize) -> DecodeError {
        DecodeError::Truncated {
            expected,
            offset: self.offset,
            needed,
            available: self.rest.len(),
        }
    }

    fn take(&mut self, n: usize, expected: &'static str) -> Result<&'a [u8], DecodeError> {
        let (head, tail) = self
            .rest
            .split_at_checked(n)
            .ok_or_else(|| self.truncated(expected, n))?;
        self.rest = tail;
        self.offset += n;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, expected: &'static str) -> Result<[u8; N], DecodeError> {
        let (head, tail) = self
            .rest
            .split_first_chunk::<N>()
            .ok_or_else(|| self.truncated(expected, N))?;
        self.rest = tail;
        self.offset += N;
        Ok(*head)
    }

    fn u8(&mut self, expected: &'static str) -> Result<u8, DecodeError> {
        self.array(expected).map(u8::from_be_bytes)
    }
    fn u16(&mut self, expected: &'static str) -> Result<u16, DecodeError> {
        self.array(expected).map(u16::from_be_bytes)
    }
    fn u32(&mut self, expected: &'static str) -> Result<u32, DecodeError> {
        self.array(expected).map(u32::from_be_bytes)
    }
    fn i32(&mut self, expected: &'static str) -> Result<i32, DecodeError> {
        self.array(expected).map(i32::from_be_bytes)
    }
    fn i64(&mut self, expected: &'static str) -> Result<i64, DecodeError> {
        self.array(expected).map(i64::from_be_bytes)
    }
    fn lsn(&mut self, expected: &'static str) -> Result<Lsn, DecodeError> {
        self.array(expected).map(|b| Lsn(u64::from_be_bytes(b)))
    }

    /// A u32 length followed by that many UTF-8 bytes.
    fn str(&mut self, expected: &'static str) -> Result<&'a str, DecodeError> {
        let len = self.u32(expected)?;
        let offset = self.offset;
        // A u32 always fits in usize on the 32- and 64-bit targets PostgreSQL
        // supports; saturating keeps a hypothetical 16-bit target panic-free.
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let bytes = self.take(len, expected)?;
        std::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8 { expected, offset })
    }

    /// Checks that `count` items of at least `min_len` bytes each can fit
    /// in the rest of the input, so `Vec::with_capacity(count)` is bounded
    /// by the input size.
    fn check_count(
        &self,
        count: usize,
        min_len: usize,
        expected: &'static str,
    ) -> Result<(), DecodeError> {
        let needed = count.saturating_mul(min_len);
        if needed > self.rest.len() {
            return Err(self.truncated(expected, needed));
        }
        Ok(())
    }

    fn tuple(&mut self) -> Result<Tuple<'a>, DecodeError> {
        let n = usize::from(self.u16("tuple column count")?);
        self.check_count(n, MIN_VALUE_LEN, "tuple values")?;
        let mut values = Vec::with_capacity(n);
        for _ in 0..n {
            let offset = self.offset;
            values.push(match self.u8("value kind")? {
                KIND_NULL => Value::Null,
                KIND_UNCHANGED => Value::Unchanged,
                KIND_TEXT => Value::Text(self.str("text value")?),
                kind => return Err(DecodeError::UnknownValueKind { kind, offset }),
            });
        }
        Ok(Tuple { values })
    }

    fn column(&mut self) -> Result<Column<'a>, DecodeError> {
        Ok(Column {
            name: self.str("column name")?,
            type_oid: self.u32("column type oid")?,
            typmod: self.i32("column typmod")?,
            flags: self.u8("column flags")?,
        })
    }

    fn message(&mut self) -> Result<Message<'a>, DecodeError> {
        let tag = self.u8("message tag")?;
        let msg = match tag {
            TAG_BEGIN => Message::Begin {
                xid: self.u32("xid")?,
                final_lsn: self.lsn("final lsn")?,
                commit_time: self.i64("commit time")?,
            },
            TAG_COMMIT => Message::Commit {
                xid: self.u32("xid")?,
                commit_lsn: self.lsn("commit lsn")?,
                end_lsn: self.lsn("end lsn")?,
                commit_time: self.i64("commit time")?,
            },
            TAG_RELATION => self.relation()?,
            TAG_INSERT => Message::Insert {
                relid: self.u32("relid")?,
                new: self.tuple()?,
            },
            TAG_UPDATE => self.update()?,
            TAG_DELETE => Message::Delete {
                relid: self.u32("relid")?,
                old_key: self.tuple()?,
            },
            TAG_TRUNCATE => self.truncate()?,
            TAG_SIGNAL => {
                let len = self.u32("signal length")?;
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                Message::Signal {
                    body: self.take(len, "signal body")?,
                }
            }
            TAG_KEEPALIVE => Message::Keepalive {
                end_lsn: self.lsn("keepalive end lsn")?,
            },
            TAG_REWRITE => Message::Rewrite {
                relid: self.u32("rewritten relid")?,
            },
            TAG_TRUNCATE_PARTITION => Message::TruncatePartition {
                relid: self.u32("partitioned relid")?,
                partition: self.str("partition name")?,
                predicate: self.str("partition predicate")?,
            },
            TAG_STREAM_START => {
                let xid = self.u32("xid")?;
                let offset = self.offset;
                let first = match self.u8("first-block flag")? {
                    0 => false,
                    1 => true,
                    value => return Err(DecodeError::InvalidFlag { value, offset }),
                };
                Message::StreamStart { xid, first }
            }
            TAG_STREAM_STOP => Message::StreamStop,
            TAG_STREAM_CHANGE => self.stream_change()?,
            TAG_STREAM_ABORT => Message::StreamAbort {
                xid: self.u32("xid")?,
                subxid: self.u32("subxid")?,
            },
            TAG_STREAM_COMMIT => Message::StreamCommit {
                xid: self.u32("xid")?,
                commit_lsn: self.lsn("commit lsn")?,
                end_lsn: self.lsn("end lsn")?,
                commit_time: self.i64("commit time")?,
            },
            tag => return Err(DecodeError::UnknownTag { tag }),
        };
        Ok(msg)
    }

    /// The body of a Relation message (after its tag).
    fn relation(&mut self) -> Result<Message<'a>, DecodeError> {
        let relid = self.u32("relid")?;
        let namespace = self.str("namespace")?;
        let name = self.str("relation name")?;
        let n = usize::from(self.u16("column count")?);
        self.check_count(n, MIN_COLUMN_LEN, "columns")?;
        let mut columns = Vec::with_capacity(n);
        for _ in 0..n {
            columns.push(self.column()?);
        }
        Ok(Message::Relation {
            relid,
            namespace,
            name,
            columns,
        })
    }

    /// The body of an Update message (after its tag).
    fn update(&mut self) -> Result<Message<'a>, DecodeError> {
        let relid = self.u32("relid")?;
        let offset = self.offset;
        let old_key = match self.u8("old-key flag")? {
            0 => None,
            1 => Some(self.tuple()?),
            value => return Err(DecodeError::InvalidOldKeyFlag { value, offset }),
        };
        Ok(Message::Update {
            relid,
            old_key,
            new: self.tuple()?,
        })
    }

    /// The body of a Truncate message (after its tag).
    fn truncate(&mut self) -> Result<Message<'a>, DecodeError> {
        let flags = self.u8("truncate flags")?;
        let count = self.u32("relation count")?;
        let n = usize::try_from(count).unwrap_or(usize::MAX);
        self.check_count(n, 4, "truncated relids")?;
        let mut relids = Vec::with_capacity(n);
        for _ in 0..n {
            relids.push(self.u32("relid")?);
        }
        Ok(Message::Truncate { flags, relids })
    }

    /// The body of a Stream Change message (after its tag): exactly one streamable message.
    fn stream_change(&mut self) -> Result<Message<'a>, DecodeError> {
        let xid = self.u32("xid")?;
        let tag = *self
            .rest
            .first()
            .ok_or_else(|| self.truncated("stream change body", 1))?;
        if !streamable(tag) {
            return Err(DecodeError::NotStreamable { tag });
        }
        let start = self.offset;
        let body = self.take(self.rest.len(), "stream change body")?;
        // The body is exactly one valid message (errors at the offsets of the whole).
        let mut inner = Reader {
            rest: body,
            offset: start,
        };
        inner.message()?;
        if !inner.rest.is_empty() {
            return Err(DecodeError::TrailingBytes {
                offset: inner.offset,
                count: inner.rest.len(),
            });
        }
        Ok(Message::StreamChange { xid, body })
    }
}

/// Decodes exactly one message occupying all of `buf`.
///
/// # Errors
/// A [`DecodeError`] naming what was expected and at which offset, if `buf`
/// is not exactly one well-formed message of this version.
pub fn decode(buf: &[u8]) -> Result<Message<'_>, DecodeError> {
    let mut r = Reader {
        rest: buf,
        offset: 0,
    };
    let msg = r.message()?;
    if !r.rest.is_empty() {
        return Err(DecodeError::TrailingBytes {
            offset: r.offset,
            count: r.rest.len(),
        });
    }
    Ok(msg)
}

/// Fuzzing entry point: decodes `data` and discards the result. Must never
/// panic, whatever `data` is.
pub fn fuzz_decode(data: &[u8]) {
    let _ = decode(data);
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
