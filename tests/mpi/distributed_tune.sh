#!/usr/bin/env bash
# Distributed tuning test: `mpirun -np 3 kiln tune` must give the single-process result for
# the same expression, and for the same cache (--continue).
# Usage: distributed_tune.sh KILN SOURCE_DIR
set -euo pipefail
kiln=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=$src/models/mlp
expr='debug.fault=[none,build_error,crash,wrong] opt.dce=[on,off] fusion.gemm_bias_act=[on,off]'
# --min-gain 100: the chosen route must not hinge on timing noise between runs.
args=(tune "$model/model.onnx" --golden "$model/test_data_set_0" --expr "$expr" --iterations 3 --warmup 1 --min-gain 100 --json)
mpi=(timeout 120 mpirun --allow-run-as-root --oversubscribe -np 3)

# Outcome per route, sorted: what must agree between the runs (timings may not).
outcomes() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('\n'.join(sorted(c['route_hash']+' '+c['outcome'] for c in r['candidates'])))" "$1"; }
best() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['best_route'])" "$1"; }

"$kiln" "${args[@]}" --tuning-cache "$work/single.jsonl" --report "$work/single.json" > /dev/null
"${mpi[@]}" "$kiln" "${args[@]}" --tuning-cache "$work/dist.jsonl" --report "$work/dist.json" > /dev/null

diff <(outcomes "$work/single.json") <(outcomes "$work/dist.json")
[ "$(best "$work/single.json")" = "$(best "$work/dist.json")" ]
grep -q '"measured_by":"rank 1"' "$work/dist.jsonl"
grep -q '"measured_by":"rank 2"' "$work/dist.jsonl"
# Each candidate measured once across the ranks.
[ "$(grep -v remeasure "$work/dist.jsonl" | python3 -c 'import json,sys; h=[json.loads(l)["route_hash"] for l in sys.stdin]; print(len(h)-len(set(h)))')" = 0 ]

# The same cache: a distributed --continue replays it exactly, measuring nothing new.
cp "$work/single.jsonl" "$work/resume.jsonl"
"${mpi[@]}" "$kiln" "${args[@]}" --tuning-cache "$work/resume.jsonl" --continue --report "$work/resume.json" > /dev/null
diff <(outcomes "$work/single.json") <(outcomes "$work/resume.json")
[ "$(best "$work/single.json")" = "$(best "$work/resume.json")" ]
[ "$(wc -l < "$work/resume.jsonl")" = "$(wc -l < "$work/single.jsonl")" ]
# A worker rank that dies loses only its candidate in flight; the search finishes.
KILN_DEBUG_KILL_RANK=2 "${mpi[@]}" --enable-recovery -x KILN_DEBUG_KILL_RANK "$kiln" "${args[@]}" --timeout-per-candidate 2 \
  --tuning-cache "$work/killed.jsonl" --report "$work/killed.json" > /dev/null
[ "$(grep -c 'stopped answering' "$work/killed.jsonl")" = 1 ]
[ "$(diff <(outcomes "$work/single.json") <(outcomes "$work/killed.json") | grep -c '^>')" -le 1 ]
[ "$(best "$work/single.json")" = "$(best "$work/killed.json")" ]
echo "distributed tuning: 1 passed, 0 failed"
