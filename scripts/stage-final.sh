#!/usr/bin/env bash
# Stages the two-GPU validation run: every GPU test and `dsv4` (scripts/stage-gpu-bins.sh), packed into
# .device-bin/final/ with the tiny-v4 golden checkpoint (../shared) and scripts/final/*.sh, under the 64 MiB
# the device tool carries. Then, with the device tool: `bash .device-bin/final/run.sh` on nvidia-h200-x2,
# carry [".device-bin/final"] (phase 1: single-GPU tests on GPU 1 beside the one-GPU bench on GPU 0;
# phase 2: gpu_multi on both GPUs with NCCL; phase 3: the split benches).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/stage-gpu-bins.sh
out=.device-bin/final
mkdir -p "$out"
strip .device-bin/main/* 2>/dev/null || true
# One large xz dictionary: every executable embeds the same fatbin, so the archive holds it about once
# (45 MB -> 8 MB with the default dictionary -> this one).
tar cf - -C .device-bin/main . | xz -T2 --lzma2=preset=6,dict=256MiB > "$out/bins.tar.xz"
golden=${DSV4_GOLDEN_V4:-../shared/golden/tiny-v4}
if [ -d "$golden" ]; then
    # What gpu_golden_v4 reads (the FP8/FP4 checkpoint and the prompt tokens), not the bf16 copy or the
    # reference logits: the carry limit.
    name=$(basename "$golden")
    tar cJf "$out/tinyv4.tar.xz" -C "$(dirname "$golden")" "$name/quant" "$name/golden/quant/tokens.json"
else
    echo "no tiny-v4 at $golden: gpu_golden_v4 will SKIP there" >&2
fi
cp scripts/final/*.sh "$out/"
du -sh "$out"
