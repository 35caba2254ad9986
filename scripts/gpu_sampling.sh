#!/usr/bin/env bash
# The fused sampling kernels on the H200 ([4/14] item 4), about 2 minutes on one GPU (most of it
# Triton compiles on a fresh machine: ~45 kernel variants), through the
# device tool with `carry: [".whl"]`:   bash scripts/gpu_sampling.sh
#   1. GPU tests: bf16/fp32 logits at a 128,256 vocabulary, every batch kind, and the runtime
#      Sampler (kernel vs torch);
#   2. `bench.sampling --quick`: batch 64 x 128,256, seven batch kinds, torch path vs fused;
#      with SWEEP=1 also the tuning sweep (about one more minute).
# Writes $OUT/sampling_gpu_tests.log, $OUT/sampling_bench.txt and $OUT/sampling_bench.json.
set -uo pipefail
OUT=${OUT:-h200_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || cat "$OUT/pip.log"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_fused_sampling.py \
  tests/test_sampler.py 2>&1 | tee "$OUT/sampling_gpu_tests.log" | tail -15
timeout 200 python3 -m radixgen.runtime.bench.sampling --quick --json "$OUT/sampling_bench.json" \
  $([ "${SWEEP:-0}" = 1 ] && echo --sweep) 2>&1 | tee "$OUT/sampling_bench.txt"
