#!/usr/bin/env bash
# The open question about the opt-in prefill attention kernel (pf_attn2s3, DSV4_PF_ATTN=1; kernels/BENCH_NOTES.md,
# eighth session): is gpu_multi's golden prefill case one unlucky draw of rounding noise, or is the kernel off?
# Runs on the GPU machine after scripts/stage-gpu-bins.sh here: gpu_prefill_noise (8 token seeds, batched prefill
# against the CPU and against stepped decode) and the failing gpu_multi case, under both kernels, plus the
# gpu_prefill and gpu_model gates under the new one. One nvidia-h200 suffices (gpu_multi's case simulates its
# ranks on one GPU). Logs go to $OUT (or ./check-attn2-out).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DSV4_TEST_DATA=$PWD/tests/data NCCL_NVLS_ENABLE=0
out=${OUT:-check-attn2-out}
mkdir -p "$out"
bin=.device-bin/main
case_name=tensor_split_prefill_matches_one_gpu_prefill_and_cpu_split
for kind in 0 1; do
    echo "== DSV4_PF_ATTN=$kind"
    DSV4_PF_ATTN=$kind timeout 200 $bin/gpu_prefill_noise-* --ignored --test-threads=1 --nocapture \
        > "$out/noise$kind.log" 2>&1
    echo "gpu_prefill_noise rc=$?"
    grep -E "seed|batched|stepped" "$out/noise$kind.log" | head -40
    DSV4_PF_ATTN=$kind timeout 100 $bin/gpu_multi-* $case_name --test-threads=1 --nocapture \
        > "$out/multi$kind.log" 2>&1
    echo "gpu_multi case rc=$?"
    grep -E "vs CPU|vs one GPU" "$out/multi$kind.log"
done
for t in gpu_prefill gpu_model; do
    DSV4_PF_ATTN=1 timeout 120 $bin/$t-* --test-threads=1 > "$out/$t-attn2.log" 2>&1
    echo "$t (DSV4_PF_ATTN=1) rc=$?"
done
