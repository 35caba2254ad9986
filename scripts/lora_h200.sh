#!/usr/bin/env bash
# Issue 22 (multi-LoRA) on one H200, for a later lease: GPU tests of the LoRA kernels and runner,
# the SGMV microbenchmark, then decode throughput / step time base vs 8 adapters (targets in
# scripts/bench_lora.py). Through the device tool: carry [".whl"] (as scripts/h200.sh); JSON and
# logs go to $OUT. About 8 minutes: the serving stage loads the dummy 8B twice.
set -uo pipefail
OUT=${OUT:-h200_out}
mkdir -p "$OUT"
log() { echo "[$(date +%H:%M:%S)] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
python3 -m radixgen.runtime.bench.model_configs llama-3.1-8b /tmp/llama-3.1-8b >/dev/null
log "gpu tests: LoRA kernels, runner with kernels and decode CUDA graphs"
timeout 180 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_lora.py \
  tests/test_lora_parity.py 2>&1 | tee "$OUT/lora_gpu_tests.log" | tail -6
log "SGMV microbenchmark"
timeout 120 python3 scripts/bench_lora.py kernels --out "$OUT" 2>&1 | tail -12
log "serving: base vs 8 rank-16 adapters, batch 1 and 64"
timeout 330 python3 scripts/bench_lora.py serving --out "$OUT" 2>&1 | grep -v Warning | tail -12
