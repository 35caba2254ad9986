#!/usr/bin/env bash
# The H200 runs by stage (about 2-5 minutes each; a lease runs the first few). The seventeenth
# session (2026-12-02/03) ran int4-sweep (batch 128 12.99 -> 10.98 ms), gather (the FP8 pool's
# 128-byte rows gather at ~4.2 TB/s: not its limit), pdl (programmatic dependent launch: batch 1
# overlapped bf16 4.58 -> 4.53, FP8 3.22 -> 3.09, int4 3.19 -> 3.08 ms), fp8-swap (FP8 batch 1
# 3.43 -> 3.23 ms synced) and gemv-pdl (bf16 batch 1 4.92 -> 4.73 ms); docs/benchmarks.md.
# The eighteenth session (2026-12-03) ran gpu-tests (121 passed with PDL), gated (slower: left
# off), fp8-gemv (packed table: FP8 batch 1 3.17 -> 2.94 ms), int4-gemv (int4 batch 1 3.55 ->
# 3.12 ms), int4-pdl (noise) and fp8-l2 (3.32 -> 3.18 ms). Still pending: int4-sweep,
# fp8-kv-attn, gemv-gated, fp8-rows, fresh-gsp, an A/B of `a16` FP8 rows in the step.
# The nineteenth session (2026-12-03) ran fp8-a16 (W8A16 GEMV launches in packed fp16: o and
# down rows installed, 2.87 -> 2.86 ms), int4-sweep (chunk_dot: int4 batch 64 7.50 -> 6.39 ms),
# silu-out (installed: batch 1 overlapped bf16 4.28 -> 4.18, FP8 2.73 -> 2.68, int4 2.86 ->
# 2.83), add-norm (no faster: left off), rotary-split (-0.09 ms) and bs64 (int4 / bf16 1.018x).
# The twentieth session (2026-12-03) ran int4-gemm (prefetch_words + silu_out GEMM rows: int4
# batch 64 6.13 -> 5.58 ms overlapped, bf16 5.63), rope-store (slower: left off), gpu-tests
# (126 passed) and bs64-repeat (int4 / bf16 0.954x synced, 0.991x overlapped).
# The twenty-first session (2026-12-03) ran decode-prefetch (batch 1 bf16 4.405 / 4.120 ->
# 4.271 / 4.081, FP8 3.064 / 2.633 -> 2.989 / 2.598, int4 3.103 / 2.818 -> 3.039 / 2.797 ms;
# prefetch_kv left off), host-profile, fp8-kv-attn (32 / 2 warps / 5 stages the FP8 pool's
# default: 199.2 -> 183.9 us at 256 x 1024) and final21 (7 GPU tests passed; FP8 offline
# ratio 1.482x). Its extended 2-warp sweep (fp8-2warp) did not run (four refused starts).
# The twenty-second session (2026-12-03) ran ncu-decode (Nsight Compute: the FP8 pool's 2-warp
# launch issue-bound, DRAM 59% busy; bf16's 87%), fast-accum (FP8 offline 74.58 -> 71.51 s),
# the fp8-kv sweep again (one-warp programs 184.0 -> 164.9 us at 256 x 1024) and one-warp
# (FP8 offline 72.57 -> 67.37 s; bf16 112.51 s: 1.670x). Still pending: no-regress and
# no-regress-long ([7/14], `.base` = fac3fba^), fp8-rows, fresh-gsp, gemv-gated, int4 16 / 32.
# The twenty-third session (2026-12-03) ran hopper-extend three times (the Gluon extend kernel:
# 1.09 / 1.01 / 1.01 / 0.98x SDPA at 1k-8k in graph replay; ping-pong and the cp.async prefix
# gather slower, left out) and gluon-offline (110.83 -> 111.10 s). Still pending: no-regress,
# no-regress-long, a fresh server's first run with the prefix-free warm-up round (fresh-gsp),
# gpu-tests with the Gluon kernel the default.
# The twenty-fourth session (2026-12-03) ran hopper-extend three times (the persistent grid:
# round robin, then zigzag, the default: 1.12 / 1.03 / 1.00 / 0.96x SDPA, 8 x 1k 0.84x; the
# ping-pong on it slower, removed), no-regress (12.37 -> 12.25 s; batch 1 4.386 / 4.136 ms) and
# no-regress-long (114.00 -> 114.75 s), both against `.base` = fac3fba^. Still pending: fresh-gsp
# and gpu-tests with the persistent Gluon kernel the default (its own GPU tests passed), and
# hopper-extend once more: the ping-pong on hardware named barriers (`pingpong=True`, built
# after the last call; its GPU test checks the bits against the plain launch; the table's
# `pp` columns) for the 8k row (0.96x SDPA).
# The twenty-fifth session (2026-12-03) had no device time left (207 s, too little to start a
# machine): hopper-extend now tries the ping-pong alone first under a 60 s timeout and leaves
# its launches out of the tests and the table where that hangs or fails. Next, in two calls
# (each under 600 s): hopper-extend fresh-gsp, then gpu-tests.
# Was pending before it: decode-prefetch (built after the twentieth session's last call: the rotary
# and decode attention kernels read positions / slots / cos / sin and lengths / rows before
# their PDL wait, and decode attention's `prefetch_kv` asks L2 for the first tile before it;
# `bench_kernels.py --split-sweep` has prefetch rows; then bench latency batch 1 in bf16, FP8,
# int4 against `.base` = 62b4893, and `prefetch_kv` the default if it wins), no-regress against
# the tree before PDL ([7/14]'s "no regression on bench
# offline": `.base` = fac3fba^, `no-regress` = latency + offline 1000 x 200/200; fp8-rows has
# bf16's 1000 x 1000/1000), fp8-kv-attn, fp8-rows, fresh-gsp, gemv-gated (bench_gemv now also
# sweeps the gate | up projection's silu_out launches against F.linear + the activation
# kernel), and int4 at 16 / 32 tokens: a longer sweep (the twentieth session's 45 s one only
# installed gate_up at 32 tokens), then `mark_fusion_rows.py silu_out --int4-buckets 16 32` in
# a bench latency A/B at batch 16 / 32.
# Pending after it, in order (one `.base` serves the two A/Bs: `git archive --prefix=.base/
# c1441b9 | tar -x`, stripped of docs/, tests/ and runtime/tiny_assets/*.safetensors; between
# it and the tree the FP8 path changed only by the L2 prefetch and the int4 GEMMs only by PDL):
#   gpu-tests    the whole GPU suite with PDL on (only the kernels' GPU tests ran with it), and
#                the packed GEMVs' first GPU tests
#   gated        [7/14] / [9/14] batch 1 bf16 and int4: the MLP's activation inside the down
#                projection's GEMV (built after the last call; opt-in per table row): bench
#                latency with the shipped tables, then with the down rows marked `gated`
#   gemv-gated   [7/14] batch 1 bf16: the GEMV table re-swept with the down projection's gated
#                launches (against the activation kernel + the best plain launch), installed,
#                bench latency before / after
#   fp8-l2       [8/14] batch 1: the FP8 GEMM's first weight rows prefetched to L2 before its PDL
#                wait (built after the last call): bench latency --quantization fp8, `.base` vs
#                this tree
#   int4-pdl     [9/14] batch 64: PDL in the int4 GEMMs (built after the last call): bench
#                latency --quantization awq at 64, `.base` vs this tree
#   fp8-gemv     [8/14] the FP8 GEMV (now with PDL, in packed fp16 arithmetic, and W8A16 `a16`
#                launches that take the bf16 activations unquantized, so the SiLU and o_proj
#                quantization passes go at batch 1: built after the last call, GPU tests in
#                the stage) against the swapped skinny GEMM at batch 1 (`bench_gemv.py --sweep
#                --fp8`), its table, bench latency --quantization fp8 (after fp8-l2: it
#                installs a table)
#   int4-gemv    [9/14] the int4 GEMV's batch-1 rows re-swept with PDL and the packed fp16 GEMV
#                (`packed_f16`, built after the last call; its GPU tests first;
#                `bench_int4_gemm.py --tokens 1 --sweep`), bench latency --quantization awq
#                before / after (after int4-pdl)
#   int4-sweep   [9/14] batch 64: again, now with the nibble GEMM's `chunk_dot` launches first
#                (the chunk's 8 packed tiles in one dot: no wait between nibbles; built after the
#                last call, interpreter-tested, GPU test in test_kernels_int4_gemm.py)
#   fp8-kv-attn  [8/14] the FP8 pool's decode attention with byte loads at 16-32-position tiles
#                and deeper pipelines (`bench_kernels.py --fp8-kv-sweep`; the gather alone reads
#                128-byte rows fastest at 16 / 4 warps / 5 stages)
#   fp8-rows     FP8 weights only (1.253x in the fourteenth session) and FP8 KV only, offline
#                1000 x 1000/1000, with bf16 in the same lease
#   fresh-gsp    [7/14] item 2 on generated-shared-prefix
# `bench latency` now prints the synced step's host part (`host ms/step`; phases in its JSON).
# Through the device tool with
# `carry: [".whl"]` (and ".base" where a stage says); JSON and logs go to $OUT.
#   gpu-tests   every GPU test (`pytest -m gpu`; 112 passed at 8cd9a13 in the eleventh session)
#   decode-merge [7/14] item 4: bench latency batch 1, 128/256, `.base` = d6999be (main before
#               only the used splits arrived at the in-kernel merge's counter) vs this tree
#   fp8         [8/14] offline 1000 x 1000/1000, bf16 then FP8 weights + FP8 KV (fifth session:
#               1.21x, target 1.6x), now with the FP8 pool's fp16 dots
#               (decode attention 10.7 -> 8.3 ms a step at batch 256 in the seventh session)
#   fp8-kv-attn [8/14] bench_kernels.py --fp8-kv-sweep: the FP8 pool's decode attention with
#               its registers capped (`max_registers` 128, more stages); the default launch
#               takes 168 registers (3 programs an SM against 5 over a bf16 pool) and reads at
#               ~2.3 TB/s against ~4.1. If a capped launch wins, make it the FP8 default
#               (`default_decode_blocks`), then `fp8` (offline 1000 x 1000/1000: 1.38x, 1.6x)
#   fp8-kv-ab   [8/14] the FP8 step at batch 256 profiled, `.base` (c4b5ba5 in the seventh
#               session; `git archive --prefix=.base/ REV | tar -x`, stripped of docs/, tests/
#               and runtime/tiny_assets/*.safetensors) vs this tree
#   fp8-gemv    [8/14] the FP8 split-K GEMV swept against the skinny GEMM at batch 1, its
#               table installed, bench latency --quantization fp8 batch 1 before and after
#   fp8-rows    [8/14] offline 1000 x 1000/1000 with FP8 weights only and FP8 KV only
#   tree-sweep  [6/14] scripts/bench_tree_attention.py with its launch sweep and each case in a
#               CUDA-graph-capacity plan ("padded us", as serving runs it) (ninth session:
#               2.56x at the defaults, 2.77x at 3 stages; now with each pass's kernel time)
#   tree-gsp    [6/14] generated-shared-prefix in-process, tree attention off / on alternating,
#               and a profile of one decode step of that batch with and without it
#   tree-suffix [6/14] bench_tree_attention.py --suffix-sweep: the suffix pass's (block_n, warps,
#               stages) at 16 x 16 and 64 x 16 sharing 2048 + 256; the best goes into
#               tree_decode_attention's suffix defaults
#   fresh-gsp   [7/14] item 2 on generated-shared-prefix: a fresh server (empty Triton cache),
#               first / second / fresh-prompts runs, the kernel variants each compiled
#   gsp-steps   [6/14] scripts/profile_step_times.py on generated-shared-prefix (tree on): each
#               scheduler step timed (prefill, decode), the slowest listed, cProfile of 10 decode
#               steps at batch 1024
#   tree-noshare [6/14] offline 1000 x 200/200 with tree attention off / on alternating (the
#               default flip needs no regression where nothing is shared)
#   int4-profile [9/14] the batch-1 int4 step's kernels (4.27 ms a step, GEMVs alone 2.29 ms)
#   lean        [7/14] item 1: generated-shared-prefix in-process, served, twice (eighth
#               session: 1.115x with the client starting each request before building the
#               next; target 1.10x). The served JSON has the scheduler loop's time during the
#               run (`server_step_time_s`, `server_idle_time_s`, ...) beside `engine_stats`.
#   no-regress, gemv-why, gemv-ab, lora, fp8-table, fresh: done (sixth and
#               seventh sessions, docs/benchmarks.md), kept for re-runs; gemv, int4, fp8-bs1
#               in the fifth; spec and constrained in the fourth.
# Usage: bash scripts/h200_pending.sh STAGE...
set -uo pipefail
OUT=${OUT:-h200_out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site
bash scripts/h200.sh setup >/dev/null 2>&1
MODEL=/tmp/llama-3.1-8b

latency_summary() {  # $1: a glob of bench latency JSONs: each file's step and greedy digest
  python3 - "$1" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1])):
    row = json.load(open(path))["results"][0]
    keys = ("decode_ms_per_step_median", "decode_ms_per_step_overlapped_median",
            "greedy_tokens_digest")
    print(path.split("/")[-1], {k: round(row[k], 3) if isinstance(row[k], float) else row[k]
                                for k in keys})
PY
}

latency_run() {  # $1: bf16 | fp8 | awq, $2: batch size, $3: output JSON. This tree's bench
  # latency (128 in / 256 out), its summary line printed.
  local flags=""
  [ "$1" != bf16 ] && flags="--quantization $1"
  timeout 150 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
    --load-format dummy --batch-sizes "$2" --input-len 128 --output-len 256 $flags \
    --output-json "$3" 2>&1 | tail -1
}

ab_latency() {  # $1: folder under $OUT; the rest: bench latency flags. `.base`, then this tree.
  mkdir -p "$OUT/$1"
  local tree name
  for tree in .base .; do
    name=$([ "$tree" = . ] && echo tree || echo base)
    (cd "$tree" && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1)
    timeout 150 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
      --load-format dummy --input-len 128 --output-len 256 "${@:2}" \
      --output-json "$OUT/$1/latency_$name.json" 2>&1 | tail -2
  done
}

fusion_ab() {  # $1: folder under $OUT, $2: a mark_fusion_rows.py fusion. Bench latency batch
  # 1 in bf16, FP8 weights and int4 with the shipped tables, then with that fusion's rows
  # marked; the tables restored.
  local dir="$OUT/$1" name quant
  mkdir -p "$dir"
  cp kernels/gemv_configs.json kernels/gemv_fp8_configs.json kernels/int4_gemm_configs.json \
    "$dir/"
  for name in before after; do
    [ "$name" = after ] && python3 scripts/mark_fusion_rows.py "$2"
    for quant in bf16 fp8 awq; do
      latency_run "$quant" 1 "$dir/latency_${quant}_$name.json"
    done
  done
  cp "$dir/gemv_configs.json" "$dir/gemv_fp8_configs.json" "$dir/int4_gemm_configs.json" \
    kernels/
  latency_summary "$dir/latency_*.json"
}

for stage in "$@"; do
  case "$stage" in
    dsl-tree)
      # ~480 shared tokens (24 few-shot examples) and ~2.5k (128), tree attention off then on
      mkdir -p "$OUT/dsl_tree"
      for examples in 24 128; do
        for flag in --disable-tree-attention --enable-tree-attention; do
          echo "prefix_sharing_benchmark.py, 64 branches x 256 tokens, $examples examples, $flag"
          timeout 150 python3 examples/prefix_sharing_benchmark.py --model-path $MODEL \
            --load-format dummy --batch-size 64 --max-tokens 256 --shared-examples $examples \
            $flag 2>&1 | grep '^|\|^shared' | tee -a "$OUT/dsl_tree/prefix_sharing_${examples}${flag#--}.md"
        done
      done ;;
    bs1-profile)
      # [7/14] / [8/14] / [9/14] batch 1: the decode step's kernels in bf16, FP8 and int4 (AWQ)
      mkdir -p "$OUT/bs1_profile"
      for quant in "" "--quantization fp8" "--quantization awq"; do
        echo "profile_decode_step.py batch 1 $quant"
        timeout 200 python3 scripts/profile_decode_step.py --model-path $MODEL --load-format dummy \
          --steps 64 $quant --out "$OUT/bs1_profile" 2>&1 | grep -v -i warn | tail -24
      done ;;
    hopper-extend)
      # [7/14] item 3 (twenty-third session): the warp-specialized Gluon extend kernel. One
      # short case first (a deadlocked mbarrier would hang), its GPU tests and the Triton
      # kernel's, then the extend table (Triton, Gluon, SDPA at 1k-8k causal)
      timeout 60 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        "tests/test_kernels_extend_attention_hopper.py::test_hopper_kernel_matches_reference[dtype0-extend_lens0-32-8]" \
        2>&1 | tail -3
      # The ping-pong (named barriers, not yet run on a GPU) alone next, under its own short
      # timeout: where it hangs or differs, the rest leaves its launches out rather than spend
      # 200 s on each hang.
      variants=tests/test_kernels_extend_attention_hopper.py::test_hopper_kernel_launch_variants_match_reference
      skip_pp=() no_pp=()
      guard=$(timeout 60 python3 -m pytest -q -x -m gpu -p no:cacheprovider "$variants[2-3]" \
        2>&1 | tail -3)
      echo "$guard"
      if [[ $guard != *" passed"* || $guard == *failed* ]]; then
        echo "ping-pong guard failed: its launches left out"
        skip_pp=(--deselect "$variants[2-2]" --deselect "$variants[2-3]") no_pp=(--no-pingpong)
      fi
      timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider "${skip_pp[@]}" \
        tests/test_kernels_extend_attention_hopper.py tests/test_kernels_extend_attention.py 2>&1 \
        | tail -15
      timeout 200 python3 scripts/bench_kernels.py --extend "${no_pp[@]}" 2>&1 \
        | tee "$OUT/extend.log" ;;
    gpu-tests)
      timeout 500 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 \
        | tee "$OUT/gpu_tests.log" | tail -15 ;;
    fp8-table)
      cp -n runtime/tiny_assets/model.safetensors .base/runtime/tiny_assets/
      OUT=$OUT/fp8_table bash scripts/ab_bench.sh .base latency-fp8 ;;
    int4-nibble)
      # [9/14] the one-dot-per-nibble int4 GEMM over the interleaved packing (sixteenth
      # session): `.base` (main before it) then this tree, bench latency with random int4
      # weights at batch 1 and 64; this tree's int4 GPU tests, the projections streamed at 1-64
      # tokens, bf16 latency in the same lease.
      mkdir -p "$OUT/int4_nibble"
      cp -n runtime/tiny_assets/model.safetensors .base/runtime/tiny_assets/
      timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_int4_gemm.py \
        2>&1 | tail -3
      lat() {  # $1: name, then flags
        local name=$1; shift
        timeout 150 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
          --load-format dummy --batch-sizes 1 64 --input-len 128 --output-len 256 "$@" \
          --output-json "$OUT/int4_nibble/latency_$name.json" 2>&1 | grep '^{' | tail -2
      }
      (cd .base && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1)
      echo "base awq"; lat base_awq --quantization awq
      python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
      echo "this tree bf16"; lat bf16
      echo "this tree awq"; lat awq --quantization awq
      (cd scripts && timeout 100 python3 bench_int4_gemm.py --tokens 64 16 \
        --out "$OUT/int4_nibble" 2>&1 | grep -v -i warn | tail -2) ;;
    int4-sweep)
      # [9/14] both GEMMs over the interleaved packing swept at 16-256 tokens (the table it
      # writes keeps the current rows of the buckets it does not sweep), then bench latency with
      # random int4 weights before (the table in the tree) and after (the swept table)
      mkdir -p "$OUT/int4_sweep"
      lat() {  # $1: name
        timeout 150 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
          --load-format dummy --batch-sizes 1 64 128 --input-len 128 --output-len 256 \
          --quantization awq --output-json "$OUT/int4_sweep/latency_$1.json" 2>&1 | tail -4
      }
      lat before
      (cd scripts && timeout 240 python3 bench_int4_gemm.py --tokens 256 128 64 32 16 --sweep \
        --sweep-budget-s 180 --out "$OUT/int4_sweep" 2>&1 | grep -v -i warn | tail -22)
      if [ -s "$OUT/int4_sweep/int4_gemm_configs.json" ]; then
        cp "$OUT/int4_sweep/int4_gemm_configs.json" kernels/
        lat after
      fi ;;
    pdl)
      # [7/14] / [8/14] / [9/14] programmatic dependent launch (kernels/pdl.py): bench latency
      # batch 1 in bf16, FP8 and int4 (AWQ), `.base` (main before it) then this tree for each;
      # the greedy digests must agree. Then the kernels' GPU tests with PDL on.
      mkdir -p "$OUT/pdl"
      for quant in bf16 fp8 awq; do
        flags=""
        [ "$quant" != bf16 ] && flags="--quantization $quant"
        for tree in .base .; do
          name=$([ "$tree" = . ] && echo pdl || echo base)
          (cd "$tree" && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1)
          echo "== $quant $name"
          timeout 150 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
            --load-format dummy --batch-sizes 1 --input-len 128 --output-len 256 $flags \
            --output-json "$OUT/pdl/${quant}_${name}.json" 2>&1 | tail -2
        done
      done
      latency_summary "$OUT/pdl/*.json"
      timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_*.py 2>&1 | tail -4 ;;
    fp8-swap)
      # [8/14] batch 1 / 64 with FP8 weights: the skinny GEMM swapped (weight rows on the
      # wgmma's M side, FP8 straight from shared memory) swept against the table's launch, the
      # merged table installed, bench latency before and after; then the FP8 GEMM's GPU tests
      mkdir -p "$OUT/fp8_swap"
      lat() {  # $1: name
        timeout 150 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
          --load-format dummy --batch-sizes 1 64 --input-len 128 --output-len 256 \
          --quantization fp8 --output-json "$OUT/fp8_swap/latency_$1.json" 2>&1 | tail -3
      }
      lat before
      timeout 300 python3 scripts/bench_fp8_gemm.py --sweep --swap-only --tokens 1 64 \
        --out "$OUT/fp8_swap" 2>&1 | grep -v -i warn | tail -24
      if [ -s "$OUT/fp8_swap/fp8_gemm_configs.json" ]; then
        cp "$OUT/fp8_swap/fp8_gemm_configs.json" kernels/
        lat after
      fi
      timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_fp8_gemm.py \
        tests/test_kernels_pdl.py 2>&1 | tail -3 ;;
    gemv-pdl | gemv-gated)
      # [7/14] batch 1 in bf16: the split-K GEMV, which now loads its first weight tile while
      # the previous kernel finishes (PDL), swept against cuBLAS (`F.linear`) (gemv-gated: the
      # down projection's gated launches too, against the activation kernel + the best plain
      # one); the table of the shapes it wins installed; bench latency before and after
      dir="$OUT/${stage//-/_}"
      mkdir -p "$dir"
      lat() {  # $1: name
        timeout 150 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
          --load-format dummy --batch-sizes 1 --input-len 128 --output-len 256 \
          --output-json "$dir/latency_$1.json" 2>&1 | tail -2
      }
      lat before
      (cd scripts && timeout 230 python3 bench_gemv.py --sweep --budget-s 150 \
        --out "$dir" 2>&1 | grep -v -i warn | tail -6)
      if grep -q '"max_tokens"' "$dir/gemv_configs.json" 2>/dev/null; then
        cp "$dir/gemv_configs.json" kernels/
        lat after
      fi ;;
    fp8-l2)
      # [8/14] batch 1 FP8: the GEMM's first weight rows to L2 before its PDL wait; `.base`
      # (c1441b9, before it) then this tree
      ab_latency fp8_l2 --batch-sizes 1 --quantization fp8 ;;
    gated)
      # [7/14] batch 1 bf16: the down projection's GEMV computes silu(gate) * up as it loads it
      # (no activation kernel); `.base` (c1441b9, before it) then this tree; same greedy digest
      # (opt-in per table row: bf16 and int4 latency with the shipped tables, then with the
      # down projection's batch-1 rows marked `gated`)
      mkdir -p "$OUT/gated"
      lat() {  # $1: name, the rest: flags
        timeout 150 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
          --load-format dummy --batch-sizes 1 --input-len 128 --output-len 256 "${@:2}" \
          --output-json "$OUT/gated/latency_$1.json" 2>&1 | tail -2
      }
      cp kernels/gemv_configs.json kernels/int4_gemm_configs.json "$OUT/gated/"
      lat bf16_before; lat awq_before --quantization awq
      python3 scripts/mark_fusion_rows.py gated
      lat bf16_after; lat awq_after --quantization awq
      cp "$OUT/gated/gemv_configs.json" "$OUT/gated/int4_gemm_configs.json" kernels/ ;;
    int4-pdl)
      # [9/14] batch 64 with PDL in the int4 GEMMs: `.base` (c1441b9, before it) then this tree
      ab_latency int4_pdl --batch-sizes 64 --quantization awq ;;
    int4-gemv)
      # [9/14] batch 1: the int4 GEMV's rows re-swept now that it loads its first words before
      # the PDL wait, bench latency before / after
      mkdir -p "$OUT/int4_gemv"
      timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_int4_gemm.py \
        2>&1 | tail -2
      lat() {  # $1: name
        timeout 150 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
          --load-format dummy --batch-sizes 1 --input-len 128 --output-len 256 \
          --quantization awq --output-json "$OUT/int4_gemv/latency_$1.json" 2>&1 | tail -2
      }
      lat before
      (cd scripts && timeout 200 python3 bench_int4_gemm.py --tokens 1 --sweep \
        --sweep-budget-s 120 --out "$OUT/int4_gemv" 2>&1 | grep -v -i warn | tail -8)
      if [ -s "$OUT/int4_gemv/int4_gemm_configs.json" ]; then
        cp "$OUT/int4_gemv/int4_gemm_configs.json" kernels/
        lat after
      fi ;;
    gather)
      # [8/14] the pool's gather alone per row length (seventeenth session: 128-byte rows, an
      # e4m3 head's, read at up to 4.2 TB/s, so the FP8 pool's 2.7 TB/s is not the gather's)
      timeout 150 python3 scripts/bench_kernels.py --gather-sweep 2>&1 | grep -v -i warn \
        | tee "$OUT/gather_sweep.log" | tail -70 ;;
    bs1-split)
      timeout 200 python3 scripts/bench_kernels.py --split-sweep 2>&1 | grep -v -i warn \
        | tee "$OUT/split_sweep.log" | tail -52 ;;
    fp8-store)
      timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_fused_layers.py \
        -k "fp8" 2>&1 | tail -3
      bash scripts/h200_pending.sh fp8 ;;
    fp8-profile)
      # [8/14] the batch-256 decode step's kernels, bf16 and FP8 (fifteenth session: attention
      # 9,695 / 7,206 us a step, GEMMs 6,520 / 4,805 us; the fused store then took 0.49 ms off)
      mkdir -p "$OUT/fp8_profile"
      for quant in "" "--quantization fp8 --kv-cache-dtype fp8_e4m3"; do
        timeout 250 python3 scripts/profile_decode_step.py --model-path $MODEL --load-format dummy \
          --batch-size 256 --input-len 1024 --steps 16 $quant --out "$OUT/fp8_profile" 2>&1 | tail -22
      done ;;
    int4-profile)
      # [9/14] batch 1 with int4 weights: 4.27 ms a step while the GEMVs stream in 2.29 ms
      mkdir -p "$OUT/int4_profile"
      timeout 200 python3 scripts/profile_decode_step.py --model-path $MODEL --load-format dummy \
        --quantization awq --steps 64 --out "$OUT/int4_profile" 2>&1 | tail -30 ;;
    fp8-kv-attn)
      timeout 300 python3 scripts/bench_kernels.py --fp8-kv-sweep 2>&1 | tee "$OUT/fp8_kv_attn.log" ;;
    fp8-gemv)
      # [8/14] batch 1 with FP8 weights (seventeenth session: 3.23 ms synced, 2.96 overlapped;
      # target 2.6): the FP8 GEMV, now also in packed fp16 arithmetic (`packed_f16`, half the
      # instructions of its float32 path) and with PDL, swept against the swapped skinny GEMM;
      # its GPU tests first; the table installed; bench latency before and after.
      mkdir -p "$OUT/fp8_gemv"
      timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gemv.py 2>&1 | tail -2
      lat() {  # $1: name
        timeout 150 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
          --load-format dummy --batch-sizes 1 --input-len 128 --output-len 256 \
          --quantization fp8 --output-json "$OUT/fp8_gemv/latency_$1.json" 2>&1 | tail -2
      }
      lat before
      timeout 220 python3 scripts/bench_gemv.py --sweep --fp8 --budget-s 150 \
        --out "$OUT/fp8_gemv" 2>&1 | grep -v -i warn | tail -5
      if grep -q '"max_tokens"' "$OUT/fp8_gemv/gemv_fp8_configs.json" 2>/dev/null; then
        cp "$OUT/fp8_gemv/gemv_fp8_configs.json" kernels/
        lat after
      fi ;;
    rotary-split)
      # [7/14] batch 1: the rotary + KV-store kernel splits a token's heads over programs at
      # up to 8 tokens (built in the nineteenth session); `.base` (9752124, before it) then
      # this tree, bf16 (the kernel is the same for every weight format)
      ab_latency rotary_split --batch-sizes 1 ;;
    bs64)
      # [9/14] batch 64: int4 (AWQ-format random weights) and bf16 in the same lease
      mkdir -p "$OUT/bs64"
      for quant in bf16 awq; do
        latency_run "$quant" 64 "$OUT/bs64/latency_$quant.json"
      done ;;
    add-norm)
      # [7/14] batch 1 bf16: the o and down GEMVs also add the residual and write the next
      # RMSNorm of the row (`add_norm` rows, built in the nineteenth session: no norm kernels
      # after layer 0's input norm). Its GPU tests; bench latency bf16 with the shipped table,
      # with o / down marked add_norm, then with gate | up also marked silu_out; restored
      dir="$OUT/add_norm"
      mkdir -p "$dir"
      timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gemv.py \
        -k "add_norm or silu" 2>&1 | tail -2
      mkdir -p "$dir/shipped"
      cp kernels/gemv_configs.json kernels/gemv_fp8_configs.json kernels/int4_gemm_configs.json \
        "$dir/shipped/"
      lat() {  # $1: name
        timeout 150 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
          --load-format dummy --batch-sizes 1 --input-len 128 --output-len 256 \
          --output-json "$dir/latency_$1.json" 2>&1 | tail -1
      }
      lat bf16_before
      python3 scripts/mark_fusion_rows.py add_norm; lat bf16_add_norm
      python3 scripts/mark_fusion_rows.py silu_out; lat bf16_add_norm_silu
      cp "$dir"/shipped/*.json kernels/; lat bf16_before_again
      latency_summary "$dir/latency_*.json" ;;
    ncu-decode)
      # [8/14] (twenty-second session): what bounds the FP8 pool's decode attention (2.92 TB/s
      # against a bf16 pool's 4.27 at 256 x 1024): Nsight Compute's counters (the machine runs
      # on Firecracker, where ncu reads them; clocks left alone) of one launch over each pool
      mkdir -p "$OUT/ncu"
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
      for pool in bf16 e4m3; do
        timeout 150 "$NCU" --clock-control none --set full --import-source no \
          -k regex:decode_split --launch-skip 2 --launch-count 1 \
          python3 scripts/bench_kernels.py --ncu-decode $pool > "$OUT/ncu/ncu_$pool.txt" 2>&1
        grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Executed Ipc A|No Eligible|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit" \
          "$OUT/ncu/ncu_$pool.txt" | sed "s/^/$pool: /" | head -30
      done ;;
    fast-accum)
      # [8/14] (twenty-second session): FP8 GEMMs over 64 tokens with cuBLASLt's fast
      # accumulation (the new default). Its GPU tests; offline 1000 x 1000/1000 FP8 weights +
      # KV without it (--disable-fp8-fast-accum), then with it (the default); bf16-offline: the
      # ratio's denominator, in the same lease.
      timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_fp8_gemm.py \
        tests/test_quantization.py 2>&1 | tail -2
      STAGE_TIMEOUT=170 bash scripts/h200.sh fp8-offline-w8kv8-exact 2>&1 | tail -4
      STAGE_TIMEOUT=170 bash scripts/h200.sh fp8-offline-w8kv8 2>&1 | tail -4 ;;
    one-warp)
      # [8/14] (twenty-second session): the FP8 pool's one-warp launch on large grids. Its GPU
      # tests; offline 1000 x 1000/1000 bf16 (the ratio's denominator), FP8 weights + KV in
      # this tree, then in `.base` (main before it: fast accumulation, two-warp programs).
      timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/test_kernels_fp8_kv_attention.py 2>&1 | tail -2
      STAGE_TIMEOUT=200 bash scripts/h200.sh fp8-offline-bf16 2>&1 | tail -4
      STAGE_TIMEOUT=170 bash scripts/h200.sh fp8-offline-w8kv8 2>&1 | tail -4
      (cd .base && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1)
      mkdir -p "$OUT/base"
      (cd .base && OUT="$OUT/base" STAGE_TIMEOUT=170 bash scripts/h200.sh fp8-offline-w8kv8 2>&1 \
        | tail -4)
      python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 ;;
    bf16-offline)
      STAGE_TIMEOUT=200 bash scripts/h200.sh fp8-offline-bf16 2>&1 | tail -4 ;;
    fp8-2warp)
      # [8/14] (twenty-first session): the FP8 pool's decode attention in 32-position tiles of
      # 2 warps (199.2 -> 183.9 us at 256 x 1024 in the first sweep) the default. The sweep
      # again with more 2-warp launches; bench latency FP8 batch 1, `.base` (main before it)
      # then this tree; offline 1000 x 1000/1000 bf16 then FP8 weights + KV (the ratio).
      # The graph replay's five input copies in one `_foreach_copy_` too: its GPU tests, and
      # bench latency bf16 batch 1 against `.base`.
      timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_runtime.py \
        tests/test_engine_tree_attention.py tests/test_kernels_decode_attention.py 2>&1 | tail -2
      timeout 200 python3 scripts/bench_kernels.py --fp8-kv-sweep 2>&1 | tee "$OUT/fp8_kv_attn.log" | grep -v "^#"
      ab_latency fp8_2warp --batch-sizes 1 --quantization fp8
      ab_latency host_bf16 --batch-sizes 1
      latency_summary "$OUT/fp8_2warp/latency_*.json"
      latency_summary "$OUT/host_bf16/latency_*.json" ;;
    final21)
      # The twenty-first session's one long call: the GPU tests of the 2-warp FP8 default and
      # the one-dispatch graph inputs, bench latency FP8 batch 1 against `.base` (main before
      # them), then the offline ratio (fp8-ratio)
      timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_runtime.py \
        tests/test_engine_tree_attention.py tests/test_kernels_decode_attention.py 2>&1 | tail -2
      ab_latency fp8_2warp --batch-sizes 1 --quantization fp8
      latency_summary "$OUT/fp8_2warp/latency_*.json"
      bash scripts/h200_pending.sh fp8-ratio ;;
    fp8-ratio)
      # [8/14]: offline 1000 x 1000/1000, bf16 then FP8 weights + KV, one lease (the ratio)
      STAGE_TIMEOUT=200 bash scripts/h200.sh fp8-offline-bf16 fp8-offline-w8kv8 2>&1 | tail -8 ;;
    host-profile)
      # [7/14] / [8/14] batch 1: where the synced step's host time goes (build 0.12-0.23 ms,
      # launch 0.09-0.14 ms in the twenty-first session's first call): cProfile of bench
      # latency, the builtins (torch ops) under build_forward_batch and the graph replay
      for quant in bf16 fp8; do
        flags=""
        [ "$quant" != bf16 ] && flags="--quantization $quant"
        timeout 150 python3 -m cProfile -o "$OUT/host_$quant.prof" -m radixgen.runtime.bench.cli \
          latency --model-path $MODEL --load-format dummy --batch-sizes 1 --input-len 128 \
          --output-len 256 $flags 2>&1 | tail -1
        python3 - "$OUT/host_$quant.prof" <<'PY'
import pstats, sys
stats = pstats.Stats(sys.argv[1])
stats.sort_stats("cumulative").print_callees("build_forward_batch|replay|host_parts_to_device|_one_batch")
PY
      done 2>&1 | grep -v "^$" | cut -c1-160 | tee "$OUT/host_profile.log" | head -150 ;;
    decode-prefetch)
      # [7/14] / [8/14] / [9/14] batch 1 (built after the twentieth session's last call): the
      # rotary and decode attention kernels' loads before their PDL wait (and the build's
      # sequence lengths in its one host-to-device copy). The PDL chain, decode
      # attention and fused-layer GPU tests; the split sweep's prefetch rows (`prefetch_kv`);
      # then bench latency batch 1 in bf16, FP8 weights and int4, `.base` = 62b4893 (carry
      # ".base") then this tree, whose greedy digests must agree.
      timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_pdl.py \
        tests/test_kernels_decode_attention.py tests/test_kernels_fused_layers.py 2>&1 | tail -2
      (cd scripts && timeout 150 python3 bench_kernels.py --split-sweep 2>&1 | grep prefetch)
      ab_latency decode_prefetch_bf16 --batch-sizes 1
      ab_latency decode_prefetch_fp8 --batch-sizes 1 --quantization fp8
      ab_latency decode_prefetch_awq --batch-sizes 1 --quantization awq
      latency_summary "$OUT/decode_prefetch_*/latency_*.json" ;;
    rope-store)
      # [7/14] / [8/14] / [9/14] batch 1 (twentieth session): the qkv GEMV rotates q and k and
      # writes k and v into the cache in its epilogue (`rope_store` rows: no rotary kernel).
      # Its GPU tests (and the nibble GEMM's silu_out ones), then `fusion_ab`. One tarball
      # comes back (the tool returns few files).
      timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_rope_store.py \
        tests/test_kernels_int4_gemm.py -k "rope or silu" 2>&1 | tail -3
      fusion_ab rope_store rope_store
      tar czf "$OUT/rope_store.tgz" -C "$OUT" rope_store && rm -rf "$OUT/rope_store" ;;
    bs64-repeat)
      # [9/14] batch 64: bf16 and int4 alternately, twice each, in one lease (the synced
      # step carries 0.4-0.9 ms of host noise between runs of one tree)
      dir="$OUT/bs64_repeat"
      mkdir -p "$dir"
      for run in 1 2; do
        for quant in bf16 awq; do
          latency_run "$quant" 64 "$dir/latency_${quant}_$run.json"
        done
      done
      latency_summary "$dir/latency_*.json"
      tar czf "$OUT/bs64_repeat.tgz" -C "$OUT" bs64_repeat && rm -rf "$dir" ;;
    int4-gemm)
      # [9/14] batch 64 (twentieth session): the nibble GEMM with the next chunk's words loaded
      # ahead (`prefetch_words`) and with the gate | up activation in its epilogue (`silu_out`
      # rows at 64 / 128 tokens). The int4 GPU tests; bench latency batch 64: bf16, int4 with
      # the table in the tree, the 64 / 128-token rows re-swept (prefetched tiles first) and
      # installed, then also marked silu_out, bf16 again. One tarball comes back (the tool
      # returns few files).
      dir="$OUT/int4_gemm"
      mkdir -p "$dir"
      timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_int4_gemm.py \
        2>&1 | tail -2
      lat() {  # $1: name, the rest: flags
        timeout 120 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
          --load-format dummy --batch-sizes 64 --input-len 128 --output-len 256 "${@:2}" \
          --output-json "$dir/latency_$1.json" 2>&1 | tail -1
      }
      lat bf16_before
      lat awq_before --quantization awq
      (cd scripts && timeout 170 python3 bench_int4_gemm.py --tokens 64 128 --sweep \
        --sweep-budget-s 120 --out "$dir" 2>&1 | grep -v -i warn | tail -10)
      if [ -s "$dir/int4_gemm_configs.json" ]; then
        cp "$dir/int4_gemm_configs.json" kernels/
        lat awq_swept --quantization awq
        python3 scripts/mark_fusion_rows.py silu_out --int4-buckets 64 128
        cp kernels/int4_gemm_configs.json "$dir/int4_gemm_configs_silu.json"
        lat awq_swept_silu --quantization awq
      fi
      lat bf16_again
      latency_summary "$dir/latency_*.json"
      tar czf "$OUT/int4_gemm.tgz" -C "$OUT" int4_gemm && rm -rf "$dir" ;;
    silu-out)
      # [7/14] / [8/14] / [9/14] batch 1: the gate | up GEMV writes silu(gate) * up in its
      # epilogue (`silu_out` rows, built in the nineteenth session: no activation kernel, and
      # for FP8 no SiLU-quantize pass). Its GPU tests, then bench latency in bf16, FP8 and int4
      # with the shipped tables, with the gate | up rows marked (`mark_fusion_rows.py
      # silu_out`; bf16 gets the GEMV's gate | up launch, cuBLAS's tie), the greedy digests
      # compared, the tables restored
      timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gemv.py \
        tests/test_kernels_int4_gemm.py -k "silu or packed" 2>&1 | tail -2
      fusion_ab silu_out silu_out
      # The nineteenth session's device was scarce: the other epilogue's A/B rides along.
      bash scripts/h200_pending.sh add-norm ;;
    fp8-a16)
      # [8/14] batch 1 with FP8 weights: W8A16 GEMV launches in packed fp16 (`a16` +
      # `packed_f16`, built in the nineteenth session: the bf16 activations enter unquantized,
      # so the SiLU's and o_proj's quantization passes go); its GPU tests, the a16 launches
      # swept, then bench latency with the shipped table, with every shape a16, with o and down
      # a16, and the shipped table again (the noise)
      dir="$OUT/fp8_a16"
      mkdir -p "$dir"
      timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gemv.py \
        2>&1 | tail -2
      cp kernels/gemv_fp8_configs.json "$dir/shipped_gemv_fp8_configs.json"
      lat() {  # $1: name
        timeout 150 python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL \
          --load-format dummy --batch-sizes 1 --input-len 128 --output-len 256 \
          --quantization fp8 --output-json "$dir/latency_$1.json" 2>&1 | tail -1
      }
      lat before
      timeout 150 python3 scripts/bench_gemv.py --sweep --fp8 --paths a16 --budget-s 100 \
        --out "$dir" 2>&1 | grep -v -i warn | tail -4
      if [ -s "$dir/gemv_fp8_a16_configs.json" ]; then
        cp "$dir/gemv_fp8_a16_configs.json" kernels/gemv_fp8_configs.json
        lat a16_all
        python3 - "$dir" <<'PY'
import json, sys
from radixgen.kernels.launch_tables import format_shape_table
shipped = json.load(open(f"{sys.argv[1]}/shipped_gemv_fp8_configs.json"))
a16 = json.load(open(f"{sys.argv[1]}/gemv_fp8_a16_configs.json"))["shapes"]
for shape in ("4096x4096", "14336x4096"):  # o and down: their quantization passes go
    if shape in a16:
        shipped["shapes"][shape] = a16[shape]
open("kernels/gemv_fp8_configs.json", "w").write(format_shape_table(shipped))
open(f"{sys.argv[1]}/gemv_fp8_o_down_a16_configs.json", "w").write(format_shape_table(shipped))
PY
        lat a16_o_down
        cp "$dir/shipped_gemv_fp8_configs.json" kernels/gemv_fp8_configs.json
        lat before_again
      fi
      latency_summary "$dir/latency_*.json" ;;
    tree-gsp)
      # [6/14] generated-shared-prefix in-process with tree attention off, on, off, on (third
      # session: 31.81 / 26.87 s; target 18 s), then one decode step of that batch (1,024
      # requests, 64 groups sharing 2,048 tokens + 128 own) profiled with and without it
      mkdir -p "$OUT/tree_gsp"
      for mode in notree tree notree2 tree2; do  # tree attention is the default on CUDA
        timeout 150 python3 -m radixgen.runtime.bench.cli offline --model-path $MODEL \
          --load-format dummy --dataset generated-shared-prefix \
          $(case $mode in notree*) echo --disable-tree-attention;; esac) \
          --output-json "$OUT/tree_gsp/offline_gsp_$mode.json" 2>&1 | grep -E "^duration" | tail -1
      done
      for flag in "" --tree-attention; do
        timeout 200 python3 scripts/profile_decode_step.py --model-path $MODEL --load-format dummy \
          --batch-size 1024 --input-len 128 --shared-prefix-len 2048 --groups 64 --steps 32 \
          $flag --out "$OUT/tree_gsp" 2>&1 | tail -16
      done ;;
    tree-overlap)
      # [6/14] each tree pass alone, both at once on two streams, and the concurrent mode
      # (`tree_decode_attention(concurrent=...)`: one merge counter for both passes, built in
      # the thirteenth session, never run on a GPU yet) at 16 x 16 and 64 x 16 sharing 2048 + 256
      timeout 200 python3 scripts/bench_tree_attention.py --overlap-probe \
        --out "$OUT/tree_overlap.json" 2>&1 | grep -v -i warn | tail -8 ;;
    tree-shared)
      # [6/14] the shared pass's launch (32- and 64-position tiles x 2-4 stages), suffix default
      timeout 300 python3 scripts/bench_tree_attention.py --shared-sweep \
        --out "$OUT/tree_shared_sweep.json" 2>&1 | grep -v -i warn | tail -14 ;;
    tree-suffix)
      timeout 400 python3 scripts/bench_tree_attention.py --suffix-sweep \
        --out "$OUT/tree_suffix_sweep.json" 2>&1 | grep -v -i warn | tail -60 ;;
    gsp-outside)
      # [6/14] the in-process run's time outside the scheduler's steps (before the first, between,
      # after the last), with a batch's outputs on one channel (thirteenth session): one run
      mkdir -p "$OUT/gsp_outside"
      timeout 200 python3 scripts/profile_step_times.py --model-path $MODEL --load-format dummy \
        --profile-steps 0 --out "$OUT/gsp_outside" 2>&1 | grep -v Warn | head -16 ;;
    gsp-steps)
      mkdir -p "$OUT/gsp_steps"
      timeout 240 python3 scripts/profile_step_times.py --model-path $MODEL --load-format dummy \
        --profile-steps 10 --out "$OUT/gsp_steps" 2>&1 | grep -v Warn | head -24 ;;
    tree-noshare)
      # [6/14] before tree attention can be the default: no regression where nothing is shared
      # (third session: 1000 x 200/200 took 15.88 s with it on against 15.14 s off)
      mkdir -p "$OUT/tree_noshare"
      for mode in off on off2 on2; do
        timeout 120 python3 -m radixgen.runtime.bench.cli offline --model-path $MODEL \
          --load-format dummy --num-prompts 1000 --random-input-len 200 --random-output-len 200 \
          $(case $mode in off*) echo --disable-tree-attention;; esac) \
          --output-json "$OUT/tree_noshare/offline_1000_200_200_$mode.json" 2>&1 \
          | grep -E "^duration" | tail -1
      done ;;
    tree-sweep)
      # [6/14] the tree kernel's launch sweep, never run (third session: 2.57x at its defaults,
      # the shared pass at 2.5 TB/s; the 16-member shared pass takes 178 registers and 80 KB
      # of shared memory at 4 warps / 2 stages on sm_90: 2 programs an SM)
      timeout 300 python3 scripts/bench_tree_attention.py --out "$OUT/bench_tree_attention.json" \
        2>&1 | tail -30 ;;
    fp8-rows)
      # [8/14] the offline rows the issue also asks for: FP8 weights only, FP8 KV only
      STAGE_TIMEOUT=200 bash scripts/h200.sh fp8-offline-w8 fp8-offline-kv8 ;;
    fp8-profile-fp8)
      mkdir -p "$OUT/fp8_profile"
      timeout 250 python3 scripts/profile_decode_step.py --model-path $MODEL --load-format dummy \
        --batch-size 256 --input-len 1024 --steps 16 --quantization fp8 --kv-cache-dtype fp8_e4m3 \
        --out "$OUT/fp8_profile" 2>&1 | head -24 ;;
    fp8-kv-ab)
      # [8/14] the FP8-KV decode step at batch 256, 1024-token prompts, profiled (bench latency
      # of the base prefills 256 x 1024 tokens in one forward: out of memory): .base = main
      # before the fp16 dots and 128-position tiles (c4b5ba5), then this tree
      cp -n runtime/tiny_assets/model.safetensors .base/runtime/tiny_assets/
      for tree in .base .; do
        name=$([ $tree = . ] && echo new || echo base)
        mkdir -p "$OUT/fp8_kv_ab/$name"
        (cd $tree && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
         timeout 85 python3 "$OLDPWD/scripts/profile_decode_step.py" --model-path $MODEL \
           --load-format dummy --batch-size 256 --input-len 1024 --steps 16 --quantization fp8 \
           --kv-cache-dtype fp8_e4m3 --out "$OUT/fp8_kv_ab/$name" 2>&1 | sed -n '2,6p')
      done
      python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 ;;
    gemv-ab)
      # bench latency batch 1 with the shipped GEMV table, the fifth session's swept one, the
      # shipped one again (ABA: the noise between runs of one tree)
      mkdir -p "$OUT/gemv_ab"
      cp kernels/gemv_configs.json /tmp/gemv_configs_shipped.json
      for table in shipped swept shipped2; do
        if [ $table = swept ]; then
          cp docs/results/h200-2026-12-01/session5/gemv/gemv_configs.json kernels/
        else
          cp /tmp/gemv_configs_shipped.json kernels/gemv_configs.json
        fi
        python3 -m radixgen.runtime.bench.cli latency --model-path $MODEL --load-format dummy \
          --batch-sizes 1 --input-len 128 --output-len 256 \
          --output-json "$OUT/gemv_ab/latency_$table.json" 2>&1 | grep '^{' | tail -1
      done
      cp /tmp/gemv_configs_shipped.json kernels/gemv_configs.json ;;
    fresh)
      OUT=$OUT/fresh TREES=new bash scripts/ab_bench.sh . serving-fresh serving-fresh-eager ;;
    gc-ab)
      # [6/14] the in-process Engine's start-up heap frozen (four ~300 ms full collections in
      # the twelfth session's run): .base = main before it, alternating; then served with the
      # radix cache on and off (the 4.4x ratio)
      for pass in 1 2; do
        # one folder a tree: ab_bench archives and clears its folder when it ends
        OUT=$OUT/gc_${pass}_base TREES=base bash scripts/ab_bench.sh .base gsp-offline
        OUT=$OUT/gc_${pass}_new TREES=new bash scripts/ab_bench.sh .base gsp-offline
        [ $pass = 1 ] && OUT=$OUT/served TREES=new bash scripts/ab_bench.sh .base gsp-served \
          gsp-served-nocache
      done ;;
    fresh-gsp)
      OUT=$OUT/fresh_gsp TREES=new bash scripts/ab_bench.sh . serving-fresh-gsp ;;
    lean)
      # Alternating (in-process, served, twice): every served run that came first in its call
      # of the eighth session measured 8-9% slower steps than the in-process run after it.
      for pass in 1 2; do
        mkdir -p "$OUT/lean_$pass"
        OUT=$OUT/lean_$pass TREES=new bash scripts/ab_bench.sh . gsp-offline gsp-served
      done ;;
    gemv-why)
      mkdir -p "$OUT/gemv_why/empty" "$OUT/gemv_why/swept"
      cp kernels/gemv_configs.json /tmp/gemv_configs_shipped.json
      for table in empty swept; do
        [ $table = swept ] && cp docs/results/h200-2026-12-01/session5/gemv/gemv_configs.json kernels/
        timeout 200 python3 scripts/profile_decode_step.py --model-path $MODEL --load-format dummy \
          --steps 64 --out "$OUT/gemv_why/$table" 2>&1 | tail -25
      done
      cp /tmp/gemv_configs_shipped.json kernels/gemv_configs.json ;;
    fp8-bs1)
      cp -n runtime/tiny_assets/model.safetensors .base/runtime/tiny_assets/
      OUT=$OUT/fp8_ab bash scripts/ab_bench.sh .base latency-fp8
      STAGE_TIMEOUT=200 OUT=$OUT/fp8_sweep bash scripts/h200.sh fp8-gemm-sweep ;;
    spec)
      OUT=$OUT bash scripts/gpu_speculative.sh verify-cost tokens
      python3 scripts/bench_speculative.py oracle --batch-sizes 1 32 --alphas 0.5 0.9 \
        --speculative-max-batch-size 32 --out "$OUT/oracle_alphas.json" 2>&1 | tail -8 ;;
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
    decode-build)
      cp -n runtime/tiny_assets/model.safetensors .base/runtime/tiny_assets/
      OUT=$OUT/decode_build bash scripts/ab_bench.sh .base latency ;;
    decode-merge)
      cp -n runtime/tiny_assets/model.safetensors .base/runtime/tiny_assets/
      OUT=$OUT/decode_merge bash scripts/ab_bench.sh .base latency ;;
    no-regress)
      # The tiny weights were stripped from .base to fit the carry: the tokenizer of the
      # dummy 8B folder comes from tiny's assets.
      cp -n runtime/tiny_assets/model.safetensors .base/runtime/tiny_assets/
      OUT=$OUT/no_regress bash scripts/ab_bench.sh .base latency offline ;;
    gluon-offline)
      # [7/14] (twenty-third session): no regression with the Gluon extend kernel the default
      # on sm_90: offline 1000 x 1000/1000 (random prompts: every prefill
      # goes through it), `.base` = 43b7457 (main before it) then this tree, one lease
      cp -n runtime/tiny_assets/model.safetensors .base/runtime/tiny_assets/
      OUT=$OUT/gluon_offline bash scripts/ab_bench.sh .base offline-long ;;
    gluon-probe)
      # [7/14] extend attention: what Gluon offers on the H200's Triton before a
      # warp-specialized kernel is written against it (seconds)
      python3 scripts/probe_gluon.py 2>&1 | grep -v -i warn ;;
    no-regress-long)
      # [7/14]'s no regression on 1000 x 1000/1000 (bf16: 110.77 / 112.51 s in the
      # twenty-second session against 108.65 / 108.53 in the fifteenth / sixteenth), `.base`
      # = fac3fba^ (the tree before PDL) then this tree, one lease (~6 minutes)
      cp -n runtime/tiny_assets/model.safetensors .base/runtime/tiny_assets/
      OUT=$OUT/no_regress_long bash scripts/ab_bench.sh .base offline-long ;;
    fp8)
      STAGE_TIMEOUT=200 bash scripts/h200.sh fp8-offline-bf16 fp8-offline-w8kv8 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
