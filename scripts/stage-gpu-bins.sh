#!/usr/bin/env bash
# Builds (here, where Rust is) every GPU test executable and the release `dsv4`, and stages them in
# .device-bin/main/ for the GPU machine, which has CUDA but no Rust. Run scripts/gpu-check.sh there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The H200 runs must use the nvcc fatbin (sm_90a wgmma kernels): without nvcc the build falls back to NVRTC
# PTX, the prefill wgmma paths are skipped and the benchmarks measure the wrong kernels. So fail instead.
export DSV4_REQUIRE_FATBIN=1
out=.device-bin/main
rm -rf "$out" && mkdir -p "$out"
cargo build --release -p dsv4-engine
cp target/release/dsv4 "$out/"
# Test executables whose names say they need a GPU, plus the kernels' GPU suite.
cargo test --release -p dsv4-engine -p dsv4-kernels -p dsv4-tests --no-run --message-format=json 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    exe = m.get("executable")
    name = (m.get("target") or {}).get("name", "")
    if exe and (name.startswith("gpu") or name == "gpu"):
        print(exe)
' | while read -r exe; do cp "$exe" "$out/"; done
ls -la "$out"
du -sh "$out"
