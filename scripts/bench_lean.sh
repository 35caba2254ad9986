#!/usr/bin/env bash
# [7/14] (a lean serving path, warm start, batch-1 decode) on the lent H200: baseline vs this
# tree in one lease, through scripts/ab_bench.sh. Prepare the baseline as ab_bench.sh says
# (`git archive --prefix=.base/ MAIN_SHA | tar -x`), then through the device tool, with
# `carry: [".whl", ".base"]`:
#   bash scripts/bench_lean.sh .base
# Stages, for base then this tree:
#   serving-fresh  a fresh server's first vs second `bench serving` run (256 x 24/128), and the
#                  seconds from launch to a healthy /health (warm-up now happens before it);
#   gsp-served     generated-shared-prefix defaults through `radixgen serve` (mean TTFT);
#   gsp-offline    the same workload in-process (`bench offline`);
#   latency        `bench latency` batch 1, 128 in / 256 out (ms per decode step);
#   gpu-tests      this tree's `pytest -m gpu` (the fused add + RMSNorm kernel and the rest).
# $OUT gets summary.json (every stage's headline numbers, per tree) and raw.tgz.
set -uo pipefail
BASE=${1:?usage: bash scripts/bench_lean.sh BASE_TREE [STAGE...]}
shift
STAGES=("$@")
[ ${#STAGES[@]} -gt 0 ] || STAGES=(serving-fresh gsp-served gsp-offline latency gpu-tests)
exec bash "$(dirname "$0")/ab_bench.sh" "$BASE" "${STAGES[@]}"
