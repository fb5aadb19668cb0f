#!/usr/bin/env bash
# Tuned/default speedups on the GPU machine (issue: the tuner's H200 figures): runs
# `kiln tune --target cuda` on the bundled models, on the shared models carried in
# .carry/shared/models (scripts/pack-gpu-carry --with-shared NAMES), and on the full-size
# exports bench/gpu_bench.py left in /tmp/kiln_gpu_bench. Reports go to $OUT (or /tmp).
# Usage (device): source scripts/gpu-env; bench/gpu_tune.sh [SECONDS_PER_MODEL]
set -uo pipefail
cd "$(dirname "$0")/.."
budget=${1:-60}
out=${OUT:-/tmp}
expr_cnn='layout.conv=[nchw,nhwc] tactic.cuda.conv=[auto,heuristic] precision.activations=[f16,bf16]'
expr_tf='tactic.cuda.attention=[fused,gemm] precision.activations=[f16,bf16] runtime.cuda_graph=[on,off]'
models=(models/mlp models/small_cnn models/transformer_block)
for d in .carry/shared/models/* /tmp/kiln_gpu_bench/*_b1; do [ -f "$d/model.onnx" ] && models+=("$d"); done
for d in "${models[@]}"; do
  name=$(basename "$d")
  case "$name" in *cnn*|*mobilenet*|*resnet*) e=$expr_cnn ;; *) e=$expr_tf ;; esac
  echo "== $name"
  timeout $((budget + 60)) "$KILN_BIN" tune "$d/model.onnx" --target cuda --expr "$e" --tolerance rel-l2=5e-2 \
    --iterations 20 --budget "${budget}s" --report "$out/tune_$name.json" 2>&1 | tail -3
done
python3 - "$out" <<'PY'
import glob, json, sys
print(f"{'model':<28}{'default ms':>11}{'best ms':>9}{'speedup':>9}  best route")
for p in sorted(glob.glob(sys.argv[1] + "/tune_*.json")):
    r = json.load(open(p))
    fin = {f.get("changes"): f.get("median_ms") for f in r.get("finalists", [])}
    print(f"{p.split('tune_')[1][:-5]:<28}{str(fin.get('default', '-'))[:9]:>11}{str(min(fin.values()) if fin else '-')[:7]:>9}"
          f"{r.get('speedup_over_default', 0):>9.2f}  {r.get('best_changes', '')}")
PY
