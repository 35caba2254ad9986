#!/usr/bin/env bash
# Issue [12/14] on one H200. Stages (JSON and logs under $OUT), in priority order:
#   oracle       8B shape, dummy weights, oracle drafts alpha 0.7, 4 draft tokens, batch 1 and 32
#                (speculation forced on at 32; verify as decode rows where a CUDA graph holds them)
#   verify-cost  8B shape: a verify forward (extend, and as decode rows) vs a decode step
#   tests        pytest -m gpu of the speculative tests (NGRAM, STANDALONE, EAGLE greedy parity)
#   tokens       tiny and its trained drafts: accept length and tok/s, batch 1 and 8
#   train-drafts retrain tiny's drafts on the GPU for 90 s (writes $OUT/drafts/*.safetensors)
# Usage: OUT=... bash scripts/gpu_speculative.sh STAGE...
set -uo pipefail
OUT=${OUT:-gpu_speculative_out}; mkdir -p "$OUT"
for stage in "$@"; do
  case "$stage" in
    oracle)
      python3 scripts/bench_speculative.py oracle --batch-sizes 1 32 --alphas 0.7 \
        --speculative-max-batch-size 32 --out "$OUT/oracle.json" 2>&1 | tee "$OUT/oracle.log" ;;
    verify-cost)
      python3 scripts/bench_speculative.py verify-cost --out "$OUT/verify_cost.json" 2>&1 \
        | tail -14 ;;
    tests)
      python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_speculative_engine.py 2>&1 \
        | tee "$OUT/gpu_tests.log" | tail -15 ;;
    tokens)
      for algorithm in NGRAM EAGLE STANDALONE; do
        draft=(); [ "$algorithm" = EAGLE ] && draft=(--draft-model-path tiny-eagle)
        [ "$algorithm" = STANDALONE ] && draft=(--draft-model-path tiny-draft)
        python3 scripts/bench_speculative.py tokens --device cuda --algorithm "$algorithm" \
          "${draft[@]}" --num-steps 3 --out "$OUT/tokens_$algorithm.json" 2>&1 | tail -3
      done ;;
    train-drafts)
      python3 -m radixgen.runtime.tiny_assets.train_drafts --out "$OUT/drafts" --device cuda \
        --num-files 800 --steps 100000 --train-seconds 90 --batch-size 32 --seq-len 512 \
        --lr 2e-3 --log-every 200 2>&1 | tail -8 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
