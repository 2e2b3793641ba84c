//! The encoder: the `put_*` functions, and [`encode`] built from them.

use super::*;

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
pub(super) fn streamable(tag: u8) -> bool {
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
