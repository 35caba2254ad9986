#!/usr/bin/env bash
# Issue [13/14] on GPUs (a 2-GPU machine: nvidia-h200-x2). Stages:
#   tests      pytest -m gpu of the tensor-parallel tests (NCCL, peer-memory all-reduce, graphs)
#   latency    bench latency batch 1, 8B dummy, TP=1, TP=2, TP=2 with NCCL only (JSON per run)
#   no-regress bench latency batch 1 and bench offline 1000 x 200/200 at TP=1 (compare with main)
# Usage: OUT=... bash scripts/gpu_distributed.sh STAGE...   (JSON and logs under $OUT)
# NVLink multicast stays off (the server and the Engine set these too).
set -uo pipefail
OUT=${OUT:-gpu_distributed_out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MODEL=${MODEL:-/tmp/llama-3.1-8b}
prepare() { [ -d "$MODEL" ] || python3 -m radixgen.runtime.bench.model_configs llama-3.1-8b "$MODEL" >/dev/null; }
for stage in "$@"; do
  case "$stage" in
    tests)
      python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_peer_all_reduce.py \
        tests/test_tensor_parallel_serving.py tests/test_tensor_parallel.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -20 ;;
    latency)
      prepare
      for tp in 1 2; do
        python3 -m radixgen.runtime.bench.cli bench latency --model-path "$MODEL" \
          --load-format dummy --tp-size "$tp" --batch-sizes 1 8 --input-len 128 --output-len 256 \
          --output-json "$OUT/latency_tp$tp.json" 2>&1 | tail -4
      done
      # The same TP = 2 with NCCL only: what the peer-memory all-reduce saves.
      python3 -m radixgen.runtime.bench.cli bench latency --model-path "$MODEL" \
        --load-format dummy --tp-size 2 --disable-custom-all-reduce --batch-sizes 1 8 \
        --input-len 128 --output-len 256 --output-json "$OUT/latency_tp2_nccl.json" 2>&1 | tail -4 ;;
    no-regress)
      prepare
      python3 -m radixgen.runtime.bench.cli bench latency --model-path "$MODEL" --load-format dummy \
        --batch-sizes 1 --input-len 128 --output-len 256 --output-json "$OUT/latency_tp1.json"
      python3 -m radixgen.runtime.bench.cli bench offline --model-path "$MODEL" --load-format dummy \
        --num-prompts 1000 --random-input-len 200 --random-output-len 200 \
        --output-json "$OUT/offline_tp1.json" 2>&1 | tail -8 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
