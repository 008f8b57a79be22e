//! Weight quantisers that produce the published formats: FP8 e4m3 with 128x128 UE8M0 block
//! scales and FP4 e2m1 with per-32 UE8M0 scales, both round-to-nearest-even.

use crate::model::checkpoint::dequant::{E2M1, E4M3, UE8M0};
use crate::model::checkpoint::FP4_GROUP;

/// Largest finite e4m3 value.
const E4M3_MAX: f32 = 448.0;
/// Largest e2m1 value.
const E2M1_MAX: f32 = 6.0;
/// Codes 0..=126 are the non-negative finite e4m3 values, in increasing order.
const E4M3_FINITE: usize = 127;

/// The UE8M0 byte of the power-of-two scale `2^ceil(log2(amax / max))`; all-zero blocks
/// get scale 1.
pub fn ue8m0_scale(amax: f32, max: f32) -> u8 {
    if amax <= 0.0 || amax.is_nan() {
        return 127;
    }
    // Divide in f32 like the reference quantiser, then take ceil(log2) exactly from the bits.
    let r = f64::from(amax / max);
    let bits = r.to_bits();
    let mut e = ((bits >> 52) & 0x7FF) as i64 - 1023;
    if bits & ((1u64 << 52) - 1) != 0 {
        e += 1;
    }
    (e + 127).clamp(0, 254) as u8
}

/// Round `a >= 0` to the nearest entry of the increasing table `values`, ties to the even
/// index (= even mantissa, which is what round-to-nearest-even means for these formats).
fn nearest_even(values: &[f32], a: f32) -> usize {
    let hi = values.partition_point(|&v| v < a);
    if hi == 0 {
        return 0;
    }
    if hi >= values.len() {
        return values.len() - 1;
    }
    let lo = hi - 1;
    let (dl, dh) = (a - values[lo], values[hi] - a);
    if dl < dh || (dl == dh && lo % 2 == 0) {
        lo
    } else {
        hi
    }
}

/// f32 -> e4m3fn code, round-to-nearest-even, saturating at +-448.
pub fn e4m3_encode(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let code = nearest_even(&E4M3[..E4M3_FINITE], x.abs().min(E4M3_MAX)) as u8;
    sign | code
}

/// f32 -> e2m1 nibble, round-to-nearest-even, saturating at +-6.
pub fn e2m1_encode(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x8 } else { 0 };
    let code = nearest_even(&E2M1[..8], x.abs().min(E2M1_MAX)) as u8;
    sign | code
}

/// Quantises `w` `[rows, cols]` to e4m3 codes and a `[ceil(rows/b), ceil(cols/b)]` scale grid.
pub(crate) fn quantize_fp8(
    w: &[f32],
    rows: usize,
    cols: usize,
    block: usize,
) -> (Vec<u8>, Vec<u8>) {
    let (sr, sc) = (rows.div_ceil(block), cols.div_ceil(block));
    let mut scales = vec![127u8; sr * sc];
    for (bi, s) in scales.iter_mut().enumerate() {
        let (r0, c0) = ((bi / sc) * block, (bi % sc) * block);
        let c1 = (c0 + block).min(cols);
        let amax = (r0..(r0 + block).min(rows))
            .flat_map(|i| &w[i * cols + c0..i * cols + c1])
            .fold(0.0f32, |m, v| m.max(v.abs()));
        *s = ue8m0_scale(amax, E4M3_MAX);
    }
    let inv: Vec<f32> = scales.iter().map(|&s| 1.0 / UE8M0[s as usize]).collect();
    let mut codes = vec![0u8; rows * cols];
    for (i, (crow, wrow)) in codes
        .chunks_mut(cols.max(1))
        .zip(w.chunks(cols.max(1)))
        .enumerate()
    {
        let irow = &inv[(i / block) * sc..][..sc];
        for (j, (c, &v)) in crow.iter_mut().zip(wrow).enumerate() {
            // Scales are powers of two, so the division is exact.
            *c = e4m3_encode(v * irow[j / block]);
        }
    }
    (codes, scales)
}

/// Quantises `w` `[rows, cols]` (cols a multiple of 32) to packed e2m1 `[rows, cols/2]`
/// (low nibble = even column) and per-32 scales `[rows, cols/32]`.
pub(crate) fn quantize_fp4(w: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let groups = cols / FP4_GROUP;
    let mut packed = vec![0u8; rows * cols / 2];
    let mut scales = vec![127u8; rows * groups];
    for (g, s) in scales.iter_mut().enumerate() {
        let vals = &w[g * FP4_GROUP..(g + 1) * FP4_GROUP];
        *s = ue8m0_scale(vals.iter().fold(0.0f32, |m, v| m.max(v.abs())), E2M1_MAX);
        let inv = 1.0 / UE8M0[*s as usize];
        let out = &mut packed[g * FP4_GROUP / 2..(g + 1) * FP4_GROUP / 2];
        for (k, byte) in out.iter_mut().enumerate() {
            *byte = e2m1_encode(vals[2 * k] * inv) | (e2m1_encode(vals[2 * k + 1] * inv) << 4);
        }
    }
    (packed, scales)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::checkpoint::dequant::{dequant_fp4, dequant_fp8};

    #[test]
    fn e4m3_encode_rounds_to_nearest_even() {
        for code in 0u8..=0x7E {
            assert_eq!(e4m3_encode(E4M3[code as usize]), code);
            assert_eq!(e4m3_encode(-E4M3[code as usize]), code | 0x80);
        }
        // 1.0625 is halfway between 1.0 (0x38, even) and 1.125 (0x39): goes to 1.0.
        assert_eq!(e4m3_encode(1.0625), 0x38);
        // 1.1875 is halfway between 1.125 (0x39) and 1.25 (0x3A, even).
        assert_eq!(e4m3_encode(1.1875), 0x3A);
        // Halfway between the largest subnormal (0x07) and the smallest normal (0x08).
        assert_eq!(e4m3_encode(7.5 * 2f32.powi(-9)), 0x08);
        assert_eq!(e4m3_encode(0.4 * 2f32.powi(-9)), 0x00);
        assert_eq!(e4m3_encode(1000.0), 0x7E);
    }

    #[test]
    fn e2m1_encode_rounds_to_nearest_even() {
        assert_eq!(e2m1_encode(0.25), 0); // tie 0 / 0.5 -> 0
        assert_eq!(e2m1_encode(0.75), 2); // tie 0.5 / 1 -> 1.0 (code 2)
        assert_eq!(e2m1_encode(2.5), 4); // tie 2 / 3 -> 2
        assert_eq!(e2m1_encode(5.0), 6); // tie 4 / 6 -> 4
        assert_eq!(e2m1_encode(-3.2), 0x8 | 5);
        assert_eq!(e2m1_encode(9.0), 7);
    }

    #[test]
    fn scale_is_ceil_log2_of_amax_over_max() {
        assert_eq!(ue8m0_scale(448.0, 448.0), 127);
        assert_eq!(ue8m0_scale(449.0, 448.0), 128);
        assert_eq!(ue8m0_scale(224.0, 448.0), 126);
        assert_eq!(ue8m0_scale(6.0 * 2f32.powi(-10), 6.0), 117);
        assert_eq!(ue8m0_scale(0.0, 6.0), 127);
    }

    #[test]
    fn fp8_round_trip_is_close_and_idempotent() {
        let (rows, cols) = (130, 200);
        let w: Vec<f32> = (0..rows * cols)
            .map(|k| ((k * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let (codes, scales) = quantize_fp8(&w, rows, cols, 128);
        assert_eq!(scales.len(), 4);
        let d = dequant_fp8(&codes, rows, cols, &scales, 128);
        for (a, b) in w.iter().zip(&d) {
            // e4m3 has 3 mantissa bits: relative error <= 2^-4 (or tiny absolute near 0).
            assert!((a - b).abs() <= a.abs() / 16.0 + 1e-3, "{a} vs {b}");
        }
        let (codes2, scales2) = quantize_fp8(&d, rows, cols, 128);
        assert_eq!((codes2, scales2), (codes, scales));
    }

    #[test]
    fn fp4_round_trip_is_idempotent() {
        let (rows, cols) = (3, 64);
        let w: Vec<f32> = (0..rows * cols)
            .map(|k| ((k * 31) % 17) as f32 - 8.0)
            .collect();
        let (packed, scales) = quantize_fp4(&w, rows, cols);
        let d = dequant_fp4(&packed, rows, cols, &scales);
        let (p2, s2) = quantize_fp4(&d, rows, cols);
        assert_eq!((p2, s2), (packed, scales));
        // Max |w| = 8 per group: scale 2, so 8 -> 8 exactly and 7 -> 8 (tie 6/8 -> 8, even).
        assert_eq!(d[w.iter().position(|&v| v == 8.0).unwrap()], 8.0);
    }
}
