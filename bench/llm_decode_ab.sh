#!/usr/bin/env bash
# Batch-1 decode time per token of each model bench/llm_gpu_bench.py saved, under several
# settings of the decode kernels' parameters (llm.cuda.*, `kiln routes MODEL_DIR`), interleaved over
# rounds so that drift hits every setting alike. Run on the device machine after that script,
# with scripts/gpu-env sourced.
# Usage: bench/llm_decode_ab.sh ROUNDS "llm.cuda.pdl=off ..." "NAME=V ..." ...   (an empty string: defaults;
# BIN=path in a setting runs that kiln binary instead of $KILN_BIN, to compare two builds)
set -uo pipefail
rounds=$1
shift
declare -A sum
for ((r = 0; r < rounds; ++r)); do
  for d in /tmp/kiln_llm_bench/*/; do
    [ -f "$d/config.json" ] || continue
    for setting in "$@"; do
      bin=$KILN_BIN route=""
      for word in $setting; do
        if [[ $word == BIN=* ]]; then bin=${word#BIN=}; else route+="${route:+;}$word"; fi
      done
      ms=$("$bin" bench-llm --route "$route" "$d" --target cuda --requests 2 --concurrency 1 --input-len 128 --output-len 128 \
        --max-batch-size 1 --max-num-tokens 256 --num-blocks 64 --json | python3 -c "import json,sys; print(json.load(sys.stdin)['tpot_ms']['median'])")
      key="$(basename "$d") [${setting:-defaults}]"
      sum[$key]="${sum[$key]:-} $ms"
    done
  done
done
printf '%-60s %s\n' "model [setting]" "b1 ms/token per round (median of each run)"
for key in "${!sum[@]}"; do printf '%-60s %s\n' "$key" "${sum[$key]}"; done | sort
