"""The split-K GEMV (`kernels/gemv.py`) against `F.linear` at batch 1, Llama-3.1-8B shapes, bf16,
on the GPU; `--sweep` writes the launch table the linear layers read. With `--fp8`: the FP8
GEMV (e4m3 weights; W8A16 launches with the bf16 activations as they are, then W8A8 ones with
e4m3 activations) against the FP8 layers' skinny GEMM (`fp8_gemm`, what they run without a
table row; timed without the activations' quantization, which an `a16` row also saves),
writing `gemv_fp8_configs.json` and, for an A/B in the decode step, every shape's best W8A16
launch in `gemv_fp8_a16_configs.json`.

    python scripts/bench_gemv.py [--sweep] [--fp8] [--out DIR]  # JSON, table: DIR or $OUT

Each timed call runs over enough distinct weight copies (>= 512 MiB in all) that the weights
stream from HBM as in a decode step, replayed from a CUDA graph (`bench_fp8_gemm.py`'s timer).
For each shape: `F.linear`, then with `--sweep` every config of `sweep_configs` (checked against
`F.linear` first) until the budget runs out; for the down projection also the `gated` launches
(x = the MLP's gate | up, silu(gate) * up computed as the GEMV loads it) against the activation
kernel followed by the best plain launch, the table taking a gated row where it wins; for
gate | up likewise its `silu_out` launches (the GEMV writing silu(gate) * up) against `F.linear`
followed by the activation kernel. The table (`$OUT/gemv_configs.json`; copy it over
kernels/gemv_configs.json) keeps a shape only where the best config beats `F.linear` by
`MIN_GAIN`: elsewhere the layers keep cuBLAS.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

# Same shapes, HBM-streaming copies and timer as the FP8 GEMM benchmark beside it.
from bench_fp8_gemm import SHAPES, STREAM_BYTES, median_ms

from radixgen.kernels.activation import silu_and_mul
from radixgen.kernels.fp8_gemm import (
    fp8_gemm,
    fp8_split_k_counter_slots,
    quantize_fp8_per_token,
    quantize_fp8_per_token_ref,
)
from radixgen.kernels.gemv import GemvConfig, gemv, gemv_counter_slots
from radixgen.kernels.launch_tables import format_shape_table

MIN_GAIN = 0.97  # a table row needs the GEMV at <= 97% of F.linear's time
SWEEP_BUDGET_S = 150.0
MAX_ELEMENTS_PER_THREAD = 64  # more spill registers on sm_90 (tests/test_kernels_gemv.py)


def sweep_configs(fp8: bool = False, paths: tuple[str, ...] | None = None) -> list[GemvConfig]:
    """Tiles of at most MAX_ELEMENTS_PER_THREAD weight elements per thread, 1-8 K splits (FP8:
    longer K steps, the same bytes a step with half the bytes an element; each first with its
    products summed in packed fp16, `packed_f16`: ptxas sm_90 at 16 x 512, 161 instructions in
    the loop against 371 and 56 registers against 181)."""
    configs = []
    block_ks = (512, 1024) if fp8 else (256, 512)
    # FP8: "a16" (W8A16: bf16 x, no quantization pass before the layer, in packed fp16) first,
    # then e4m3 x in packed fp16, then in float32.
    if paths is None:
        paths = ("a16", "packed", "float32") if fp8 else ("float32",)
    # Fewer splits first: the budget may end a shape's sweep, and 1-2 splits won every FP8 shape.
    for path, split_k, block_n, block_k, warps in itertools.product(
        paths, (1, 2, 4, 8), (8, 16, 32), block_ks, (4, 8)
    ):
        packed = path in ("a16", "packed")
        # The packed paths hold half the registers an element (16 x 1,024 / 4 warps: 118).
        if block_n * block_k <= MAX_ELEMENTS_PER_THREAD * (2 if packed else 1) * 32 * warps:
            configs.append(
                GemvConfig(block_n, block_k, split_k, warps, packed_f16=packed, a16=path == "a16")
            )
    return configs


def sweep_shape(
    row: dict, configs: list[GemvConfig], run, reference, copies: int, weight_bytes: int,
    baseline_ms: float, deadline: float,
) -> dict:  # fmt: skip
    """Adds the fastest of `configs` to `row`: `run(i, config)` multiplies weight copy i; each
    config is checked against `reference(config)` (copy 0's product) before it is timed, until
    `deadline`."""
    best, tried = None, 0
    for config in configs:
        if time.monotonic() > deadline:
            break
        out, expected = run(0, config).float(), reference(config)
        # Norm-wise: the launches sum in other orders and precisions (packed fp16 lanes), so
        # single outputs near zero differ by more than an elementwise tolerance allows.
        if ((out - expected).norm() / expected.norm()).item() > 1e-2:
            raise AssertionError(f"{row['shape']}: {config} disagrees with the baseline")
        calls = lambda c=config: [run(i, c) for i in range(copies)]  # noqa: E731
        # 25 ms of replays per config rather than 100: more configs within the budget.
        ms = triton.testing.do_bench_cudagraph(calls, rep=25, return_mode="median") / copies
        tried += 1
        if best is None or ms < best[1]:
            best = (config, ms)
    if best is not None:
        row |= {
            "gemv_best": dataclasses.asdict(best[0]),
            "gemv_ms": best[1],
            "gemv_tb_per_s": weight_bytes / best[1] / 1e9,
            "speedup": baseline_ms / best[1],
        }
    return row | {"configs_tried": tried}


def bench_shape_fp8(
    name: str, n: int, k: int, sweep: bool, deadline: float,
    paths: tuple[str, ...] | None = None,
) -> dict:  # fmt: skip
    """The FP8 GEMV against `fp8_gemm` (the FP8 layers' path at 1 token), e4m3 operands."""
    copies = max(2, min(64, -(-STREAM_BYTES // (n * k))))
    weights = [
        quantize_fp8_per_token_ref(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        for _ in range(copies)
    ]  # (e4m3 [n, k], fp32 [n]) per copy
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    xq, x_scale = quantize_fp8_per_token(x)
    counters = torch.zeros(
        max(fp8_split_k_counter_slots(n), gemv_counter_slots(n)), dtype=torch.int32, device="cuda"
    )

    def skinny(i):
        return fp8_gemm(xq, x_scale, *weights[i], torch.bfloat16, split_k_counters=counters)

    def fp8_gemv(i, config):
        wq, w_scale = weights[i]
        if config.a16:  # the bf16 activations as they are (W8A16)
            return gemv(x, wq, config, counters, weight_scale=w_scale)
        return gemv(
            xq, wq, config, counters, x_scale=x_scale, weight_scale=w_scale,
            out_dtype=torch.bfloat16,
        )  # fmt: skip

    # W8A8 launches against the skinny GEMM's output, W8A16 ones against x times the
    # dequantized weight (they differ by the activations' quantization error).
    w8a8 = skinny(0).float()
    wq, w_scale = weights[0]
    w8a16 = (x.float() @ wq.float().t()) * w_scale[None, :]

    baseline_ms = median_ms(lambda: [skinny(i) for i in range(copies)], copies)
    row = {"shape": name, "n": n, "k": k, "fp8_gemm_ms": baseline_ms,
           "fp8_gemm_tb_per_s": n * k / baseline_ms / 1e9}  # fmt: skip
    if not sweep:
        return row
    # The W8A16 launches in the first half of the shape's time, recorded on their own (the
    # microbenchmark does not credit them the quantization passes they remove: an `a16` table
    # is for an A/B in the decode step), then the W8A8 ones; the row's best is the faster.
    configs = sweep_configs(fp8=True, paths=paths)
    start = time.monotonic()
    a16_share = 0.5 if any(not c.a16 for c in configs) else 1.0
    a16 = sweep_shape(
        {"shape": name}, [c for c in configs if c.a16], fp8_gemv, lambda c: w8a16, copies, n * k,
        baseline_ms, start + (deadline - start) * a16_share,
    )  # fmt: skip
    row = sweep_shape(
        row, [c for c in configs if not c.a16], fp8_gemv, lambda c: w8a8, copies, n * k,
        baseline_ms, deadline,
    )  # fmt: skip
    row["configs_tried"] += a16["configs_tried"]
    if "gemv_best" in a16:
        row["a16_best"], row["a16_ms"] = a16["gemv_best"], a16["gemv_ms"]
        if row["a16_ms"] < row.get("gemv_ms", float("inf")):
            for key in ("gemv_best", "gemv_ms", "gemv_tb_per_s", "speedup"):
                row[key] = a16[key]
    return row


def sweep_fused(row, fusion, run_fused, unfused, copies, weight_bytes, deadline) -> dict:
    """Adds to `row` the best launch of the fusion (`"gated"` or `"silu_out"`, a GemvConfig
    flag) whose `run_fused(i, config)` replaces the two kernels `unfused(i)` (weight copy i) as
    the MLP runs them, checked against `unfused(0)`; the table takes it where it wins."""
    unfused_ms = median_ms(lambda: [unfused(i) for i in range(copies)], copies)
    expected = unfused(0).float()
    fused_row = sweep_shape(
        {"shape": f"{row['shape']} {fusion}"},
        [dataclasses.replace(c, **{fusion: True}) for c in sweep_configs()],
        run_fused, lambda c: expected, copies, weight_bytes, unfused_ms, deadline,
    )  # fmt: skip
    row["unfused_ms"] = unfused_ms
    if "gemv_best" in fused_row:
        row[f"{fusion}_best"], row[f"{fusion}_ms"] = fused_row["gemv_best"], fused_row["gemv_ms"]
        if fused_row["gemv_ms"] <= MIN_GAIN * unfused_ms:  # the table takes the fused launch
            row["gemv_best"], row["gemv_ms"] = fused_row["gemv_best"], fused_row["gemv_ms"]
    return row


def bench_shape(name: str, n: int, k: int, sweep: bool, deadline: float) -> dict:
    copies = max(2, min(64, -(-STREAM_BYTES // (2 * n * k))))
    weights = [
        torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)
    ]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    counters = torch.zeros(gemv_counter_slots(n), dtype=torch.int32, device="cuda")
    linear_ms = median_ms(lambda: [F.linear(x, w) for w in weights], copies)
    row = {"shape": name, "n": n, "k": k, "linear_ms": linear_ms,
           "linear_tb_per_s": 2 * n * k / linear_ms / 1e9}  # fmt: skip
    if not sweep:
        return row
    reference = F.linear(x.float(), weights[0].float())
    # down and gate_up: half the time for the plain launches, then the fused ones.
    fused = name in ("down", "gate_up")
    start = time.monotonic()
    row = sweep_shape(
        row, sweep_configs(), lambda i, c: gemv(x, weights[i], c, counters), lambda c: reference,
        copies, 2 * n * k, linear_ms, start + (deadline - start) / 2 if fused else deadline,
    )  # fmt: skip
    if name == "gate_up":  # silu_out launches against F.linear then the activation kernel
        return sweep_fused(
            row, "silu_out", lambda i, c: gemv(x, weights[i], c, counters, silu_out=True),
            lambda i: silu_and_mul(F.linear(x, weights[i])), copies, 2 * n * k, deadline,
        )  # fmt: skip
    if name != "down":
        return row
    # gated launches (x = the MLP's gate | up, silu(gate) * up computed as it loads) against
    # the activation kernel followed by the best plain launch (or F.linear).
    gate_up = torch.randn(1, 2 * k, device="cuda", dtype=torch.bfloat16)
    plain = GemvConfig(**row["gemv_best"]) if "gemv_best" in row else None

    def unfused(i):
        activated = silu_and_mul(gate_up)
        return F.linear(activated, weights[i]) if plain is None else gemv(
            activated, weights[i], plain, counters
        )  # fmt: skip

    return sweep_fused(
        row, "gated", lambda i, c: gemv(gate_up, weights[i], c, counters, gated=True), unfused,
        copies, 2 * n * k, deadline,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--fp8", action="store_true", help="the FP8 GEMV against fp8_gemm")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--budget-s", type=float, default=SWEEP_BUDGET_S, help="the sweep's time")
    parser.add_argument(
        "--paths", help="--fp8: the launches to sweep, of a16,packed,float32 (default: all)"
    )
    args = parser.parse_args()
    if args.fp8:
        paths = tuple(args.paths.split(",")) if args.paths else None
        bench, baseline = functools.partial(bench_shape_fp8, paths=paths), "fp8_gemm_ms"
    else:
        bench, baseline = bench_shape, "linear_ms"
    prefix = "gemv_fp8" if args.fp8 else "gemv"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    rows, shapes = [], {}
    for i, (name, (n, k)) in enumerate(SHAPES.items()):
        share = time.monotonic() + max(0.0, deadline - time.monotonic()) / (len(SHAPES) - i)
        row = bench(name, n, k, args.sweep, share)
        rows.append(row)
        print(json.dumps(row), flush=True)
        # A gated or silu_out row already beat the activation kernel with the plain product.
        best = row.get("gemv_best", {})
        fused = best.get("gated", False) or best.get("silu_out", False)
        if fused or row.get("gemv_ms", float("inf")) <= MIN_GAIN * row[baseline]:
            shapes[f"{k}x{n}"] = [{"max_tokens": 1, **row["gemv_best"]}]
    result = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
              "date": time.strftime("%Y-%m-%d"), "rows": rows}  # fmt: skip
    (out_dir / f"bench_{prefix}.json").write_text(json.dumps(result, indent=1))
    if args.sweep:
        against = "fp8_gemm" if args.fp8 else "F.linear"
        table = {
            "note": f"From scripts/bench_gemv.py --sweep{' --fp8' if args.fp8 else ''}: shapes "
            f"where the GEMV beat {against} by {round((1 - MIN_GAIN) * 100)}% or more at 1 "
            f"token; copy over kernels/{prefix}_configs.json.",
            "source": f"{result['device']}, triton {triton.__version__}, {result['date']}",
            "shapes": shapes,
        }
        (out_dir / f"{prefix}_configs.json").write_text(format_shape_table(table))
        if args.fp8:  # every shape's best W8A16 launch, for an A/B in the decode step
            a16_rows = {f"{row['k']}x{row['n']}": [{"max_tokens": 1, **row["a16_best"]}]
                        for row in rows if "a16_best" in row}  # fmt: skip
            a16_table = table | {
                "note": "From scripts/bench_gemv.py --sweep --fp8: each shape's fastest W8A16 "
                "(a16, packed fp16) launch at 1 token.",
                "shapes": a16_rows,
            }
            (out_dir / f"{prefix}_a16_configs.json").write_text(format_shape_table(a16_table))


if __name__ == "__main__":
    main()
