"""Marks the down projection's batch-1 GEMV rows `gated` in the shipped launch tables (bf16
`kernels/gemv_configs.json`, `kernels/int4_gemm_configs.json`): the layer then hands the GEMV the
MLP's gate | up and the launch computes silu(gate) * up itself (an A/B on the GPU:
`scripts/h200_pending.sh gated`, which restores the tables afterwards).

    python scripts/mark_gated_rows.py [--intermediate 14336]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KERNELS = Path(__file__).resolve().parent.parent / "kernels"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intermediate", type=int, default=14336, help="down's in_features")
    args = parser.parse_args()
    path = KERNELS / "gemv_configs.json"
    table = json.loads(path.read_text())
    marked = 0
    for shape, rows in table["shapes"].items():
        if int(shape.split("x")[0]) == args.intermediate:
            for row in rows:
                if row.get("max_tokens") == 1:
                    row["gated"] = True
                    marked += 1
    path.write_text(json.dumps(table, indent=2) + "\n")
    path = KERNELS / "int4_gemm_configs.json"
    table = json.loads(path.read_text())
    for row in table["configs"]:
        if row["k"] == args.intermediate and row["gemv"] and row["m_bucket"] == 1:
            row["gated"] = True
            marked += 1
    path.write_text(json.dumps(table, indent=2) + "\n")
    print(f"marked {marked} rows gated")


if __name__ == "__main__":
    main()
