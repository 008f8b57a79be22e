#!/usr/bin/env bash
# The FP8-activation GEMV (gemv_wq8.cu) on one H200: every single-GPU test (tests.sh, whose last part reruns the
# model-level tests with it from one row), or with Q8_AB=1 the same-binary A/B of the full-size bench at 16-64
# rows (DSV4_GEMV_Q8 0 / 1; Q8_ROUNDS, Q8_BATCHES).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 DSV4_TEST_DATA=$PWD/tests/data NCCL_NVLS_ENABLE=0
B=/tmp/b; mkdir -p $B /tmp/v4
[ -x $B/dsv4 ] || tar xJf .device-bin/final/bins.tar.xz -C $B
if [ "${Q8_AB:-0}" = 1 ]; then
  AB_VAR=DSV4_GEMV_Q8 AB_VALS="0 1" AB_ROUNDS=${Q8_ROUNDS:-1} AB_BATCHES=${Q8_BATCHES:-16,32,64} \
    exec bash .device-bin/final/ab.sh
fi
[ -d /tmp/v4/tiny-v4 ] || tar xJf .device-bin/final/tinyv4.tar.xz -C /tmp/v4
export DSV4_GOLDEN_V4=/tmp/v4/tiny-v4
timeout 420 bash .device-bin/final/tests.sh $B > $OUT/tests.log 2>&1
grep -E "===|test result|FAILED|panicked|rc=" $OUT/tests.log
