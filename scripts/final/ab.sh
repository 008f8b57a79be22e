#!/usr/bin/env bash
# A/B of the full-size bench on one H200, 4K context, graphs (ms per step in the table's rows), AB_ROUNDS rounds of
# batches AB_BATCHES, each round running every arm in turn. Two forms:
#   same binary, an environment knob: AB_VAR set to each of AB_VALS
#     AB_VAR=DSV4_GEMV_Q8_MIN AB_VALS="17 9" AB_BATCHES=9,16 AB_ROUNDS=2 bash .device-bin/final/ab.sh
#   two binaries (AB_VAR unset): the staged dsv4 against an older build packed as .device-bin/final/dsv4_old.xz
#   (`xz -T2 -c <old dsv4> > .device-bin/final/dsv4_old.xz` after scripts/stage-final.sh)
#     AB_BATCHES=32,64 AB_ROUNDS=2 bash .device-bin/final/ab.sh
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
B=/tmp/b; mkdir -p $B
[ -x $B/dsv4 ] || tar xJf .device-bin/final/bins.tar.xz -C $B
if [ -n "${AB_VAR:-}" ]; then
  arms=(${AB_VALS:?})
else
  arms=(dsv4_old dsv4)
  [ -x $B/dsv4_old ] || { xz -dc .device-bin/final/dsv4_old.xz > $B/dsv4_old && chmod +x $B/dsv4_old; }
fi
for round in $(seq 1 "${AB_ROUNDS:-1}"); do
  for arm in "${arms[@]}"; do
    if [ -n "${AB_VAR:-}" ]; then cmd=(env "$AB_VAR=$arm" $B/dsv4); label="$AB_VAR=$arm"; else cmd=($B/$arm); label=$arm; fi
    echo "=== round $round $label"
    timeout 150 "${cmd[@]}" bench --batches "${AB_BATCHES:-1,8}" --contexts 4096 --steps 15 --warmup 3 --prefill 0 \
      2>&1 | grep -E "^\| 4096 .* on "
  done
done
