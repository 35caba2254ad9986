#!/usr/bin/env bash
# The H200 runs still pending after the fourth session of 2026-12-01, by stage, in priority
# order (about 2-5 minutes each; a lease runs the first few). Through the device tool with
# `carry: [".whl"]` (and ".base" for no-regress); JSON and logs go to $OUT.
#   gpu-tests   every GPU test (`pytest -m gpu`): session 4 changed the FP8 path (quantization
#               in the norms / SiLU, in-kernel split-K sums), the LoRA decode kernels, EAGLE's
#               graphs; none of it has run on a GPU yet
#   lora        [11/14] the decode-kernel sweep (now with the one-launch variant), then serving
#               with its table (batch 1 was 1.25x base; target <= 1.15x)
#   fp8-bs1     [8/14] FP8 latency batch 1 / 64, main before session 4's FP8 changes (.base at
#               757c0e1, stripped as for no-regress) vs this tree, then the FP8 GEMM sweep
#   gemv        [7/14] item 4: bf16 batch-1 latency with cuBLAS (the empty GEMV table), the
#               split-K GEMV sweep (kernels/gemv.py), then batch-1 latency with its table
#   int4        [9/14] GPU tests, the launch sweep, then batch-1/64 latency with its table
#   no-regress  [13/14] item 5: bench latency batch 1 and offline 1000 x 200/200, main before
#               tensor parallelism (`git archive --prefix=.base/ 9c99b46 | tar -x`; strip
#               runtime/tiny_assets/*.safetensors, docs/ and tests/ from it to stay under the
#               64 MiB carry: the stage copies tiny's weights back on the device) vs this tree
#   fp8         [8/14] bench offline 1000 x 1000/1000, bf16 vs FP8 weights + FP8 KV
#   spec        [12/14] (done in session 4) verify cost, oracle alpha 0.5 / 0.9, trained pair
#   constrained [4/14] (done in session 4) serving json-array vs random-ids, this tree only
# Usage: bash scripts/h200_pending.sh STAGE...
set -uo pipefail
OUT=${OUT:-h200_out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site
bash scripts/h200.sh setup >/dev/null 2>&1
MODEL=/tmp/llama-3.1-8b
for stage in "$@"; do
  case "$stage" in
    gpu-tests)
      timeout 500 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 \
        | tee "$OUT/gpu_tests.log" | tail -15 ;;
    fp8-bs1)
      cp -n runtime/tiny_assets/model.safetensors .base/runtime/tiny_assets/
      OUT=$OUT/fp8_ab bash scripts/ab_bench.sh .base latency-fp8
      STAGE_TIMEOUT=200 OUT=$OUT/fp8_sweep bash scripts/h200.sh fp8-gemm-sweep ;;
    spec)
      OUT=$OUT bash scripts/gpu_speculative.sh verify-cost tokens
      python3 scripts/bench_speculative.py oracle --batch-sizes 1 32 --alphas 0.5 0.9 \
        --speculative-max-batch-size 32 --out "$OUT/oracle_alphas.json" 2>&1 | tail -6 ;;
    gemv)
      mkdir -p "$OUT/gemv"
      for when in before after; do
        if [ $when = after ]; then
          timeout 300 python3 scripts/bench_gemv.py --sweep --out "$OUT/gemv" 2>&1 | tail -5
          [ -s "$OUT/gemv/gemv_configs.json" ] && cp "$OUT/gemv/gemv_configs.json" kernels/
        fi
        python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL --load-format dummy \
          --batch-sizes 1 --input-len 128 --output-len 256 \
          --output-json "$OUT/gemv/latency_$when.json" 2>&1 | grep '^{' | tail -1
      done ;;
    int4)
      STAGE_TIMEOUT=300 bash scripts/h200.sh int4-tests int4-gemm-sweep
      [ -s "$OUT/int4_gemm_configs.json" ] && cp "$OUT/int4_gemm_configs.json" kernels/
      python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL --load-format dummy \
        --batch-sizes 1 64 --input-len 128 --output-len 256 --quantization awq \
        --output-json "$OUT/latency_awq_tuned.json" 2>&1 | grep '^{' ;;
    lora)
      OUT=$OUT STAGES="kernels serving" bash scripts/lora_h200.sh ;;
    constrained)
      OUT=$OUT/constrained TREES=new REPEATS=4 bash scripts/ab_bench.sh . serving-json-new ;;
    no-regress)
      # The tiny weights were stripped from .base to fit the carry: the tokenizer of the
      # dummy 8B folder comes from tiny's assets.
      cp -n runtime/tiny_assets/model.safetensors .base/runtime/tiny_assets/
      OUT=$OUT/no_regress bash scripts/ab_bench.sh .base latency offline ;;
    fp8)
      STAGE_TIMEOUT=200 bash scripts/h200.sh fp8-offline-bf16 fp8-offline-w8kv8 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
