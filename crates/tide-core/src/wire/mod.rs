//! The binary format between the output plugin and the worker.
//!
//! Owns the version-4 encoding of one logical-decoding message (see
//! `docs/wire-format.md`, which this module implements): the message types here, the
//! encoder in `encode.rs`, the decoder in `decode.rs`. Guarantees:
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

mod decode;
mod encode;

pub use decode::{decode, fuzz_decode, DecodeError};
pub use encode::*;

#[cfg(test)]
#[path = "../wire_tests.rs"]
mod tests;
