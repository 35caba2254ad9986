"""int4 weight-only GEMM microbenchmark at Llama-3.1-8B projection shapes (run on the H200).

    python scripts/bench_int4_gemm.py [--tokens 1 64] [--sweep] [--out DIR]   # JSON to DIR or $OUT

For M (tokens) in --tokens and the qkv, o, gate_up and down projections (group 128), medians of
CUDA-graph replays (`triton.testing.do_bench_cudagraph`) of:
- bf16: `F.linear` (cuBLAS) on the same shape, the baseline;
- int4_linear: what the model runs (the GEMV, GEMM or dequantize + cuBLAS, chosen by M);
- for M > 4, both large-M paths alone: triton_gemm (the fused dequantize-GEMM) and
  dequantize_then_cublas (`dequantize_int4` then a bf16 matmul), to place DEQUANTIZE_M_MIN;
- with --sweep, the best of a grid of kernels, block sizes and split-K (for tuning the defaults).
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
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

# Same shapes, layer count, HBM-streaming copies and timer as the FP8 GEMM benchmark beside it.
from bench_fp8_gemm import NUM_LAYERS, SHAPES, STREAM_BYTES, median_ms

from radixgen.kernels.int4_gemm import (
    DEQUANTIZE_M_MIN,
    GEMV_M_MAX,
    default_int4_config,
    dequantize_int4,
    int4_gemm,
    int4_linear,
    int4_linear_ref,
    pack_int4_rows,
)
from radixgen.runtime.models.int4_checkpoint import quantize_rtn_int4

GROUP_SIZE = 128


def random_int4_weight(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runtime-layout (qweight [K/8, N], scales, zeros [K/G, N] bf16) of a random weight."""
    codes, scales, zeros = quantize_rtn_int4(torch.randn(n, k, device="cuda") * 0.02, GROUP_SIZE)
    qweight = pack_int4_rows(codes.T.contiguous())
    return qweight, scales.T.contiguous().bfloat16(), zeros.T.contiguous().bfloat16()


def bench_shape(name: str, m: int, n: int, k: int, sweep: bool) -> dict:
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
    results["int4_linear"] = median_ms(
        run_all(lambda i: int4_linear(x, *weights[i], GROUP_SIZE)), copies
    )
    if m > GEMV_M_MAX:  # the two large-M paths side by side (int4_linear picks one by M)
        results["triton_gemm"] = median_ms(
            run_all(lambda i: int4_gemm(x, *weights[i], GROUP_SIZE)), copies
        )
        results["dequantize_then_cublas"] = median_ms(
            run_all(lambda i: x @ dequantize_int4(*weights[i], GROUP_SIZE)), copies
        )
    # Check against the reference once (a wrong kernel must not post a speed).
    out = int4_linear(x, *weights[0], GROUP_SIZE)
    ref = int4_linear_ref(x.float(), *weights[0], GROUP_SIZE)
    error = ((out.float() - ref).norm() / ref.norm()).item()
    best = None
    if sweep:
        # 24 configs of the kernel M selects (about 1 s each with compilation).
        gemv = m <= GEMV_M_MAX
        splits = (2, 4, 8, 16) if gemv else (1, 2, 4, 8)
        grid = itertools.product(
            (32, 64, 128) if gemv else (64, 128), (64, 128) if gemv else (32, 64, 128), splits
        )
        for block_n, block_k, split_k in grid:
            config = dict(gemv=gemv, block_n=block_n, block_k=block_k, split_k=split_k)
            if not gemv:
                config["block_m"] = min(64, max(16, triton.next_power_of_2(m)))
            try:
                ms = median_ms(
                    run_all(lambda i, c=config: int4_gemm(x, *weights[i], GROUP_SIZE, **c)), copies
                )
            except Exception as error_:  # noqa: BLE001 (a config that does not compile)
                print(f"  {name} M={m} {config}: {type(error_).__name__}")
                continue
            if best is None or ms < best["ms"]:
                best = {"ms": ms, **config}
    row = {
        "shape": name,
        "m": m,
        "n": n,
        "k": k,
        "ms": results,
        "default_config": default_int4_config(m, n, k, GROUP_SIZE, x.device),
        "int4_TBps": packed_bytes / results["int4_linear"] / 1e9,
        "bf16_TBps": 2 * n * k / results["bf16"] / 1e9,
        "relative_error_vs_ref": error,
        "best_sweep": best,
    }
    if best is not None:
        row["best_sweep_TBps"] = packed_bytes / best["ms"] / 1e9
    print(json.dumps(row))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    rows = [
        bench_shape(name, m, n, k, args.sweep)
        for m in args.tokens
        for name, (n, k) in SHAPES.items()
    ]
    per_step = {}
    for m in args.tokens:
        selected = [row for row in rows if row["m"] == m]
        per_step[m] = {
            key: NUM_LAYERS * sum(row["ms"][key] for row in selected)
            for key in ("bf16", "int4_linear")
        }
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


if __name__ == "__main__":
    main()
