#!/usr/bin/env bash
# The single-GPU half of run.sh on one nvidia-h200 (when no two-GPU machine is lent): every single-GPU test,
# then the one-GPU bench alone on the GPU. multi.sh is the other half.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 DSV4_TEST_DATA=$PWD/tests/data
B=/tmp/b; mkdir -p $B /tmp/v4
tar xJf .device-bin/final/bins.tar.xz -C $B
tar xJf .device-bin/final/tinyv4.tar.xz -C /tmp/v4
export DSV4_GOLDEN_V4=/tmp/v4/tiny-v4
nvidia-smi -L
timeout 480 bash .device-bin/final/tests.sh $B > $OUT/tests.log 2>&1
grep -E "===|test result|FAILED|panicked|rc=" $OUT/tests.log
timeout 200 $B/dsv4 bench --profile --steps 15 --json $OUT/bench.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"
grep -E "^\| (4096|65536)" $OUT/bench.txt
tail -42 $OUT/bench.txt | grep -vE "^\| (4096|65536)"
