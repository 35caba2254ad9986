#!/usr/bin/env bash
# Cluster-wide prefix-cache hit rate of 2 data-parallel replicas (tiny, CPU) behind the
# router, cache-aware vs round-robin, on a scaled-down generated-shared-prefix workload.
# Usage: bash scripts/bench_router_cache_hit.sh   (JSON per policy in $OUT, default ./router_out)
#   NUM_GROUPS=32 SERVE_EXTRA="--max-total-tokens 12000" bash scripts/bench_router_cache_hit.sh
#   (cache pressure: the groups' prefixes fit in one replica's KV only when split between them)
# Hit rate = client_cached_tokens / total_input_tokens of `radixgen bench serving`.
set -euo pipefail
OUT=${OUT:-router_out}; mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}
PORT=${PORT:-31000}
NUM_GROUPS=${NUM_GROUPS:-16}
SERVE_EXTRA=${SERVE_EXTRA:-}
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
for policy in cache_aware round_robin; do
  $PY -m radixgen.runtime.cli serve --model-path tiny --device cpu --dtype float32 \
    --dp-size 2 --routing-policy "$policy" --port "$PORT" --log-level warning $SERVE_EXTRA &
  server=$!
  until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do sleep 0.5; done
  # Both replicas healthy (the front end answers /health at the first).
  until [ "$(curl -s "http://127.0.0.1:$PORT/workers" | grep -o '"healthy":true' | wc -l)" = 2 ]; do
    sleep 0.5
  done
  $PY -m radixgen.runtime.cli bench serving --port "$PORT" --dataset generated-shared-prefix \
    --gsp-num-groups "$NUM_GROUPS" --gsp-prompts-per-group 8 --gsp-system-prompt-len 512 \
    --gsp-question-len 32 --gsp-output-len 4 --num-prompts $((NUM_GROUPS * 8)) --max-concurrency 4 \
    --output-json "$OUT/$policy.json" >"$OUT/$policy.log" 2>&1
  kill -TERM "$server"; wait "$server" || true
  $PY - "$OUT/$policy.json" "$policy" <<'PYEOF'
import json, sys
summary = json.load(open(sys.argv[1]))
summary = summary.get("summary", summary)
rate = summary["client_cached_tokens"] / summary["total_input_tokens"]
print(f"{sys.argv[2]}: cluster cache hit rate {rate:.1%} "
      f"({summary['client_cached_tokens']} / {summary['total_input_tokens']} prompt tokens), "
      f"{summary['successful_requests']} ok, {summary['failed_requests']} failed, "
      f"{summary['duration_s']:.1f} s")
PYEOF
done
