//! Split plans of the real DeepSeek-V4-Flash config (shapes only, no weights): bytes per
//! rank, balance, the KV-cache arithmetic of spec §3, and the fit check's message.

use dsv4_engine::model::synth::SynthSpec;
use dsv4_engine::model::ModelConfig;
use dsv4_engine::parallel::fit::{rank_state_bytes, Gib};
use dsv4_engine::parallel::{check_fits, FitError, PlanError, SplitMode, SplitPlan};

const FLASH_BYTES: u64 = 159_609_485_896;
const GIB: u64 = 1 << 30;

fn flash() -> ModelConfig {
    let mut ratios = vec![0, 0];
    ratios.extend((2..42).map(|i| if i % 2 == 0 { 4 } else { 128 }));
    ratios.extend([4, 0]);
    SynthSpec {
        vocab_size: 129_280,
        hidden_size: 4096,
        num_hidden_layers: 43,
        num_nextn_predict_layers: 1,
        num_attention_heads: 64,
        head_dim: 512,
        qk_rope_head_dim: 64,
        q_lora_rank: 1024,
        o_groups: 8,
        o_lora_rank: 1024,
        sliding_window: 128,
        compress_ratios: ratios,
        index_n_heads: 64,
        index_head_dim: 128,
        index_topk: 512,
        n_routed_experts: 256,
        num_experts_per_tok: 6,
        moe_intermediate_size: 2048,
        num_hash_layers: 3,
        hc_mult: 4,
        ..SynthSpec::tiny_default()
    }
    .with_quantized(true)
    .model_config()
    .expect("flash config")
}

fn spread(plan: &SplitPlan) -> f64 {
    let b: Vec<u64> = plan.ranks.iter().map(|r| r.weight_bytes).collect();
    let (lo, hi) = (b.iter().min().copied(), b.iter().max().copied());
    hi.unwrap_or(0) as f64 / lo.unwrap_or(1).max(1) as f64
}

#[test]
fn layer_split_partitions_the_checkpoint_exactly_and_evenly() {
    let cfg = flash();
    for ranks in [1, 2, 3, 4, 8] {
        let plan = SplitPlan::new(&cfg, ranks, SplitMode::Layer).expect("plan");
        assert_eq!(plan.total_bytes(), FLASH_BYTES, "x{ranks}");
        let covered: usize = plan.ranks.iter().map(|r| r.layers.len()).sum();
        assert_eq!(covered, 43);
        // A layer is ~3.6 GB; balance is at layer granularity.
        assert!(spread(&plan) < 1.0 + 1.2 * ranks as f64 * 3.7e9 / FLASH_BYTES as f64);
    }
}

#[test]
fn tensor_split_is_balanced_and_replicates_only_small_parts() {
    let cfg = flash();
    for ranks in [2, 3, 4, 8] {
        let plan = SplitPlan::new(&cfg, ranks, SplitMode::Tensor).expect("plan");
        let per_rank = FLASH_BYTES / ranks as u64;
        for r in &plan.ranks {
            // Replicated: embedding + head (2 GB) + mHC, router, compressors, indexer, wq_a...
            let extra = r.weight_bytes as i64 - per_rank as i64;
            assert!(
                extra > 0 && extra < 6 * GIB as i64,
                "x{ranks} rank {}: {extra}",
                r.rank
            );
        }
        assert!(spread(&plan) < 1.06, "x{ranks}: {}", spread(&plan));
        assert!(
            !plan.exchange_latent,
            "8 groups of 1024: no latent exchange"
        );
    }
    let heads: Vec<usize> = SplitPlan::new(&cfg, 3, SplitMode::Tensor)
        .expect("plan")
        .ranks
        .iter()
        .map(|r| r.heads.len())
        .collect();
    assert_eq!(heads, [24, 24, 16], "whole output groups 3/3/2");
}

#[test]
fn kv_state_matches_the_spec_numbers() {
    let plan = SplitPlan::new(&flash(), 1, SplitMode::Layer).expect("plan");
    // Fixed: 44 windows + compressor states (spec §3).
    assert_eq!(rank_state_bytes(&plan, 0, 0), 5_767_168 + 12_206_080);
    // Growth: 6880 bytes per token.
    let n = 1 << 20;
    assert_eq!(
        rank_state_bytes(&plan, 0, 2 * n) - rank_state_bytes(&plan, 0, n),
        6880 * n as u64
    );
    // Tensor mode replicates the single K=V head's cache on every rank.
    let tp = SplitPlan::new(&flash(), 4, SplitMode::Tensor).expect("plan");
    let layers = SplitPlan::new(&flash(), 4, SplitMode::Layer).expect("plan");
    assert_eq!(rank_state_bytes(&tp, 3, n), rank_state_bytes(&plan, 0, n));
    let split: u64 = (0..4).map(|r| rank_state_bytes(&layers, r, n)).sum();
    assert_eq!(split, rank_state_bytes(&plan, 0, n));
}

#[test]
fn fit_check_says_how_much_is_missing_per_gpu() {
    let plan = SplitPlan::new(&flash(), 2, SplitMode::Tensor).expect("plan");
    let h200 = 141 * GIB;
    assert_eq!(check_fits(&plan, &[h200, h200], 1 << 20, 4), Ok(()));
    let err = check_fits(&plan, &[h200, 80 * GIB], 1 << 20, 4).expect_err("too small");
    let FitError::TooSmall { short, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(short.len(), 1);
    let s = &short[0];
    assert_eq!(s.rank, 1);
    let text = err.to_string();
    eprintln!("{text}");
    assert!(
        text.contains("1048576 tokens of context x batch 4"),
        "{text}"
    );
    assert!(text.contains("GPU 1 needs"), "{text}");
    assert!(
        text.contains(&format!("{} missing", Gib(s.missing()))),
        "{text}"
    );
    assert!(!text.contains("GPU 0"), "{text}");
    assert_eq!(
        check_fits(&plan, &[h200], 1, 1),
        Err(FitError::GpuCount { plan: 2, gpus: 1 })
    );
}

#[test]
fn impossible_splits_are_refused_clearly() {
    let tiny = SynthSpec::tiny_default().model_config().expect("tiny");
    let e = SplitPlan::new(&tiny, 5, SplitMode::Tensor).expect_err("5 ranks, 4 heads");
    assert_eq!(e, PlanError::TooManyRanksForHeads { ranks: 5, heads: 4 });
    assert!(e.to_string().contains("only 4 attention heads"));
    let e = SplitPlan::new(&tiny, 6, SplitMode::Layer).expect_err("6 ranks, 5 layers");
    assert!(e.to_string().contains("only 5 layers"), "{e}");
    assert_eq!(
        SplitPlan::new(&tiny, 0, SplitMode::Layer).expect_err("0"),
        PlanError::NoRanks
    );
}
