"""Measures what the DSL's prefix sharing saves: run_batch with and without warming the
common prefix, and fork(n) against n independent runs of the same prefix.

    python examples/prefix_sharing_benchmark.py [--model-path DIR] [--batch-size N]
        [--max-tokens N] [--shared-examples N] [--load-format dummy]
        [--enable-tree-attention | --disable-tree-attention]

Reports prefill tokens the engine computed (from `Engine.get_stats()`), the decode steps that
read the shared prefix once (tree attention) and wall time. Longer outputs (`--max-tokens`)
make decode, and thus tree attention, matter (on by default on CUDA: compare with
`--disable-tree-attention`); EOS
is ignored, so every branch generates exactly that many tokens. `--shared-examples` sets how
many few-shot examples the shared prefix holds (24, ~360 tokens, by default; 128 is ~2k tokens,
a long system prompt).
"""

from __future__ import annotations

import argparse
import time

import radixgen as rg


def few_shot(num_examples: int) -> str:
    return "".join(
        f"Review: sample review number {i} with some words.\nSentiment: positive\n"
        for i in range(num_examples)
    )


@rg.function
def classify(s, prefix, review, max_tokens=2):
    s += prefix + f"Review: {review}\nSentiment: "
    s += rg.gen("label", max_tokens=max_tokens, ignore_eos=True)


@rg.function
def branches(s, prefix, num_branches, max_tokens=2):
    s += prefix + "Review: one more.\nSentiment: "
    forks = s.fork(num_branches)
    forks += rg.gen("label", max_tokens=max_tokens, ignore_eos=True)
    forks.join()


@rg.function
def single_branch(s, prefix, max_tokens=2):
    s += prefix + "Review: one more.\nSentiment: "
    s += rg.gen("label", max_tokens=max_tokens, ignore_eos=True)


def measure(engine, run) -> tuple[int, int, float]:
    """(prefill tokens computed, tree-attention decode steps, seconds) of `run()`, starting
    from an empty cache."""
    assert engine.flush_cache()
    before = engine.get_stats()
    start = time.perf_counter()
    run()
    elapsed = time.perf_counter() - start
    after = engine.get_stats()
    return (
        after["num_computed_prefill_tokens"] - before["num_computed_prefill_tokens"],
        after["num_tree_attention_steps"] - before["num_tree_attention_steps"],
        elapsed,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default="tiny")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=2, help="tokens each branch generates")
    parser.add_argument("--shared-examples", type=int, default=24, help="few-shot examples")
    parser.add_argument("--load-format", default="auto", help="'dummy': random weights")
    tree = parser.add_mutually_exclusive_group()
    tree.add_argument("--enable-tree-attention", dest="tree", action="store_true", default=None)
    tree.add_argument("--disable-tree-attention", dest="tree", action="store_false")
    args = parser.parse_args()
    max_tokens = args.max_tokens
    prefix = few_shot(args.shared_examples)
    batch = [
        {"prefix": prefix, "review": f"text {i}", "max_tokens": max_tokens}
        for i in range(args.batch_size)
    ]
    engine_args = dict(load_format=args.load_format, enable_tree_attention=args.tree)
    with rg.Engine(model_path=args.model_path, **engine_args) as engine:
        prefix_tokens = len(engine.tokenizer.encode(prefix))
        print(f"shared prefix: {prefix_tokens} tokens, batch of {len(batch)}")
        rows = {
            "run_batch, warm_prefix=True": lambda: classify.run_batch(
                batch, backend=engine, progress_bar=False, temperature=0.0
            ),
            "run_batch, warm_prefix=False": lambda: classify.run_batch(
                batch, backend=engine, progress_bar=False, temperature=0.0, warm_prefix=False
            ),
            f"fork({len(batch)})": lambda: branches.run(
                prefix=prefix,
                num_branches=len(batch),
                max_tokens=max_tokens,
                backend=engine,
                temperature=0.0,
            ),
            f"{len(batch)} separate runs, concurrent": lambda: single_branch.run_batch(
                [{"prefix": prefix, "max_tokens": max_tokens}] * len(batch),
                backend=engine,
                progress_bar=False,
                warm_prefix=False,
            ),
        }
        print("| case | prefill tokens computed | tree-attention steps | wall s |")
        print("| --- | ---: | ---: | ---: |")
        for name, run in rows.items():
            tokens, tree_steps, seconds = measure(engine, run)
            print(f"| {name} | {tokens} | {tree_steps} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
