#!/usr/bin/env bash
# The third session's closing H200 lease (2026-12-01), two calls on one warm machine, stages in
# priority order (a call cut short by the device budget loses only its last stages):
#   PART=A  GPU tests of every path this session changed (fused sampling for every batch kind,
#           tree attention on by default, the new LoRA decode kernels, the rewritten int4
#           kernels, EAGLE / verify as decode rows, warm-up); multi-LoRA serving vs base
#   PART=B  the speculative oracle ([12/14]); constrained serving and never-seen-schema TTFT
#           ([4/14]); bench offline 1000 x 200/200 with tree attention on (default) and off;
#           generated-shared-prefix in-process; jump-forward off/on on json-keys; int4 batch-1/64
#           latency; the sampling benchmark
# Through the device tool: carry [".whl"]; OUT is set by the tool.
set -uo pipefail
OUT=${OUT:-h200_out}
mkdir -p "$OUT"
log() { echo "[$(date +%H:%M:%S)] $*"; }
export PYTHONPATH=/tmp/site
bash scripts/h200.sh setup >/dev/null 2>&1
MODEL=/tmp/llama-3.1-8b
BENCH="python3 -m radixgen.runtime.bench.cli"
case "${PART:-A}" in
  A)
    log "GPU tests"
    timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_fused_sampling.py \
      tests/test_sampler.py tests/test_kernels_tree_attention.py tests/test_engine_tree_attention.py \
      tests/test_kernels_lora.py tests/test_lora_parity.py tests/test_kernels_int4_gemm.py \
      tests/test_int4_checkpoint.py tests/test_speculative_engine.py tests/test_warmup.py \
      tests/test_kernels_decode_attention.py 2>&1 | tee "$OUT/gpu_tests.log" \
      | grep -E "^(FAILED|ERROR)|passed|failed" | tail -25
    log "multi-LoRA serving: base vs 8 adapters"
    STAGES=serving timeout 240 bash scripts/lora_h200.sh 2>&1 | grep -v Warning | tail -6
    ;;
  B)
    log "speculative oracle"
    OUT=$OUT timeout 200 bash scripts/gpu_speculative.sh oracle 2>&1 | grep -v Warning | tail -8
    log "constrained serving + TTFT (this tree)"
    OUT=$OUT/serving TREES=new timeout 130 bash scripts/ab_bench.sh . serving-json-new 2>&1 | grep -E "^\[|tpot|extra_ms|Error"
    for flag in "" --disable-tree-attention; do
      log "bench offline 1000 x 200/200 ${flag:-tree attention on (default)}"
      timeout 80 $BENCH offline --model-path $MODEL --load-format dummy --num-prompts 1000 \
        --random-input-len 200 --random-output-len 200 $flag \
        --output-json "$OUT/offline_1000_200_200${flag:+_notree}.json" 2>&1 | grep -E "duration|Error" | tail -2
    done
    log "generated-shared-prefix defaults in-process (tree attention on by default)"
    timeout 90 $BENCH offline --model-path $MODEL --load-format dummy --dataset generated-shared-prefix \
      --output-json "$OUT/offline_gsp_tree.json" 2>&1 | grep -E "duration|Error" | tail -2
    OUT=$OUT/jf TREES=new timeout 130 bash scripts/ab_bench.sh . jump-forward 2>&1 | grep -E "^\[|throughput|Error"
    log "int4 latency"
    timeout 70 $BENCH latency --model-path $MODEL --load-format dummy --batch-sizes 1 64 \
      --input-len 128 --output-len 256 --quantization awq --output-json "$OUT/latency_awq.json" \
      2>&1 | grep '^{' | tail -2
    log "sampling benchmark"
    timeout 60 python3 -m radixgen.runtime.bench.sampling --quick --json "$OUT/sampling_bench.json" \
      2>&1 | tail -12
    ;;
esac
ls "$OUT"
