//! The GPT-2 byte-level alphabet, inverted: BPE vocabulary strings -> raw bytes.
//!
//! Byte-level BPE stores every byte as a printable char: bytes that are already printable
//! (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) stand for themselves; the remaining 68 bytes are given the
//! chars U+0100, U+0101, ... in increasing byte order. The `tokenizers` ByteLevel decoder maps
//! each char of a token back through this table and, if any char is outside the alphabet, keeps
//! the token's own UTF-8 instead. We need the raw bytes per token (not the lossy decoded string)
//! so that the incremental detokenizer can hold back a split multi-byte character.

/// Whether byte `b` is represented by the char with the same code point.
fn is_self_mapped(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// `char -> byte` for the 256 chars of the byte-level alphabet, indexed by code point (< 0x144).
fn char_to_byte_table() -> [Option<u8>; 0x144] {
    let mut table = [None; 0x144];
    let mut next_shifted = 0x100usize;
    for b in 0..=255u8 {
        if is_self_mapped(b) {
            table[usize::from(b)] = Some(b);
        } else {
            table[next_shifted] = Some(b);
            next_shifted += 1;
        }
    }
    table
}

/// Converts vocabulary strings to the bytes they stand for.
pub(crate) struct ByteDecoder {
    table: [Option<u8>; 0x144],
}

impl ByteDecoder {
    pub(crate) fn new() -> Self {
        Self {
            table: char_to_byte_table(),
        }
    }

    /// Bytes of one token string, with the same fallback as the `tokenizers` ByteLevel decoder:
    /// if any char is not in the alphabet (e.g. `｜` in `<｜User｜>`), the token is its own UTF-8.
    pub(crate) fn token_bytes(&self, token: &str) -> Vec<u8> {
        let mapped: Option<Vec<u8>> = token
            .chars()
            .map(|c| self.table.get(c as usize).copied().flatten())
            .collect();
        mapped.unwrap_or_else(|| token.as_bytes().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection() {
        let table = char_to_byte_table();
        let mut seen = [false; 256];
        for b in table.iter().flatten() {
            assert!(!seen[usize::from(*b)], "byte {b} mapped twice");
            seen[usize::from(*b)] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn known_chars() {
        let d = ByteDecoder::new();
        // 'Ġ' (U+0120) is the space, 'Ċ' (U+010A) the newline in GPT-2 style vocabularies.
        assert_eq!(d.token_bytes("Ġhello"), b" hello");
        assert_eq!(d.token_bytes("ĊĊ"), b"\n\n");
        assert_eq!(d.token_bytes("<｜User｜>"), "<｜User｜>".as_bytes());
        // "é" as two byte-level chars: 0xC3 -> 'Ã', 0xA9 -> '©'.
        assert_eq!(d.token_bytes("Ã©"), "é".as_bytes());
    }
}
