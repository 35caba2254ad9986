#!/usr/bin/env bash
# Runs radixgen's GPU checks and benchmarks on the lent H200 (through the device tool, with
# `carry: [".whl"]`). Usage: bash scripts/h200.sh STAGE...   Stages: gpu-tests latency offline
# bench-latency bench-offline bench-gsp bench-hf perf fp8-tests fp8-gemm fp8-gemm-sweep
# fp8-latency fp8-accuracy fp8-offline-bf16 fp8-offline-w8 fp8-offline-kv8 fp8-offline-w8kv8
# fp8-offline-w8kv8-exact (FP8 without fast accumulation)
# offline-200-g256 offline-200-g1024 perf-after offline-200-before tree tools int4-tests int4-gemm
# int4-gemm-sweep int4-latency int4-accuracy. Logs and JSON go to $OUT (or ./h200_out).
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

MODEL=${MODEL:-/tmp/llama-3.1-8b}
BENCH="timeout ${STAGE_TIMEOUT:-330} python3 -m radixgen.runtime.bench.cli"

bench_latency() {
  log "bench latency 128/256 over batch sizes"
  $BENCH latency --model-path $MODEL --load-format dummy --batch-sizes 1 8 32 64 128 256 \
    --input-len 128 --output-len 256 --output-json "$OUT/latency_cuda_graphs.json" 2>&1 | grep '^{' | tail -8
}

bench_offline() {
  for lens in "1000 1000" "200 200"; do
    set -- $lens
    log "bench offline 1000 x ($1 in / $2 out)"
    $BENCH offline --model-path $MODEL --load-format dummy --num-prompts 1000 \
      --random-input-len $1 --random-output-len $2 --output-json "$OUT/offline_1000_$1_$2.json" 2>&1 \
      | grep -E "duration|throughput|successful" | tail -8
  done
}

start_server() {  # $@: extra server flags
  python3 -m radixgen.runtime.server --model-path $MODEL --load-format dummy --port 30000 \
    --log-level warning "$@" >"$OUT/server_$$.log" 2>&1 &
  SERVER_PID=$!
  python3 - <<'PY'
import time, httpx
for _ in range(600):
    try:
        if httpx.get("http://127.0.0.1:30000/health", timeout=1).status_code == 200:
            break
    except Exception:
        pass
    time.sleep(0.5)
else:
    raise SystemExit("server did not become healthy")
PY
}

stop_server() { kill -INT $SERVER_PID; wait $SERVER_PID 2>/dev/null; }

bench_gsp() {
  for mode in cache nocache; do
    log "bench serving generated-shared-prefix (defaults), radix $mode"
    if [ $mode = cache ]; then start_server; else start_server --disable-radix-cache; fi
    $BENCH serving --base-url http://127.0.0.1:30000 --dataset generated-shared-prefix \
      --output-json "$OUT/serving_gsp_$mode.json" 2>&1 \
      | grep -E "duration|throughput|ttft|tpot|hit_rate|successful|failed" | tail -14
    stop_server
  done
}

bench_hf() {
  log "bench hf: transformers generate, bf16 sdpa, 128/256"
  $BENCH hf --model-path $MODEL --load-format dummy --batch-sizes 1 8 32 64 --input-len 128 \
    --output-len 256 --output-json "$OUT/hf_peer.json" 2>&1 | grep '^{' | tail -6
}

perf() {  # step breakdown before (perf_base.tar: the engine before the perf work) and after
  if [ -f perf_base.tar ] && [ -z "${PERF_SKIP_BEFORE:-}" ]; then
    mkdir -p /tmp/base && tar -xf perf_base.tar -C /tmp/base
    log "BEFORE: step breakdown 256 x 512/256"
    PYTHONPATH=/tmp/base:/tmp/site timeout ${STAGE_TIMEOUT:-330} python3 scripts/step_breakdown.py \
      --model-path $MODEL --load-format dummy --num-prompts 256 --input-len 512 --output-len 256 \
      2>&1 | grep -E '^\||wall|Error'
  fi
  for overlap in ${PERF_OVERLAP:-off on}; do
    log "AFTER: step breakdown 256 x 512/256, overlap $overlap"
    timeout ${STAGE_TIMEOUT:-330} python3 scripts/step_breakdown.py --model-path $MODEL \
      --load-format dummy --num-prompts 256 --input-len 512 --output-len 256 --overlap $overlap \
      $([ $overlap = on ] && echo --no-sync) 2>&1 | grep -E '^\||wall|Error'
  done
}

perf_after() { PERF_SKIP_BEFORE=1 perf; }

offline_200_before() {  # the engine before the perf work (perf_base.tar), its defaults
  mkdir -p /tmp/base && tar -xf perf_base.tar -C /tmp/base
  log "BEFORE: bench offline 1000 x (200 in / 200 out)"
  PYTHONPATH=/tmp/base:/tmp/site $BENCH offline --model-path $MODEL --load-format dummy \
    --num-prompts 1000 --random-input-len 200 --random-output-len 200 \
    --output-json "$OUT/offline_1000_200_200_before.json" 2>&1 \
    | grep -E "duration|total_token_throughput|output_token_throughput" | tail -3
}

offline_200() {  # $1: cuda_graph_max_bs
  log "bench offline 1000 x (200 in / 200 out), graphs to $1"
  $BENCH offline --model-path $MODEL --load-format dummy --num-prompts 1000 --cuda-graph-max-bs $1 \
    --random-input-len 200 --random-output-len 200 --output-json "$OUT/offline_1000_200_200_g$1.json" \
    2>&1 | grep -E "duration|total_token_throughput|output_token_throughput" | tail -3
}

fp8_tests() {
  log "pytest -m gpu: FP8 GEMM, FP8 KV attention, FP8 engine"
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_fp8_gemm.py \
    tests/test_kernels_fp8_kv_attention.py tests/test_quantization.py 2>&1 | tee "$OUT/fp8_gpu_tests.log" | tail -30
}

fp8_gemm() {  # $1: extra flags (--sweep)
  log "bench_fp8_gemm $*"
  timeout ${STAGE_TIMEOUT:-330} python3 scripts/bench_fp8_gemm.py --out "$OUT" "$@" 2>&1 | grep -v Warning | tail -40
}

fp8_offline() {  # $1: label; rest: flags. 1000 x (1000 in / 1000 out), Llama-3.1-8B shape.
  local label=$1; shift
  log "bench offline 1000 x (1000 in / 1000 out) $label: $*"
  timeout ${STAGE_TIMEOUT:-280} python3 -m radixgen.runtime.bench.cli offline --model-path $MODEL \
    --load-format dummy --num-prompts 1000 --random-input-len 1000 --random-output-len 1000 "$@" \
    --output-json "$OUT/offline_1000_1000_1000_$label.json" 2>&1 \
    | grep -E "duration|output_token_throughput|total_token_throughput|KV slots|Error" | tail -5
}

fp8_latency() {  # batch-1 decode ms/token (target <= 2.6 ms with FP8 weights), bf16 beside it
  for quant in bf16 fp8; do
    log "bench latency bs1/64 128/256, weights $quant"
    timeout ${STAGE_TIMEOUT:-280} python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
      --load-format dummy --batch-sizes 1 64 --input-len 128 --output-len 256 \
      $([ $quant = fp8 ] && echo --quantization fp8) \
      --output-json "$OUT/latency_$quant.json" 2>&1 | grep '^{' | tail -3
  done
}

tree() {  # issue 17: tree decode attention; GSP in-process with it on and off, no-sharing check
  log "tree attention: GPU tests, microbenchmark"
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_tree_attention.py \
    tests/test_engine_tree_attention.py tests/test_kernels_decode_attention.py \
    tests/test_kernels_runtime.py 2>&1 | tee "$OUT/tree_gpu_tests.log" | tail -15
  timeout ${STAGE_TIMEOUT:-330} python3 scripts/bench_tree_attention.py \
    --out "$OUT/bench_tree_attention.json" 2>&1 | tail -30
  for mode in tree notree; do
    log "bench offline generated-shared-prefix (defaults), $mode"
    $BENCH offline --model-path $MODEL --load-format dummy --dataset generated-shared-prefix \
      $([ $mode = tree ] && echo --enable-tree-attention || echo --disable-tree-attention) \
      --output-json "$OUT/offline_gsp_$mode.json" 2>&1 \
      | grep -E "duration|throughput|hit_rate|successful" | tail -8
    python3 -c "import json; s = json.load(open('$OUT/offline_gsp_$mode.json'))['engine_stats']; \
print('tree attention steps', s['num_tree_attention_steps'], 'of', s['num_forward_steps'])"
  done
  for flag in --enable-tree-attention --disable-tree-attention; do
    log "DSL prefix sharing (fork / run_batch), 64 branches x 256 tokens $flag"
    timeout ${STAGE_TIMEOUT:-330} python3 examples/prefix_sharing_benchmark.py --model-path $MODEL \
      --load-format dummy --batch-size 64 --max-tokens 256 $flag 2>&1 | grep '^|' \
      | tee "$OUT/dsl_prefix_sharing_${flag#--}.md"
  done
  log "bench offline 1000 x (200 in / 200 out), tree attention on (no sharing: plain kernel)"
  $BENCH offline --model-path $MODEL --load-format dummy --num-prompts 1000 \
    --random-input-len 200 --random-output-len 200 --output-json "$OUT/offline_1000_200_200_tree.json" \
    2>&1 | grep -E "duration|total_token_throughput|output_token_throughput" | tail -3
}

tools() {  # [10/14]: logit_bias on CUDA (torch and fused sampling paths), tool calling and the
  # OpenAI compatibility suite against a server on the GPU (tiny); results as JSON
  log "tools: logit_bias GPU test + OpenAI compatibility on CUDA"
  python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/test_sampler.py \
    tests/test_server_openai_compat.py tests/test_tool_parsers.py --junitxml="$OUT/tools.xml" \
    2>&1 | tee "$OUT/tools_tests.log" | tail -15
  python3 - "$OUT/tools.xml" "$OUT/tools_tests.json" <<'PY'
import json, sys, xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
rows = [{"test": f"{c.get('classname')}::{c.get('name')}", "time_s": float(c.get("time")),
         "outcome": "failed" if c.find("failure") is not None or c.find("error") is not None
         else "skipped" if c.find("skipped") is not None else "passed"} for c in cases]
json.dump(rows, open(sys.argv[2], "w"), indent=1)
print({o: sum(r["outcome"] == o for r in rows) for o in ("passed", "failed", "skipped")})
PY
}

int4_tests() {
  log "pytest -m gpu int4"
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_int4_gemm.py \
    tests/test_int4_checkpoint.py 2>&1 | tee "$OUT/int4_gpu_tests.log" | tail -30
}

int4_latency() {  # batch-1 / batch-64 decode (targets <= 1.8 ms/token; <= bf16 at 64)
  for quant in bf16 awq; do
    log "bench latency bs1/64 128/256, weights $quant"
    timeout ${STAGE_TIMEOUT:-280} python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
      --load-format dummy --batch-sizes 1 64 --input-len 128 --output-len 256 \
      $([ $quant = awq ] && echo --quantization awq) \
      --output-json "$OUT/latency_int4_$quant.json" 2>&1 | grep '^{' | tail -3
  done
}

setup
for stage in "$@"; do
  case "$stage" in
    setup) ;;
    gpu-tests) gpu_tests ;;
    latency) latency ;;
    offline) offline ;;
    bench-latency) bench_latency ;;
    bench-offline) bench_offline ;;
    bench-gsp) bench_gsp ;;
    bench-hf) bench_hf ;;
    perf) perf ;;
    tools) tools ;;
    perf-after) perf_after ;;
    offline-200-before) offline_200_before ;;
    offline-200-g256) offline_200 256 ;;
    offline-200-g1024) offline_200 1024 ;;
    fp8-tests) fp8_tests ;;
    fp8-gemm) fp8_gemm ;;
    fp8-gemm-sweep) fp8_gemm --sweep --tokens 1 64 256 ;;
    fp8-latency) fp8_latency ;;
    fp8-accuracy) timeout ${STAGE_TIMEOUT:-280} python3 scripts/fp8_accuracy.py --device cuda --out "$OUT" 2>&1 | grep -v Warning | tail -20 ;;
    fp8-offline-bf16) fp8_offline bf16 ;;
    fp8-offline-w8) fp8_offline fp8w --quantization fp8 ;;
    fp8-offline-kv8) fp8_offline fp8kv --kv-cache-dtype fp8_e4m3 ;;
    fp8-offline-w8kv8) fp8_offline fp8w_fp8kv --quantization fp8 --kv-cache-dtype fp8_e4m3 ;;
    fp8-offline-w8kv8-exact) fp8_offline fp8w_fp8kv_exact --quantization fp8 \
      --kv-cache-dtype fp8_e4m3 --disable-fp8-fast-accum ;;
    tree) tree ;;
    int4-tests) int4_tests ;;
    int4-gemm) timeout ${STAGE_TIMEOUT:-330} python3 scripts/bench_int4_gemm.py --out "$OUT" 2>&1 | grep -v Warning | tail -12 ;;
    int4-gemm-sweep) timeout ${STAGE_TIMEOUT:-330} python3 scripts/bench_int4_gemm.py --sweep --out "$OUT" 2>&1 | grep -v Warning | tail -12 ;;
    int4-latency) int4_latency ;;
    int4-accuracy) timeout ${STAGE_TIMEOUT:-280} python3 scripts/int4_accuracy.py --device cuda --out "$OUT" 2>&1 | grep -v Warning | tail -8 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
log "done"
