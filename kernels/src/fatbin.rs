//! Minimal reader of a CUDA fatbin's entry table, to check which architectures the embedded one holds.
//!
//! Layout (little-endian, as written by nvcc 13.0): a 16-byte header (magic 0xBA55ED50, u16 version,
//! u16 header size, u64 size of the entries), then entries, each a header (u16 kind: 1 PTX, 2 ELF/SASS;
//! u16 version; u32 header size; u64 payload size; ...; u32 arch at byte 28, e.g. 90 or 120; u64 flags at byte
//! 40) followed by its payload.

/// What one fatbin entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Ptx,
    Sass,
    Other(u16),
}

/// One entry of a fatbin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FatbinEntry {
    pub kind: EntryKind,
    /// SM number, e.g. 90 for sm_90/sm_90a, 120 for sm_120a.
    pub arch: u32,
    /// Raw flags word (nvcc sets 0x100000 on arch-specific "a" targets).
    pub flags: u64,
}

const MAGIC: u32 = 0xBA55_ED50;

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// Lists the entries, or None if `bytes` is not a well-formed fatbin.
pub fn entries(bytes: &[u8]) -> Option<Vec<FatbinEntry>> {
    if u32_at(bytes, 0)? != MAGIC {
        return None;
    }
    let header = usize::from(u16_at(bytes, 6)?);
    let end = header.checked_add(usize::try_from(u64_at(bytes, 8)?).ok()?)?;
    let mut off = header;
    let mut out = Vec::new();
    while off < end.min(bytes.len()) {
        let kind = match u16_at(bytes, off)? {
            1 => EntryKind::Ptx,
            2 => EntryKind::Sass,
            k => EntryKind::Other(k),
        };
        let ehs = usize::try_from(u32_at(bytes, off + 4)?).ok()?;
        let payload = usize::try_from(u64_at(bytes, off + 8)?).ok()?;
        out.push(FatbinEntry {
            kind,
            arch: u32_at(bytes, off + 28)?,
            flags: u64_at(bytes, off + 40)?,
        });
        off = off.checked_add(ehs)?.checked_add(payload)?;
    }
    Some(out)
}
