#!/usr/bin/env bash
# The two-GPU half of run.sh on nvidia-h200-x2: gpu_multi (and with the prefill wgmma path forced from one
# row), the peer all-reduce's tests, then the split benches.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DSV4_TEST_DATA=$PWD/tests/data
B=/tmp/b; mkdir -p $B
tar xJf .device-bin/final/bins.tar.xz -C $B
nvidia-smi -L
for w in default all; do
  if [ $w = all ]; then export DSV4_PF_WGMMA=all; fi
  timeout 120 $B/gpu_multi-* --test-threads=1 --nocapture > $OUT/gpu_multi_$w.log 2>&1; echo "gpu_multi ($w) rc=$?"
  grep -E "test result|FAILED|panicked|SKIP" $OUT/gpu_multi_$w.log
done
unset DSV4_PF_WGMMA
# The peer all-reduce: the kernel's tests and the backend's collective, on both GPUs.
timeout 60 $B/gpu-* peer --test-threads=1 > $OUT/peer.log 2>&1; echo "peer kernel rc=$?"
timeout 60 $B/gpu_collective-* --test-threads=1 >> $OUT/peer.log 2>&1; echo "gpu_collective rc=$?"
grep -E "test result|FAILED|panicked|SKIP" $OUT/peer.log
timeout 140 $B/dsv4 bench --gpus 0,1 --split tensor,layer --contexts 4096 --steps 10 --warmup 2 --prefill 1024,8192 --json $OUT/split.json > $OUT/split.txt 2>&1
echo "split bench rc=$?"
grep -E "^\||prefill|TTFT|collective" $OUT/split.txt | head -40
