//! Tests that need no GPU: number codecs of the reference, and the embedded fatbin's architectures.
use dsv4_kernels::fatbin::{entries, EntryKind};
use dsv4_kernels::reference::formats::{e2m1_to_f32, e4m3_to_f32, f32_to_e4m3, ue8m0};
use dsv4_kernels::EMBEDDED_FATBIN;

#[test]
fn e4m3_round_trips_every_finite_code() {
    for c in 0u8..=255 {
        if c & 0x7f == 0x7f {
            assert!(e4m3_to_f32(c).is_nan());
            continue;
        }
        let v = e4m3_to_f32(c);
        let back = f32_to_e4m3(v);
        // +0 and -0 are distinct codes and both round-trip.
        assert_eq!(back, c, "code {c:#04x} = {v}");
    }
    assert_eq!(e4m3_to_f32(0x7e), 448.0);
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
}

#[test]
fn e4m3_rounds_to_nearest_even_and_saturates() {
    assert_eq!(f32_to_e4m3(1.0625), 0x38); // tie between 1.0 (even) and 1.125 -> 1.0
    assert_eq!(f32_to_e4m3(1.1875), 0x3a); // tie between 1.125 and 1.25 (even) -> 1.25
    assert_eq!(f32_to_e4m3(3.0 * 2f32.powi(-10)), 0x02); // subnormal tie 1.5 units -> 2 units
    assert_eq!(f32_to_e4m3(1000.0), 0x7e);
    assert_eq!(f32_to_e4m3(-1000.0), 0xfe);
    assert_eq!(f32_to_e4m3(0.015_625 * 0.999), 0x08); // just under 2^-6 rounds up to the smallest normal
}

#[test]
fn fp4_and_ue8m0_decode() {
    let want = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    for (n, w) in want.iter().enumerate() {
        assert_eq!(e2m1_to_f32(n as u8), *w);
        assert_eq!(e2m1_to_f32(n as u8 | 8), -w);
    }
    assert_eq!(ue8m0(127), 1.0);
    assert_eq!(ue8m0(120), 2f32.powi(-7));
}

/// When the build had nvcc, the fatbin must hold SASS for sm_90a and sm_120a and PTX for compute_90.
#[test]
fn fatbin_has_sm90a_and_sm120a_sass() {
    let Some(bytes) = EMBEDDED_FATBIN else {
        eprintln!("SKIP: built without nvcc (NVRTC fallback); no fatbin to check");
        return;
    };
    let list = entries(bytes).expect("embedded fatbin parses");
    println!("fatbin entries: {list:?}");
    let has = |kind, arch| list.iter().any(|e| e.kind == kind && e.arch == arch);
    assert!(has(EntryKind::Sass, 90), "no sm_90a SASS");
    assert!(has(EntryKind::Sass, 120), "no sm_120a SASS");
    assert!(has(EntryKind::Ptx, 90), "no compute_90 PTX");
    // nvcc marks arch-specific ("a") targets with flag bit 0x100000.
    assert!(list
        .iter()
        .filter(|e| e.kind == EntryKind::Sass)
        .all(|e| e.flags & 0x10_0000 != 0));
}

/// The NVRTC fallback (machines where the build had no nvcc) must compile the same sources for
/// both targets. Needs only libnvrtc, no GPU: CI installs it with nvcc (`.ci/install-nvcc.sh`).
#[test]
fn nvrtc_compiles_every_kernel_for_sm90_and_sm120() {
    // SAFETY: only tries to dlopen libnvrtc; no NVRTC call is made.
    if !unsafe { dsv4_kernels::cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("SKIP: libnvrtc not found (set LD_LIBRARY_PATH to its lib dir)");
        return;
    }
    for cc in [(9, 0), (12, 0)] {
        if let Err(e) = dsv4_kernels::compile_ptx(cc) {
            panic!("NVRTC failed for compute_{}{}: {e}", cc.0, cc.1);
        }
    }
}

/// The split-K plans (a function of the shape and the family, never of the batch: the batch invariance
/// rests on it) are a power of two within the ring kernel's limits on the ring, at most one split per K
/// step on either family, and never above what `gemv_splits_max` sizes the scratch for.
#[test]
fn gemv_split_plans_fit_the_kernels_and_the_scratch() {
    use dsv4_kernels::{gemv_splits, gemv_splits_max, GemvPath, GemvWeights, RING_ROWS_MIN};
    for sms in [78usize, 132, 188] {
        for wt in [GemvWeights::Fp8, GemvWeights::Bf16] {
            for (n, k) in [
                (77usize, 264usize),
                (512, 4096),
                (4096, 8192),
                (32768, 1024),
                (129280, 4096),
            ] {
                let tiles = n.div_ceil(32);
                let ring = gemv_splits(sms, tiles, k, wt, GemvPath::Ring);
                let skinny = gemv_splits(sms, tiles, k, wt, GemvPath::Skinny);
                let steps = k.div_ceil(if wt == GemvWeights::Fp8 { 128 } else { 64 });
                assert!(
                    ring.is_power_of_two() && ring <= 8 && ring <= steps,
                    "{n}x{k}: ring {ring}"
                );
                assert!(skinny >= 1 && skinny <= steps, "{n}x{k}: skinny {skinny}");
                assert_eq!(gemv_splits_max(sms, tiles, k, wt), ring.max(skinny));
            }
        }
    }
    // The row count alone picks the family: the ring from its switch (at least RING_ROWS_MIN rows).
    assert_eq!(GemvPath::for_rows(1), GemvPath::Skinny);
    assert_eq!(GemvPath::for_rows(RING_ROWS_MIN - 1), GemvPath::Skinny);
    if std::env::var("DSV4_GEMV_RING_MIN").is_err() {
        assert_eq!(GemvPath::for_rows(16), GemvPath::Skinny);
        assert_eq!(GemvPath::for_rows(17), GemvPath::Ring);
        assert_eq!(GemvPath::for_rows(64), GemvPath::Ring);
    }
}
