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

/// A table without a key copied whole at one point of the stream (README, *Tables without a
/// key*): which source transactions the copy already holds.
///
/// The worker reads the copy in one statement, at an iteration boundary: every source
/// transaction committed before the boundary has been applied, none after. The copy holds
/// exactly the transactions its snapshot sees. It is taken only if every transaction the stream
/// already applied is among them (the retake check, [`DeliveredXids::missed_by`] on the xids
/// the stream delivered for the table, plus a commit-log look at the snapshot's in-progress
/// ones: a transaction whose commit record the stream already applied can still be running in
/// the process array, above all under synchronous replication). Then the transactions after the
/// boundary that the snapshot sees are in the copy already, and the stream skips the table's
/// changes in them: [`KeylessCopy::holds`].
///
/// Guarantees: [`KeylessCopy::holds`] is true exactly for a transaction whose commit record
/// lies before `until` (the WAL insert position read after the snapshot was taken: every
/// transaction the snapshot sees committed before it) and whose top-level xid the snapshot does
/// not treat as in progress. A subtransaction's changes reach the stream under its top-level
/// xid, whose visibility decides (a top-level transaction is listed in a snapshot while it
/// runs, whatever its subtransactions). Past `until` nothing is held, so an xid that wrapped
/// around (2^31 transactions later) is never taken for one the snapshot saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeylessCopy {
    /// The copy's snapshot.
    pub snapshot: InvisibleXids,
    /// The WAL insert position read after the snapshot was taken.
    pub until: crate::lsn::Lsn,
}

impl KeylessCopy {
    /// Whether the transaction with top-level `xid` whose commit record is at `commit_lsn` is in
    /// the copy (its changes of the table are skipped by the stream).
    pub fn holds(&self, xid: u32, commit_lsn: crate::lsn::Lsn) -> bool {
        commit_lsn < self.until && self.snapshot.xmax.is_some() && !self.snapshot.contains(xid)
    }
}

/// The retake check of a keyless copy (see [`KeylessCopy`]): `None` when the copy of table
/// `relid` read with `snapshot` may be taken, else a transaction the stream already applied
/// that the snapshot does not see (its rows would be missing from the copy, which replaces the
/// table at the target: lost). Then the copy is read again later, with a new snapshot.
pub fn copy_misses(delivered: &DeliveredXids, relid: u32, snapshot: &InvisibleXids) -> Option<u32> {
    delivered
        .by_table
        .get(&relid)?
        .iter()
        .copied()
        .find(|&x| snapshot.contains(x))
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

    use crate::lsn::Lsn;

    #[test]
    fn keyless_copy_holds_what_its_snapshot_sees_before_until() {
        let copy = KeylessCopy {
            snapshot: InvisibleXids::parse("100:110:101,105").unwrap(),
            until: Lsn(5000),
        };
        // Committed before the snapshot (seen): skipped by the stream.
        assert!(copy.holds(99, Lsn(4000)));
        assert!(copy.holds(102, Lsn(4999)));
        // In progress when the copy was read, or began after it: applied by the stream.
        assert!(!copy.holds(101, Lsn(4000)));
        assert!(!copy.holds(105, Lsn(4000)));
        assert!(!copy.holds(110, Lsn(4000)));
        assert!(!copy.holds(200, Lsn(4000)));
        // Past `until` nothing is held, whatever the xid (a wrapped-around one looks old).
        assert!(!copy.holds(99, Lsn(5000)));
        assert!(!copy.holds(99, Lsn(9000)));
        // No snapshot: nothing held.
        let none = KeylessCopy {
            snapshot: InvisibleXids::default(),
            until: Lsn(5000),
        };
        assert!(!none.holds(1, Lsn(1)));
        // Epochs: the snapshot's xids are 64-bit, decoding's 32-bit.
        let base = 3u64 << 32;
        let e = KeylessCopy {
            snapshot: InvisibleXids::parse(&format!("{}:{}:{}", base + 5, base + 10, base + 7))
                .unwrap(),
            until: Lsn(10),
        };
        assert!(e.holds(6, Lsn(1)) && e.holds(9, Lsn(1)));
        assert!(!e.holds(7, Lsn(1)) && !e.holds(10, Lsn(1)) && !e.holds(11, Lsn(1)));
    }

    #[test]
    fn copy_retake_check_catches_an_applied_transaction_still_running() {
        let mut d = DeliveredXids::default();
        d.record(7, 90);
        d.record(7, 104);
        d.record(8, 105);
        // 104 was applied (its commit record decoded) but the snapshot still lists it: retake.
        let gap = InvisibleXids::parse("100:110:101,104").unwrap();
        assert_eq!(copy_misses(&d, 7, &gap), Some(104));
        // At or past xmax (not listed) counts too.
        let past = InvisibleXids::parse("100:104:101").unwrap();
        assert_eq!(copy_misses(&d, 7, &past), Some(104));
        // Another table's transaction does not hold this copy back.
        let other = InvisibleXids::parse("100:110:105").unwrap();
        assert_eq!(copy_misses(&d, 7, &other), None);
        // Once it is visible: the copy may be taken.
        let later = InvisibleXids::parse("106:112:").unwrap();
        assert_eq!(copy_misses(&d, 7, &later), None);
        assert_eq!(copy_misses(&d, 9, &gap), None, "nothing delivered");
    }

    /// A model of the copy of a keyless table: the source is a multiset of rows changed by
    /// transactions in commit order; the stream applies those up to the boundary, the copy
    /// replaces the target with what its snapshot sees, and the stream goes on, skipping what
    /// the copy holds. A transaction whose commit record precedes the boundary but which the
    /// snapshot still sees in progress (the gap): with the retake check the copy is taken
    /// later and the target equals the source; without it, its row is lost.
    #[test]
    fn keyless_copy_model_converges_only_with_the_retake_check() {
        // (xid, commit LSN, row inserted)
        let txns: Vec<(u32, u64, &str)> = vec![
            (10, 100, "a"),
            (11, 200, "b"),
            (12, 300, "a"), // a duplicate
            (13, 400, "c"),
            (14, 500, "d"),
        ];
        let source: Vec<&str> = txns.iter().map(|t| t.2).collect();
        let boundary = 350u64; // 10, 11, 12 applied by the stream
        let run = |check: bool, snapshots: &[&str]| -> Vec<String> {
            let mut target: Vec<String> = Vec::new();
            let mut delivered = DeliveredXids::default();
            for &(xid, lsn, row) in &txns {
                if lsn < boundary {
                    target.push(row.into());
                    delivered.record(1, xid);
                }
            }
            let mut taken = None;
            for (i, s) in snapshots.iter().enumerate() {
                let snap = InvisibleXids::parse(s).unwrap();
                if check && copy_misses(&delivered, 1, &snap).is_some() {
                    continue; // retake
                }
                taken = Some((i, snap));
                break;
            }
            let (_, snap) = taken.expect("a snapshot was taken");
            let copy = KeylessCopy {
                snapshot: snap,
                until: Lsn(450),
            };
            // The copy: what the snapshot sees.
            target = txns
                .iter()
                .filter(|&&(xid, lsn, _)| lsn < 450 && !copy.snapshot.contains(xid))
                .map(|t| t.2.to_string())
                .collect();
            for &(xid, lsn, row) in &txns {
                if lsn >= boundary && !copy.holds(xid, Lsn(lsn)) {
                    target.push(row.into());
                }
            }
            target.sort();
            target
        };
        let mut want: Vec<String> = source.iter().map(|s| s.to_string()).collect();
        want.sort();
        // First snapshot: 12 (applied, commit 300) still in progress; 13 committed (seen).
        // Second: everything up to 13 seen.
        let snaps = ["12:14:12", "14:14:"];
        assert_eq!(run(true, &snaps), want, "with the retake check");
        let broken = run(false, &snaps);
        assert_ne!(broken, want, "without it a row is lost");
        assert_eq!(broken.len(), want.len() - 1);
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
