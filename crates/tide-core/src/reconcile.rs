//! The DBLog watermark reconciler.
//!
//! Owns the in-memory state that merges backfill chunks into the change
//! stream. For each chunk the worker commits a low watermark (LW), reads the
//! chunk (`WHERE key > last ORDER BY key LIMIT n`), commits a high watermark
//! (HW), and registers the rows here before the stream reaches the LW. While
//! the stream is between the chunk's LW and HW (the chunk's *window* is
//! open), every change to a key of the chunk's table removes that key from
//! the chunk: the stream itself carries a value at least as new. At the HW
//! the surviving rows are exactly as of the HW position and are emitted there
//! as `read` events. `tests/reconcile_model.rs` checks this against a model
//! of the whole system with crashes.
//!
//! Guarantees: single-threaded, no I/O; memory is the chunk rows plus O(1)
//! per chunk; a change to a table with no open window costs one hash lookup,
//! to a table with an open window O(log n) per open window on that table.
//! After a restart nothing is known ([`Reconciler::forget_all`]), and
//! watermarks of unknown chunks are ignored, so chunks read before a crash
//! are simply read again. Chunk ids must therefore never be reused across
//! restarts (take them from a sequence), or a stale watermark still in the
//! replayed stream could open or close a new chunk's window.

use std::collections::HashMap;
use std::hash::Hash;

/// Identifies one backfill chunk; written into its LW and HW.
pub type ChunkId = u64;

/// The rows of a chunk that survive reconciliation, to emit at its HW.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkResult<K, R> {
    /// Surviving rows in the order the chunk was registered with (the order it was read in:
    /// its key order in the source, which the rendered keys `K` need not sort in).
    pub rows: Vec<(K, R)>,
    /// Rows the chunk was registered with.
    pub read: usize,
    /// Rows removed because the stream changed their key inside the window.
    pub dropped: usize,
}

struct Chunk<T, K, R> {
    table: T,
    /// Sorted by key, each with its place in the registered order; `None` once dropped (the
    /// row's memory is freed).
    rows: Vec<(K, u32, Option<R>)>,
    open: bool,
    dropped: usize,
}

/// Reconciles backfill chunks of tables `T` (keys `K`, rows `R`) with the
/// change stream, fed in commit order.
pub struct Reconciler<T, K, R> {
    chunks: HashMap<ChunkId, Chunk<T, K, R>>,
    /// Chunks whose window is open, by table.
    open: HashMap<T, Vec<ChunkId>>,
}

impl<T, K: Ord, R> Chunk<T, K, R> {
    /// Drop every row of `key`.
    fn drop(&mut self, key: &K) {
        let first = self.rows.partition_point(|(k, _, _)| k < key);
        for (k, _, row) in self.rows.iter_mut().skip(first) {
            if k != key {
                break;
            }
            if row.take().is_some() {
                self.dropped += 1;
            }
        }
    }
}

impl<T, K, R> Default for Reconciler<T, K, R> {
    fn default() -> Self {
        Reconciler {
            chunks: HashMap::new(),
            open: HashMap::new(),
        }
    }
}

impl<T: Eq + Hash + Clone, K: Ord, R> Reconciler<T, K, R> {
    /// An empty reconciler.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a chunk read from `table`. Must happen before the stream
    /// reaches the chunk's LW. Rows may come in any order (the survivors come
    /// back in that order); registering an id again replaces the earlier
    /// chunk.
    pub fn add_chunk(&mut self, chunk: ChunkId, table: T, rows: Vec<(K, R)>) {
        self.remove(chunk);
        let mut rows: Vec<(K, u32, Option<R>)> = rows
            .into_iter()
            .enumerate()
            .map(|(i, (k, r))| (k, u32::try_from(i).unwrap_or(u32::MAX), Some(r)))
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        self.chunks.insert(
            chunk,
            Chunk {
                table,
                rows,
                open: false,
                dropped: 0,
            },
        );
    }

    /// The stream reached `chunk`'s LW: open its window. Returns false if
    /// the chunk is unknown (e.g. read before a restart), which the caller
    /// ignores.
    pub fn on_low_watermark(&mut self, chunk: ChunkId) -> bool {
        let Some(c) = self.chunks.get_mut(&chunk) else {
            return false;
        };
        if !c.open {
            c.open = true;
            self.open.entry(c.table.clone()).or_default().push(chunk);
        }
        true
    }

    /// The stream carries a change (insert, update or delete) to `key` of
    /// `table`: drop that key from every chunk of `table` whose window is
    /// open. For an update that changes the key, call this for both keys.
    pub fn on_change(&mut self, table: &T, key: &K) {
        let Some(ids) = self.open.get(table) else {
            return;
        };
        for id in ids {
            let Some(c) = self.chunks.get_mut(id) else {
                continue; // unreachable: `open` only lists registered chunks
            };
            c.drop(key);
        }
    }

    /// Drop `key` from `chunk` whether or not its window is open: the stream
    /// carries a change by a transaction the chunk's snapshot could not see
    /// (PostgreSQL writes a commit record before the transaction becomes
    /// visible, so such a transaction can commit before the LW in the log and
    /// still be missing from the chunk). Unknown chunks are ignored.
    pub fn drop_key(&mut self, chunk: ChunkId, key: &K) {
        if let Some(c) = self.chunks.get_mut(&chunk) {
            c.drop(key);
        }
    }

    /// The stream reached `chunk`'s HW: close its window and return the
    /// surviving rows, to emit at this position. `None` if the chunk is
    /// unknown, or its LW was never seen (it is then discarded: its rows
    /// cannot be trusted and the chunk must be read again).
    pub fn on_high_watermark(&mut self, chunk: ChunkId) -> Option<ChunkResult<K, R>> {
        let c = self.remove(chunk)?;
        if !c.open {
            return None;
        }
        let read = c.rows.len();
        let mut rows: Vec<(u32, K, R)> = c
            .rows
            .into_iter()
            .filter_map(|(k, i, r)| Some((i, k, r?)))
            .collect();
        rows.sort_unstable_by_key(|(i, _, _)| *i);
        let rows = rows.into_iter().map(|(_, k, r)| (k, r)).collect();
        Some(ChunkResult {
            rows,
            read,
            dropped: c.dropped,
        })
    }

    /// Forgets every chunk, as a crash would.
    pub fn forget_all(&mut self) {
        self.chunks.clear();
        self.open.clear();
    }

    /// Chunks registered and not yet closed by their HW.
    pub fn pending(&self) -> usize {
        self.chunks.len()
    }

    fn remove(&mut self, chunk: ChunkId) -> Option<Chunk<T, K, R>> {
        let c = self.chunks.remove(&chunk)?;
        if c.open {
            if let Some(ids) = self.open.get_mut(&c.table) {
                ids.retain(|&id| id != chunk);
                if ids.is_empty() {
                    self.open.remove(&c.table);
                }
            }
        }
        Some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(keys: &[i64]) -> Vec<(i64, String)> {
        keys.iter().map(|k| (*k, format!("r{k}"))).collect()
    }

    #[test]
    fn changes_inside_the_window_drop_keys() {
        let mut r = Reconciler::new();
        r.add_chunk(1, "t", rows(&[3, 1, 2, 4]));
        r.on_change(&"t", &1); // before LW: ignored
        assert!(r.on_low_watermark(1));
        r.on_change(&"t", &2);
        r.on_change(&"t", &2);
        r.on_change(&"u", &3); // other table
        r.on_change(&"t", &9); // not in chunk
        let res = r.on_high_watermark(1).unwrap();
        // In the order registered, not the keys' order.
        assert_eq!(
            res,
            ChunkResult {
                rows: rows(&[3, 1, 4]),
                read: 4,
                dropped: 1
            }
        );
        assert_eq!(r.pending(), 0);
        r.on_change(&"t", &3); // after HW: no window
    }

    #[test]
    fn invisible_transactions_drop_keys_before_the_window() {
        let mut r = Reconciler::new();
        r.add_chunk(1, "t", rows(&[1, 2, 3]));
        // A transaction that committed before the LW but was not yet visible to the chunk.
        r.drop_key(1, &2);
        r.drop_key(7, &1); // unknown chunk: ignored
        assert!(r.on_low_watermark(1));
        let res = r.on_high_watermark(1).unwrap();
        assert_eq!(
            res,
            ChunkResult {
                rows: rows(&[1, 3]),
                read: 3,
                dropped: 1
            }
        );
    }

    #[test]
    fn unknown_and_unopened_chunks() {
        let mut r: Reconciler<u32, i64, ()> = Reconciler::new();
        assert!(!r.on_low_watermark(7));
        assert_eq!(r.on_high_watermark(7), None);
        r.add_chunk(8, 0, vec![(1, ())]);
        assert_eq!(r.on_high_watermark(8), None, "HW without LW");
        assert_eq!(r.pending(), 0);
        r.add_chunk(9, 0, vec![(1, ())]);
        assert!(r.on_low_watermark(9));
        r.forget_all();
        assert_eq!((r.pending(), r.on_high_watermark(9)), (0, None));
    }

    #[test]
    fn overlapping_windows_and_duplicate_keys() {
        let mut r = Reconciler::new();
        r.add_chunk(1, 0u8, rows(&[1, 2, 2, 3]));
        r.add_chunk(2, 0u8, rows(&[2, 3, 4]));
        assert!(r.on_low_watermark(1));
        r.on_change(&0, &1);
        assert!(r.on_low_watermark(2));
        r.on_change(&0, &2);
        let first = r.on_high_watermark(1).unwrap();
        assert_eq!((first.rows, first.dropped), (rows(&[3]), 3));
        r.on_change(&0, &4);
        assert_eq!(r.on_high_watermark(2).unwrap().rows, rows(&[3]));
        assert!(r.open.is_empty());
    }

    #[test]
    fn re_adding_a_chunk_replaces_it() {
        let mut r = Reconciler::new();
        r.add_chunk(1, 0u8, rows(&[1]));
        assert!(r.on_low_watermark(1));
        r.add_chunk(1, 0u8, rows(&[5]));
        assert!(r.open.is_empty());
        assert_eq!(r.on_high_watermark(1), None, "replacement's LW not seen");
    }
}
