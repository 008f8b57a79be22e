//! Helpers shared by the parallel tests: token streams and injectable shard readers.

#![allow(dead_code)] // each test file uses its own subset

use dsv4_engine::parallel::reader::{MmapReader, ShardFile, ShardReader};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `n` pseudo-random token ids below `vocab` (xorshift, deterministic per seed).
pub fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

/// Sleeps on every read and records how many shards are open at once.
#[derive(Default)]
pub struct SlowReader {
    pub open_now: Arc<AtomicUsize>,
    pub most_open: Arc<AtomicUsize>,
}

struct SlowFile {
    inner: Box<dyn ShardFile>,
    open_now: Arc<AtomicUsize>,
}

impl ShardReader for SlowReader {
    fn open(&self, path: &Path) -> io::Result<Box<dyn ShardFile>> {
        let inner = MmapReader.open(path)?;
        let now = self.open_now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_open.fetch_max(now, Ordering::SeqCst);
        Ok(Box::new(SlowFile {
            inner,
            open_now: self.open_now.clone(),
        }))
    }
}

impl ShardFile for SlowFile {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::thread::sleep(Duration::from_micros(300));
        self.inner.read_at(offset, buf)
    }
}

impl Drop for SlowFile {
    fn drop(&mut self) {
        self.open_now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Deletes `victim` just before it is opened; or fails the `fail_at`-th read.
pub struct FailingReader {
    pub victim: Option<PathBuf>,
    pub fail_at: Option<usize>,
    pub reads: Arc<AtomicUsize>,
}

struct CountedFile {
    inner: Box<dyn ShardFile>,
    reads: Arc<AtomicUsize>,
    fail_at: Option<usize>,
}

impl ShardReader for FailingReader {
    fn open(&self, path: &Path) -> io::Result<Box<dyn ShardFile>> {
        if self.victim.as_deref() == Some(path) {
            std::fs::remove_file(path)?;
        }
        Ok(Box::new(CountedFile {
            inner: MmapReader.open(path)?,
            reads: self.reads.clone(),
            fail_at: self.fail_at,
        }))
    }
}

impl ShardFile for CountedFile {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let n = self.reads.fetch_add(1, Ordering::SeqCst) + 1;
        if Some(n) == self.fail_at {
            return Err(io::Error::other("device unplugged"));
        }
        self.inner.read_at(offset, buf)
    }
}
