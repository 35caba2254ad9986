#!/usr/bin/env bash
# One H200 lease for this session's before/after (2026-12-01, second session): GPU tests of the
# new kernels, the tree-attention microbenchmark, constrained serving (main at 551fdd1 in .base/
# vs this tree), generated-shared-prefix in-process with tree attention on and off, then
# (PART=2) batch-1 latency before/after and constrained serving of this tree (tree attention
# was on by default when part 1 ran and its server ran out of memory; the flag is now opt-in).
# Through the device tool: carry [".whl", ".base"]; OUT is set by the tool.
set -uo pipefail
OUT=${OUT:-h200_out}
mkdir -p "$OUT"
log() { echo "[$(date +%H:%M:%S)] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
python3 -m radixgen.runtime.bench.model_configs llama-3.1-8b /tmp/llama-3.1-8b >/dev/null
if [ "${PART:-1}" = 1 ]; then
  log "gpu tests: tree, decode, fp8 kv, fused layers"
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_tree_attention.py \
    tests/test_engine_tree_attention.py tests/test_kernels_decode_attention.py \
    tests/test_kernels_fp8_kv_attention.py tests/test_kernels_fused_layers.py 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -6
  log "tree attention microbenchmark"
  timeout 90 python3 scripts/bench_tree_attention.py --quick --out "$OUT/bench_tree_attention.json" 2>&1 | tail -8
  for mode in tree notree; do
    log "offline generated-shared-prefix defaults, $mode"
    timeout 150 python3 -m radixgen.runtime.bench.cli offline --model-path /tmp/llama-3.1-8b \
      --load-format dummy --dataset generated-shared-prefix \
      $([ $mode = tree ] && echo --enable-tree-attention) \
      --output-json "$OUT/offline_gsp_$mode.json" 2>&1 | grep -E "duration|output_token_throughput" | tail -2
  done
  bash scripts/ab_bench.sh .base serving-json 2>&1 | grep -E "^\[|median_tpot|extra_ms|Error" | head -40
else
  bash scripts/ab_bench.sh .base latency serving-json-new 2>&1 | grep -E "^\[|decode|output_token_throughput|median_tpot|Error" | head -40
fi
