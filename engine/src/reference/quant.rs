//! The fake-quantisation steps of the official numerics (spec §2.0, §5): FP8 e4m3 and FP4 e2m1
//! round trips with UE8M0 power-of-two block scales, and the Walsh-Hadamard rotation.
//!
//! Every function here must be bit-exact against `golden/quantizer_cases.safetensors`.

/// Largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Largest e2m1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// Floor on a block's amax before computing an FP8 activation scale.
const FP8_AMAX_FLOOR: f32 = 1e-4;

/// `2^ceil(log2(v))` for a positive normal f32, computed from the bits so it is exact
/// (the official kernel does the same: exponent, plus one if any mantissa bit is set).
pub fn pow2_ceil(v: f32) -> f32 {
    let bits = v.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32;
    let mantissa = bits & 0x7f_ffff;
    let e = exp - 127 + i32::from(mantissa != 0);
    (e as f32).exp2()
}

/// Rounds to the nearest value with `mant_bits` mantissa bits and a minimum normal exponent
/// `min_exp` (values below are subnormal with a fixed quantum), ties to even. The caller
/// clamps to the format's range first.
fn round_float_format(x: f32, mant_bits: i32, min_exp: i32) -> f32 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let exp = x.abs().log2().floor() as i32;
    // log2 of values just below a power of two can round up; correct with an exact check.
    let exp = if (exp as f32).exp2() > x.abs() {
        exp - 1
    } else {
        exp
    };
    let quantum = ((exp.max(min_exp) - mant_bits) as f32).exp2();
    (x / quantum).round_ties_even() * quantum
}

/// f32 → e4m3fn → f32, round to nearest even (input already within ±448).
pub fn round_e4m3(x: f32) -> f32 {
    round_float_format(x, 3, -6)
}

/// f32 → e2m1 → f32, round to nearest even (input already within ±6).
pub fn round_e2m1(x: f32) -> f32 {
    round_float_format(x, 1, 0)
}

/// FP8 quant-dequant of `v` in blocks of `block` along the slice (a trailing partial block is
/// one shorter block): scale `2^ceil(log2(max(amax, 1e-4)/448))`, e4m3 RNE, saturating.
pub fn fake_quant_fp8(v: &mut [f32], block: usize) {
    for chunk in v.chunks_mut(block) {
        let amax = chunk.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let scale = pow2_ceil(amax.max(FP8_AMAX_FLOOR) / E4M3_MAX);
        for x in chunk.iter_mut() {
            *x = round_e4m3((*x / scale).clamp(-E4M3_MAX, E4M3_MAX)) * scale;
        }
    }
}

/// FP4 quant-dequant in blocks of `block` (32 in the model): scale
/// `2^ceil(log2(max(amax, 6*2^-126)/6))`, e2m1 RNE, saturating.
pub fn fake_quant_fp4(v: &mut [f32], block: usize) {
    let floor = E2M1_MAX * f32::MIN_POSITIVE;
    for chunk in v.chunks_mut(block) {
        let amax = chunk.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let scale = pow2_ceil(amax.max(floor) / E2M1_MAX);
        for x in chunk.iter_mut() {
            *x = round_e2m1((*x / scale).clamp(-E2M1_MAX, E2M1_MAX)) * scale;
        }
    }
}

/// Entry `(j, i)` of the natural-order (Sylvester) Walsh-Hadamard matrix: `(-1)^popcount(j & i)`.
fn hadamard_sign(j: usize, i: usize) -> f32 {
    if (j & i).count_ones().is_multiple_of(2) {
        1.0
    } else {
        -1.0
    }
}

/// In-place natural-order Walsh-Hadamard transform scaled by `len^-1/2` (`len` a power of two).
///
/// Computed as the plain product `(v · H)` with a sequential f32 sum per output, then scaled:
/// this is the summation order the golden quantizer cases were made with, and bit-exactness
/// matters because an FP4 rounding follows. (A butterfly differs in the last bit.)
pub fn hadamard(v: &mut [f32]) {
    let n = v.len();
    debug_assert!(n.is_power_of_two());
    let scale = (n as f32).sqrt().recip();
    let x = v.to_vec();
    for (i, out) in v.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (j, &xj) in x.iter().enumerate() {
            acc += xj * hadamard_sign(j, i);
        }
        *out = acc * scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_grid_points() {
        assert_eq!(round_e4m3(448.0), 448.0);
        assert_eq!(round_e4m3(1.0625), 1.0); // tie between 1.0 and 1.125 → even mantissa
        assert_eq!(round_e4m3(1.1875), 1.25); // tie between 1.125 and 1.25 → even
        assert_eq!(round_e4m3(2f32.powi(-9)), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(round_e4m3(2f32.powi(-10)), 0.0); // tie to even (zero)
        assert_eq!(round_e4m3(-3.0 * 2f32.powi(-10)), -(2f32.powi(-8))); // 1.5 quanta → 2
    }

    #[test]
    fn e2m1_grid_points() {
        let cases = [
            (0.25, 0.0),
            (0.75, 1.0),
            (1.25, 1.0),
            (1.75, 2.0),
            (2.5, 2.0),
            (3.5, 4.0),
            (5.0, 4.0),
            (5.5, 6.0),
            (-5.0, -4.0),
        ];
        for (x, want) in cases {
            assert_eq!(round_e2m1(x), want, "x = {x}");
        }
    }

    #[test]
    fn pow2_ceil_is_exact() {
        assert_eq!(pow2_ceil(1.0), 1.0);
        assert_eq!(pow2_ceil(1.0000001), 2.0);
        assert_eq!(pow2_ceil(0.75), 1.0);
        assert_eq!(pow2_ceil(0.5), 0.5);
    }

    #[test]
    fn hadamard_is_orthonormal() {
        let mut v = vec![0.0f32; 8];
        v[3] = 1.0;
        hadamard(&mut v);
        hadamard(&mut v);
        for (i, x) in v.iter().enumerate() {
            let want = if i == 3 { 1.0 } else { 0.0 };
            assert!((x - want).abs() < 1e-6);
        }
    }
}
