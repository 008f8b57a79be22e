#!/usr/bin/env bash
# Per-kernel census of a decode step on the device (ncu, `gpu__time_duration` only: one pass per launch, so no
# memory save/restore of the 135 GB synthetic model; ~40 s a batch size). Usage on the GPU machine:
#   bash scripts/ncu-census.sh <dsv4 binary> <batch> [kernel-name regex]
# CENSUS_BY_GRID=1 keys the rows by kernel name and grid size (ncu's "Grid Size" column), which tells launches of
# one kernel apart: the gate from the stacked projection (gemv_bf16_nt1), wq_b from wo_b (gemv_fp8_nt1).
# Prints ms per decode step and us per launch for each kernel name, summed over the launches of the bench's decode
# steps (eager, graph warm-up and replay: --steps 1 --warmup 0 profiles 3 steps, so the sums are divided by 3;
# the setup kernels, synth_fill and the layout conversions, are listed too and are not per step). ncu serialises
# the launches, so the sums exceed the graph replay time (kernels/BENCH_NOTES.md, sixteenth session).
set -euo pipefail
bin=$1 batch=$2 filter=${3:-}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
csv=$(mktemp)
args=(--clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --log-file "$csv")
[ -n "$filter" ] && args+=(--kernel-name "regex:$filter")
"$NCU" "${args[@]}" "$bin" bench --batches "$batch" --contexts 4096 --steps 1 --warmup 0 --prefill 0 > /dev/null
python3 - "$csv" <<'PY'
import csv, os, sys, collections
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
h = rows[0]
name, value, unit = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
grid = h.index("Grid Size") if os.environ.get("CENSUS_BY_GRID") == "1" and "Grid Size" in h else None
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
total, count = collections.defaultdict(float), collections.Counter()
for r in rows[1:]:
    k = r[name].split("(")[0] + (f" {r[grid]}" if grid is not None else "")
    total[k] += float(r[value].replace(",", "")) * scale[r[unit]]
    count[k] += 1
steps = 3
w = max([40] + [len(k) for k in total])
print(f"{'kernel':{w}s} {'launches/step':>13s} {'ms/step':>9s} {'us each':>9s}")
for k, us in sorted(total.items(), key=lambda x: -x[1]):
    print(f"{k:{w}s} {count[k] / steps:13.1f} {us / steps / 1000:9.3f} {us / count[k]:9.2f}")
PY
rm -f "$csv"
