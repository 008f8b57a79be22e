//! The safetensors element types a checkpoint may contain.

use std::fmt;

/// A safetensors dtype string, parsed. Only the ones with a whole-byte element size are
/// accepted: packed sub-byte types would need their own size rules and the model has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum Dtype {
    BOOL,
    U8,
    I8,
    F8_E4M3,
    F8_E5M2,
    F8_E8M0,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    I64,
    U64,
    F64,
}

const ALL: [Dtype; 16] = [
    Dtype::BOOL,
    Dtype::U8,
    Dtype::I8,
    Dtype::F8_E4M3,
    Dtype::F8_E5M2,
    Dtype::F8_E8M0,
    Dtype::I16,
    Dtype::U16,
    Dtype::F16,
    Dtype::BF16,
    Dtype::I32,
    Dtype::U32,
    Dtype::F32,
    Dtype::I64,
    Dtype::U64,
    Dtype::F64,
];

impl Dtype {
    /// The exact string safetensors uses in its header.
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::BOOL => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8_E4M3 => "F8_E4M3",
            Dtype::F8_E5M2 => "F8_E5M2",
            Dtype::F8_E8M0 => "F8_E8M0",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
            Dtype::F64 => "F64",
        }
    }

    /// Parses a header dtype string; `None` for anything unknown.
    pub fn parse(s: &str) -> Option<Dtype> {
        ALL.iter().copied().find(|d| d.as_str() == s)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::BOOL | Dtype::U8 | Dtype::I8 => 1,
            Dtype::F8_E4M3 | Dtype::F8_E5M2 | Dtype::F8_E8M0 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::F64 => 8,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[a, b, c]`, the way shapes appear in error messages.
pub(crate) fn shape_str(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_through_its_string() {
        for d in ALL {
            assert_eq!(Dtype::parse(d.as_str()), Some(d));
        }
        assert_eq!(Dtype::parse("F4"), None);
        assert_eq!(Dtype::BF16.size(), 2);
        assert_eq!(shape_str(&[3, 4]), "[3, 4]");
    }
}
