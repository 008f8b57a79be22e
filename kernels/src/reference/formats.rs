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
