#!/usr/bin/env bash
# Runs radixgen's GPU checks and benchmarks on the lent H200 (through the device tool, with
# `carry: [".whl"]`). Usage: bash scripts/h200.sh STAGE...   Stages: setup gpu-tests latency
# offline. Logs and JSON go to $OUT (or ./h200_out).
set -uo pipefail
OUT=${OUT:-h200_out}; mkdir -p "$OUT"
log() { echo "[$(date +%H:%M:%S)] $*"; }

setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
  python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || cat "$OUT/pip.log"
  python3 -c "import radixgen, torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  python3 -m radixgen.runtime.bench.model_configs llama-3.1-8b /tmp/llama-3.1-8b >/dev/null
}

gpu_tests() {
  log "pytest -m gpu"
  python3 -m pytest -q -m gpu -s -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
}

latency() {
  log "latency bs1 128/256, CUDA graphs on, then off"
  python3 -m radixgen.runtime.bench.cli bench latency --model-path /tmp/llama-3.1-8b \
    --load-format dummy --batch-sizes 1 8 32 64 --input-len 128 --output-len 256 \
    --output-json "$OUT/latency_graphs.json" 2>&1 | grep -v Warning | tail -6
  python3 -m radixgen.runtime.bench.cli bench latency --model-path /tmp/llama-3.1-8b \
    --load-format dummy --batch-sizes 1 --input-len 128 --output-len 256 --disable-cuda-graph \
    --output-json "$OUT/latency_nographs.json" 2>&1 | grep -v Warning | tail -3
}

offline() {
  log "offline 256 x 512/256"
  python3 -m radixgen.runtime.bench.cli bench offline --model-path /tmp/llama-3.1-8b \
    --load-format dummy --num-prompts 256 --random-input-len 512 --random-output-len 256 \
    --output-json "$OUT/offline_256_512_256.json" 2>&1 | grep -v Warning | tail -14
}

setup
for stage in "$@"; do
  case "$stage" in
    setup) ;;
    gpu-tests) gpu_tests ;;
    latency) latency ;;
    offline) offline ;;
    *) echo "unknown stage $stage" ;;
  esac
done
log "done"
