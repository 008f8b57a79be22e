//! Exact decoding of the checkpoint's FP8 / FP4 / UE8M0 / BF16 encodings (spec §4.4).
//!
//! Decoding goes through 256-entry tables built at compile time: one lookup per byte is both
//! the fastest and the most obviously correct way to turn an 8-bit code into an f32.

/// Value of an e4m3fn code: sign 1, exponent 4 (bias 7), mantissa 3, subnormals, no
/// infinities, `0x7F`/`0xFF` NaN.
const fn e4m3_value(code: u8) -> f32 {
    let exp = ((code >> 3) & 0xF) as i32;
    let mant = (code & 0x7) as u32;
    if code & 0x7F == 0x7F {
        return f32::NAN;
    }
    let magnitude = if exp == 0 {
        // Subnormal: mant * 2^-3 * 2^(1-7) = mant * 2^-9, exact in f32.
        mant as f32 / 512.0
    } else {
        // Re-bias the exponent to f32's 127 and left-align the 3 mantissa bits.
        f32::from_bits((((exp - 7 + 127) as u32) << 23) | (mant << 20))
    };
    if code & 0x80 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// Value of a UE8M0 scale byte: `2^(e - 127)`, `e = 255` is NaN.
const fn ue8m0_value(e: u8) -> f32 {
    match e {
        255 => f32::NAN,
        // 2^-127 is below f32's normal range: it is the subnormal with only bit 22 set.
        0 => f32::from_bits(1 << 22),
        _ => f32::from_bits((e as u32) << 23),
    }
}

/// Function pointers cannot be called in const fns, hence one builder per table.
const fn build_e4m3() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_value(i as u8);
        i += 1;
    }
    t
}

const fn build_ue8m0() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = ue8m0_value(i as u8);
        i += 1;
    }
    t
}

/// e4m3fn code -> f32.
pub static E4M3: [f32; 256] = build_e4m3();
/// UE8M0 byte -> f32.
pub static UE8M0: [f32; 256] = build_ue8m0();
/// e2m1 nibble -> f32 (bit 3 = sign).
pub static E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Index of the first e4m3 NaN code in `bytes`, if any.
pub fn first_e4m3_nan(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b & 0x7F == 0x7F)
}

/// Index of the first UE8M0 NaN byte (255) in `bytes`, if any.
pub fn first_ue8m0_nan(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b == 255)
}

/// BF16 little-endian bytes -> f32 (a BF16 is the top half of an f32).
pub fn bf16_to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
        .collect()
}

/// F32 little-endian bytes -> f32. The data is not 4-byte aligned in the file, so it is
/// read byte-wise rather than reinterpreted.
pub fn f32_from_le(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// FP8 weight `[rows, cols]` times its `block x block` scale grid
/// `[ceil(rows/block), ceil(cols/block)]`. Crate-private: the caller has checked both
/// lengths against the header and that no NaN codes occur (so errors can name the tensor).
pub(crate) fn dequant_fp8(
    codes: &[u8],
    rows: usize,
    cols: usize,
    scale: &[u8],
    block: usize,
) -> Vec<f32> {
    use rayon::prelude::*;
    let scale_cols = cols.div_ceil(block);
    let mut out = vec![0.0f32; rows * cols];
    if cols == 0 {
        return out;
    }
    out.par_chunks_mut(cols).enumerate().for_each(|(i, row)| {
        let srow = &scale[(i / block) * scale_cols..][..scale_cols];
        let crow = &codes[i * cols..][..cols];
        for (j, (o, &c)) in row.iter_mut().zip(crow).enumerate() {
            *o = E4M3[c as usize] * UE8M0[srow[j / block] as usize];
        }
    });
    out
}

/// FP4 weight, logical `[rows, cols]`, packed `[rows, cols/2]` (low nibble = even column),
/// times the per-32-column scale `[rows, cols/32]`. Lengths and NaN-free scales are checked
/// by the caller, as for [`dequant_fp8`].
pub(crate) fn dequant_fp4(packed: &[u8], rows: usize, cols: usize, scale: &[u8]) -> Vec<f32> {
    use rayon::prelude::*;
    let scale_cols = cols / 32;
    let mut out = vec![0.0f32; rows * cols];
    if cols == 0 {
        return out;
    }
    out.par_chunks_mut(cols).enumerate().for_each(|(i, row)| {
        let prow = &packed[i * (cols / 2)..][..cols / 2];
        let srow = &scale[i * scale_cols..][..scale_cols];
        for (k, &byte) in prow.iter().enumerate() {
            let s = UE8M0[srow[(2 * k) / 32] as usize];
            row[2 * k] = E2M1[(byte & 0xF) as usize] * s;
            row[2 * k + 1] = E2M1[(byte >> 4) as usize] * s;
        }
    });
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_table_has_the_spec_values() {
        assert_eq!(E4M3[0x00], 0.0);
        assert!(E4M3[0x80] == 0.0 && E4M3[0x80].is_sign_negative());
        // Smallest subnormal 2^-9, largest subnormal 7 * 2^-9, smallest normal 2^-6.
        assert_eq!(E4M3[0x01], 2f32.powi(-9));
        assert_eq!(E4M3[0x07], 7.0 * 2f32.powi(-9));
        assert_eq!(E4M3[0x08], 2f32.powi(-6));
        assert_eq!(E4M3[0x38], 1.0);
        assert_eq!(E4M3[0x39], 1.125);
        assert_eq!(E4M3[0xB8], -1.0);
        // Max finite: exponent 15, mantissa 6 = 1.75 * 2^8.
        assert_eq!(E4M3[0x7E], 448.0);
        assert_eq!(E4M3[0xFE], -448.0);
        assert!(E4M3[0x7F].is_nan() && E4M3[0xFF].is_nan());
        let nans = E4M3.iter().filter(|v| v.is_nan()).count();
        assert_eq!(nans, 2);
        assert_eq!(first_e4m3_nan(&[0x00, 0x7E, 0xFF]), Some(2));
    }

    #[test]
    fn e4m3_table_is_monotonic_over_positive_codes() {
        for c in 1..0x7F {
            assert!(E4M3[c] > E4M3[c - 1], "code {c:#x}");
        }
    }

    #[test]
    fn ue8m0_table_is_powers_of_two() {
        assert_eq!(UE8M0[127], 1.0);
        assert_eq!(UE8M0[128], 2.0);
        assert_eq!(UE8M0[120], 2f32.powi(-7));
        assert_eq!(UE8M0[1], 2f32.powi(-126));
        assert_eq!(UE8M0[0], 2f32.powi(-127));
        assert_eq!(UE8M0[254], 2f32.powi(127));
        assert!(UE8M0[255].is_nan());
        assert_eq!(first_ue8m0_nan(&[1, 255]), Some(1));
    }

    #[test]
    fn fp4_low_nibble_is_the_even_column() {
        // Row of 32 logical columns: byte 0 = 0x2F -> col0 = code 0xF (-6), col1 = code 2 (1.0).
        let mut packed = vec![0u8; 16];
        packed[0] = 0x2F;
        packed[15] = 0x71; // col30 = code 1 (0.5), col31 = code 7 (6)
        let out = dequant_fp4(&packed, 1, 32, &[128]);
        assert_eq!(out[0], -12.0);
        assert_eq!(out[1], 2.0);
        assert_eq!(out[30], 1.0);
        assert_eq!(out[31], 12.0);
        assert!(out[2..30].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn fp4_scale_is_per_32_columns() {
        let packed = vec![0x22u8; 2 * 32]; // 2 rows x 64 logical cols, every value 1.0
        let scale = [127u8, 128, 129, 130]; // rows x 2 groups
        let out = dequant_fp4(&packed, 2, 64, &scale);
        assert_eq!((out[0], out[31], out[32], out[63]), (1.0, 1.0, 2.0, 2.0));
        assert_eq!((out[64], out[95], out[96], out[127]), (4.0, 4.0, 8.0, 8.0));
    }

    #[test]
    fn fp8_block_scale_handles_partial_blocks() {
        // 130 x 200 weight of code 0x38 (1.0): scale grid 2 x 2, partial last row/col block.
        let (rows, cols) = (130, 200);
        let codes = vec![0x38u8; rows * cols];
        let scale = [127u8, 128, 129, 130];
        let out = dequant_fp8(&codes, rows, cols, &scale, 128);
        let at = |i: usize, j: usize| out[i * cols + j];
        assert_eq!((at(0, 0), at(127, 127)), (1.0, 1.0));
        assert_eq!((at(0, 128), at(127, 199)), (2.0, 2.0));
        assert_eq!((at(128, 0), at(129, 127)), (4.0, 4.0));
        assert_eq!((at(128, 128), at(129, 199)), (8.0, 8.0));
    }

    #[test]
    fn bf16_and_f32_decode_unaligned_bytes() {
        let bytes = [0x80, 0x3F, 0x00, 0xC0]; // bf16 1.0, -2.0
        assert_eq!(bf16_to_f32(&bytes), vec![1.0, -2.0]);
        let mut raw = vec![0u8];
        raw.extend_from_slice(&1.5f32.to_le_bytes());
        assert_eq!(f32_from_le(&raw[1..]), vec![1.5]);
    }
}
