#!/usr/bin/env python3
"""Peer measurement for BENCHMARKS.md: Hugging Face transformers' DeepSeek-V4 on the same GPU, at the
real Flash dimensions with as many layers as fit (random bf16 weights made on the GPU), timing the
decode step with the KV cache at batch 1 and 64. Prints the step time and the time per layer (the
step divided by the layer count, so embedding and head are charged to the layers: in HF's favour).

Usage: python3 scripts/hf_peer.py [--layers 4] [--batches 1,64] [--prompt 256] [--steps 8] [--tiny]
--tiny uses the small golden dimensions (to try the script on a CPU).
"""
import argparse
import json
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

FLASH = dict(
    vocab_size=129280, hidden_size=4096, num_attention_heads=64, num_key_value_heads=1, head_dim=512,
    qk_rope_head_dim=64, q_lora_rank=1024, o_groups=8, o_lora_rank=1024, sliding_window=128,
    compress_rope_theta=160000, rope_theta=10000, index_n_heads=64, index_head_dim=128, index_topk=512,
    n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=6, moe_intermediate_size=2048,
    num_hash_layers=3, routed_scaling_factor=1.5, swiglu_limit=10.0, hc_mult=4, hc_sinkhorn_iters=20,
    hc_eps=1e-6, rms_norm_eps=1e-6, scoring_func="sqrtsoftplus", topk_method="noaux_tc",
    norm_topk_prob=True, hidden_act="silu", max_position_embeddings=1048576,
    rope_scaling=dict(type="yarn", factor=16, original_max_position_embeddings=65536, beta_fast=32, beta_slow=1),
    bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, num_nextn_predict_layers=1,
)
TINY = dict(FLASH, vocab_size=4096, hidden_size=32, num_attention_heads=4, head_dim=128, qk_rope_head_dim=32,
            q_lora_rank=64, o_groups=2, o_lora_rank=32, index_n_heads=16, index_head_dim=64, index_topk=8,
            n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, num_hash_layers=2)
# The Flash schedule's first layers: window-only (hash-routed), then CSA / HCA alternating.
RATIOS = [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128]


def build(layers, tiny, device):
    dims = dict(TINY if tiny else FLASH)
    dims["num_hidden_layers"] = layers
    dims["num_hash_layers"] = min(dims["num_hash_layers"], layers)
    dims["compress_ratios"] = RATIOS[:layers] + [0]
    cfg = AutoConfig.for_model("deepseek_v4", **dims)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return model.eval(), cfg


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def time_decode(model, cfg, batch, prompt, steps, device):
    ids = torch.randint(2, cfg.vocab_size, (batch, prompt), device=device)
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    nxt = out.logits[:, -1:].argmax(-1)
    for _ in range(2):  # warm-up steps
        out = model(input_ids=nxt, past_key_values=past, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = model(input_ids=nxt, past_key_values=past, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
    sync(device)
    return (time.perf_counter() - t0) / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    import transformers
    t0 = time.perf_counter()
    model, cfg = build(a.layers, a.tiny, device)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {device}"
          + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else "")
          + f"; {a.layers} layers built in {time.perf_counter() - t0:.1f} s")
    rows = []
    for b in [int(x) for x in a.batches.split(",")]:
        step = time_decode(model, cfg, b, a.prompt, a.steps, device)
        rows.append(dict(batch=b, layers=a.layers, step_ms=step * 1e3, per_layer_ms=step * 1e3 / a.layers))
        print(f"batch {b}: decode step {step * 1e3:.2f} ms, {step * 1e3 / a.layers:.2f} ms per layer")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
