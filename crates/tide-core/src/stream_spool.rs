//! The worker's side of streamed (in-progress) transactions: each one's messages are spooled,
//! one [`SpillBuffer`] (a temporary file past a threshold) per transaction, until the
//! transaction ends; at its commit they go on to the decoder's output as one ordinary committed
//! transaction (Begin, the messages, Commit), at its abort they are forgotten.
//!
//! Owns: the spools and the state of the stream block being received.
//!
//! Guarantees:
//! - What [`Streams::route`] pushes to the output is what a decoding without streaming would
//!   have written: messages outside streamed transactions as they come, and each streamed
//!   transaction whole, at the position of its commit, between a Begin and a Commit carrying the
//!   commit's positions and time, without the messages of its aborted subtransactions.
//! - Memory holds at most about `threshold` bytes per transaction in progress (plus one message);
//!   the rest is in its file. A spool's file is removed when its transaction commits or aborts,
//!   and every one when the `Streams` is cleared or dropped (a decoder reopened starts again
//!   from the slot's restart point, where PostgreSQL streams every transaction in progress again
//!   from its start).
//! - With [`Streams::pass_through`] on, every stream message but the commit (block start and
//!   stop, each change, each abort) is also pushed to the output, in the order received and
//!   between whole committed transactions, so that a reader of the output can apply a
//!   transaction's blocks while it runs (a remote target: `worker::stream_apply`); the spool
//!   stays the source of truth, and the commit still comes as Begin ... Commit from it.
//! - A message that breaks the protocol (a change outside a block, a block inside a block, a
//!   continuation or commit of a transaction that was never started) is an error, never dropped
//!   or applied out of place.

use crate::lsn::Lsn;
use crate::spill::{FileBudget, SpillBuffer};
use crate::wire::{self, Message};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::PathBuf;

/// One streamed transaction in progress.
struct Spooled {
    /// Each message as the `u32` little-endian (sub)transaction id it belongs to, then the
    /// message.
    buf: SpillBuffer,
    /// Subtransactions that aborted.
    aborted: HashSet<u32>,
}

/// The spools of the streamed transactions in progress.
pub struct Streams {
    dir: PathBuf,
    prefix: String,
    threshold: usize,
    /// The transaction whose block is being received.
    current: Option<u32>,
    txns: HashMap<u32, Spooled>,
    scratch: Vec<u8>,
    /// Streamed transactions committed, aborted, and messages spooled, over the life.
    pub committed: u64,
    pub aborted: u64,
    pub spooled: u64,
    /// Also push the stream messages (all but the commit) to the output (see the module
    /// header).
    pub pass_through: bool,
    /// What every spool's file counts against.
    budget: FileBudget,
}

/// Why a message could not be routed.
#[derive(Debug)]
pub enum StreamError {
    /// The bytes are not a valid message.
    Decode(wire::DecodeError),
    /// The message is valid but out of place.
    Protocol(String),
    /// A spool's temporary file.
    Io(std::io::Error),
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::Decode(e) => write!(f, "invalid message from the output plugin: {e}"),
            StreamError::Protocol(m) => write!(f, "streamed transaction out of order: {m}"),
            StreamError::Io(e) => write!(f, "streamed transaction spool: {e}"),
        }
    }
}

impl std::error::Error for StreamError {}

impl From<std::io::Error> for StreamError {
    fn from(e: std::io::Error) -> Self {
        StreamError::Io(e)
    }
}

fn is_stream_tag(tag: u8) -> bool {
    matches!(tag, b'S' | b'E' | b'X' | b'A' | b'F')
}

impl Streams {
    /// Spools whose files are created in `dir`, named `prefix.xXID.N`, each keeping up to
    /// `threshold` bytes in memory.
    pub fn new(dir: impl Into<PathBuf>, prefix: impl Into<String>, threshold: usize) -> Self {
        Streams {
            dir: dir.into(),
            prefix: prefix.into(),
            threshold,
            current: None,
            txns: HashMap::new(),
            scratch: Vec::new(),
            committed: 0,
            aborted: 0,
            spooled: 0,
            pass_through: false,
            budget: FileBudget::unlimited(),
        }
    }

    /// The same spools, their files counted against `budget` (shared with other buffers).
    pub fn with_budget(mut self, budget: FileBudget) -> Self {
        self.budget = budget;
        self
    }

    /// Streamed transactions in progress.
    pub fn in_progress(&self) -> usize {
        self.txns.len()
    }

    /// The transactions in progress.
    pub fn in_progress_xids(&self) -> Vec<u32> {
        self.txns.keys().copied().collect()
    }

    /// Forget every transaction in progress and remove their files.
    pub fn clear(&mut self) {
        self.current = None;
        self.txns.clear();
    }

    fn protocol<T>(m: String) -> Result<T, StreamError> {
        Err(StreamError::Protocol(m))
    }

    /// Route one message of the output plugin: push it to `out`, spool it, or act on it.
    pub fn route(&mut self, msg: &[u8], out: &mut SpillBuffer) -> Result<(), StreamError> {
        match msg.first() {
            Some(&tag) if is_stream_tag(tag) => {}
            _ => {
                if let Some(xid) = self.current {
                    return Self::protocol(format!(
                        "a message outside a stream change inside the block of transaction {xid}"
                    ));
                }
                return Ok(out.push(msg)?);
            }
        }
        let decoded = wire::decode(msg).map_err(StreamError::Decode)?;
        let pass = self.pass_through && !matches!(decoded, Message::StreamCommit { .. });
        self.route_stream(decoded, out)?;
        if pass {
            out.push(msg)?;
        }
        Ok(())
    }

    fn route_stream(&mut self, msg: Message<'_>, out: &mut SpillBuffer) -> Result<(), StreamError> {
        match msg {
            Message::StreamStart { xid, first } => self.start(xid, first),
            Message::StreamStop => match self.current.take() {
                Some(_) => Ok(()),
                None => Self::protocol("a stream stop outside a block".into()),
            },
            Message::StreamChange { xid: sub, body } => {
                let Some(top) = self.current else {
                    return Self::protocol(format!(
                        "a change of transaction {sub} outside a stream block"
                    ));
                };
                let Some(t) = self.txns.get_mut(&top) else {
                    return Self::protocol(format!("no spool for transaction {top}"));
                };
                self.scratch.clear();
                self.scratch.extend_from_slice(&sub.to_le_bytes());
                self.scratch.extend_from_slice(body);
                t.buf.push(&self.scratch)?;
                self.spooled += 1;
                Ok(())
            }
            Message::StreamAbort { xid, subxid } => {
                self.outside_block("abort", xid)?;
                if xid == subxid {
                    if self.txns.remove(&xid).is_some() {
                        self.aborted += 1;
                    }
                } else if let Some(t) = self.txns.get_mut(&xid) {
                    t.aborted.insert(subxid);
                }
                Ok(())
            }
            Message::StreamCommit {
                xid,
                commit_lsn,
                end_lsn,
                commit_time,
            } => {
                self.outside_block("commit", xid)?;
                self.commit(xid, commit_lsn, end_lsn, commit_time, out)
            }
            _ => Self::protocol("unexpected message".into()),
        }
    }

    fn outside_block(&self, what: &str, xid: u32) -> Result<(), StreamError> {
        match self.current {
            Some(cur) => Self::protocol(format!(
                "a stream {what} of transaction {xid} inside the block of transaction {cur}"
            )),
            None => Ok(()),
        }
    }

    fn start(&mut self, xid: u32, first: bool) -> Result<(), StreamError> {
        if let Some(cur) = self.current {
            return Self::protocol(format!(
                "a block of transaction {xid} inside the block of transaction {cur}"
            ));
        }
        if first {
            // A first block replaces whatever was spooled for the id (there is nothing unless
            // the plugin restarted under us).
            let prefix = format!("{}.x{xid}", self.prefix);
            self.txns.insert(
                xid,
                Spooled {
                    buf: SpillBuffer::new(&self.dir, prefix, self.threshold)
                        .with_budget(self.budget.clone()),
                    aborted: HashSet::new(),
                },
            );
        } else if !self.txns.contains_key(&xid) {
            return Self::protocol(format!(
                "a later block of transaction {xid}, whose first block was not received"
            ));
        }
        self.current = Some(xid);
        Ok(())
    }

    fn commit(
        &mut self,
        xid: u32,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_time: i64,
        out: &mut SpillBuffer,
    ) -> Result<(), StreamError> {
        let Some(mut t) = self.txns.remove(&xid) else {
            return Self::protocol(format!(
                "a commit of streamed transaction {xid}, none of whose blocks was received"
            ));
        };
        self.scratch.clear();
        wire::put_begin(&mut self.scratch, xid, commit_lsn, commit_time);
        out.push(&self.scratch)?;
        let mut drain = t.buf.drain();
        while let Some(rec) = drain.next_message()? {
            let Some((sub, body)) = rec.split_first_chunk::<4>() else {
                return Self::protocol("a spooled record without its transaction id".into());
            };
            if !t.aborted.contains(&u32::from_le_bytes(*sub)) {
                out.push(body)?;
            }
        }
        drop(drain);
        self.scratch.clear();
        wire::put_commit(&mut self.scratch, xid, commit_lsn, end_lsn, commit_time);
        out.push(&self.scratch)?;
        self.committed += 1;
        Ok(())
    }
}

#[cfg(test)]
#[path = "stream_spool_tests.rs"]
mod tests;
