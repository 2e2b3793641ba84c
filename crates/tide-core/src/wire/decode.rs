//! The decoder: [`decode`], zero-copy and bounds-checked.

use super::encode::streamable;
use super::*;

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
