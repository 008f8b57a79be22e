#!/usr/bin/env bash
# Every single-GPU test executable in $1 (the multi-GPU one runs later, on both GPUs), with the
# numbers the tests print; then the prefill noise diagnostic (ignored by default).
for t in "$1"/gpu*; do
  case $(basename "$t") in gpu_multi-*|gpu_attention_bench-*|gpu_prefill_noise-*) continue;; esac
  echo "=== $(basename "$t")"
  # The kernels' suite (gpu-*) takes ~2.5 min on an H200: it tries every kernel variant.
  limit=120; case $(basename "$t") in gpu-*) limit=300;; esac
  timeout $limit "$t" --test-threads=1 --nocapture 2>&1 | grep -vE "^test .* \.\.\. ok$|^running|^$" | tail -60
  echo "rc=${PIPESTATUS[0]}"
done
# The prefill's wgmma path from one row (it starts at 256 rows by default, more than these tests prefill).
for t in "$1"/gpu_prefill-* "$1"/gpu_model-* "$1"/gpu_golden_v4-*; do
  echo "=== $(basename "$t") DSV4_PF_WGMMA=all"
  DSV4_PF_WGMMA=all timeout 120 "$t" --test-threads=1 --nocapture 2>&1 | grep -vE "^test .* \.\.\. ok$|^running|^$" | tail -20
  echo "rc=${PIPESTATUS[0]}"
done
# The same with every dense GEMM on the warp-specialised kernel (the default keeps launches of few tiles on s6).
for t in "$1"/gpu_prefill-* "$1"/gpu_model-*; do
  echo "=== $(basename "$t") DSV4_PF_WGMMA=all DSV4_PF_GEMM=ws"
  DSV4_PF_WGMMA=all DSV4_PF_GEMM=ws timeout 120 "$t" --test-threads=1 --nocapture 2>&1 | grep -vE "^test .* \.\.\. ok$|^running|^$" | tail -20
  echo "rc=${PIPESTATUS[0]}"
done
# The wgmma FP8-activation GEMV from one row (by default gemv_fp8x takes 1-8 rows, which is all these tests decode;
# the tiny checkpoints' K is not whole 128-value blocks, the awkward synthetic model's is).
for t in "$1"/gpu_model-* "$1"/gpu_attention-* "$1"/gpu_prefix_reuse-*; do
  echo "=== $(basename "$t") DSV4_GEMV_Q8S_MAX=0"
  DSV4_GEMV_Q8S_MAX=0 timeout 120 "$t" --test-threads=1 --nocapture 2>&1 | grep -vE "^test .* \.\.\. ok$|^running|^$" | tail -20
  echo "rc=${PIPESTATUS[0]}"
done
