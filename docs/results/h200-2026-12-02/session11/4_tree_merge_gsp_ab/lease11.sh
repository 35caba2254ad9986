#!/usr/bin/env bash
# Eleventh session's second lease: GPU tests of the tree merge change, the tree microbenchmark,
# generated-shared-prefix main (8cd9a13, tree opt-in) vs this tree (default on, penalties fix)
set -uo pipefail
OUT=${OUT:-h200_out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site
bash scripts/h200.sh setup 2>&1 | tail -2
MODEL=/tmp/llama-3.1-8b
echo "[$(date +%T)] gpu tests"
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_tree_attention.py \
  tests/test_engine_tree_attention.py tests/test_kernels_decode_attention.py 2>&1 \
  | tee "$OUT/gpu_tests_tree.log" | tail -4
echo "[$(date +%T)] tree bench"
timeout 60 python3 scripts/bench_tree_attention.py --quick --out "$OUT/bench_tree_quick.json" 2>&1 | tail -4
gsp() {  # name, extra flags
  timeout 95 python3 -m radixgen.runtime.bench.cli offline --model-path $MODEL --load-format dummy \
    --dataset generated-shared-prefix "${@:2}" --output-json "$OUT/offline_gsp_$1.json" 2>&1 \
    | grep -E "^duration" | tail -1
  python3 -c "import json; s=json.load(open('$OUT/offline_gsp_$1.json'))['engine_stats']; print('$1', 'tree steps', s['num_tree_attention_steps'], 'of', s['num_forward_steps'], 'step_time_s', round(s['step_time_s'], 2))" 2>&1 | tail -1
}
echo "[$(date +%T)] gsp base"
(cd .base && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1) && gsp base --enable-tree-attention
echo "[$(date +%T)] gsp new"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 && gsp new
echo "[$(date +%T)] end"
