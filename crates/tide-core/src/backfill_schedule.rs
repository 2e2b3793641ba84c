//! Backfill scheduling: which chunks a pipeline worker holds in memory, when each is written,
//! and what is forgotten with it. One pure function, [`Schedule::decide`], says what a
//! watermark in the stream means for the chunks in memory; the transition methods perform it.
//! `src/worker/backfill/` drives this module (it reads and writes the chunks), and so does
//! `tests/reconcile_model.rs` (it simulates the database around it, with crashes): the model
//! test checks this code, not a copy of it. This header is the specification.
//!
//! # Slots
//!
//! A backfill's durable progress is one last key, so its chunks are written in key order. The
//! schedule keeps, per backfill, the chunks in memory as *slots* in key order (`seq`: the
//! chunk's number in its backfill, increasing with its key range). A slot is
//!
//! ```text
//!   expected --add--> waiting --HW, first of its backfill--> passed --next_ready--> (written)
//!   (announced,       (read, its rows     \                   ^
//!    not read)         in the reconciler)  \--HW, an earlier --/  (held: its window stays open
//!                                             slot is there        until it is written)
//! ```
//!
//! *Expected* slots are announced before they are read ([`Schedule::expect`]); the worker never
//! announces (its chunks are read in key order, between iterations, and registered before the
//! stream reaches their low watermark), the model test does (it plans ranges and reads them in
//! any order). A chunk the worker lost between (a reader gone) leaves no slot: the chunk after it
//! is then written at its own high watermark and refused by its progress
//! (`catalog::backfills::record_progress` accepts only a chunk that starts where its backfill
//! durably stands), which forgets the backfill's chunks ([`Schedule::forget_backfill`]).
//!
//! # Rules
//!
//! - **Low watermark** of a chunk in memory: open its window in the reconciler
//!   ([`Action::Open`]). Of any other (read before a restart, or forgotten): ignore it.
//! - **High watermark** of a chunk in memory with an earlier slot of its backfill (expected,
//!   waiting or passed): **hold** it ([`Action::Hold`]): its window stays open, so a change to
//!   one of its keys between here and the point where it is written still drops the key; it
//!   is written right after the earlier chunk, at that chunk's high watermark. Sound because a
//!   key the stream did not change from the chunk's low watermark to there has there the value
//!   the chunk read.
//! - **High watermark** of the first slot of its backfill: **emit** ([`Action::Emit`]): write
//!   it, then each held slot after it, in key order, up to the first that is not passed
//!   ([`Schedule::next_ready`] hands them out one by one, closing each window as it goes).
//! - A chunk that is not written — its window never opened (its low watermark passed before it
//!   was registered: the reconciler has no result), or the worker could not write it (its
//!   progress refused it, its table changed shape) — takes every later slot of its backfill
//!   along ([`Schedule::forget_backfill`]): they do not start where the backfill durably
//!   stands. They are read again from there.
//! - A crash, or a failed stream iteration, forgets every slot ([`Schedule::forget_all`]).
//!
//! # Caps and plans
//!
//! [`chunk_cap`]: while the stream applies source changes (any in the last second) a chunk read
//! has at most `tide.streaming_chunk_size` rows. [`Plans`]: the key ranges of a backfill's next
//! chunks, planned from where its last chunk in memory ends, are used only from there and with
//! the cap they were planned with. [`read_ahead_count`]: how many of a backfill's next chunks are
//! asked of the idle readers at once. [`Holds`]: a backfill whose next chunk waits (throttled, its
//! table locked, a snapshot to take again) until a time.
//!
//! Guarantees: no I/O, no clock of its own (times are given); memory is the slots plus the
//! reconciler's rows; every method is O(slots) at most.

use crate::reconcile::{ChunkId, ChunkResult, Reconciler};
use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A watermark in the stream, as the schedule sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Low(ChunkId),
    High(ChunkId),
}

/// What a watermark means for the chunks in memory ([`Schedule::decide`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Not a chunk in memory: nothing.
    Ignore,
    /// Open the chunk's window.
    Open,
    /// Hold the chunk: an earlier chunk of its backfill is still in memory.
    Hold,
    /// Write the chunk, then the held chunks of its backfill after it.
    Emit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Expected,
    Waiting,
    Passed,
}

struct Slot<B, C> {
    backfill: B,
    seq: i64,
    watermark: Option<ChunkId>,
    state: State,
    chunk: Option<C>,
}

/// A chunk whose turn to be written has come ([`Schedule::next_ready`]).
#[derive(Debug)]
pub struct Ready<K, R, C> {
    pub watermark: ChunkId,
    pub chunk: C,
    /// Its surviving rows; `None` when its window never opened: it must not be written (then
    /// [`Schedule::forget_backfill`]).
    pub result: Option<ChunkResult<K, R>>,
}

/// The chunks in memory of backfills `B` of tables `T` (keys `K`, rows `R`), each with the
/// caller's own state `C`, and the reconciler that merges them into the stream.
pub struct Schedule<B, T, K, R, C> {
    reconciler: Reconciler<T, K, R>,
    /// In the order they were announced or read.
    slots: Vec<Slot<B, C>>,
}

impl<B, T, K, R, C> Default for Schedule<B, T, K, R, C> {
    fn default() -> Self {
        Schedule {
            reconciler: Reconciler::default(),
            slots: Vec::new(),
        }
    }
}

impl<B: Copy + Eq, T: Eq + Hash + Clone, K: Ord, R, C> Schedule<B, T, K, R, C> {
    /// An empty schedule.
    pub fn new() -> Self {
        Self::default()
    }

    /// What `signal` means for the chunks in memory. Pure.
    pub fn decide(&self, signal: Signal) -> Action {
        let (wm, high) = match signal {
            Signal::Low(wm) => (wm, false),
            Signal::High(wm) => (wm, true),
        };
        let Some(s) = self.slot(wm) else {
            return Action::Ignore;
        };
        if !high {
            Action::Open
        } else if self.has_earlier(s.backfill, s.seq) {
            Action::Hold
        } else {
            Action::Emit
        }
    }

    /// Announce chunk `seq` of `backfill` before it is read: a later chunk of the backfill
    /// whose high watermark comes first is held until this one is written or forgotten.
    pub fn expect(&mut self, backfill: B, seq: i64) {
        if self.find(backfill, seq).is_none() {
            self.slots.push(Slot {
                backfill,
                seq,
                watermark: None,
                state: State::Expected,
                chunk: None,
            });
        }
    }

    /// Chunk `seq` of `backfill` was read under watermark `wm` from `table`: its `rows` go to the
    /// reconciler (before the stream reaches its low watermark), `chunk` is the caller's.
    pub fn add(
        &mut self,
        backfill: B,
        seq: i64,
        wm: ChunkId,
        table: T,
        rows: Vec<(K, R)>,
        chunk: C,
    ) {
        self.reconciler.add_chunk(wm, table, rows);
        let slot = Slot {
            backfill,
            seq,
            watermark: Some(wm),
            state: State::Waiting,
            chunk: Some(chunk),
        };
        match self.find(backfill, seq) {
            Some(i) => {
                // Read again under another watermark: the earlier read's window closes.
                if let Some(old) = self.slots[i].watermark.filter(|&old| old != wm) {
                    self.reconciler.on_high_watermark(old);
                }
                self.slots[i] = slot;
            }
            None => self.slots.push(slot),
        }
    }

    /// The stream reached `wm`'s low watermark: open the chunk's window. `false` when it is not
    /// a chunk in memory.
    pub fn on_low_watermark(&mut self, wm: ChunkId) -> bool {
        self.decide(Signal::Low(wm)) == Action::Open && self.reconciler.on_low_watermark(wm)
    }

    /// The stream reached `wm`'s high watermark: [`Action::Hold`] or [`Action::Emit`] (then
    /// call [`Self::next_ready`] until it says `None`), or [`Action::Ignore`].
    pub fn on_high_watermark(&mut self, wm: ChunkId) -> Action {
        let action = self.decide(Signal::High(wm));
        if action != Action::Ignore {
            if let Some(s) = self.slots.iter_mut().find(|s| s.watermark == Some(wm)) {
                s.state = State::Passed;
            }
        }
        action
    }

    /// The next chunk of `backfill` to write now: its first slot, if its high watermark has
    /// passed. Taken out of the schedule, its window closed.
    pub fn next_ready(&mut self, backfill: B) -> Option<Ready<K, R, C>> {
        let i = self.first_of(backfill)?;
        if self.slots[i].state != State::Passed {
            return None;
        }
        let s = self.slots.remove(i);
        let wm = s.watermark?;
        Some(Ready {
            watermark: wm,
            result: self.reconciler.on_high_watermark(wm),
            chunk: s.chunk?,
        })
    }

    /// Forget every slot of `backfill` (an earlier chunk was not written): their windows close,
    /// their chunks are returned.
    pub fn forget_backfill(&mut self, backfill: B) -> Vec<C> {
        let mut gone = Vec::new();
        let mut i = 0;
        while i < self.slots.len() {
            if self.slots[i].backfill != backfill {
                i += 1;
                continue;
            }
            let s = self.slots.remove(i);
            if let Some(wm) = s.watermark {
                self.reconciler.on_high_watermark(wm);
            }
            gone.extend(s.chunk);
        }
        gone
    }

    /// Forget every slot, as a crash does.
    pub fn forget_all(&mut self) {
        self.reconciler.forget_all();
        self.slots.clear();
    }

    /// A change to `key` of `table` in the stream: dropped from every chunk of the table whose
    /// window is open (see `reconcile`).
    pub fn on_change(&mut self, table: &T, key: &K) {
        self.reconciler.on_change(table, key);
    }

    /// Drop `key` from chunk `wm` whether or not its window is open (a transaction its snapshot
    /// could not see).
    pub fn drop_key(&mut self, wm: ChunkId, key: &K) {
        self.reconciler.drop_key(wm, key);
    }

    /// Whether a chunk read is in memory.
    pub fn has_chunks(&self) -> bool {
        self.slots.iter().any(|s| s.chunk.is_some())
    }

    /// The chunks read and in memory, with their watermarks, in the order they were added.
    pub fn chunks(&self) -> impl Iterator<Item = (ChunkId, &C)> {
        self.slots
            .iter()
            .filter_map(|s| Some((s.watermark?, s.chunk.as_ref()?)))
    }

    /// The same, to change the caller's state of each.
    pub fn chunks_mut(&mut self) -> impl Iterator<Item = (ChunkId, &mut C)> {
        self.slots
            .iter_mut()
            .filter_map(|s| Some((s.watermark?, s.chunk.as_mut()?)))
    }

    /// The chunk read under `wm`, if in memory.
    pub fn chunk(&self, wm: ChunkId) -> Option<&C> {
        self.slot(wm)?.chunk.as_ref()
    }

    /// The same, to change it.
    pub fn chunk_mut(&mut self, wm: ChunkId) -> Option<&mut C> {
        let i = self.slots.iter().position(|s| s.watermark == Some(wm))?;
        self.slots[i].chunk.as_mut()
    }

    /// The last chunk read of `backfill` in key order, if any.
    pub fn last_of(&self, backfill: B) -> Option<&C> {
        self.slots
            .iter()
            .filter(|s| s.backfill == backfill && s.chunk.is_some())
            .max_by_key(|s| s.seq)
            .and_then(|s| s.chunk.as_ref())
    }

    /// How many chunks of `backfill` were read and are in memory.
    pub fn count_of(&self, backfill: B) -> usize {
        self.slots
            .iter()
            .filter(|s| s.backfill == backfill && s.chunk.is_some())
            .count()
    }

    /// The backfills with a chunk in memory, each once, in the order of their first chunk.
    pub fn backfills(&self) -> Vec<B> {
        let mut ids: Vec<B> = Vec::new();
        for s in self.slots.iter().filter(|s| s.chunk.is_some()) {
            if !ids.contains(&s.backfill) {
                ids.push(s.backfill);
            }
        }
        ids
    }

    /// Chunks registered with the reconciler (its windows not closed).
    pub fn pending(&self) -> usize {
        self.reconciler.pending()
    }

    fn slot(&self, wm: ChunkId) -> Option<&Slot<B, C>> {
        self.slots
            .iter()
            .find(|s| s.watermark == Some(wm) && s.chunk.is_some())
    }

    fn find(&self, backfill: B, seq: i64) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.backfill == backfill && s.seq == seq)
    }

    fn has_earlier(&self, backfill: B, seq: i64) -> bool {
        self.slots
            .iter()
            .any(|s| s.backfill == backfill && s.seq < seq)
    }

    fn first_of(&self, backfill: B) -> Option<usize> {
        (self.slots.iter().enumerate())
            .filter(|(_, s)| s.backfill == backfill)
            .min_by_key(|(_, s)| s.seq)
            .map(|(i, _)| i)
    }
}

/// The most rows the chunks read now may have: `streaming_chunk_size` (when positive) while the
/// stream applied source changes less than a second ago (`since_stream`: the time since), else
/// none beyond the backfill's own chunk size.
pub fn chunk_cap(streaming_chunk_size: i64, since_stream: Option<Duration>) -> Option<i64> {
    let busy = since_stream.is_some_and(|d| d < Duration::from_secs(1));
    (streaming_chunk_size > 0 && busy).then_some(streaming_chunk_size)
}

/// How many of a backfill's next chunks are asked of its readers at once: one per idle reader,
/// at most one per planned bound plus the one after the last bound, and no more than tops the
/// backfill's chunks in memory (`in_memory`) up to twice the number of readers (its memory
/// bound).
pub fn read_ahead_count(idle: usize, bounds: usize, readers: usize, in_memory: usize) -> usize {
    idle.min(bounds + 1)
        .min((2 * readers).saturating_sub(in_memory))
}

/// Planned bounds of a backfill's next chunks after a key (`None`: the table's start).
pub type Plan<Key> = (Option<Key>, Vec<Key>);

/// The key ranges planned for backfills' next chunks, each from where its last chunk in memory
/// ends, with the chunk cap they were planned with (a plan's ranges hold that many keys each).
#[derive(Debug)]
pub struct Plans<B, Key> {
    plans: HashMap<B, Plan<Key>>,
    cap: Option<i64>,
}

impl<B, Key> Default for Plans<B, Key> {
    fn default() -> Self {
        Plans {
            plans: HashMap::new(),
            cap: None,
        }
    }
}

impl<B: Copy + Eq + Hash, Key: PartialEq> Plans<B, Key> {
    /// Before planning with `readers` readers and cap `cap`: a plan made with another cap, or
    /// with fewer than two readers, is dropped. Whether to plan at all (two readers or more).
    pub fn begin(&mut self, readers: usize, cap: Option<i64>) -> bool {
        if readers < 2 || self.cap != cap {
            self.plans.clear();
            self.cap = cap;
        }
        readers >= 2
    }

    /// Whether `backfill` needs a plan from `from` (it has none from there).
    pub fn wanted(&self, backfill: B, from: &Option<Key>) -> bool {
        self.plans.get(&backfill).is_none_or(|(f, _)| f != from)
    }

    /// Keep only the plans of backfills `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(B) -> bool) {
        self.plans.retain(|b, _| keep(*b));
    }

    /// The plan of `backfill` made from `from`.
    pub fn insert(&mut self, backfill: B, from: Option<Key>, bounds: Vec<Key>) {
        self.plans.insert(backfill, (from, bounds));
    }

    /// Take `backfill`'s plan to use it: its bounds if it was made from `from` with the cap
    /// `cap`, else none (one chunk after `from`).
    pub fn take(&mut self, backfill: B, from: &Option<Key>, cap: Option<i64>) -> Vec<Key> {
        match self.plans.remove(&backfill) {
            Some((f, b)) if &f == from && self.cap == cap => b,
            _ => Vec::new(),
        }
    }

    /// Forget `backfill`'s plan.
    pub fn remove(&mut self, backfill: B) {
        self.plans.remove(&backfill);
    }

    /// Forget every plan.
    pub fn clear(&mut self) {
        self.plans.clear();
    }
}

/// Backfills whose next chunk waits until a time: a throttled one (its pace; it lapses when the
/// backfill's throttle is removed), one whose chunk could not be read now or must be read again.
#[derive(Clone, Debug)]
pub struct Holds<B> {
    holds: HashMap<B, (Instant, bool)>,
}

impl<B> Default for Holds<B> {
    fn default() -> Self {
        Holds {
            holds: HashMap::new(),
        }
    }
}

impl<B: Copy + Eq + Hash> Holds<B> {
    /// Hold `backfill` until `until`; `throttle`: a throttle's pace.
    pub fn hold(&mut self, backfill: B, until: Instant, throttle: bool) {
        self.holds.insert(backfill, (until, throttle));
    }

    /// Release `backfill`.
    pub fn release(&mut self, backfill: B) {
        self.holds.remove(&backfill);
    }

    /// Whether `backfill` must not be read at `now`: a hold that has not passed, unless it is a
    /// throttle the backfill no longer has (`throttled`: whether it has one now).
    pub fn holds(&self, backfill: B, throttled: bool, now: Instant) -> bool {
        self.holds
            .get(&backfill)
            .is_some_and(|(until, throttle)| now < *until && (!throttle || throttled))
    }

    /// Whether `backfill` has a hold that has not passed at `now`, whatever kind.
    pub fn until_passed(&self, backfill: B, now: Instant) -> bool {
        self.holds
            .get(&backfill)
            .is_some_and(|(until, _)| now < *until)
    }

    /// Drop the holds passed at `now`.
    pub fn expire(&mut self, now: Instant) {
        self.holds.retain(|_, (until, _)| *until > now);
    }

    /// The soonest end of a hold.
    pub fn soonest(&self) -> Option<Instant> {
        self.holds.values().map(|(until, _)| *until).min()
    }

    /// Whether no backfill is held.
    pub fn is_empty(&self) -> bool {
        self.holds.is_empty()
    }
}

#[cfg(test)]
#[path = "backfill_schedule_tests.rs"]
mod tests;
