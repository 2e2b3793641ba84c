//! Streamed transactions written to a remote target while they run (issue 34): the state of
//! each one, kept for as long as the decoding session that streams them.
//!
//! With `tide.stream_in_progress` on, the decoder spools each streamed transaction's blocks
//! (`tide_core::stream_spool`, the source of truth) and, for a remote target with
//! `tide.remote_stream_connections` above 0, also hands them to the applier in stream order
//! (between whole committed transactions). The applier (`worker::apply`) writes each block
//! into a remote transaction of the streamed transaction's own, on a connection of its own
//! ([`crate::target::RemoteTarget::open_stream`]), left open between blocks; at the source's commit it
//! commits that transaction together with the applied position, instead of applying the
//! transaction from the spool; at the source's abort it rolls it back.
//!
//! Owns: per streamed transaction of the session, whether it is written while it runs
//! ([`Entry::Live`], with its target, its relation descriptions and the tables it wrote) or at
//! its commit ([`Entry::Fallback`]); the block being received; the transactions a failed
//! attempt left behind (`attempted`).
//!
//! Guarantees:
//! - A remote reader never sees part of a source transaction: a live transaction's remote
//!   transaction commits only at the source's commit, after everything committed before it at
//!   the source (the main target commits first), with the applied position; a crash in between
//!   closes the connection, which rolls it back, and the source streams it again.
//! - Falling back is always safe and loses nothing: the spool has every change, and a
//!   transaction that is not live at its commit is applied from it exactly as before. An entry
//!   falls back (its remote transaction rolled back: dropping the target closes its connection)
//!   on any error of its own connection (a lock wait past its `lock_timeout` included), on
//!   anything but row changes of captured tables and their relation descriptions (a truncate,
//!   a schema change, a marker, a change needing DDL at the target, a table its owner may no
//!   longer read: nothing of it goes to the remote, even uncommitted), on an aborted
//!   subtransaction (the rows it wrote must not stay locked at the remote: a later
//!   transaction may change them), before a backfill chunk is written (it may upsert rows the
//!   transaction holds), and past `tide.remote_stream_connections` live at once.
//! - A transaction whose attempt ended without a commit (an iteration failed while it was
//!   live: the decoder is closed and its session's entries dropped) is never live again in
//!   this worker, so a conflict cannot repeat forever.
//! - Dropping the state (the decoder closed, a failed iteration) rolls back every live remote
//!   transaction.

use crate::error::TideResult;
use crate::target::Target;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use tide_core::lsn::Lsn;
use tide_core::model::{RelDesc, Txn};

/// A streamed transaction written to the target while it runs.
pub struct LiveTxn {
    /// Its target (its own connection and open remote transaction).
    pub target: Box<dyn Target>,
    /// Its relation descriptions (a streamed transaction's Relation messages are its own).
    pub rels: HashMap<u32, RelDesc>,
    /// Captured tables it wrote: each must still be captured at its commit.
    pub written: HashSet<u32>,
    /// Tables captured when it began (its target knows where they go): a change of another
    /// one makes it fall back.
    pub known: HashSet<u32>,
    /// The transaction as the target sees it (no commit position yet).
    pub txn: Txn,
}

/// What is done with one streamed transaction of the session.
pub enum Entry {
    Live(Box<LiveTxn>),
    /// Applied at its commit from the spool, as a committed transaction.
    Fallback,
}

/// The streamed transactions of one decoding session (see the module header).
#[derive(Default)]
pub struct StreamApply {
    /// Most transactions live at once (0: none; then the decoder passes no block on).
    pub limit: usize,
    entries: HashMap<u32, Entry>,
    /// The transaction whose block is being received.
    pub current: Option<u32>,
    /// Transactions committed from their remote transaction, and fallen back, in the session.
    pub committed: u64,
    pub fallbacks: u64,
}

/// Most transaction ids remembered by [`attempted`].
const ATTEMPTED_MAX: usize = 4096;

thread_local! {
    /// Transactions made live in this worker and not yet committed or aborted.
    static ATTEMPTED: RefCell<HashSet<u32>> = RefCell::new(HashSet::new());
}

/// Whether `xid` was made live before by this worker without reaching its end.
fn attempted(xid: u32) -> bool {
    ATTEMPTED.with(|a| a.borrow().contains(&xid))
}

fn attempt(xid: u32) {
    ATTEMPTED.with(|a| {
        let mut a = a.borrow_mut();
        if a.len() >= ATTEMPTED_MAX {
            a.clear();
        }
        a.insert(xid);
    });
}

fn ended(xid: u32) {
    ATTEMPTED.with(|a| a.borrow_mut().remove(&xid));
}

impl StreamApply {
    pub fn new(limit: usize) -> StreamApply {
        StreamApply {
            limit,
            ..Default::default()
        }
    }

    fn live_count(&self) -> usize {
        self.entries
            .values()
            .filter(|e| matches!(e, Entry::Live(_)))
            .count()
    }

    /// A block of `xid` begins (`first`: its first). Decides, at the first block, whether it is
    /// written while it runs (`open` makes its target; `None` or an error: not). Returns whether
    /// it is live.
    pub fn start(
        &mut self,
        xid: u32,
        first: bool,
        open: impl FnOnce() -> TideResult<Option<Box<dyn Target>>>,
        capturing: &HashSet<u32>,
    ) -> bool {
        self.current = Some(xid);
        if first {
            // Whatever a first block replaces (only a restarted plugin sends one twice).
            self.entries.remove(&xid);
            let entry = if self.live_count() < self.limit && !attempted(xid) {
                match open() {
                    Ok(Some(target)) => {
                        attempt(xid);
                        Entry::Live(Box::new(LiveTxn {
                            target,
                            rels: HashMap::new(),
                            written: HashSet::new(),
                            known: capturing.clone(),
                            txn: Txn {
                                xid,
                                lsn: Lsn(0),
                                commit_time: 0,
                                skip: false,
                                position: 0,
                                barrier: false,
                            },
                        }))
                    }
                    _ => Entry::Fallback,
                }
            } else {
                Entry::Fallback
            };
            self.entries.insert(xid, entry);
        }
        self.is_live(xid)
    }

    pub fn is_live(&self, xid: u32) -> bool {
        matches!(self.entries.get(&xid), Some(Entry::Live(_)))
    }

    pub fn live_mut(&mut self, xid: u32) -> Option<&mut LiveTxn> {
        match self.entries.get_mut(&xid) {
            Some(Entry::Live(l)) => Some(l),
            _ => None,
        }
    }

    /// `xid` is applied at its commit from now on; its remote transaction is rolled back.
    pub fn fall_back(&mut self, xid: u32) {
        if let Some(e) = self.entries.get_mut(&xid) {
            if matches!(e, Entry::Live(_)) {
                self.fallbacks += 1;
                *e = Entry::Fallback;
            }
        }
    }

    /// Every live transaction falls back (before a backfill chunk is written).
    pub fn fall_back_all(&mut self) {
        let live: Vec<u32> = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Live(_)))
            .map(|(x, _)| *x)
            .collect();
        for xid in live {
            self.fall_back(xid);
        }
    }

    /// `xid` aborted: forget it (rolling back its remote transaction).
    pub fn abort(&mut self, xid: u32) {
        self.entries.remove(&xid);
        ended(xid);
    }

    /// At `xid`'s commit: its live state, if it is live (the entry is gone either way).
    pub fn take(&mut self, xid: u32) -> Option<Box<LiveTxn>> {
        match self.entries.remove(&xid)? {
            Entry::Live(l) => Some(l),
            Entry::Fallback => {
                ended(xid);
                None
            }
        }
    }

    /// `xid`'s remote transaction committed.
    pub fn committed(&mut self, xid: u32) {
        self.committed += 1;
        ended(xid);
    }
}
