//! Shared test helpers: the GPU (or a skip), random data, comparisons.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{bf16, Gpu, GpuContext};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The GPU context, or None after printing why the test is skipped (no driver / no device).
pub fn gpu() -> Option<GpuContext> {
    match Gpu::probe() {
        Ok(Some(_)) => {}
        Ok(None) => {
            let why = Gpu::probe_reason(0)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            eprintln!("SKIP: no GPU ({why})");
            return None;
        }
        Err(e) => {
            eprintln!("SKIP: GPU probe failed: {e}");
            return None;
        }
    }
    Some(GpuContext::new(0).expect("GPU present but context creation failed"))
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// bf16 values spread over [-2, 2].
pub fn rand_bf16(r: &mut StdRng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(r.random_range(-2.0f32..2.0)))
        .collect()
}

/// Random e4m3 bytes, NaN codes excluded (subnormals and +-448 included).
pub fn rand_e4m3(r: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| loop {
            let b: u8 = r.random();
            if b & 0x7f != 0x7f {
                break b;
            }
        })
        .collect()
}

pub fn rand_bytes(r: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| r.random()).collect()
}

pub fn rand_exponents(r: &mut StdRng, n: usize, lo: u8, hi: u8) -> Vec<u8> {
    (0..n).map(|_| r.random_range(lo..=hi)).collect()
}

pub fn upload<T: dsv4_kernels::cudarc::driver::DeviceRepr>(
    g: &GpuContext,
    v: &[T],
) -> CudaSlice<T> {
    g.stream.clone_htod(v).expect("upload")
}

/// FP4 expert weights (checkpoint nibble order, `experts` matrices [n, k]) uploaded and put into the device
/// layout the kernels read.
pub fn upload_fp4(g: &GpuContext, w: &[u8], experts: usize, n: usize, k: usize) -> CudaSlice<u8> {
    let mut d = upload(g, w);
    g.launch_fp4_to_device_layout(&g.stream, &mut d, experts, n, k)
        .expect("fp4 device layout");
    d
}

/// FP4 expert scales (checkpoint order, `experts` matrices [n, k]) uploaded in the device layout.
pub fn upload_fp4_scales(
    g: &GpuContext,
    sc: &[u8],
    experts: usize,
    n: usize,
    k: usize,
) -> CudaSlice<u8> {
    g.fp4_scales_to_device_layout(&g.stream, &upload(g, sc), experts, n, k)
        .expect("fp4 scale layout")
}

pub fn download<T: dsv4_kernels::cudarc::driver::DeviceRepr + Default + Clone>(
    g: &GpuContext,
    d: &CudaSlice<T>,
) -> Vec<T> {
    g.stream.clone_dtoh(d).expect("download")
}

/// Max over elements of |got - want| / bound_i; the test passes when <= 1.
pub fn worst_ratio(got: &[f32], want: &[f32], bound: impl Fn(usize) -> f32) -> (f32, usize) {
    assert_eq!(got.len(), want.len());
    let mut worst = (0f32, 0usize);
    for i in 0..got.len() {
        assert!(
            got[i].is_finite(),
            "element {i} not written or not finite: {}",
            got[i]
        );
        let r = (got[i] - want[i]).abs() / bound(i);
        if r > worst.0 {
            worst = (r, i);
        }
    }
    worst
}

/// ||got - want|| / ||want||.
pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Asserts that `got` is finite and has exactly the bits of `want`.
pub fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            a.is_finite() && a.to_bits() == b.to_bits(),
            "{what}: element {i} is {a}, want {b}"
        );
    }
}

/// An expert GEMV shape from the (b, topk, experts, n, k, x_per_slot) tuples of the test tables.
pub fn expert_shape(c: (usize, usize, usize, usize, usize, bool)) -> dsv4_kernels::ExpertShape {
    let (b, topk, experts, n, k, x_per_slot) = c;
    dsv4_kernels::ExpertShape {
        b,
        topk,
        experts,
        n,
        k,
        x_per_slot,
    }
}
