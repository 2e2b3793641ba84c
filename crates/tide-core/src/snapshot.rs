//! Which transactions a chunk's snapshot cannot see, as logical decoding names them.
//!
//! A backfill chunk is read with a snapshot taken after its low watermark committed. A
//! transaction whose commit record precedes the low watermark in the WAL can still be invisible
//! to that snapshot: PostgreSQL writes the commit record before it removes the transaction from
//! the process array. The stream delivers such a transaction before the window opens, so the
//! reconciliation must drop its keys from the chunk wherever it appears. Which transactions
//! these are is what `pg_current_snapshot()` says: `xmin:xmax:xip,...` — every xid listed, and
//! every xid at or after `xmax`, which the list leaves out (a transaction whose xid is newer
//! than the newest one completed is in progress by definition; PostgreSQL's `XidInMVCCSnapshot`
//! treats it so).
//!
//! Guarantees: [`InvisibleXids::contains`] is true exactly for the xids the snapshot treats as
//! in progress, compared as decoding reports them (32 bits, modulo 2^32, as PostgreSQL's
//! `TransactionIdFollowsOrEquals` does for normal xids).

use std::collections::{HashMap, HashSet};

/// The transactions a snapshot treats as in progress.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InvisibleXids {
    /// The snapshot's `xmin` (32-bit): every earlier xid has finished, for this snapshot and
    /// every later one.
    pub xmin: Option<u32>,
    /// The listed ones (32-bit).
    pub listed: HashSet<u32>,
    /// The snapshot's `xmax` (32-bit): it and every later xid are invisible.
    pub xmax: Option<u32>,
    /// The snapshot's `xmax` as a full (64-bit) xid.
    pub xmax_full: Option<u64>,
}

impl InvisibleXids {
    /// Parse `pg_current_snapshot()::text` (`xmin:xmax:xip1,xip2,...`, 64-bit xids).
    /// `None` for text of another shape.
    pub fn parse(snapshot: &str) -> Option<InvisibleXids> {
        let mut parts = snapshot.trim().split(':');
        let xmin: u64 = parts.next()?.trim().parse().ok()?;
        let xmax: u64 = parts.next()?.trim().parse().ok()?;
        let xip = parts.next()?;
        if parts.next().is_some() {
            return None;
        }
        let mut listed = HashSet::new();
        for x in xip.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            listed.insert(x.parse::<u64>().ok()? as u32);
        }
        Some(InvisibleXids {
            xmin: Some(xmin as u32),
            listed,
            xmax: Some(xmax as u32),
            xmax_full: Some(xmax),
        })
    }

    /// Whether the snapshot treats the (32-bit) transaction `xid` as in progress.
    pub fn contains(&self, xid: u32) -> bool {
        self.listed.contains(&xid)
            || self
                .xmax
                .is_some_and(|xmax| (xid.wrapping_sub(xmax) as i32) >= 0)
    }
}

/// The transactions the stream has delivered changes of, per table, that a later chunk's
/// snapshot may still treat as in progress.
///
/// Why: a transaction's commit record can be decoded before the transaction is visible (the
/// committing backend writes and flushes the record, then marks the transaction committed in
/// the commit log and the process array). A chunk read with a snapshot taken in that gap misses
/// the transaction's changes although the stream has already delivered them: its rows for the
/// transaction's keys are older than what the target has, and writing them would move those
/// keys backwards. The reconciler drops such keys when the stream delivers the transaction after
/// the chunk is registered; this set catches the ones delivered before: a chunk whose invisible
/// transactions ([`InvisibleXids`]) include one of them is read again instead of registered. A
/// read ahead makes the gap easy to hit (the next chunk is read while the stream is applied), but
/// any chunk read right after an iteration can meet it.
///
/// Memory: xids are forgotten once a chunk's snapshot has `xmin` past them, or once they are no
/// longer in progress (the worker checks when the set grows: [`DeliveredXids::retain`]); what
/// stays are the transactions committed but not yet visible, a handful.
#[derive(Debug, Default)]
pub struct DeliveredXids {
    by_table: HashMap<u32, HashSet<u32>>,
}

impl DeliveredXids {
    /// The stream delivered a change of table `relid` by transaction `xid`.
    pub fn record(&mut self, relid: u32, xid: u32) {
        self.by_table.entry(relid).or_default().insert(xid);
    }

    /// Whether a chunk of `relid` whose snapshot has `invisible` would miss changes the stream
    /// already delivered.
    pub fn missed_by(&self, relid: u32, invisible: &InvisibleXids) -> bool {
        self.by_table
            .get(&relid)
            .is_some_and(|xids| xids.iter().any(|&x| invisible.contains(x)))
    }

    /// Forget the xids a snapshot with `xmin` (and every later one) sees as finished.
    pub fn forget_before(&mut self, xmin: u32) {
        for xids in self.by_table.values_mut() {
            xids.retain(|&x| (x.wrapping_sub(xmin) as i32) >= 0);
        }
        self.by_table.retain(|_, xids| !xids.is_empty());
    }

    /// Keep only the xids `keep` is true for (those still in progress: a transaction no longer
    /// in progress is visible to every later snapshot).
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        for xids in self.by_table.values_mut() {
            xids.retain(|&x| keep(x));
        }
        self.by_table.retain(|_, xids| !xids.is_empty());
    }

    /// How many xids are remembered.
    pub fn len(&self) -> usize {
        self.by_table.values().map(HashSet::len).sum()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivered_but_invisible_is_caught_and_forgotten_by_xmin() {
        let mut d = DeliveredXids::default();
        d.record(1, 105);
        d.record(1, 90);
        d.record(2, 101);
        // A snapshot that still sees 105 in progress (listed) would miss it.
        let s = InvisibleXids::parse("100:110:101,105").unwrap();
        assert!(d.missed_by(1, &s));
        assert!(d.missed_by(2, &s), "101 is listed too");
        assert!(!d.missed_by(3, &s), "another table");
        // A later snapshot sees them finished.
        let later = InvisibleXids::parse("108:112:").unwrap();
        assert!(!d.missed_by(1, &later));
        d.forget_before(later.xmin.unwrap());
        assert_eq!(d.len(), 0, "all before 108");
        // Wraparound: 5 follows u32::MAX - 5.
        d.record(1, 5);
        d.forget_before(u32::MAX - 5);
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn listed_and_at_or_after_xmax() {
        let s = InvisibleXids::parse("100:110:101,105").unwrap();
        assert!(s.contains(101) && s.contains(105));
        assert!(!s.contains(100) && !s.contains(102) && !s.contains(109));
        assert!(s.contains(110), "xmax itself is invisible");
        assert!(
            s.contains(111) && s.contains(5000),
            "xids after xmax are invisible"
        );
        assert_eq!(s.xmax_full, Some(110));
        let empty = InvisibleXids::parse("7:7:").unwrap();
        assert!(empty.listed.is_empty());
        assert!(!empty.contains(6) && empty.contains(7));
        assert_eq!(InvisibleXids::parse("garbage"), None);
        assert_eq!(InvisibleXids::parse("1:2:3:4"), None);
        assert!(
            !InvisibleXids::default().contains(1),
            "no snapshot: nothing invisible"
        );
    }

    #[test]
    fn epochs_and_wraparound() {
        // 64-bit xids of epoch 1; decoding reports 32-bit ones.
        let base = 1u64 << 32;
        let s = InvisibleXids::parse(&format!("{}:{}:{}", base + 5, base + 10, base + 7)).unwrap();
        assert!(s.contains(7) && s.contains(10) && s.contains(11));
        assert!(!s.contains(9));
        // xmax just below the 32-bit wrap: xids past the wrap are later, hence invisible.
        let w = u32::MAX as u64 - 2;
        let s = InvisibleXids::parse(&format!("{w}:{w}:")).unwrap();
        assert!(s.contains(u32::MAX - 2) && s.contains(u32::MAX) && s.contains(3));
        assert!(!s.contains(u32::MAX - 3));
    }
}
