"""The split-K GEMV (`kernels/gemv.py`) against `F.linear` at batch 1, Llama-3.1-8B shapes, bf16,
on the GPU; `--sweep` writes the launch table the linear layers read.

    python scripts/bench_gemv.py [--sweep] [--out DIR]      # JSON (and the table) to DIR / $OUT

Each timed call runs over enough distinct weight copies (>= 512 MiB in all) that the weights
stream from HBM as in a decode step, replayed from a CUDA graph (`bench_fp8_gemm.py`'s timer).
For each shape: `F.linear`, then with `--sweep` every config of `sweep_configs` (checked against
`F.linear` first) until the budget runs out. The table (`$OUT/gemv_configs.json`; copy it over
kernels/gemv_configs.json) keeps a shape only where the best config beats `F.linear` by
`MIN_GAIN`: elsewhere the layers keep cuBLAS.
"""

from __future__ import annotations

import argparse
import dataclasses
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

from radixgen.kernels.gemv import GemvConfig, gemv, gemv_counter_slots
from radixgen.kernels.launch_tables import format_shape_table

MIN_GAIN = 0.97  # a table row needs the GEMV at <= 97% of F.linear's time
SWEEP_BUDGET_S = 150.0
MAX_ELEMENTS_PER_THREAD = 64  # more spill registers on sm_90 (tests/test_kernels_gemv.py)


def sweep_configs() -> list[GemvConfig]:
    """Tiles of at most MAX_ELEMENTS_PER_THREAD weight elements per thread, 1-8 K splits."""
    configs = []
    for block_n, block_k, warps, split_k in itertools.product(
        (8, 16, 32), (256, 512), (4, 8), (1, 2, 4, 8)
    ):
        if block_n * block_k <= MAX_ELEMENTS_PER_THREAD * 32 * warps:
            configs.append(GemvConfig(block_n, block_k, split_k, warps))
    return configs


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
    best, tried = None, 0
    for config in sweep_configs():
        if time.monotonic() > deadline:
            break
        out = gemv(x, weights[0], config, counters)
        if not torch.allclose(out.float(), reference, atol=2e-2, rtol=2e-2):
            raise AssertionError(f"{name}: {config} disagrees with F.linear")
        calls = lambda c=config: [gemv(x, w, c, counters) for w in weights]  # noqa: E731
        # 25 ms of replays per config rather than 100: more configs within the budget.
        ms = triton.testing.do_bench_cudagraph(calls, rep=25, return_mode="median") / copies
        tried += 1
        if best is None or ms < best[1]:
            best = (config, ms)
    if best is not None:
        row |= {
            "gemv_best": dataclasses.asdict(best[0]),
            "gemv_ms": best[1],
            "gemv_tb_per_s": 2 * n * k / best[1] / 1e9,
            "speedup": linear_ms / best[1],
        }
    row["configs_tried"] = tried
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + SWEEP_BUDGET_S
    rows, shapes = [], {}
    for i, (name, (n, k)) in enumerate(SHAPES.items()):
        share = time.monotonic() + max(0.0, deadline - time.monotonic()) / (len(SHAPES) - i)
        row = bench_shape(name, n, k, args.sweep, share)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if row.get("gemv_ms", float("inf")) <= MIN_GAIN * row["linear_ms"]:
            shapes[f"{k}x{n}"] = [{"max_tokens": 1, **row["gemv_best"]}]
    result = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
              "date": time.strftime("%Y-%m-%d"), "rows": rows}  # fmt: skip
    (out_dir / "bench_gemv.json").write_text(json.dumps(result, indent=1))
    if args.sweep:
        table = {
            "note": "From scripts/bench_gemv.py --sweep: shapes where the GEMV beat F.linear by "
            f"{round((1 - MIN_GAIN) * 100)}% or more at 1 token; copy over "
            "kernels/gemv_configs.json.",
            "source": f"{result['device']}, triton {triton.__version__}, {result['date']}",
            "shapes": shapes,
        }
        (out_dir / "gemv_configs.json").write_text(format_shape_table(table))


if __name__ == "__main__":
    main()
