#!/usr/bin/env bash
# Two-binary A/B of the full-size bench on one H200: the staged dsv4 against an older build packed as
# .device-bin/final/dsv4_old.xz (`xz -T2 -c <old dsv4> > .device-bin/final/dsv4_old.xz` after stage-final.sh),
# alternating in each of AB_ROUNDS rounds, batches AB_BATCHES, 4K context, graphs (ms per step in the rows).
#   AB_BATCHES=1,16,64 AB_ROUNDS=2 bash .device-bin/final/abbin.sh
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
B=/tmp/b; mkdir -p $B
[ -x $B/dsv4 ] || tar xJf .device-bin/final/bins.tar.xz -C $B
[ -x $B/dsv4_old ] || { xz -dc .device-bin/final/dsv4_old.xz > $B/dsv4_old && chmod +x $B/dsv4_old; }
for round in $(seq 1 "${AB_ROUNDS:-1}"); do
  for bin in dsv4_old dsv4; do
    echo "=== round $round $bin"
    timeout 150 $B/$bin bench --batches "${AB_BATCHES:-1,8}" --contexts 4096 --steps 15 --warmup 3 --prefill 0 \
      2>&1 | grep -E "^\| 4096 .* on "
  done
done
