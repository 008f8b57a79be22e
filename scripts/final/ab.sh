#!/usr/bin/env bash
# Same-binary A/B of the full-size bench on one H200: AB_VAR set to each of AB_VALS in turn, AB_ROUNDS rounds,
# batches AB_BATCHES, 4K context, graphs (ms per step in the table's rows).
#   AB_VAR=DSV4_L2_PREFETCH AB_VALS="0 8" AB_BATCHES=1,8 AB_ROUNDS=2 bash .device-bin/final/ab.sh
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
B=/tmp/b; mkdir -p $B
[ -x $B/dsv4 ] || tar xJf .device-bin/final/bins.tar.xz -C $B
for round in $(seq 1 "${AB_ROUNDS:-1}"); do
  for v in ${AB_VALS:?}; do
    echo "=== round $round ${AB_VAR:?}=$v"
    env "$AB_VAR=$v" timeout 120 $B/dsv4 bench --batches "${AB_BATCHES:-1,8}" --contexts 4096 --steps 15 \
      --warmup 3 --prefill 0 2>&1 | grep -E "^\| 4096 .* on "
  done
done
