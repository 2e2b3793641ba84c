//! A buffer of messages that moves to a temporary file once it grows past a threshold, and
//! hands the messages back in the order they were pushed.
//!
//! The pipeline worker collects what the output plugin writes during one decoding call here: a
//! source transaction is replayed by its commit record in one call, so one huge transaction
//! would otherwise have to fit in memory. Messages are stored as a little-endian `u32` length
//! followed by the bytes, in memory and in the file alike.
//!
//! Guarantees: [`SpillBuffer::drain`] yields every pushed message exactly once, in push order,
//! whether it went to the file or stayed in memory; the file is removed when the buffer is
//! cleared, drained or dropped; memory holds at most about `threshold` bytes of messages (plus
//! one message). The bytes in the files of every buffer sharing one [`FileBudget`] never exceed
//! its limit: a write that would go past it fails with [`FileLimitReached`] (see
//! [`limit_reached`]) and writes nothing.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The most bytes the files of a set of buffers may hold at once (pg_tide's
/// `tide.spool_file_limit`, for the buffers of one pipeline worker's decoder), and what they
/// hold now. Clones share it.
#[derive(Clone, Debug)]
pub struct FileBudget(Arc<BudgetState>);

#[derive(Debug)]
struct BudgetState {
    /// `u64::MAX`: no limit.
    limit: AtomicU64,
    used: AtomicU64,
}

impl Default for FileBudget {
    fn default() -> Self {
        FileBudget(Arc::new(BudgetState {
            limit: AtomicU64::new(u64::MAX),
            used: AtomicU64::new(0),
        }))
    }
}

impl FileBudget {
    /// No limit (until [`FileBudget::set_limit`]).
    pub fn unlimited() -> Self {
        Self::default()
    }

    /// The limit in bytes (`None`: none). Applies to the next write; what the files hold stays.
    pub fn set_limit(&self, bytes: Option<u64>) {
        self.0
            .limit
            .store(bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Bytes the files hold now.
    pub fn used(&self) -> u64 {
        self.0.used.load(Ordering::Relaxed)
    }

    fn take(&self, n: u64) -> std::io::Result<()> {
        let limit = self.0.limit.load(Ordering::Relaxed);
        let used = self.0.used.load(Ordering::Relaxed);
        if used.saturating_add(n) > limit {
            return Err(std::io::Error::other(FileLimitReached { limit, used }));
        }
        self.0.used.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    fn give_back(&self, n: u64) {
        let _ = self
            .0
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(n))
            });
    }
}

/// A write refused by a [`FileBudget`]: the files held `used` bytes, and the write would have
/// taken them past `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimitReached {
    pub limit: u64,
    pub used: u64,
}

impl std::fmt::Display for FileLimitReached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "temporary files would exceed their limit of {} kB ({} kB in use)",
            self.limit / 1024,
            self.used / 1024
        )
    }
}

impl std::error::Error for FileLimitReached {}

/// The [`FileLimitReached`] an I/O error of a buffer carries, if that is what it is.
pub fn limit_reached(e: &std::io::Error) -> Option<FileLimitReached> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<FileLimitReached>())
        .copied()
}

pub struct SpillBuffer {
    mem: Vec<u8>,
    count: usize,
    threshold: usize,
    dir: PathBuf,
    prefix: String,
    file: Option<SpillFile>,
    /// Bytes written to files since the buffer was created.
    spilled_total: u64,
    files_created: u64,
    budget: FileBudget,
}

struct SpillFile {
    path: PathBuf,
    writer: Option<BufWriter<File>>,
    reader: Option<BufReader<File>>,
    /// Bytes written to it, taken from `budget` and given back when it is removed.
    bytes: u64,
    budget: FileBudget,
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        self.writer = None;
        self.reader = None;
        let _ = std::fs::remove_file(&self.path);
        self.budget.give_back(self.bytes);
    }
}

impl SpillBuffer {
    /// A buffer whose files are created in `dir` (created when needed), named `prefix.N`.
    pub fn new(dir: impl AsRef<Path>, prefix: impl Into<String>, threshold: usize) -> Self {
        SpillBuffer {
            mem: Vec::new(),
            count: 0,
            threshold: threshold.max(1),
            dir: dir.as_ref().to_path_buf(),
            prefix: prefix.into(),
            file: None,
            spilled_total: 0,
            files_created: 0,
            budget: FileBudget::unlimited(),
        }
    }

    /// The same buffer, its files counted against `budget` (shared with other buffers).
    pub fn with_budget(mut self, budget: FileBudget) -> Self {
        self.budget = budget;
        self
    }

    /// Bytes kept in memory before they move to the file (applies from the next push).
    pub fn set_threshold(&mut self, threshold: usize) {
        self.threshold = threshold.max(1);
    }

    /// Messages pushed since the last drain or clear.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes written to temporary files over the buffer's life.
    pub fn spilled_total(&self) -> u64 {
        self.spilled_total
    }

    /// The current file, if the buffer spilled since the last drain or clear.
    pub fn file_path(&self) -> Option<&Path> {
        self.file.as_ref().map(|f| f.path.as_path())
    }

    pub fn push(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let len = u32::try_from(bytes.len()).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "message over 4 GiB")
        })?;
        self.mem.extend_from_slice(&len.to_le_bytes());
        self.mem.extend_from_slice(bytes);
        self.count += 1;
        if self.mem.len() >= self.threshold {
            self.spill()?;
        }
        Ok(())
    }

    fn spill(&mut self) -> std::io::Result<()> {
        let n = self.mem.len() as u64;
        self.budget.take(n)?;
        if let Err(e) = self.write_out() {
            self.budget.give_back(n);
            return Err(e);
        }
        if let Some(f) = self.file.as_mut() {
            f.bytes += n;
        }
        Ok(())
    }

    fn write_out(&mut self) -> std::io::Result<()> {
        if self.file.is_none() {
            std::fs::create_dir_all(&self.dir)?;
            self.files_created += 1;
            let path = self
                .dir
                .join(format!("{}.{}", self.prefix, self.files_created));
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)?;
            self.file = Some(SpillFile {
                path,
                writer: Some(BufWriter::with_capacity(1 << 20, file)),
                reader: None,
                bytes: 0,
                budget: self.budget.clone(),
            });
        }
        if let Some(w) = self.file.as_mut().and_then(|f| f.writer.as_mut()) {
            w.write_all(&self.mem)?;
            self.spilled_total += self.mem.len() as u64;
        }
        self.mem.clear();
        Ok(())
    }

    /// Forget every message (and remove the file).
    pub fn clear(&mut self) {
        self.mem.clear();
        self.count = 0;
        self.file = None;
    }

    /// Hand the messages out in order; whatever is left is cleared when the drain is dropped.
    pub fn drain(&mut self) -> Drain<'_> {
        Drain {
            buf: self,
            at: 0,
            scratch: Vec::new(),
        }
    }
}

pub struct Drain<'a> {
    buf: &'a mut SpillBuffer,
    /// Offset of the next message in memory.
    at: usize,
    scratch: Vec<u8>,
}

impl Drain<'_> {
    /// The next message, or `None` after the last.
    pub fn next_message(&mut self) -> std::io::Result<Option<&[u8]>> {
        if let Some(f) = self.buf.file.as_mut() {
            if let Some(mut w) = f.writer.take() {
                w.flush()?;
                let mut file = w.into_inner().map_err(|e| e.into_error())?;
                file.seek(SeekFrom::Start(0))?;
                f.reader = Some(BufReader::with_capacity(1 << 20, file));
            }
            if let Some(r) = f.reader.as_mut() {
                let mut len = [0u8; 4];
                match r.read_exact(&mut len) {
                    Ok(()) => {
                        self.scratch.resize(u32::from_le_bytes(len) as usize, 0);
                        r.read_exact(&mut self.scratch)?;
                        return Ok(Some(&self.scratch));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        // The file is done: remove it, go on with memory.
                        self.buf.file = None;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        let mem = &self.buf.mem;
        if self.at + 4 > mem.len() {
            return Ok(None);
        }
        let mut len = [0u8; 4];
        len.copy_from_slice(&mem[self.at..self.at + 4]);
        let start = self.at + 4;
        let end = start + u32::from_le_bytes(len) as usize;
        if end > mem.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "truncated message in the buffer",
            ));
        }
        self.at = end;
        Ok(Some(&mem[start..end]))
    }
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        self.buf.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tide_spill_{name}_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn messages(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("message {i} {}", "x".repeat(i % 37)).into_bytes())
            .collect()
    }

    fn drain_all(b: &mut SpillBuffer) -> Vec<Vec<u8>> {
        let mut d = b.drain();
        let mut out = Vec::new();
        while let Some(m) = d.next_message().unwrap() {
            out.push(m.to_vec());
        }
        out
    }

    #[test]
    fn memory_only_round_trip() {
        let d = dir("mem");
        let mut b = SpillBuffer::new(&d, "t", 1 << 20);
        let msgs = messages(100);
        for m in &msgs {
            b.push(m).unwrap();
        }
        assert_eq!(b.len(), 100);
        assert!(b.file_path().is_none());
        assert_eq!(drain_all(&mut b), msgs);
        assert_eq!(b.len(), 0);
        assert_eq!(b.spilled_total(), 0);
    }

    #[test]
    fn spills_in_order_and_removes_the_file() {
        let d = dir("spill");
        let mut b = SpillBuffer::new(&d, "t", 256);
        let msgs = messages(1000);
        for m in &msgs {
            b.push(m).unwrap();
        }
        let path = b.file_path().expect("spilled").to_path_buf();
        assert!(path.exists());
        assert!(b.spilled_total() > 0);
        // Memory holds less than the threshold plus one message.
        assert!(b.mem.len() < 256 + 4 + 64, "{}", b.mem.len());
        assert_eq!(drain_all(&mut b), msgs);
        assert!(!path.exists(), "file left behind");
        // Reusable after a drain: a second round spills to a new file.
        for m in &msgs[..500] {
            b.push(m).unwrap();
        }
        let second = b.file_path().expect("spilled again").to_path_buf();
        assert_ne!(path, second);
        assert_eq!(drain_all(&mut b), msgs[..500].to_vec());
        assert!(!second.exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn partial_drain_and_clear_remove_the_file() {
        let d = dir("partial");
        let mut b = SpillBuffer::new(&d, "t", 64);
        for m in messages(200) {
            b.push(&m).unwrap();
        }
        let path = b.file_path().unwrap().to_path_buf();
        {
            let mut dr = b.drain();
            assert!(dr.next_message().unwrap().is_some());
        }
        assert!(!path.exists());
        assert!(b.is_empty());
        for m in messages(200) {
            b.push(&m).unwrap();
        }
        let path = b.file_path().unwrap().to_path_buf();
        b.clear();
        assert!(!path.exists());
        drop(b);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn empty_messages_survive() {
        let d = dir("empty");
        let mut b = SpillBuffer::new(&d, "t", 8);
        let msgs: Vec<Vec<u8>> = vec![vec![], b"a".to_vec(), vec![], vec![0; 20], vec![]];
        for m in &msgs {
            b.push(m).unwrap();
        }
        assert_eq!(drain_all(&mut b), msgs);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_shared_budget_bounds_the_files_and_is_given_back() {
        let d = dir("budget");
        let budget = FileBudget::unlimited();
        budget.set_limit(Some(4096));
        let mut a = SpillBuffer::new(&d, "a", 256).with_budget(budget.clone());
        let mut b = SpillBuffer::new(&d, "b", 256).with_budget(budget.clone());
        let msg = vec![7u8; 300];
        // Each push spills 304 bytes: 13 fit in 4096, shared by both buffers.
        let mut pushed = 0;
        let err = loop {
            let r = if pushed % 2 == 0 {
                a.push(&msg)
            } else {
                b.push(&msg)
            };
            match r {
                Ok(()) => pushed += 1,
                Err(e) => break e,
            }
            assert!(pushed < 100, "the limit was never reached");
        };
        assert_eq!(pushed, 13);
        let reached = limit_reached(&err).expect("a limit error");
        assert_eq!(reached.limit, 4096);
        assert!(budget.used() <= 4096, "{}", budget.used());
        assert!(limit_reached(&std::io::Error::other("x")).is_none());
        // Raising the limit lets the write through; removing the files gives it all back.
        budget.set_limit(None);
        b.push(&msg).unwrap();
        assert!(budget.used() > 4096);
        let n = drain_all(&mut a).len() + drain_all(&mut b).len();
        assert!(n >= 13, "{n}");
        assert_eq!(budget.used(), 0);
        let _ = std::fs::remove_dir_all(&d);
    }
}
