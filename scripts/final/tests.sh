#!/usr/bin/env bash
# Every single-GPU test executable in $1 (the multi-GPU one runs later, on both GPUs), with the
# numbers the tests print; then the prefill noise diagnostic (ignored by default).
for t in "$1"/gpu*; do
  case $(basename "$t") in gpu_multi-*|gpu_attention_bench-*|gpu_prefill_noise-*) continue;; esac
  echo "=== $(basename "$t")"
  timeout 120 "$t" --test-threads=1 --nocapture 2>&1 | grep -vE "^test .* \.\.\. ok$|^running|^$" | tail -60
  echo "rc=${PIPESTATUS[0]}"
done
