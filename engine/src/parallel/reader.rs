//! How the loader reads shard files: an injectable trait (tests use slow and failing
//! readers), a memory-mapped default, and the safetensors header parser on top of it.

use crate::model::checkpoint::Dtype;
use memmap2::Mmap;
use serde_json::Value;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::Path;

/// An open shard.
pub trait ShardFile: Send {
    /// File size in bytes.
    fn size(&self) -> u64;
    /// Fills `buf` with the bytes at `offset`; an error if the file is shorter.
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
}

/// Opens shards. Shared by the loader's worker threads.
pub trait ShardReader: Send + Sync {
    fn open(&self, path: &Path) -> io::Result<Box<dyn ShardFile>>;
}

/// Reads straight from a read-only memory mapping of each shard.
#[derive(Debug, Clone, Copy, Default)]
pub struct MmapReader;

struct MappedShard {
    map: Mmap,
}

impl ShardReader for MmapReader {
    fn open(&self, path: &Path) -> io::Result<Box<dyn ShardFile>> {
        let file = File::open(path)?;
        // SAFETY: read-only mapping of a checkpoint file treated as immutable while loading;
        // we only read it through `&[u8]`. A file truncated underneath us is the same hazard
        // every mmap loader accepts (SIGBUS), not unsoundness in our code.
        let map = unsafe { Mmap::map(&file) }?;
        Ok(Box::new(MappedShard { map }))
    }
}

impl ShardFile for MappedShard {
    fn size(&self) -> u64 {
        self.map.len() as u64
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let src = self
            .map
            .get(start..start.saturating_add(buf.len()))
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::UnexpectedEof, "read past end of shard")
            })?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// A tensor's place in a shard: dtype, shape and absolute byte offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderEntry {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub start: u64,
}

/// Headers larger than this are corrupt (the real checkpoint's are under 1 MiB).
const MAX_HEADER: u64 = 100 << 20;

/// Reads and parses the safetensors header of an open shard.
pub fn read_header(f: &mut dyn ShardFile) -> Result<HashMap<String, HeaderEntry>, String> {
    let mut len = [0u8; 8];
    f.read_at(0, &mut len)
        .map_err(|e| format!("cannot read header length: {e}"))?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER || n + 8 > f.size() {
        return Err(format!(
            "header length {n} exceeds the file ({} bytes)",
            f.size()
        ));
    }
    let mut text = vec![0u8; n as usize];
    f.read_at(8, &mut text)
        .map_err(|e| format!("cannot read header: {e}"))?;
    let json: Value =
        serde_json::from_slice(&text).map_err(|e| format!("malformed header JSON: {e}"))?;
    let obj = json
        .as_object()
        .ok_or("malformed header: not a JSON object")?;
    let data = 8 + n;
    obj.iter()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .map(|(k, v)| Ok((k.clone(), entry(k, v, data)?)))
        .collect()
}

fn entry(name: &str, v: &Value, data: u64) -> Result<HeaderEntry, String> {
    let bad = || format!("tensor `{name}`: malformed header entry");
    let dtype = v
        .get("dtype")
        .and_then(Value::as_str)
        .and_then(Dtype::parse)
        .ok_or_else(bad)?;
    let nums = |key: &str| -> Option<Vec<u64>> {
        v.get(key)?.as_array()?.iter().map(Value::as_u64).collect()
    };
    let shape = nums("shape")
        .ok_or_else(bad)?
        .into_iter()
        .map(|d| usize::try_from(d).map_err(|_| bad()))
        .collect::<Result<Vec<_>, _>>()?;
    let offsets = nums("data_offsets")
        .filter(|o| o.len() == 2)
        .ok_or_else(bad)?;
    Ok(HeaderEntry {
        dtype,
        shape,
        start: data + offsets[0],
    })
}
