"""Marks the batch-1 GEMV rows of the shipped launch tables for one of the MLP's opt-in fusions,
for an A/B on the GPU (`scripts/h200_pending.sh gated` / `silu-out`, which restore the tables
afterwards):

- `gated`: the down projection's rows (bf16 `kernels/gemv_configs.json`,
  `kernels/int4_gemm_configs.json`): the layer hands the GEMV the MLP's gate | up and the launch
  computes silu(gate) * up as it loads x;
- `silu_out`: the merged gate | up projection's rows (those two tables and the FP8 one,
  `kernels/gemv_fp8_configs.json`): the launch writes silu(gate) * up in its epilogue. A table
  without a gate | up row (the bf16 one keeps cuBLAS there) gets `BF16_GATE_UP`'s launch;
- `add_norm`: the o and down projections' rows of the bf16 table: the launch also adds the
  residual and writes the next RMSNorm of the row (16-bit GEMVs only);
- `rope_store`: the merged q | k | v projection's rows (all three tables): the launch also
  rotates q and k and writes k and v into the KV cache (no rotary kernel after it).

    python scripts/mark_fusion_rows.py {gated,silu_out,add_norm,rope_store} [--hidden 4096]
        [--intermediate 14336] [--qkv 6144] [--int4-buckets 16 32 64 128]

`--int4-buckets` (silu_out): the int4 table's gate | up rows of those token buckets too, where
they are nibble-GEMM launches (the epilogue of a `[BLOCK_M, BLOCK_N]` tile).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from radixgen.kernels.launch_tables import format_shape_table

KERNELS = Path(__file__).resolve().parent.parent / "kernels"
# The bf16 GEMV's best gate | up launch at 1 token on the H200 (seventeenth session: 54.6 us
# against cuBLAS's 54.7, so the table kept cuBLAS there).
BF16_GATE_UP = {"block_n": 16, "block_k": 256, "split_k": 1, "num_warps": 4}


def mark_shape_table(path: Path, shape: str, flag: str, missing: dict | None) -> int:
    """Marks the batch-1 rows of `shape` ("KxN") in a shape-keyed GEMV table; adds `missing`
    as its batch-1 row where it has none (if given)."""
    table = json.loads(path.read_text())
    rows = table["shapes"].setdefault(shape, [])
    if not any(row.get("max_tokens") == 1 for row in rows) and missing is not None:
        rows.insert(0, {"max_tokens": 1, **missing})
    if not rows:
        del table["shapes"][shape]
    marked = 0
    for row in rows:
        if row.get("max_tokens") == 1:
            row[flag] = True
            marked += 1
    path.write_text(format_shape_table(table))  # the shipped files' layout
    return marked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fusion", choices=("gated", "silu_out", "add_norm", "rope_store"))
    parser.add_argument("--hidden", type=int, default=4096, help="gate_up's in_features")
    parser.add_argument("--intermediate", type=int, default=14336, help="down's in_features")
    parser.add_argument("--qkv", type=int, default=6144, help="q | k | v's out_features")
    parser.add_argument(
        "--int4-buckets", type=int, nargs="*", default=[],
        help="silu_out: also the int4 nibble-GEMM gate | up rows of these token buckets",
    )  # fmt: skip
    args = parser.parse_args()
    if args.fusion == "add_norm":  # o and down (N = hidden), bf16 only
        marked = sum(
            mark_shape_table(KERNELS / "gemv_configs.json", f"{k}x{args.hidden}", "add_norm", None)
            for k in (args.hidden, args.intermediate)
        )
        print(f"marked {marked} rows add_norm")
        return
    if args.fusion == "gated":  # the down projection: K = intermediate, N = hidden
        k, n, tables = args.intermediate, args.hidden, ("gemv_configs.json",)
    elif args.fusion == "rope_store":  # the q | k | v projection: K = hidden
        k, n = args.hidden, args.qkv
        tables = ("gemv_configs.json", "gemv_fp8_configs.json")
    else:  # the gate | up projection: K = hidden, N = 2 * intermediate
        k, n = args.hidden, 2 * args.intermediate
        tables = ("gemv_configs.json", "gemv_fp8_configs.json")
    marked = 0
    for name in tables:
        missing = (
            BF16_GATE_UP if name == "gemv_configs.json" and args.fusion == "silu_out" else None
        )
        marked += mark_shape_table(KERNELS / name, f"{k}x{n}", args.fusion, missing)
    path = KERNELS / "int4_gemm_configs.json"
    table = json.loads(path.read_text())
    gemm_buckets = set(args.int4_buckets) if args.fusion == "silu_out" else set()
    for row in table["configs"]:
        if (row["k"], row["n"]) != (k, n):
            continue
        batch_1 = row["gemv"] and row["m_bucket"] == 1
        nibble_gemm = not row["gemv"] and row.get("per_nibble", True)
        if batch_1 or (nibble_gemm and row["m_bucket"] in gemm_buckets):
            row[args.fusion] = True
            marked += 1
    path.write_text(json.dumps(table, indent=1) + "\n")  # as bench_int4_gemm.py writes it
    print(f"marked {marked} rows {args.fusion}")


if __name__ == "__main__":
    main()
