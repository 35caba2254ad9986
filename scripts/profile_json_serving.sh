#!/usr/bin/env bash
# GPU host: where the scheduler process spends a constrained decode step. Starts `radixgen
# serve` per grammar backend, runs `bench serving` random-ids then json-array twice (64
# concurrent), and samples the server's processes with py-spy (a static binary in .whl/)
# during the second pair. Output: TPOT JSON and py-spy raw stacks in $OUT.
set -uo pipefail
OUT=${OUT:-h200_out}
mkdir -p "$OUT"
MODEL=/tmp/llama-3.1-8b
python3 -m radixgen.runtime.bench.model_configs llama-3.1-8b $MODEL >/dev/null
chmod +x .whl/py-spy
bench() {
  timeout 200 python3 -m radixgen.runtime.bench.cli serving --base-url http://127.0.0.1:30000 \
    --dataset "$1" --num-prompts 256 --max-concurrency 64 --random-input-len 64 \
    --random-output-len 48 --json-array-items 24 --output-json "$2" 2>&1 | grep -E "tpot" | head -2
}
for backend in ${BACKENDS:-llguidance}; do
  python3 -m radixgen.runtime.server --model-path $MODEL --load-format dummy --port 30000 \
    --log-level warning --grammar-backend "$backend" ${SERVER_FLAGS:-} >"$OUT/server_$backend.log" 2>&1 &
  pid=$!
  python3 -c "
import os, sys, time, httpx
for _ in range(600):
    try:
        os.kill($pid, 0)
    except OSError:
        sys.exit('server exited')
    try:
        if httpx.get('http://127.0.0.1:30000/health', timeout=1).status_code == 200: break
    except Exception: pass
    time.sleep(0.5)
" || { tail -20 "$OUT/server_$backend.log"; exit 1; }
  bench random-ids "$OUT/${backend}_warm_random.json"
  bench json-array "$OUT/${backend}_warm_json.json"
  for dataset in random-ids json-array; do
    .whl/py-spy record --pid $pid --subprocesses --nonblocking --format raw -r 200 -d 12 \
      -o "$OUT/prof_${backend}_$dataset.txt" >"$OUT/pyspy_${backend}_$dataset.log" 2>&1 &
    spy=$!
    bench $dataset "$OUT/${backend}_$dataset.json"
    wait $spy
  done
  kill -INT $pid
  wait $pid 2>/dev/null
done
ls -la "$OUT"
