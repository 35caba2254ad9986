"""Measures what the DSL's prefix sharing saves: run_batch with and without warming the
common prefix, and fork(n) against n independent runs of the same prefix.

    python examples/prefix_sharing_benchmark.py [--model-path DIR] [--batch-size N]

Reports prefill tokens the engine computed (from `Engine.get_stats()`) and wall time.
"""

from __future__ import annotations

import argparse
import time

import radixgen as rg

FEW_SHOT = "".join(
    f"Review: sample review number {i} with some words.\nSentiment: positive\n" for i in range(24)
)


@rg.function
def classify(s, review):
    s += FEW_SHOT + f"Review: {review}\nSentiment: "
    s += rg.gen("label", max_tokens=2)


@rg.function
def branches(s, num_branches):
    s += FEW_SHOT + "Review: one more.\nSentiment: "
    forks = s.fork(num_branches)
    forks += rg.gen("label", max_tokens=2)
    forks.join()


@rg.function
def single_branch(s):
    s += FEW_SHOT + "Review: one more.\nSentiment: "
    s += rg.gen("label", max_tokens=2)


def measure(engine, run) -> tuple[int, float]:
    """(prefill tokens computed, seconds) of `run()`, starting from an empty cache."""
    assert engine.flush_cache()
    before = engine.get_stats()["num_computed_prefill_tokens"]
    start = time.perf_counter()
    run()
    elapsed = time.perf_counter() - start
    return engine.get_stats()["num_computed_prefill_tokens"] - before, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default="tiny")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    batch = [{"review": f"text {i}"} for i in range(args.batch_size)]
    with rg.Engine(model_path=args.model_path) as engine:
        prefix_tokens = len(engine.tokenizer.encode(FEW_SHOT))
        print(f"shared prefix: {prefix_tokens} tokens, batch of {len(batch)}")
        rows = {
            "run_batch, warm_prefix=True": lambda: classify.run_batch(
                batch, backend=engine, progress_bar=False, temperature=0.0
            ),
            "run_batch, warm_prefix=False": lambda: classify.run_batch(
                batch, backend=engine, progress_bar=False, temperature=0.0, warm_prefix=False
            ),
            f"fork({len(batch)})": lambda: branches.run(
                num_branches=len(batch), backend=engine, temperature=0.0
            ),
            f"{len(batch)} separate runs, concurrent": lambda: single_branch.run_batch(
                [{}] * len(batch), backend=engine, progress_bar=False, warm_prefix=False
            ),
        }
        print("| case | prefill tokens computed | wall s |")
        print("| --- | ---: | ---: |")
        for name, run in rows.items():
            tokens, seconds = measure(engine, run)
            print(f"| {name} | {tokens} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
