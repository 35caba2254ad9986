#!/usr/bin/env bash
# Before/after on the lent H200, in one lease: the same stages on a baseline tree, then on
# this tree. The baseline is a `git archive` of main's commit extracted into an ignored folder:
#   git archive --prefix=.base/ MAIN_SHA | tar -x        (and `/.base/` in .git/info/exclude)
# then, through the device tool with `carry: [".whl", ".base"]`:
#   bash scripts/ab_bench.sh .base STAGE...
# Stages: offline (1000 x 200/200), offline-long (1000 x 1000/1000), latency (batch 1, 128/256), latency-fp8 (FP8 weights, batch
# 1 and 64), gpu-tests (this tree only),
# jump-forward (this tree: the key-heavy json-keys dataset, jump-forward off vs on, at 1 and 64),
# serving-json (constrained vs unconstrained TPOT through `radixgen serve`, then time to first
# token with never-seen schemas), sampling-bench (this tree only: the fused sampling kernel),
# serving-fresh (a fresh server's first vs second `bench serving` run, 256 x 24/128; and
# serving-fresh-eager, the same with CUDA_MODULE_LOADING=EAGER; serving-fresh-gsp, the same on
# generated-shared-prefix's defaults),
# gsp-served / gsp-offline (generated-shared-prefix defaults through `radixgen serve` / the
# in-process Engine; mean TTFT from the served run), step64 (in-process decode steps at batch
# 64, device-synced: forward / sample / host ms per step), trace-path (per-process timestamps of
# 1-token requests: where the served time to first token goes). scripts/bench_lean.sh runs
# [7/14]'s set.
# JSON and logs go to $OUT (or ./h200_out), one file per tree and stage.
set -uo pipefail
BASE=$1
shift
OUT=${OUT:-h200_out}
mkdir -p "$OUT"
MODEL=/tmp/llama-3.1-8b
log() { echo "[$(date +%H:%M:%S)] $*"; }

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
# The serving benchmark's client always runs this tree's code (its datasets), whichever tree
# serves: a plain (non-editable) install of it, put first on the client's path.
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/client . >/dev/null 2>&1

use_tree() {  # $1: folder to install editable
  (cd "$1" && python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1) \
    || cat "$OUT/pip.log"
  python3 -m radixgen.runtime.bench.model_configs llama-3.1-8b $MODEL >/dev/null
}

bench() { timeout 400 python3 -m radixgen.runtime.bench.cli "$@" 2>&1 | grep -v Warning; }

wait_healthy() {  # $1: server pid; fails when it exits first
  python3 -c "
import os, sys, time, httpx
for _ in range(1200):
    try:
        os.kill($1, 0)
    except OSError:
        sys.exit('server exited')
    try:
        if httpx.get('http://127.0.0.1:30000/health', timeout=1).status_code == 200: break
    except Exception: pass
    time.sleep(0.5)
"
}

stage_offline() {  # $1: tree name
  log "$1: bench offline 1000 x 200/200"
  bench offline --model-path $MODEL --load-format dummy --num-prompts 1000 \
    --random-input-len 200 --random-output-len 200 --output-json "$OUT/$1_offline.json" \
    | grep -E "duration|throughput" | tail -4
}

stage_offline_long() {  # [7/14]'s other no-regression workload (and [8/14]'s bf16 row)
  log "$1: bench offline 1000 x 1000/1000"
  bench offline --model-path $MODEL --load-format dummy --num-prompts 1000 \
    --random-input-len 1000 --random-output-len 1000 --output-json "$OUT/$1_offline_long.json" \
    | grep -E "duration|throughput" | tail -4
}

stage_latency() {
  log "$1: bench latency batch 1, 128/256"
  bench latency --model-path $MODEL --load-format dummy --batch-sizes 1 --input-len 128 \
    --output-len 256 --output-json "$OUT/$1_latency.json" | grep '^{' | tail -2
}

stage_latency_fp8() {  # [8/14]: FP8 weights, batch 1 and 64 (the launches per layer)
  log "$1: bench latency --quantization fp8, batch 1 and 64, 128/256"
  bench latency --model-path $MODEL --load-format dummy --batch-sizes 1 64 --input-len 128 \
    --output-len 256 --quantization fp8 --output-json "$OUT/$1_latency_fp8.json" | grep '^{' | tail -3
}

stage_gpu_tests() {
  [ "$1" = new ] || return 0
  log "$1: pytest -m gpu"
  python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -8
}

stage_serving_json_outlines() {  # this tree with the outlines grammar backend
  [ "$1" = new ] || return 0
  stage_serving_json new-outlines --grammar-backend outlines
}

stage_serving_json_new() {  # this tree only, with $NEW_SERVER_FLAGS
  [ "$1" = new ] || return 0
  stage_serving_json new ${NEW_SERVER_FLAGS:-}
}

stage_serving_json() {  # $1: name; more: server flags
  local name=$1
  shift
  set -- "$name" "$@"
  log "$1: serving, json vs random-ids at 64 concurrent, ${REPEATS:-2} alternating pairs"
  start_server "$1" "${@:2}" || return 1
  # One serving run is a few seconds and TPOT moves ~10% between runs of one server: the
  # ratio is taken per pair (random-ids then json-array), and its median over the pairs.
  local pair dataset
  for pair in $(seq 1 "${REPEATS:-2}"); do
    for dataset in random-ids json-array; do
      PYTHONPATH=/tmp/client:$PYTHONPATH bench serving --base-url http://127.0.0.1:30000 \
        --dataset $dataset --num-prompts "${NUM_PROMPTS:-256}" --max-concurrency 64 \
        --random-input-len 64 --random-output-len 48 --json-array-items 24 \
        --output-json "$OUT/$1_serving_${dataset}_p$pair.json" | grep -E "median_tpot" | tail -1
    done
  done
  python3 - "$OUT" "$1" <<'PY' | tee "$OUT/$1_serving_ratio.json"
import json, pathlib, statistics, sys
out, name = pathlib.Path(sys.argv[1]), sys.argv[2]
def tpot(dataset, pair):
    data = json.loads((out / f"{name}_serving_{dataset}_p{pair}.json").read_text())
    return data.get("results", [data])[0]["median_tpot_ms"]
pairs = sorted(int(p.stem.rsplit("_p", 1)[1]) for p in out.glob(f"{name}_serving_json-array_p*.json"))
ratios = [tpot("json-array", p) / tpot("random-ids", p) for p in pairs]
print(json.dumps({"pairs": len(ratios), "tpot_ratio_per_pair": ratios,
                  "tpot_ratio_median": statistics.median(ratios)}))
PY
  log "$1: time to first token, never-seen schemas vs unconstrained"
  PYTHONPATH=/tmp/client:$PYTHONPATH timeout 150 python3 scripts/bench_schema_ttft.py \
    --num 10 | tee "$OUT/$1_schema_ttft.json"
  stop_server
}

SERVER_PID=
start_server() {  # $1: log name; more: server flags. Returns once /health answers 200.
  python3 -m radixgen.runtime.server --model-path $MODEL --load-format dummy --port 30000 \
    --log-level warning "${@:2}" >"$OUT/$1_server.log" 2>&1 &
  SERVER_PID=$!
  local start=$SECONDS
  wait_healthy $SERVER_PID || { tail -5 "$OUT/$1_server.log"; return 1; }
  log "$1: server healthy after $((SECONDS - start)) s"
  echo "{\"startup_to_healthy_s\": $((SECONDS - start))}" >"$OUT/$1_startup.json"
}

stop_server() {
  kill -INT $SERVER_PID
  wait $SERVER_PID 2>/dev/null
}

serve_bench() {  # the client runs this tree's code whichever tree serves
  PYTHONPATH=/tmp/client:$PYTHONPATH bench serving --base-url http://127.0.0.1:30000 "$@"
}

triton_kernels() {  # the kernel variants in a Triton cache dir, one line each
  find "$1" -name '*.json' ! -name '__grp__*' 2>/dev/null | sort
}
fresh_server_runs() {  # $1 tree, $2 name, $3 label; the rest: `bench serving` workload args
  # Its own empty Triton cache: what compiles after /health turns 200 (i.e. inside a run,
  # missed by the warm-up) is listed per run in $1_$2_compiled_<run>.txt.
  local tree=$1 name=$2 label=$3
  shift 3
  local cache=/tmp/triton_fresh_${tree}_$name
  rm -rf "$cache"
  TRITON_CACHE_DIR=$cache start_server "${tree}_$name"
  triton_kernels "$cache" >/tmp/fresh_kernels_before
  # A run with fresh prompts (seed 1) after the two of the issue: the second run's prompts
  # are the first's, so it also hits the radix cache.
  for run in first second fresh-prompts; do
    local seed=0
    [ $run = fresh-prompts ] && seed=1
    log "$tree: fresh server, $run run of $label (seed $seed)"
    serve_bench "$@" --seed $seed --output-json "$OUT/${tree}_${name}_$run.json" \
      | grep -E "duration|mean_ttft" | tail -2
    triton_kernels "$cache" >/tmp/fresh_kernels_after
    # Per new variant: its name, warps, and the signature line of its TTIR (the arguments'
    # specialisations: divisibility, constants), which says why it compiled again.
    comm -13 /tmp/fresh_kernels_before /tmp/fresh_kernels_after | while read -r meta; do
      echo "$(basename "$meta" .json) $(grep -o '"num_warps": [0-9]*' "$meta")"
      grep -m1 'tt.func' "${meta%.json}.ttir" 2>/dev/null | cut -c1-1500
    done >"$OUT/${tree}_${name}_compiled_$run.txt"
    log "$tree: $(grep -c num_warps "$OUT/${tree}_${name}_compiled_$run.txt") kernel variants compiled in the $run run"
    cp /tmp/fresh_kernels_after /tmp/fresh_kernels_before
  done
  stop_server
}

stage_serving_fresh() {  # a fresh server: first vs second run of the same workload
  fresh_server_runs "$1" fresh "256 x 24/128" --dataset random-ids --num-prompts 256 \
    --random-input-len 24 --random-output-len 128
}

stage_serving_fresh_gsp() {  # the same for generated-shared-prefix's defaults: the twelfth
  # session's first in-process run on a fresh machine took 23.36 s against 19.17 / 19.35 s
  fresh_server_runs "$1" fresh_gsp "generated-shared-prefix" --dataset generated-shared-prefix
}

stage_gsp_served() {  # generated-shared-prefix defaults (1024 x 2048+128/256) through HTTP
  start_server "$1_gsp"
  # A short untimed run first, as `bench offline` does, so both sides are warm.
  serve_bench --dataset random-ids --num-prompts 16 --random-input-len 64 \
    --random-output-len 8 >/dev/null
  log "$1: generated-shared-prefix defaults, served"
  serve_bench --dataset generated-shared-prefix --output-json "$OUT/$1_gsp_served.json" \
    | grep -E "^(duration|mean_ttft|output_token_throughput|last_|server_[a-z_]*time)" | tail -9
  # The scheduler's counters (forward steps, prefill tokens computed) beside the in-process
  # run's `engine_stats`: does the served run schedule differently, or only pay around it?
  python3 -c "import httpx; print(httpx.get('http://127.0.0.1:30000/get_server_info').text)" \
    >"$OUT/$1_gsp_server_info.json"
  stop_server
}

stage_gsp_served_nocache() {  # [6/14]'s ratio: the same workload with the radix cache off
  start_server "$1_gsp_nocache" --disable-radix-cache || return 1
  serve_bench --dataset random-ids --num-prompts 16 --random-input-len 64 \
    --random-output-len 8 >/dev/null
  log "$1: generated-shared-prefix defaults, served, radix cache off"
  serve_bench --dataset generated-shared-prefix --output-json "$OUT/$1_gsp_served_nocache.json" \
    | grep -E "^(duration|mean_ttft|output_token_throughput)" | tail -3
  stop_server
}

stage_gsp_offline() {
  log "$1: generated-shared-prefix defaults, in-process"
  bench offline --model-path $MODEL --load-format dummy --dataset generated-shared-prefix \
    --output-json "$OUT/$1_gsp_offline.json" | grep -E "duration|output_token_throughput" | tail -2
}

stage_jump_forward() {  # this tree only: the json dataset with jump-forward off, then on
  [ "$1" = new ] || return 0
  local flags name
  # (on by default with llguidance since session 3: off is the explicit flag)
  for flags in "--disable-jump-forward" "--enable-jump-forward"; do  # the key-heavy json-keys
    name=jf$([ "$flags" = --enable-jump-forward ] && echo _on || echo _off)
    start_server "$name" $flags || return 1
    for conc in 1 64; do
      log "$name: json-keys at concurrency $conc"
      serve_bench --dataset json-keys --num-prompts $((conc == 1 ? 16 : 256)) --max-concurrency $conc \
        --output-json "$OUT/${name}_c$conc.json" | grep -E "output_token_throughput|tpot" | head -2
    done
    stop_server
  done
}

stage_gpu_sampling() {  # the fused sampling kernel's GPU tests only
  [ "$1" = new ] || return 0
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_fused_sampling.py \
    tests/test_sampler.py 2>&1 | tail -4
}

stage_step64() {  # in-process decode at batch 64 (64 x 64/48), device-synced: GPU vs host ms
  log "$1: step breakdown, 64 x 64/48 in-process"
  timeout 300 python3 scripts/step_breakdown.py --model-path $MODEL --load-format dummy \
    --num-prompts 64 --input-len 64 --output-len 48 2>&1 | grep -E '^\||wall' \
    | tee "$OUT/$1_step64.txt"
}

stage_serving_fresh_eager() {  # the same first vs second run, CUDA modules loaded eagerly
  # CUDA loads each kernel's module lazily, on its first launch (cuBLAS's too): if the fresh
  # server's first run is slow for that, this server's first run is not (its start-up is).
  CUDA_MODULE_LOADING=EAGER start_server "$1_fresh_eager"
  for run in first second; do
    log "$1: fresh server (eager module loading), $run run of 256 x 24/128"
    serve_bench --dataset random-ids --num-prompts 256 --random-input-len 24 \
      --random-output-len 128 --output-json "$OUT/$1_fresh_eager_$run.json" \
      | grep -E "duration|mean_ttft" | tail -2
  done
  stop_server
}

stage_trace_path() {  # where a 1-token request's time goes inside the server (per process)
  log "$1: request path trace (after 256 random-ids), 1-token plain vs never-seen schema"
  timeout 400 python3 scripts/trace_request_path.py \
    --model-path $MODEL --preload 256 --num 10 --output-json "$OUT/$1_trace_path.json" \
    -- --load-format dummy 2>&1 | grep -v "requests:" | tail -40
}

stage_sampling_bench() {
  [ "$1" = new ] || return 0
  log "$1: fused sampling kernel vs the torch path"
  timeout 200 python3 -m radixgen.runtime.bench.sampling ${SAMPLING_BENCH_FLAGS:-} 2>&1 | tee "$OUT/sampling_bench.txt" | tail -40
}

for tree in ${TREES:-base new}; do  # TREES=new: this tree only
  dir=$([ $tree = base ] && echo "$BASE" || echo .)
  use_tree "$dir"
  for stage in "$@"; do
    "stage_${stage//-/_}" $tree
  done
done

# At most 8 files come back from the device: one summary of every JSON, the rest in one archive.
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
keys = ("duration_s", "total_output_tokens", "median_tpot_ms", "mean_tpot_ms", "p99_tpot_ms",
        "median_ttft_ms", "mean_ttft_ms", "mean_e2e_latency_ms", "startup_to_healthy_s",
        "output_token_throughput", "extra_ms_median", "new_schema_ms_median",
        "unconstrained_ms_median", "decode_ms_per_step_median",
        "decode_ms_per_step_overlapped_median", "prefill_ms",
        "tpot_ratio_median", "tpot_ratio_per_pair")
summary = {}
for path in sorted(out.glob("*.json")):
    text = path.read_text().strip()
    try:
        data = json.loads(text)
    except ValueError:  # a log with the JSON on its last line
        try:
            data = json.loads(text.splitlines()[-1])
        except (ValueError, IndexError):
            continue
    if isinstance(data, dict) and "results" in data:
        data = data["results"][0]
    summary[path.stem] = {k: data[k] for k in keys if isinstance(data, dict) and k in data}
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
PY
tar -czf "$OUT/raw.tgz" -C "$OUT" $(cd "$OUT" && ls | grep -v -e summary.json -e raw.tgz) 2>/dev/null
(cd "$OUT" && ls | grep -v -e summary.json -e raw.tgz -e ab.log -e gpu_tests.log | xargs -r rm -f)
