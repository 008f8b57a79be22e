#!/usr/bin/env bash
# Runs on the GPU machine: every staged GPU test (correctness against the CPU reference), then the
# full-size benchmark. Logs go to $OUT (or ./gpu-check-out). Usage: scripts/gpu-check.sh [bench args]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DSV4_TEST_DATA=$PWD/tests/data
# Several GPUs: NCCL without NVLink multicast (NVLS), which the lent machines do not allow.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
status=0
for t in .device-bin/main/*; do
    name=$(basename "$t")
    [ "$name" = dsv4 ] && continue
    echo "== $name"
    # --include-ignored: the GPU-only diagnostics (e.g. gpu_prefill_noise) run here too.
    if "$t" --test-threads=1 --include-ignored --nocapture > "$out/$name.log" 2>&1; then
        grep -E "test result|SKIP" "$out/$name.log" | tail -3
    else
        status=1
        echo "FAILED: $name"; tail -30 "$out/$name.log"
    fi
done
echo "== bench"
.device-bin/main/dsv4 bench "$@" --json "$out/bench.json" 2>&1 | tee "$out/bench.txt"
exit $status
