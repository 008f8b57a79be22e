//! The attention kernels' quantisers against `golden/quantizer_cases.safetensors`, bit for bit: the FP8
//! activation quant (128-blocks) and KV sim (64-blocks) of `attn_row_prep`, and the indexer's Hadamard +
//! FP4 of `attn_vec_prep`. Skips without a GPU.
use dsv4_kernels::attn::{AttnRowPrep, AttnVecPrep, QUANT_HAD_Q4};
use dsv4_kernels::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use dsv4_kernels::{bf16, Gpu, GpuContext};
use safetensors::SafeTensors;
use std::path::PathBuf;

fn data_dir() -> PathBuf {
    std::env::var_os("DSV4_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data"))
}

fn f32s(st: &SafeTensors<'_>, name: &str) -> Vec<f32> {
    let t = st.tensor(name).expect("tensor");
    t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn differing(got: &[bf16], want: &[f32]) -> usize {
    got.iter()
        .zip(want)
        .filter(|(g, w)| g.to_f32().to_bits() != w.to_bits())
        .count()
}

fn addr<T>(b: &CudaSlice<T>, ctx: &GpuContext) -> u64 {
    b.device_ptr(&ctx.stream).0
}

fn addr_mut<T>(b: &mut CudaSlice<T>, ctx: &GpuContext) -> u64 {
    b.device_ptr_mut(&ctx.stream).0
}

#[test]
fn quantizers_are_bit_exact() {
    if !matches!(Gpu::probe(), Ok(Some(_))) {
        eprintln!("SKIP gpu_attention_quant: no usable GPU");
        return;
    }
    let ctx = GpuContext::new(0).expect("context");
    let s = &ctx.stream;
    let bytes = std::fs::read(data_dir().join("tiny-v4-small/golden/quantizer_cases.safetensors"))
        .expect("read cases");
    let st = SafeTensors::deserialize(&bytes).expect("parse cases");
    let q8_in = s.clone_htod(&f32s(&st, "q8_in")).expect("htod");
    let (rows, width) = (13usize, 256usize);
    for (blk, name) in [(128, "q8_block128"), (64, "q8_block64")] {
        let mut out = s.alloc_zeros::<bf16>(rows * width).expect("alloc");
        let p = AttnRowPrep {
            x: addr(&q8_in, &ctx),
            out: addr_mut(&mut out, &ctx),
            x_f32: 1,
            groups: 1,
            rows: 13,
            width: 256,
            quant_blk: blk,
            ..Default::default()
        };
        // SAFETY: q8_in holds 13 x 256 f32, out 13 x 256 bf16; no norm.
        unsafe { ctx.launch_attn_row_prep(s, &p) }.expect("launch");
        let got = s.clone_dtoh(&out).expect("dtoh");
        let bad = differing(&got, &f32s(&st, name));
        println!("{name}: {bad} of {} elements differ", rows * width);
        assert_eq!(bad, 0, "{name}");
    }
    let q4_in = s.clone_htod(&f32s(&st, "q4_in")).expect("htod");
    let zeros = s.alloc_zeros::<i32>(10).expect("positions");
    let freqs = s.alloc_zeros::<f32>(1).expect("freqs");
    let mut out = s.alloc_zeros::<bf16>(10 * 128).expect("alloc");
    let p = AttnVecPrep {
        x: addr(&q4_in, &ctx),
        freqs: addr(&freqs, &ctx),
        positions: addr(&zeros, &ctx),
        out: addr_mut(&mut out, &ctx),
        x_stride: 128,
        dim: 128,
        quant: QUANT_HAD_Q4,
        ..Default::default()
    };
    // SAFETY: q4_in holds 10 x 128 f32, out 10 x 128 bf16, positions 10 ints; rdim 0 reads no frequency.
    unsafe { ctx.launch_attn_vec_prep(s, 10, &[(1, p)]) }.expect("launch");
    let got = s.clone_dtoh(&out).expect("dtoh");
    let bad = differing(&got, &f32s(&st, "had_q4_block32"));
    println!("had_q4_block32: {bad} of 1280 elements differ");
    assert_eq!(bad, 0, "had_q4_block32");
}
