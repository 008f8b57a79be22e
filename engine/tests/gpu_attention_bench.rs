//! Full-size GPU attention decode timing on synthetic device-generated weights (DeepSeek-V4-Flash dims:
//! hidden 4096, 64 heads x 512, rope 64, q_lora 1024, o_groups 8 x 1024, window 128, indexer 64 x 128,
//! top-k 512). Caches are zero (only the amount of work matters); every row sits at the same position.
//! Prints microseconds per step, launched one by one and replayed as a captured CUDA graph (which also
//! checks capturability). Skips without a GPU.
//!
//! H200, Official numerics, graph replay, us/step (first version -> attn-perf branch):
//!   SWA  B1 203 -> 117, B8 170 -> 122, B64 369 -> 328
//!   CSA  B1 283 -> 206 (pos 4095), 319 -> 242 (pos 65534), B8 344 -> 274, B64 1191 -> 945
//!   HCA  B1 229 -> 150, B8 233 -> 157, B64 694 -> 443
//! attn-perf: wo_a's 8 groups in one launch, all FP8/bf16 projections through grouped GEMVs with the split-K
//! reduction inside the kernel (4-5 launches instead of ~22), tensor-core bf16 GEMV, row_prep cut in pieces.
//! Eager per-stage times of that version at B1 CSA pos 4095 (include ~5 us launch gaps each): wq_a+wkv 10,
//! wq_b(+indexer) 20, bf16 lin 14, wo_a 20, wo_b 17; attention 33 + merge 31, index score 15 + topk 28,
//! compressors 13 + 9, q/kv prep 13. Next: attention/merge and the indexer top-k (pos 65534: score 41, topk
//! 52), the HCA compressor on its pooling step (28), then the fp8 GEMV body's bandwidth (wq_b at ~55%).
//! decode-perf (graph us/step): SWA B1 117 -> 83, B8 122 -> 88, B64 328 -> 314; CSA B1 206 -> 123 (pos 4095),
//! 242 -> 141 (pos 65534), B8 274 -> 151, B64 945 -> 542; HCA (pooling step) B1 150 -> 130, B8 157 -> 136,
//! B64 443 -> 429. Tensor-core sparse attention + parallel merge (B1 CSA eager: 16 + 11 us), tensor-core
//! indexer scores (8 / 9 us), faster top-k (9 us at 4K, 34 at 64K), one launch for q / kv / indexer-q prep
//! and one for both compressors, split-K reduced inside every GEMV.
use dsv4_engine::api::Numerics;
use dsv4_engine::gpu::attention::{
    decode, decode_profiled, AttnLayer, AttnScratch, AttnState, DecodeIn, StepMeta,
};
use dsv4_engine::model::ModelConfig;
use dsv4_kernels::cudarc::driver::sys;
use dsv4_kernels::{bf16, Gpu, GpuContext};
use std::path::PathBuf;
use std::time::Instant;

fn data_dir() -> PathBuf {
    std::env::var_os("DSV4_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data"))
}

/// The tiny config with the real attention dims; layers: 0 SWA, 1 CSA, 2 HCA.
fn flash_cfg() -> ModelConfig {
    let path = data_dir().join("tiny-v4-small/quant/config.json");
    let mut c = ModelConfig::from_file(&path).expect("tiny config");
    c.hidden_size = 4096;
    c.num_attention_heads = 64;
    c.head_dim = 512;
    c.qk_rope_head_dim = 64;
    c.q_lora_rank = 1024;
    c.o_groups = 8;
    c.o_lora_rank = 1024;
    c.sliding_window = 128;
    c.index_n_heads = 64;
    c.index_head_dim = 128;
    c.index_topk = 512;
    c.compress_ratios = vec![0, 4, 128, 4, 0];
    c
}

#[test]
fn full_size_decode_timing() {
    if !matches!(Gpu::probe(), Ok(Some(_))) {
        eprintln!("SKIP gpu_attention_bench: no usable GPU");
        return;
    }
    let ctx = GpuContext::new(0).expect("context");
    let cfg = flash_cfg();
    let s = &ctx.stream;
    let max_context = 65536;
    for layer in [0usize, 1, 2] {
        let l = AttnLayer::synthetic(&ctx, &cfg, layer, 7).expect("synthetic layer");
        let mut state = AttnState::new(&ctx, &cfg, layer, 64, max_context).expect("state");
        let mut scratch = AttnScratch::new(&ctx, &cfg, 64).expect("scratch");
        let mut meta = StepMeta::new(s, 64).expect("meta");
        let a_host: Vec<bf16> = (0..64 * 4096)
            .map(|i| bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 50.0))
            .collect();
        let a = s.clone_htod(&a_host).expect("a");
        let mut out = s.alloc_zeros::<bf16>(64 * 4096).expect("out");
        println!(
            "layer {layer} {:?}: weights {:.1} MB, state {:.1} MB (64 slots, {max_context} ctx)",
            cfg.attention_kind(layer),
            l.weight_bytes() as f64 / 1e6,
            state.bytes() as f64 / 1e6
        );
        for (rows, pos) in [(1usize, 4095i32), (1, 65534), (8, 4095), (64, 4095)] {
            let slots: Vec<i32> = (0..rows as i32).collect();
            meta.upload(s, &slots, &vec![pos; rows]).expect("meta");
            for nm in [Numerics::Official] {
                let mut run = || {
                    decode(
                        &ctx,
                        s,
                        &l,
                        &mut state,
                        &DecodeIn::new(&meta, rows, &a),
                        &mut scratch,
                        &mut out,
                        nm,
                    )
                    .expect("decode")
                };
                run();
                s.synchronize().expect("sync");
                let iters = 20;
                let t = Instant::now();
                for _ in 0..iters {
                    run();
                }
                s.synchronize().expect("sync");
                let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
                // The same step captured as a CUDA graph (also proves it is capturable).
                s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                    .expect("capture");
                run();
                let graph = s
                    .end_capture(sys::CUgraphInstantiate_flags(0))
                    .expect("end capture")
                    .expect("graph");
                graph.launch().expect("replay");
                s.synchronize().expect("sync");
                let t = Instant::now();
                for _ in 0..iters {
                    graph.launch().expect("replay");
                }
                s.synchronize().expect("sync");
                let gus = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
                let o = s.clone_dtoh(&out).expect("dtoh");
                let finite = o[..rows * 4096].iter().all(|v| v.to_f32().is_finite());
                println!("  rows {rows:2} pos {pos:6} {nm:?}: {us:8.1} us/step launched, {gus:8.1} us/step as a graph (finite: {finite})");
                assert!(finite);
                // Per-stage breakdown of one eager step (includes launch gaps, so it sums above the graph time).
                let mut marks = Vec::new();
                decode_profiled(
                    &ctx,
                    s,
                    &l,
                    &mut state,
                    &DecodeIn::new(&meta, rows, &a),
                    &mut scratch,
                    &mut out,
                    nm,
                    &mut marks,
                )
                .expect("profiled decode");
                s.synchronize().expect("sync");
                let parts: Vec<String> = marks
                    .windows(2)
                    .map(|w| {
                        let ms = w[0].1.elapsed_ms(&w[1].1).expect("elapsed");
                        format!("{} {:.1}", w[1].0, ms * 1000.0)
                    })
                    .collect();
                println!("    stages (us): {}", parts.join(", "));
            }
        }
    }
}
