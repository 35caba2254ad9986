#!/usr/bin/env bash
# Issue 22 (multi-LoRA) on one H200: GPU tests of the LoRA kernels and runner, the decode-kernel
# launch sweep (<= ~90 s) followed by the kernel
# microbenchmark (SGMV before / decode kernels after, and the swept table's winners), then
# decode throughput / step time base vs 8 adapters (targets in scripts/bench_lora.py). Through the device tool: carry [".whl"] (as
# scripts/h200.sh); JSON and logs go to $OUT. Stages can run alone: STAGES="tests kernels serving".
# The sweep's table is $OUT/lora_decode_configs.json: the serving stage of the same run uses it;
# copy it over kernels/lora_decode_configs.json in the branch.
set -uo pipefail
OUT=${OUT:-h200_out}
STAGES=${STAGES:-tests kernels serving}
mkdir -p "$OUT"
log() { echo "[$(date +%H:%M:%S)] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
if [[ $STAGES == *tests* ]]; then
  log "gpu tests: LoRA kernels (SGMV and decode), runner with kernels and decode CUDA graphs"
  timeout 180 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_lora.py \
    tests/test_lora_parity.py 2>&1 | tee "$OUT/lora_gpu_tests.log" | tail -6
fi
if [[ $STAGES == *kernels* ]]; then
  log "decode sweep, then the kernel microbenchmark"
  timeout 240 python3 scripts/bench_lora.py kernels --sweep --out "$OUT" 2>&1 \
    | tee "$OUT/lora_kernels.log" | tail -40
  # This machine's copy (editable install) serves with the swept table from here on.
  [[ -s $OUT/lora_decode_configs.json ]] && cp "$OUT/lora_decode_configs.json" kernels/
fi
if [[ $STAGES == *serving* ]]; then
  python3 -m radixgen.runtime.bench.model_configs llama-3.1-8b /tmp/llama-3.1-8b >/dev/null
  log "serving: base vs 8 rank-16 adapters, batch 1 and 64"
  timeout 330 python3 scripts/bench_lora.py serving --out "$OUT" 2>&1 | grep -v Warning | tail -12
fi
