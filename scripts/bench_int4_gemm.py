"""int4 weight-only GEMM microbenchmark at Llama-3.1-8B projection shapes (run on the H200).

    python scripts/bench_int4_gemm.py [--tokens 1 64] [--sweep] [--sweep-budget-s 110] [--out DIR]

For M (tokens) in --tokens and the qkv, o, gate_up and down projections (group 128), medians of
CUDA-graph replays (`triton.testing.do_bench_cudagraph`) of:
- bf16: `F.linear` (cuBLAS) on the same shape, the baseline;
- int4_linear: what the model runs (the GEMV, GEMM or dequantize + cuBLAS, chosen by M and the
  tuned table kernels/int4_gemm_configs.json);
- for M > 1, both large-M paths alone: triton_gemm (the fused dequantize-GEMM) and
  dequantize_then_cublas (`dequantize_int4` then a bf16 matmul), to place DEQUANTIZE_M_MIN; and
  reshaped_gemm, the whole-tile GEMM (`per_nibble=False`) at its old default launch, beside the
  one-dot-per-nibble GEMM the table picks;
- with --sweep, a grid of GEMV and GEMM configs (`sweep_configs`), each checked against the
  reference before it is timed, within --sweep-budget-s seconds of timing in all. The best per
  shape and M goes to DIR/int4_gemm_configs.json, with the current table's rows for the shapes
  and buckets not swept: copy it over kernels/int4_gemm_configs.json.
Each timed call runs over enough distinct weight copies (>= 512 MiB in all) that the weights
stream from HBM, not L2, as in a real forward pass. Effective TB/s = bytes of packed weights,
scales and zeros read / time (against the H200's 4.8 TB/s). It also sums the four shapes over
32 layers at each M: the weight-streaming time of one decode step.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

# Same shapes, layer count, HBM-streaming copies and timer as the FP8 GEMM benchmark beside it.
from bench_fp8_gemm import NUM_LAYERS, SHAPES, STREAM_BYTES, median_ms

from radixgen.kernels.int4_gemm import (
    DEQUANTIZE_M_MIN,
    GEMV_M_LIMIT,
    GEMV_M_MAX,
    default_int4_config,
    dequantize_int4,
    int4_gemm,
    int4_linear,
    int4_linear_ref,
    pack_int4_rows,
    runtime_span,
    split_k_counter_slots,
)
from radixgen.kernels.int4_gemm_configs import DEFAULT_TABLE_PATH, Int4GemmConfig, m_bucket
from radixgen.runtime.models.int4_checkpoint import quantize_rtn_int4

GROUP_SIZE = 128
MAX_RELATIVE_ERROR = 1e-2  # bf16 output rounding is ~2e-3


def random_int4_weight(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runtime-layout (qweight [K/8, N], scales, zeros [K/G, N] bf16) of a random weight."""
    codes, scales, zeros = quantize_rtn_int4(torch.randn(n, k, device="cuda") * 0.02, GROUP_SIZE)
    qweight = pack_int4_rows(codes.T.contiguous(), runtime_span(GROUP_SIZE))
    return qweight, scales.T.contiguous().bfloat16(), zeros.T.contiguous().bfloat16()


# GEMV (num_warps, block_n, block_k, prefetch): 128 columns per warp keep each tile row in one
# thread (no shared-memory layout conversions); the others spread rows over warps.
GEMV_TILES = [
    (1, 128, 32, 2),
    (1, 128, 32, 1),
    (2, 256, 32, 2),
    (4, 512, 32, 2),
    (1, 64, 64, 2),
    (2, 64, 128, 1),
    (4, 128, 128, 1),
    (1, 256, 16, 2),
    (1, 128, 16, 2),
]
GEMV_SPLITS = (1, 2, 4, 8, 16, 32)
# GEMM (block_n, block_k, num_warps, num_stages, swap_ab), most promising first (up to 16 tokens
# the swap_ab ones first): ptxas sm_90 puts the plain 128 x 128 / 8 warps at 128 registers,
# swap_ab (weights from registers, no 16-bit shared stores) at 106-210.
GEMM_TILES = [
    (128, 128, 8, 3, False),
    (128, 128, 8, 3, True),
    (64, 128, 4, 3, False),
    (64, 128, 4, 3, True),
    (128, 64, 4, 4, False),
    (128, 128, 8, 4, False),
    (128, 64, 8, 3, True),
    (64, 64, 4, 4, False),
]

# GEMMs over the interleaved packing (group sizes that are multiples of 128), one 128-row chunk
# a step: (block_m: 0 for the tokens rounded up, block_n, num_warps, num_stages, swap_ab,
# per_nibble), the sixteenth session's best at 16-64 tokens first. ptxas (sm_90) puts the nibble
# GEMM at 64 registers for 16 tokens (4 warps), 114 for 32, 148-154 for 64: more tokens may run
# as several 16-token tiles (the words re-read from L2, unpacked again). per_nibble False: the
# whole chunk unpacked and reshaped into one dot (the old GEMM's way). A 7th True: the nibble
# GEMM's packed tiles stacked into one dot (`chunk_dot`; sm_90 compile: its 8 wgmma steps back to
# back, 182 registers swapped at 64 x 64, 103 at 64 x 128 / 8 warps), tried first. An 8th True:
# also the next chunk's words loaded ahead (`prefetch_words`).
NIBBLE_GEMM_TILES = [
    (0, 64, 4, 3, True, True, True, True),
    (0, 128, 8, 3, False, True, True, True),
    (0, 64, 4, 3, False, True, True, True),
    (0, 128, 8, 3, True, True, True, True),
    (0, 64, 4, 3, True, True, True),
    (0, 128, 8, 3, False, True, True),
    (0, 64, 4, 3, False, True, True),
    (0, 64, 4, 3, False, True),
    (0, 64, 4, 3, True, True),
    (16, 64, 4, 3, False, True),
    (0, 128, 4, 3, False, True),
    (32, 64, 4, 3, False, True),
    (0, 128, 8, 3, False, False),
    (0, 64, 4, 3, True, False),
    (0, 128, 4, 4, False, False),
    (16, 128, 4, 3, False, True),
    (0, 32, 4, 3, True, True),
]


def sweep_configs(m: int, n: int, k: int, num_sms: int) -> list[Int4GemmConfig]:
    """The grid the sweep tries for one shape, most promising first: GEMV (M <= 4) by tile and
    split-K, then GEMM by tiles, warps, pipelining depth and split-K. Splits leaving fewer than
    one program per SM, or fewer than two K steps each, are left out."""
    configs = []
    if m <= GEMV_M_LIMIT:
        # Each tile with its products summed in packed fp16 pairs (fewer instructions and
        # registers a weight: ptxas sm_90 at 256 columns a warp, 1,050 against 1,431 in the loop,
        # 168 registers against 255), then in float32.
        for tile, split_k, packed in itertools.product(GEMV_TILES, GEMV_SPLITS, (True, False)):
            num_warps, block_n, block_k, prefetch = tile
            programs = m * triton.cdiv(n, block_n) * split_k
            if programs * num_warps < 2 * num_sms or k // split_k < 2 * block_k:
                continue
            configs.append(
                Int4GemmConfig(
                    True, 1, block_n, block_k, split_k, num_warps, 1, prefetch=prefetch,
                    packed_f16=packed,
                )
            )  # fmt: skip
    block_m = min(128, max(16, triton.next_power_of_2(m)))
    tiles = GEMM_TILES if m > 16 else sorted(GEMM_TILES, key=lambda tile: not tile[-1])
    if runtime_span(GROUP_SIZE) == 128:  # the nibble GEMM: one 128-row chunk a step
        tiles = [tile for tile in NIBBLE_GEMM_TILES if tile[0] <= block_m]
        for tile, split_k in itertools.product(tiles, (1, 2, 4, 8)):
            tile_m, block_n, num_warps, num_stages, swap_ab, per_nibble, *chunk = tile
            tile_m = tile_m or block_m
            programs = triton.cdiv(m, tile_m) * triton.cdiv(n, block_n) * split_k
            if split_k > 1 and programs > 4 * num_sms or k // split_k < 2 * 128:
                continue
            configs.append(
                Int4GemmConfig(
                    False,
                    tile_m,
                    block_n,
                    128,
                    split_k,
                    num_warps,
                    num_stages,
                    swap_ab,
                    per_nibble=per_nibble,
                    chunk_dot=bool(chunk and chunk[0]),
                    prefetch_words=len(chunk) > 1 and chunk[1],
                )  # fmt: skip
            )
        return configs
    for (block_n, block_k, num_warps, num_stages, swap_ab), split_k in itertools.product(
        tiles, (1, 2, 4, 8)
    ):
        programs = triton.cdiv(m, block_m) * triton.cdiv(n, block_n) * split_k
        if split_k > 1 and programs > 4 * num_sms or k // split_k < 2 * block_k:
            continue
        configs.append(
            Int4GemmConfig(
                False, block_m, block_n, block_k, split_k, num_warps, num_stages, swap_ab
            )
        )
    return configs


def sweep_median_ms(fn, copies: int) -> float:
    """`median_ms` over 25 ms of graph replays instead of 100: more configs in the budget."""
    return triton.testing.do_bench_cudagraph(fn, rep=25, return_mode="median") / copies


def run_sweep(
    x, weights, counters, copies, reference, budget_s: float
) -> tuple[dict | None, list[str]]:
    """The fastest correct config of `sweep_configs` (timed until budget_s runs out)."""
    m, k = x.shape
    n = weights[0][0].shape[1]
    num_sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    best, notes, start = None, [], time.monotonic()
    configs = sweep_configs(m, n, k, num_sms)
    for index, config in enumerate(configs):
        if time.monotonic() - start > budget_s:
            notes.append(f"budget spent: {len(configs) - index} of {len(configs)} configs skipped")
            break
        # The launch's fields (the epilogue flags are int4_gemm's own arguments, off here).
        overrides = {
            name: getattr(config, name)
            for name in config.__dataclass_fields__
            if name not in ("gated", "silu_out", "rope_store")
        }
        try:
            out = int4_gemm(x, *weights[0], GROUP_SIZE, counters, **overrides)
        except Exception as error:  # noqa: BLE001 (a config that does not compile or launch)
            notes.append(f"{overrides}: {type(error).__name__}")
            continue
        error = ((out.float() - reference).norm() / reference.norm()).item()
        if not error < MAX_RELATIVE_ERROR:  # a wrong kernel must not post a speed
            notes.append(f"{overrides}: relative error {error:.2e}")
            continue
        ms = sweep_median_ms(
            lambda o=overrides: [int4_gemm(x, *w, GROUP_SIZE, counters, **o) for w in weights],
            copies,
        )
        if best is None or ms < best["ms"]:
            best = {"ms": ms, **overrides}
    return best, notes


def bench_shape(name: str, m: int, n: int, k: int, sweep_budget_s: float | None) -> dict:
    packed_bytes = n * k // 2 + 2 * 2 * n * (k // GROUP_SIZE)  # qweight + bf16 scales, zeros
    copies = max(2, min(64, -(-STREAM_BYTES // packed_bytes)))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)

    def run_all(fn):
        return lambda: [fn(i) for i in range(copies)]

    results: dict[str, float] = {}
    bf16_copies = max(2, min(64, -(-STREAM_BYTES // (2 * n * k))))
    weights_bf16 = [
        torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(bf16_copies)
    ]
    results["bf16"] = median_ms(lambda: [F.linear(x, w) for w in weights_bf16], bf16_copies)
    weights_bf16.clear()
    torch.cuda.empty_cache()
    weights = [random_int4_weight(n, k) for _ in range(copies)]
    # As a loaded layer holds them: split-K partials are summed in the kernel launch itself.
    counters = torch.zeros(split_k_counter_slots(n), dtype=torch.int32, device="cuda")
    # Check against the reference first (a wrong kernel must not post a speed).
    reference = int4_linear_ref(x.float(), *weights[0], GROUP_SIZE).float()
    out = int4_linear(x, *weights[0], GROUP_SIZE, None, counters)
    error = ((out.float() - reference).norm() / reference.norm()).item()
    results["int4_linear"] = median_ms(
        run_all(lambda i: int4_linear(x, *weights[i], GROUP_SIZE, None, counters)), copies
    )
    if m > GEMV_M_MAX:  # the two large-M paths side by side (int4_linear picks one by M)
        results["triton_gemm"] = median_ms(
            run_all(lambda i: int4_gemm(x, *weights[i], GROUP_SIZE, counters)), copies
        )
        if runtime_span(GROUP_SIZE) == 128:  # the old GEMM's launch, over the same packing
            block_m = min(64, max(16, triton.next_power_of_2(m)))
            reshaped = dict(
                per_nibble=False, block_m=block_m, block_n=128, num_warps=8 if block_m >= 64 else 4,
                swap_ab=block_m == 16, chunk_dot=False, prefetch_words=False,
            )  # fmt: skip
            out = int4_gemm(x, *weights[0], GROUP_SIZE, counters, **reshaped)
            reshaped_error = ((out.float() - reference).norm() / reference.norm()).item()
            if reshaped_error < MAX_RELATIVE_ERROR:  # a wrong kernel must not post a speed
                results["reshaped_gemm"] = median_ms(
                    run_all(lambda i: int4_gemm(x, *weights[i], GROUP_SIZE, counters, **reshaped)),
                    copies,
                )
            else:
                print(f"reshaped_gemm {name} M={m}: relative error {reshaped_error:.2e}")
        results["dequantize_then_cublas"] = median_ms(
            run_all(lambda i: x @ dequantize_int4(*weights[i], GROUP_SIZE)), copies
        )
    best, notes = (None, [])
    if sweep_budget_s is not None:
        best, notes = run_sweep(x, weights, counters, copies, reference, sweep_budget_s)
    row = {
        "shape": name,
        "m": m,
        "n": n,
        "k": k,
        "ms": results,
        "default_config": vars(default_int4_config(m, n, k, GROUP_SIZE, x.device)),
        "int4_TBps": packed_bytes / results["int4_linear"] / 1e9,
        "bf16_TBps": 2 * n * k / results["bf16"] / 1e9,
        "relative_error_vs_ref": error,
        "best_sweep": best,
        "sweep_notes": notes[:20],
    }
    if best is not None:
        row["best_sweep_TBps"] = packed_bytes / best["ms"] / 1e9
    print(json.dumps(row), flush=True)
    return row


def tuned_table(rows: list[dict]) -> dict:
    """The int4_gemm_configs.json of the sweep's best configs, over the current table's rows for
    the shapes and token buckets this run did not sweep (a sweep of some buckets keeps the
    others)."""
    swept = {}
    for row in rows:
        best = row["best_sweep"]
        if best is None:
            continue
        config = Int4GemmConfig(**{key: value for key, value in best.items() if key != "ms"})
        table_row = config.to_row(row["n"], row["k"], GROUP_SIZE, m_bucket(row["m"]))
        swept[_table_key(table_row)] = table_row
    current = json.loads(DEFAULT_TABLE_PATH.read_text())["configs"]
    kept = [row for row in current if _table_key(row) not in swept]
    return {
        "note": "Written by scripts/bench_int4_gemm.py --sweep: the fastest correct config per "
        "projection shape and token bucket.",
        "source": f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}",
        "configs": kept + list(swept.values()),
    }


def _table_key(row: dict) -> tuple[int, int, int, int]:
    return row["n"], row["k"], row["group_size"], row["m_bucket"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument(
        "--sweep-budget-s",
        type=float,
        default=90.0,
        help="seconds of the whole run, sweep included",
    )
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    cases = [(name, m, *shape) for m in args.tokens for name, shape in SHAPES.items()]
    rows, sweep_start = [], time.monotonic()
    for index, (name, m, n, k) in enumerate(cases):
        budget = None
        if args.sweep:  # what earlier cases left unspent (compilation is cached) carries over
            left = args.sweep_budget_s - (time.monotonic() - sweep_start)
            budget = max(0.0, left / (len(cases) - index))
        rows.append(bench_shape(name, m, n, k, budget))
    per_step = {}
    for m in args.tokens:
        selected = [row for row in rows if row["m"] == m]
        per_step[m] = {
            key: NUM_LAYERS * sum(row["ms"][key] for row in selected)
            for key in ("bf16", "int4_linear")
        }
        if all(row["best_sweep"] for row in selected):
            per_step[m]["int4_best_sweep"] = NUM_LAYERS * sum(
                row["best_sweep"]["ms"] for row in selected
            )
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "group_size": GROUP_SIZE,
        "dequantize_m_min": DEQUANTIZE_M_MIN,
        "rows": rows,
        "per_step_ms_32_layers": per_step,
    }
    print(json.dumps(per_step))
    out = Path(args.out) / "bench_int4_gemm.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    if args.sweep:
        table = Path(args.out) / "int4_gemm_configs.json"
        table.write_text(json.dumps(tuned_table(rows), indent=1) + "\n")
        for row in rows:
            print(f"best {row['shape']} M={row['m']}: {row['best_sweep']}")
        print(f"wrote {table}: copy it over kernels/int4_gemm_configs.json")


if __name__ == "__main__":
    main()
