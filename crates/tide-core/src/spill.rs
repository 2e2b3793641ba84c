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
//! one message).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

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
}

struct SpillFile {
    path: PathBuf,
    writer: Option<BufWriter<File>>,
    reader: Option<BufReader<File>>,
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        self.writer = None;
        self.reader = None;
        let _ = std::fs::remove_file(&self.path);
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
        }
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
}
