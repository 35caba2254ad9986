"""Plots for docs/benchmarks.md from the JSON files the bench modes write.

    python -m radixgen.runtime.bench.plots RESULTS_DIR docs/img

Draws, when the inputs exist:
- `decode_throughput_vs_batch.png`: decode tokens/s against batch size (`latency_*.json`), and
  the HF peer's output tokens/s (`hf*.json`);
- `latency_cdf.png`: TTFT and end-to-end latency CDFs of the serving runs (`serving_*.json`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(paths) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(paths)}


def plot_throughput(results_dir: Path, out_dir: Path) -> Path | None:
    import matplotlib.pyplot as plt

    latency = _load(results_dir.glob("latency_*.json"))
    hf = _load(results_dir.glob("hf*.json"))
    if not latency and not hf:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, data in latency.items():
        rows = data["results"]
        ax.plot(
            [r["batch_size"] for r in rows],
            [r["decode_tokens_per_s"] for r in rows],
            "o-",
            label=f"radixgen {name}",
        )
    for name, data in hf.items():
        rows = [r for r in data["results"] if r["variant"] == "hf-eager-dynamic-cache"]
        if rows:
            ax.plot(
                [r["batch_size"] for r in rows],
                [r["output_token_throughput"] for r in rows],
                "s--",
                label=f"transformers ({name})",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("decode tokens / s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    path = out_dir / "decode_throughput_vs_batch.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_latency_cdf(results_dir: Path, out_dir: Path) -> Path | None:
    import matplotlib.pyplot as plt
    import numpy as np

    serving = _load(results_dir.glob("serving_*.json"))
    serving = {k: v for k, v in serving.items() if v.get("per_request")}
    if not serving:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, data in serving.items():
        for ax, key in zip(axes, ("ttft_ms", "e2e_ms"), strict=True):
            values = np.sort([r[key] for r in data["per_request"]])
            ax.plot(values / 1000, np.arange(1, len(values) + 1) / len(values), label=name)
    for ax, title in zip(axes, ("time to first token", "end-to-end latency"), strict=True):
        ax.set_xlabel("seconds")
        ax.set_ylabel("fraction of requests")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    path = out_dir / "latency_cdf.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2:
        sys.exit("usage: python -m radixgen.runtime.bench.plots RESULTS_DIR OUT_DIR")
    results_dir, out_dir = Path(args[0]), Path(args[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in (plot_throughput(results_dir, out_dir), plot_latency_cdf(results_dir, out_dir)):
        if path:
            print(path)


if __name__ == "__main__":
    main()
