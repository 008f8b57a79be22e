#!/usr/bin/env bash
# The first half of a one-GPU final run (when no two-GPU machine is lent): every single-GPU test, then the
# multi-GPU tests' simulated-rank cases (the ones across GPUs SKIP with one GPU). one_b.sh is the bench half.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 DSV4_TEST_DATA=$PWD/tests/data NCCL_NVLS_ENABLE=0
B=/tmp/b; mkdir -p $B /tmp/v4
tar xJf .device-bin/final/bins.tar.xz -C $B
tar xJf .device-bin/final/tinyv4.tar.xz -C /tmp/v4
export DSV4_GOLDEN_V4=/tmp/v4/tiny-v4
nvidia-smi -L
timeout 450 bash .device-bin/final/tests.sh $B > $OUT/tests.log 2>&1
timeout 100 $B/gpu_multi-* --test-threads=1 --nocapture > $OUT/gpu_multi.log 2>&1; echo "gpu_multi rc=$?" >> $OUT/tests.log
grep -E "test result|FAILED|panicked|SKIP" $OUT/gpu_multi.log >> $OUT/tests.log
grep -E "===|test result|FAILED|panicked|rc=" $OUT/tests.log
