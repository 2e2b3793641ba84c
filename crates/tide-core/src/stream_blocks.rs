//! The output plugin's side of streamed (in-progress) transactions: which stream block is being
//! decoded, whether its `StreamStart` has been written, and which transactions have written a
//! block in this decoding session. The plugin (`src/plugin/`) asks this module what to write;
//! the worker's reader of what it writes is [`crate::stream_spool::Streams`].
//!
//! Owns: the bookkeeping of one decoding session (a plugin's `startup` to its `shutdown`).
//!
//! Guarantees (the protocol `Streams` checks, `docs/wire-format.md`):
//! - A block's `StreamStart` is written lazily, before the first thing the block writes; a block
//!   that writes nothing writes no `StreamStart` and no `StreamStop`.
//! - The first `StreamStart` a transaction writes in the session says `first`, and only that
//!   one: `first` is decided from the blocks *written*, never from other bookkeeping of the
//!   transaction (a rewrite reported, a relation described). (Issue 42: the rewrite bookkeeping
//!   once shared this set, so a streamed table rewrite's first block went out without `first`
//!   and the worker stopped for good on "a later block ... whose first block was not
//!   received".)
//! - A `StreamAbort` or `StreamCommit` is written only for a transaction that wrote a block (the
//!   reader knows no other); a transaction's end forgets it, so an id used again later starts
//!   afresh.

use std::collections::{HashMap, HashSet};

/// One decoding session's streamed-transaction bookkeeping (see the module header).
#[derive(Debug, Default)]
pub struct StreamBlocks {
    /// The top-level transaction whose block is being decoded.
    block: Option<u32>,
    /// Whether that block's `StreamStart` has been written.
    open: bool,
    /// Transactions that wrote a block in this session.
    written: HashSet<u32>,
    /// Per transaction in progress, the relations whose rewrite it reported.
    rewrites: HashMap<u32, HashSet<u32>>,
}

impl StreamBlocks {
    /// A block of top-level transaction `top` begins (PostgreSQL's `stream_start`).
    pub fn start(&mut self, top: u32) {
        self.block = Some(top);
        self.open = false;
    }

    /// The top-level transaction of the block being decoded, if one is.
    pub fn block(&self) -> Option<u32> {
        self.block
    }

    /// Before the block writes anything: `Some((top, first))` when its `StreamStart` must be
    /// written now (then it counts as written), `None` when it was, or outside a block.
    pub fn open(&mut self) -> Option<(u32, bool)> {
        let top = self.block?;
        if self.open {
            return None;
        }
        self.open = true;
        Some((top, self.written.insert(top)))
    }

    /// The block ends (PostgreSQL's `stream_stop`): whether a `StreamStop` must be written.
    pub fn stop(&mut self) -> bool {
        let open = self.open;
        self.block = None;
        self.open = false;
        open
    }

    /// In a block: whether this is the first rewrite of `relid` its transaction reports in the
    /// session (recording it). `None` outside a block.
    pub fn rewrite_first(&mut self, relid: u32) -> Option<bool> {
        let top = self.block?;
        Some(self.rewrites.entry(top).or_default().insert(relid))
    }

    /// Subtransaction `sub` of `top` aborted (`sub == top`: the transaction itself, which ends
    /// it): whether a `StreamAbort` must be written.
    pub fn abort(&mut self, top: u32, sub: u32) -> bool {
        let written = self.written.contains(&top);
        if top == sub {
            self.end(top);
        }
        written
    }

    /// `top` committed: whether a `StreamCommit` must be written (else it wrote nothing). Ends
    /// it.
    pub fn commit(&mut self, top: u32) -> bool {
        let written = self.written.contains(&top);
        self.end(top);
        written
    }

    fn end(&mut self, top: u32) {
        self.written.remove(&top);
        self.rewrites.remove(&top);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_is_lazy_and_first_once() {
        let mut s = StreamBlocks::default();
        s.start(7);
        assert!(!s.stop(), "a block that wrote nothing has no StreamStop");
        s.start(7);
        assert_eq!(s.open(), Some((7, true)));
        assert_eq!(s.open(), None, "one StreamStart per block");
        assert!(s.stop());
        s.start(7);
        assert_eq!(s.open(), Some((7, false)));
        assert!(s.stop());
        assert!(s.commit(7));
        // The id starts afresh after its end.
        s.start(7);
        assert_eq!(s.open(), Some((7, true)));
    }

    /// Issue 42: a rewrite reported before anything else of the transaction was written leaves
    /// its first block `first`.
    #[test]
    fn a_rewrite_does_not_count_as_a_written_block() {
        let mut s = StreamBlocks::default();
        s.start(9);
        assert_eq!(s.rewrite_first(100), Some(true));
        assert_eq!(s.open(), Some((9, true)));
        assert!(s.stop());
        s.start(9);
        assert_eq!(s.rewrite_first(100), Some(false), "once per transaction");
        assert!(!s.stop(), "nothing written in this block");
        assert_eq!(s.rewrite_first(100), None, "outside a block");
    }

    #[test]
    fn ends_are_written_only_for_transactions_that_wrote_a_block() {
        let mut s = StreamBlocks::default();
        s.start(3);
        assert!(!s.stop());
        assert!(!s.abort(3, 4), "a subtransaction of one that wrote nothing");
        assert!(!s.commit(3), "skipped: nothing written");
        s.start(5);
        s.open();
        s.stop();
        assert!(s.abort(5, 6), "a subtransaction's abort");
        assert!(s.abort(5, 5));
        assert!(!s.commit(5), "the abort ended it");
    }
}
