//! Number formats of the checkpoint (spec 4.4): e4m3, e2m1 (fp4), UE8M0, bf16.
use half::bf16;

/// UE8M0 byte -> 2^(e-127).
pub fn ue8m0(e: u8) -> f32 {
    (f64::from(e) - 127.0).exp2() as f32
}

/// float8_e4m3fn byte -> f32 (no infinities; 0x7F/0xFF are NaN).
pub fn e4m3_to_f32(c: u8) -> f32 {
    let sign = if c & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((c >> 3) & 15);
    let m = f32::from(c & 7);
    if e == 15 && c & 7 == 7 {
        return f32::NAN;
    }
    let mag = if e == 0 {
        m * (-9f32).exp2()
    } else {
        (8.0 + m) * ((e - 10) as f32).exp2()
    };
    sign * mag
}

/// f32 -> float8_e4m3fn, round to nearest even, saturating to +-448 (NaN -> 0x7F).
pub fn f32_to_e4m3(v: f32) -> u8 {
    if v.is_nan() {
        return 0x7f;
    }
    let sign: u8 = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = f64::from(v.abs()).min(448.0);
    // Quantum: 2^-9 below the smallest normal 2^-6, else 2^(floor(log2 a) - 3).
    let exp = if a < (-6f64).exp2() {
        -6
    } else {
        a.log2().floor() as i32
    };
    let quantum = f64::from(exp - 3).exp2();
    let units = (a / quantum).round_ties_even(); // exact: a is an f32, quantum a power of two
                                                 // Code = (biased exponent << 3) + mantissa; a carry out of the mantissa moves to the next exponent.
    let code = if exp == -6 && units < 8.0 {
        units as u8
    } else {
        (((exp + 7) as u8) << 3) + (units as u8 - 8)
    };
    sign | code.min(0x7e)
}

/// fp4 e2m1 nibble -> f32: {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign.
pub fn e2m1_to_f32(n: u8) -> f32 {
    const MAG: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let m = MAG[usize::from(n & 7)];
    if n & 8 != 0 {
        -m
    } else {
        m
    }
}

pub fn bf16_to_f32(v: bf16) -> f32 {
    v.to_f32()
}

pub fn f32_to_bf16(v: f32) -> bf16 {
    bf16::from_f32(v)
}

/// Rotation that brings bit `bit` (0 mantissa, 1-2 exponent, 3 sign) of a weight of pair `pair` into place
/// (the device layout of FP4 expert weights; cuda/common.cuh `fp4_layout_rot`).
fn fp4_layout_rot(pair: usize, bit: usize) -> usize {
    match (pair, bit) {
        (0, _) => 0,
        (1, _) => 6,
        (2, _) => 10,
        (_, 2) => 4,
        _ => 12,
    }
}

/// Where the device layout keeps bit `bit` of nibble `nibble` of a 32-bit word (cuda `fp4_layout_dst`).
fn fp4_layout_dst(nibble: usize, bit: usize) -> usize {
    let target = if bit == 3 { 15 } else { 6 + bit } + 16 * (nibble & 1);
    (target + 32 - fp4_layout_rot(nibble >> 1, bit)) & 31
}

/// One 32-bit word of FP4 weights (nibble i = K offset i) in the device layout (cuda/fp4_layout.cu).
pub fn fp4_device_word(w: u32) -> u32 {
    let mut out = 0u32;
    for nibble in 0..8 {
        for bit in 0..4 {
            out |= ((w >> (4 * nibble + bit)) & 1) << fp4_layout_dst(nibble, bit);
        }
    }
    out
}

/// The largest K whose FP4 rows the device stores in tiles (cuda `FP4_TILE_MAX_K`).
pub const FP4_TILE_MAX_K: usize = 4096;

/// Whether the device stores FP4 matrices [n, k] in 2 KB tiles [n/32][k/128][32 rows][64 B] (cuda `fp4_tiled`).
pub fn fp4_tiled(n: usize, k: usize) -> bool {
    k.is_multiple_of(128) && n.is_multiple_of(32) && k <= FP4_TILE_MAX_K
}

/// Offset of byte `b` of row `row` inside one device FP4 matrix [n, k] (cuda `fp4_w_at`).
pub fn fp4_w_at(row: usize, b: usize, n: usize, k: usize) -> usize {
    if fp4_tiled(n, k) {
        (((row >> 5) * (k >> 7) + (b >> 6)) << 11) + ((row & 31) << 6) + (b & 63)
    } else {
        row * (k / 2) + b
    }
}

/// FP4 weight bytes u8 [experts, n, k/2] (checkpoint order) rewritten into the device layout, in place: each
/// 32-bit word's bits, then the rows into tiles where [`fp4_tiled`].
pub fn fp4_device_layout(bytes: &mut [u8], experts: usize, n: usize, k: usize) {
    for c in bytes.chunks_exact_mut(4) {
        let w = fp4_device_word(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        c.copy_from_slice(&w.to_le_bytes());
    }
    if !fp4_tiled(n, k) {
        return;
    }
    let per = n * k / 2;
    for m in bytes[..experts * per].chunks_exact_mut(per) {
        let rows = m.to_vec();
        for row in 0..n {
            for b in 0..k / 2 {
                m[fp4_w_at(row, b, n, k)] = rows[row * (k / 2) + b];
            }
        }
    }
}

/// FP4 expert scales (u8 UE8M0 [experts, n, k/32], checkpoint order) in the device layout (cuda
/// `fp4_scale_at`): for k % 128 == 0 each expert's [n, k/128] 4-byte words become [k/128, n]; otherwise as they are.
pub fn fp4_scales_device_layout(src: &[u8], experts: usize, n: usize, k: usize) -> Vec<u8> {
    let per = n * (k / 32);
    if !k.is_multiple_of(128) {
        return src[..experts * per].to_vec();
    }
    let chunks = k / 128;
    let mut out = vec![0u8; experts * per];
    for e in 0..experts {
        for row in 0..n {
            for c in 0..chunks {
                let from = e * per + (row * chunks + c) * 4;
                let to = e * per + (c * n + row) * 4;
                out[to..to + 4].copy_from_slice(&src[from..from + 4]);
            }
        }
    }
    out
}

/// The kernels' decode of a device-layout word (cuda `fp4_pairs`): pair I = bf16 bit patterns of
/// value * 2^-126 of weights 2I (low half) and 2I + 1 (high half).
pub fn fp4_device_pairs(w: u32) -> [u32; 4] {
    const M: u32 = 0x81c0_81c0;
    [
        w & M,
        (w << 6) & M,
        w.rotate_left(10) & M,
        (w.rotate_left(12) & 0x80c0_80c0) | ((w << 4) & 0x0100_0100),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 bits of e2m1(n) * 2^-126 (what a decoded pair half must be).
    fn raw_bits(n: u32) -> u32 {
        ((n >> 3) & 1) << 15 | ((n >> 2) & 1) << 8 | ((n >> 1) & 1) << 7 | (n & 1) << 6
    }

    #[test]
    fn fp4_tile_offsets_permute_each_matrix() {
        for (n, k, tiled) in [
            (64, 256, true),
            (96, 4096, true),
            (32, 8192, false),
            (48, 256, false),
        ] {
            assert_eq!(fp4_tiled(n, k), tiled, "[{n}, {k}]");
            let mut seen = vec![false; n * k / 2];
            for row in 0..n {
                for b in 0..k / 2 {
                    let at = fp4_w_at(row, b, n, k);
                    assert!(!seen[at], "[{n}, {k}] row {row} byte {b}");
                    seen[at] = true;
                }
            }
            // A warp's 128-wide chunk of 32 rows is one contiguous 2 KB when tiled.
            if tiled {
                assert_eq!(fp4_w_at(33, 64, n, k), (k / 128 + 1) * 2048 + 64);
            }
        }
    }

    #[test]
    fn fp4_device_layout_is_a_bit_permutation() {
        let mut seen = 0u32;
        for nibble in 0..8 {
            for bit in 0..4 {
                seen |= 1 << fp4_layout_dst(nibble, bit);
            }
        }
        assert_eq!(seen, u32::MAX);
    }

    #[test]
    fn fp4_device_pairs_decode_every_weight() {
        // Every code in every nibble position (the other nibbles varying), plus pseudo-random words.
        let mut words: Vec<u32> = (0..8)
            .flat_map(|i| {
                (0..16u32).map(move |c| {
                    (c << (4 * i)) | (0x9e37_79b9u32.rotate_left(i) & !(15 << (4 * i)))
                })
            })
            .collect();
        let mut s = 0x1234_5678u32;
        for _ in 0..4096 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            words.push(s);
        }
        for w in words {
            let pairs = fp4_device_pairs(fp4_device_word(w));
            for (i, p) in pairs.iter().enumerate() {
                let (lo, hi) = ((w >> (8 * i)) & 15, (w >> (8 * i + 4)) & 15);
                assert_eq!(
                    *p,
                    raw_bits(lo) | raw_bits(hi) << 16,
                    "word {w:#010x} pair {i}"
                );
                // And the pattern is the weight's value: bf16 bits * 2^126.
                let v = f32::from_bits(raw_bits(lo) << 16) * 2f32.powi(126);
                assert_eq!(v, e2m1_to_f32(lo as u8), "word {w:#010x} nibble {}", 2 * i);
            }
        }
    }

    #[test]
    fn fp4_scales_device_layout_transposes_words_per_expert() {
        // 2 experts x [3 rows, 256 cols]: 2 words per row; byte = 100 * expert + 10 * row + 4 * chunk + j.
        let (experts, n, k) = (2, 3, 256);
        let src: Vec<u8> = (0..experts)
            .flat_map(|e| {
                (0..n).flat_map(move |r| {
                    (0..8).map(move |b| (100 * e + 10 * r + 4 * (b / 4) + b % 4) as u8)
                })
            })
            .collect();
        let got = fp4_scales_device_layout(&src, experts, n, k);
        for e in 0..experts {
            for c in 0..2 {
                for r in 0..n {
                    for j in 0..4 {
                        let at = e * n * 8 + (c * n + r) * 4 + j;
                        assert_eq!(got[at] as usize, 100 * e + 10 * r + 4 * c + j);
                    }
                }
            }
        }
        // K % 128 != 0: the checkpoint order is the device layout.
        assert_eq!(
            fp4_scales_device_layout(&src[..18], 1, 3, 192),
            src[..18].to_vec()
        );
    }
}
