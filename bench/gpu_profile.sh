#!/usr/bin/env bash
# Per-kernel GPU time (Nsight Compute, clocks not locked) of one decode step of each model
# that bench/llm_gpu_bench.py saved, and of one inference of each engine bench/gpu_bench.py
# built, summed by kernel name (bench/ncu_summary.py). Run on the device machine after those
# scripts, with scripts/gpu-env sourced. NCU_CACHE=none keeps caches warm between kernels (as run). Writes the CSVs and summaries to $OUT (or /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
ncu_run() {  # name skip count command...
  local name=$1 skip=$2 count=$3
  shift 3
  timeout 240 ncu --csv --metrics gpu__time_duration.sum --clock-control none --cache-control "${NCU_CACHE:-all}" --launch-skip "$skip" --launch-count "$count" "$@" \
    > "$out/ncu-$name.csv" 2> "$out/ncu-$name.err" || { echo "ncu $name failed:"; tail -3 "$out/ncu-$name.err"; }
  echo "== $name: $count kernels after the first $skip"
  python3 bench/ncu_summary.py "$out/ncu-$name.csv" 14 | cut -c1-60,92-
}
for d in /tmp/kiln_llm_bench/*/; do
  [ -f "$d/config.json" ] || continue
  # The prompt's prefill and a few decode steps first; then about one decode step's kernels.
  layers=$(python3 -c "import json; print(json.load(open('$d/config.json')).get('num_hidden_layers') or json.load(open('$d/config.json')).get('n_layer'))")
  per_step=$((5 * layers + 2))
  ncu_run "decode-$(basename "$d")" $((12 * per_step)) "$per_step" "$KILN_BIN" bench-llm "$d" --target cuda --requests 1 --concurrency 1 \
    --input-len 128 --output-len 32 --max-batch-size 1 --max-num-tokens 256 --num-blocks 64
done
for d in /tmp/kiln_gpu_bench/*_b1/; do
  [ -f "$d/model.engine" ] || continue
  flags=()
  for f in "$d"/*.npy; do flags+=(--input "$(basename "$f" .npy)=$f"); done
  ncu_run "engine-$(basename "$d")" 300 110 "$KILN_BIN" bench "$d/model.engine" "${flags[@]}" --warmup 3 --iterations 5 --duration 0
done
