#!/usr/bin/env bash
# The second half of a one-GPU final run (after one_a.sh): the one-GPU bench alone on the GPU, the HF peer in the
# same call, then the tensor split simulated on this one GPU (two ranks on ordinal 0, 6 expert banks a rank): that
# the split runner runs at full size, not a two-GPU figure.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
B=/tmp/b; mkdir -p $B
[ -x $B/dsv4 ] || tar xJf .device-bin/final/bins.tar.xz -C $B
timeout 200 $B/dsv4 bench --profile --steps 15 --json $OUT/bench.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"
timeout 150 python3 scripts/hf_peer.py --layers 4 --batches 1,64 --prompt 64 --steps 4 > $OUT/hf.txt 2>&1
echo "hf_peer rc=$?"; tail -5 $OUT/hf.txt
timeout 200 $B/dsv4 bench --gpus 0,0 --split tensor --banks 6 --batches 1,8 --contexts 4096 --steps 5 --warmup 2 --prefill 0 > $OUT/split_sim.txt 2>&1
echo "simulated split rc=$?"; grep -E "^\|" $OUT/split_sim.txt | head -12
grep -E "^\| (4096|65536)" $OUT/bench.txt
tail -42 $OUT/bench.txt | grep -vE "^\| (4096|65536)"
