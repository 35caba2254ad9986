"""FP8 GEMM microbenchmark at Llama-3.1-8B projection shapes (run on the H200).

    python scripts/bench_fp8_gemm.py [--sweep] [--out DIR]      # JSON to DIR or $OUT

For M (tokens) in 1, 64, 256, 8192 and the qkv, o, gate_up and down projections, medians of
CUDA-graph replays (`triton.testing.do_bench_cudagraph`) of:
- bf16: `F.linear` (cuBLAS), the baseline;
- fp8_linear: what the model runs (per-token activation quantization + the GEMM chosen by M);
- triton: `fp8_gemm` alone (its launch table, else the heuristic), and with --sweep the best of
  a block/split-K/warps grid for M <= 256;
- scaled_mm: `torch._scaled_mm` alone, row-wise scales (and with use_fast_accum);
- quantize: `quantize_fp8_per_token` alone.
Each timed call runs over enough distinct weight copies (>= 512 MiB in all) that the weights
stream from HBM, not L2, as in a real forward pass. TFLOP/s = 2*M*N*K / time; TB/s = bytes of
weight + activations + output / time (against 1,980 dense FP8 TFLOP/s and 4.8 TB/s peak).
Every FP8 GEMM gets split-K counters as the model's layers do (splits summed in the same
launch). It also sums the four shapes at M = 1 over 32 layers: the weight-streaming time of one
decode token. With --sweep it writes `fp8_gemm_configs.json` beside its JSON after every shape
(a run stopped by its time budget keeps the rows so far): for M <= SMALL_M_MAX, the best launch
where it beats the heuristic (`default_gemm_config`) by 3% or more; copy it over
kernels/fp8_gemm_configs.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from radixgen.kernels.fp8_gemm import (
    SMALL_M_MAX,
    default_gemm_config,
    fp8_gemm,
    fp8_linear,
    fp8_scaled_mm,
    fp8_split_k_counter_slots,
    gemm_config,
    quantize_fp8_per_token,
    quantize_fp8_per_token_ref,
)
from radixgen.kernels.launch_tables import format_shape_table

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
NUM_LAYERS = 32
TOKENS = (1, 64, 256, 8192)
STREAM_BYTES = 512 << 20
MIN_GAIN = 0.97  # a table row needs the swept launch at <= 97% of the heuristic's time


def median_ms(fn, copies: int) -> float:
    """Milliseconds of one call (graph replay of `copies` calls, divided)."""
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") / copies


def sweep_launches(swap_only: bool) -> list[dict]:
    """The launches --sweep times: the token-major grid (unless `swap_only`) and the swapped
    one (the weight rows on the dot's M side: FP8 wgmma, so 64 rows or more)."""
    launches = []
    if not swap_only:
        # Warps rather than stages: the M <= 64 tiles compile to mma.sync, whose operands the
        # stage count does not move, and at 4 warps the default tile spills registers on sm_90
        # (ptxas, tests/test_kernels_fp8_gemm.py); 8 warps do not.
        for block_n, split_k, warps in itertools.product((32, 64, 128), (1, 2, 4, 8, 16), (4, 8)):
            launches.append({"block_n": block_n, "split_k": split_k, "num_warps": warps})
    for block_n, split_k in itertools.product((64, 128, 256), (1, 2, 4, 8)):
        launches.append({"block_n": block_n, "split_k": split_k, "num_warps": 4, "swap_ab": True})
    return launches


def bench_shape(name: str, m: int, n: int, k: int, sweep: bool, swap_only: bool = False) -> dict:
    weight_bytes = n * k
    copies = max(2, min(64, -(-STREAM_BYTES // weight_bytes)))
    if m >= 4096:
        copies = 2  # compute bound: L2 reuse no longer matters
    weights_bf16 = [
        torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)
    ]
    quantized = [quantize_fp8_per_token_ref(w) for w in weights_bf16]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    x_q, x_scale = quantize_fp8_per_token(x)
    counters = torch.zeros(fp8_split_k_counter_slots(n), dtype=torch.int32, device="cuda")
    flops = 2 * m * n * k
    bytes_fp8 = n * k + m * k + 2 * m * n
    bytes_bf16 = 2 * n * k + 2 * m * k + 2 * m * n

    def run_all(fn):
        return lambda: [fn(i) for i in range(copies)]

    results: dict[str, float] = {}
    results["bf16"] = median_ms(run_all(lambda i: F.linear(x, weights_bf16[i])), copies)
    weights_bf16.clear()  # frees the bf16 copies before the FP8 runs
    torch.cuda.empty_cache()
    results["fp8_linear"] = median_ms(
        run_all(lambda i: fp8_linear(x, *quantized[i], split_k_counters=counters)), copies
    )
    results["quantize"] = median_ms(run_all(lambda i: quantize_fp8_per_token(x)), copies)
    if m <= 1024:
        results["triton"] = median_ms(
            run_all(
                lambda i: fp8_gemm(
                    x_q, x_scale, *quantized[i], torch.bfloat16, split_k_counters=counters
                )
            ),
            copies,
        )
    if m >= 16:
        for fast in (False, True):
            results["scaled_mm" + ("_fast_accum" if fast else "")] = median_ms(
                run_all(
                    lambda i, fast=fast: fp8_scaled_mm(
                        x_q, x_scale, *quantized[i], torch.bfloat16, use_fast_accum=fast
                    )
                ),
                copies,
            )
    row = {
        "shape": name,
        "m": m,
        "n": n,
        "k": k,
        "heuristic_triton_config": default_gemm_config(m, n, k, x.device),
        "triton_config": gemm_config(m, n, k, x.device),
        "ms": results,
        "tflops": {key: flops / ms / 1e9 for key, ms in results.items() if key != "quantize"},
        "tb_per_s": {
            key: (bytes_bf16 if key == "bf16" else bytes_fp8) / ms / 1e9
            for key, ms in results.items()
            if key != "quantize"
        },
    }
    if sweep and m <= 256:
        best, timed = None, {}
        for config in sweep_launches(swap_only):
            try:
                ms = median_ms(
                    run_all(
                        lambda i, c=config: fp8_gemm(
                            x_q,
                            x_scale,
                            *quantized[i],
                            torch.bfloat16,
                            **c,
                            split_k_counters=counters,
                        )
                    ),
                    copies,
                )
            except Exception as error:  # noqa: BLE001 (a config the GPU cannot run: skip it)
                print(f"  {name} m={m} {config}: {type(error).__name__}")
                continue
            timed[tuple(config.values())] = ms
            if best is None or ms < best[1]:
                best = (config, ms)
        # The launch in use (the table's row, else the heuristic's) competes too: a sweep that
        # finds nothing faster keeps it.
        current = row["triton_config"]
        current_launch = {key: current[key] for key in ("block_n", "split_k", "num_warps")}
        if current.get("swap_ab"):
            current_launch["swap_ab"] = True
        if "triton" in results and (best is None or results["triton"] < best[1]):
            best = (current_launch, results["triton"])
        if best is not None:
            row["triton_sweep_best"] = {
                "config": best[0],
                "ms": best[1],
                "tflops": flops / best[1] / 1e9,
                "tb_per_s": bytes_fp8 / best[1] / 1e9,
            }
            heuristic = default_gemm_config(m, n, k, x.device)
            key = (heuristic["block_n"], heuristic["split_k"], heuristic["num_warps"])
            row["triton_sweep_heuristic_ms"] = timed.get(key)
    return row


def write_table(rows: list[dict], out_dir: Path) -> None:
    """`fp8_gemm_configs.json`: per shape, the swept launches for M <= SMALL_M_MAX that beat
    the heuristic's time by MIN_GAIN (a row serves up to its M tokens)."""
    shapes: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["m"]):
        best, heuristic_ms = row.get("triton_sweep_best"), row.get("triton_sweep_heuristic_ms")
        if row["m"] > SMALL_M_MAX or best is None:
            continue
        if heuristic_ms is not None and best["ms"] > MIN_GAIN * heuristic_ms:
            continue
        key = f"{row['k']}x{row['n']}"
        shapes.setdefault(key, []).append({"max_tokens": row["m"], **best["config"]})
    table = {
        "note": "Written by scripts/bench_fp8_gemm.py --sweep: per shape, the fastest launch at "
        "each swept M <= SMALL_M_MAX that beat the heuristic by 3% or more (a row serves up to "
        "its max_tokens); copy over kernels/fp8_gemm_configs.json.",
        "source": f"{torch.cuda.get_device_name()}, triton {triton.__version__}",
        "shapes": shapes,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "fp8_gemm_configs.json").write_text(format_shape_table(table))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", action="store_true", help="tune the Triton GEMM for M <= 256")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument(
        "--swap-only",
        action="store_true",
        help="sweep only the swapped (weight-rows-as-M) launches",
    )
    args = parser.parse_args()
    rows = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    columns = ["shape", "M", "bf16 ms", "fp8_linear ms", "triton ms", "scaled_mm ms"]
    columns += ["fp8 TFLOP/s", "fp8 TB/s", "speed-up"]
    print("| " + " | ".join(columns) + " |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for m in args.tokens:
        for name, (n, k) in SHAPES.items():
            row = bench_shape(name, m, n, k, args.sweep, args.swap_only)
            rows.append(row)
            ms = row["ms"]
            print(
                f"| {name} | {m} | {ms['bf16']:.4f} | {ms['fp8_linear']:.4f} | "
                f"{ms.get('triton', float('nan')):.4f} | {ms.get('scaled_mm', float('nan')):.4f} | "
                f"{row['tflops']['fp8_linear']:.0f} | {row['tb_per_s']['fp8_linear']:.2f} | "
                f"{ms['bf16'] / ms['fp8_linear']:.2f}x |",
                flush=True,
            )
            if "triton_sweep_best" in row:
                print(f"  best triton: {row['triton_sweep_best']}")
                write_table(rows, Path(args.out))
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if 1 in args.tokens:
        decode = [r for r in rows if r["m"] == 1]
        summary["decode_weight_stream_ms"] = {
            key: NUM_LAYERS * sum(r["ms"][key] for r in decode) for key in ("bf16", "fp8_linear")
        }
        print(f"decode weight streaming, 32 layers, M=1: {summary['decode_weight_stream_ms']}")
    path = Path(args.out) / "bench_fp8_gemm.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
