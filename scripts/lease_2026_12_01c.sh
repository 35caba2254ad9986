#!/usr/bin/env bash
# One H200 lease of the third session of 2026-12-01 (main at 1c8478e): the first GPU runs of
# what landed without one ([9/14] int4, [11/14] LoRA, [12/14] speculative, [6/14] tree attention
# after its memory fix, [4/14] jump-forward), in three calls on one warm machine:
#   PART=1  GPU tests of those features, the int4 GEMM and tree-attention microbenchmarks
#   PART=2  bench latency batch 1 and 64 (bf16, FP8, AWQ int4); generated-shared-prefix with
#           tree attention on and off
#   PART=3  multi-LoRA kernels and serving
#   PART=4  the extend-attention tuning sweep
# Through the device tool: carry [".whl"]; OUT is set by the tool.
set -uo pipefail
OUT=${OUT:-h200_out}
mkdir -p "$OUT"
export STAGE_TIMEOUT=150
export PYTHONPATH=/tmp/site  # where h200.sh's setup installs the wheels
case "${PART:-1}" in
  1)
    bash scripts/h200.sh setup int4-tests
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_lora.py \
      tests/test_lora_parity.py tests/test_speculative_engine.py tests/test_kernels_fused_sampling.py \
      tests/test_sampler.py tests/test_warmup.py tests/test_engine_tree_attention.py \
      tests/test_kernels_vocab_mask.py tests/test_quantization.py 2>&1 | tee "$OUT/gpu_tests.log" \
      | grep -E "passed|failed|Error|FAILED" | tail -15
    STAGE_TIMEOUT=100 bash scripts/h200.sh int4-gemm
    timeout 170 python3 scripts/bench_tree_attention.py --out "$OUT/bench_tree_attention.json" 2>&1 \
      | grep -v Warning | tail -45
    ;;
  2)
    bash scripts/h200.sh setup fp8-latency
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_lora.py \
      tests/test_lora_parity.py tests/test_speculative_engine.py tests/test_warmup.py \
      2>&1 | tee "$OUT/gpu_tests_2.log" | grep -E "passed|failed|Error|FAILED" | tail -15
    MODEL=/tmp/llama-3.1-8b
    echo "bench latency bs1/64 128/256, weights awq (random int4)"
    timeout 150 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL --load-format dummy \
      --batch-sizes 1 64 --input-len 128 --output-len 256 --quantization awq \
      --output-json "$OUT/latency_awq.json" 2>&1 | grep '^{' | tail -3
    for mode in tree notree; do
      echo "bench offline generated-shared-prefix defaults, $mode"
      timeout 150 python3 -m radixgen.runtime.bench.cli offline --model-path $MODEL \
        --load-format dummy --dataset generated-shared-prefix \
        $([ $mode = tree ] && echo --enable-tree-attention) \
        --output-json "$OUT/offline_gsp_$mode.json" 2>&1 | grep -E "duration|Error" | tail -3
    done
    ;;
  3)
    bash scripts/h200.sh setup >/dev/null
    timeout 100 python3 scripts/bench_lora.py kernels --out "$OUT" 2>&1 | grep -v Warning | tail -12
    timeout 240 python3 scripts/bench_lora.py serving --out "$OUT" 2>&1 | grep -v Warning | tail -8
    ;;
  4)  # the extend-attention tuning sweep ([7/14] item 3) and the GPU tests of the kernel
    bash scripts/h200.sh setup >/dev/null
    timeout 300 python3 scripts/tune_extend_attention.py --out "$OUT" 2>&1 | tail -45
    timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_extend_attention.py \
      tests/test_kernels_fp8_kv_attention.py tests/test_warmup.py 2>&1 | grep -E "passed|failed|Error" | tail -8
    ;;
esac
ls "$OUT"
