"""Benchmark: both grammar backends at a 128k vocabulary over a corpus of realistic schemas.

    OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \
        .venv/bin/python -m radixgen.constrained.benchmark_backends [--outlines-every 4]

Measures, per backend, on the committed 128k benchmark tokenizer (`build_benchmark_tokenizer`)
and the schemas of `benchmark_schemas`:
- compile: `GrammarBackend.compile(ConstraintSpec.json_schema(s))` + `new_matcher()`, i.e.
  radixgen's JSON-schema translation plus the backend's matcher creation, each schema once;
- mask fill per request per step: `fill_bitmask` of one matcher, and `accept_token`, along a
  seeded random walk through allowed tokens (up to `--steps` steps per schema);
- `compile_constraint(json_schema=s, tokenizer="tiny")` with the default backend.

Every backend runs in its own worker process, limited in memory, and each compile has a
deadline: outlines-core's index at 128k tokens takes 10-60 s and many GiB for ordinary tool
schemas, so it runs on every `--outlines-every`-th schema, and a compile past the deadline
counts as the deadline (percentiles over such censored values are lower bounds, marked >=).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import platform
import random
import statistics
import time
from datetime import datetime, timezone

import numpy as np

from radixgen.constrained.benchmark_schemas import realistic_schemas
from radixgen.constrained.deadline_worker import DeadlineWorker


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure_schema(backend, schema: dict, *, steps: int, seed: int) -> dict:
    """Compile seconds and per-step fill/accept seconds of one schema (or its error)."""
    from radixgen.constrained import ConstraintSpec, allocate_token_bitmask

    start = time.perf_counter()
    try:
        matcher = backend.compile(ConstraintSpec.json_schema(schema)).new_matcher()
    except ValueError as error:  # refused by the translator, or invalid for this vocabulary
        return {"error": f"{type(error).__name__}: {str(error)[:120]}"}
    compile_s = time.perf_counter() - start
    bitmask = allocate_token_bitmask(4, backend.vocab.vocab_size)  # [4, 4000] int32
    eos_ids = set(backend.vocab.eos_token_ids)
    generator = random.Random(seed)
    fill_s, accept_s = [], []
    for _ in range(steps):
        if matcher.is_terminated():
            break
        start = time.perf_counter()
        matcher.fill_bitmask(bitmask, 2)
        fill_s.append(time.perf_counter() - start)
        allowed = np.flatnonzero(
            np.unpackbits(bitmask[2].numpy().view(np.uint8), bitorder="little")
        )
        regular = [int(token) for token in allowed if int(token) not in eos_ids]
        if not regular:
            break
        token_id = generator.choice(regular)
        start = time.perf_counter()
        assert matcher.accept_token(token_id)
        accept_s.append(time.perf_counter() - start)
    return {"compile_s": compile_s, "fill_s": fill_s, "accept_s": accept_s}


def benchmark_backend(backend_name: str):
    """The worker's state: a backend for the 128k benchmark tokenizer."""
    from radixgen.constrained import GrammarBackend
    from radixgen.constrained.build_benchmark_tokenizer import load_benchmark_tokenizer

    tokenizer = load_benchmark_tokenizer()
    return GrammarBackend(tokenizer, grammar_backend=backend_name, jump_forward=False)


def measure_job(backend, job: tuple[dict, int, int]) -> dict:
    schema, steps, seed = job
    return measure_schema(backend, schema, steps=steps, seed=seed)


def bench_backend(name: str, corpus, *, steps: int, deadline_s: float) -> dict:
    worker = DeadlineWorker(functools.partial(benchmark_backend, name), measure_job)
    results = {}
    try:
        for index, (schema_name, schema) in enumerate(corpus):
            finished, result = worker.run((schema, steps, index), deadline_s=deadline_s)
            results[schema_name] = result if finished else {"timeout_s": deadline_s}
    finally:
        worker.stop()
    return {"setup_s": worker.setup_s, "results": results}


def summary_row(label: str, run: dict) -> str:
    results = list(run["results"].values())
    compiled = [r["compile_s"] for r in results if "compile_s" in r]
    timed_out = [r["timeout_s"] for r in results if "timeout_s" in r]
    refused = [r for r in results if "error" in r]
    compile_all = compiled + timed_out  # censored at the deadline
    mark = ">= " if timed_out else ""
    fill = [s for r in results if "fill_s" in r for s in r["fill_s"]]
    accept = [s for r in results if "accept_s" in r for s in r["accept_s"]]

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.1f} s"

    compile_cells = (
        [f"{mark if percentile(compile_all, q) in timed_out else ''}{ms(percentile(compile_all, q))}"
         for q in (0.5, 0.9, 0.99)] + [ms(max(compile_all))]
        if compile_all else ["-"] * 4
    )  # fmt: skip
    mask_cells = (
        [f"{percentile(fill, 0.5) * 1e6:.0f} µs", f"{percentile(fill, 0.99) * 1e6:.0f} µs",
         f"{percentile(accept, 0.5) * 1e6:.0f} µs", f"{percentile(accept, 0.99) * 1e6:.0f} µs"]
        if fill else ["-"] * 4
    )  # fmt: skip
    counts = f"{len(compiled)} / {len(timed_out)} / {len(refused)}"
    return " | ".join([f"| {label}", f"{run['setup_s']:.2f} s", counts, *compile_cells,
                       f"{len(fill)}", *mask_cells]) + " |"  # fmt: skip


def bench_compile_constraint_tiny(corpus) -> str:
    from radixgen.constrained import DEFAULT_GRAMMAR_BACKEND, compile_constraint

    compile_constraint(json_schema={"type": "boolean"}, tokenizer="tiny")  # loads the vocabulary
    seconds, refused = [], 0
    for _, schema in corpus:
        start = time.perf_counter()
        try:
            compile_constraint(json_schema=schema, tokenizer="tiny")
        except ValueError:
            refused += 1
            continue
        seconds.append(time.perf_counter() - start)
    p50, p90, p99 = (percentile(seconds, q) * 1e3 for q in (0.5, 0.9, 0.99))
    return (
        f'`compile_constraint(json_schema=s, tokenizer="tiny")`, default backend '
        f"({DEFAULT_GRAMMAR_BACKEND}), {len(seconds)} schemas ({refused} refused): "
        f"p50 {p50:.2f} ms, p90 {p90:.2f} ms, p99 {p99:.2f} ms, max {max(seconds) * 1e3:.1f} ms"
    )


def bench_batched_fill(corpus, *, batch: int = 32, steps: int = 16) -> str:
    """llguidance: one step's masks for `batch` requests (different schemas, each a few tokens
    into its output), row by row versus `GrammarBackend.fill_bitmasks` (parallel threads)."""
    from radixgen.constrained import ConstraintSpec, GrammarBackend, allocate_token_bitmask
    from radixgen.constrained.build_benchmark_tokenizer import load_benchmark_tokenizer

    backend = GrammarBackend(load_benchmark_tokenizer(), grammar_backend="llguidance")
    bitmask = allocate_token_bitmask(batch, backend.vocab.vocab_size)  # [batch, 4000] int32
    matchers = []
    for index, (_, schema) in enumerate(corpus):
        try:
            matcher = backend.compile(ConstraintSpec.json_schema(schema)).new_matcher()
        except ValueError:
            continue
        matchers.append((matcher, random.Random(index)))
        if len(matchers) == batch:
            break
    row_by_row, batched = [], []
    for _ in range(steps):
        start = time.perf_counter()
        for row, (matcher, _) in enumerate(matchers):
            matcher.fill_bitmask(bitmask, row)
        row_by_row.append(time.perf_counter() - start)
        start = time.perf_counter()
        backend.fill_bitmasks(
            [(matcher, row) for row, (matcher, _) in enumerate(matchers)], bitmask
        )
        batched.append(time.perf_counter() - start)
        for row, (matcher, generator) in enumerate(matchers):  # advance every request one token
            if matcher.is_terminated():
                continue
            allowed = np.flatnonzero(
                np.unpackbits(bitmask[row].numpy().view(np.uint8), bitorder="little")
            )
            regular = [int(t) for t in allowed if int(t) not in backend.vocab.eos_token_ids]
            if regular:
                matcher.accept_token(generator.choice(regular))
    backend.shutdown()
    return (
        f"llguidance, {len(matchers)} requests, one step's masks at 128k (median of {steps} steps): "
        f"row by row {statistics.median(row_by_row) * 1e3:.2f} ms, `fill_bitmasks` "
        f"{statistics.median(batched) * 1e3:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=48, help="mask steps per schema")
    parser.add_argument("--deadline-s", type=float, default=30.0, help="per compile")
    parser.add_argument("--outlines-every", type=int, default=4, help="outlines schema stride")
    parser.add_argument("--skip-outlines", action="store_true", help="llguidance rows only")
    args = parser.parse_args()
    corpus = realistic_schemas()
    subset = corpus[:: args.outlines_every]
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or 'cpu'}, "
          f"{multiprocessing.cpu_count()} cores, corpus {len(corpus)} schemas")  # fmt: skip
    print("\n| backend (schemas) | setup (vocabulary) | compiled / past deadline / refused "
          "| compile p50 | p90 | p99 | max | mask steps | fill_bitmask p50 | p99 "
          "| accept_token p50 | p99 |")  # fmt: skip
    print("| --- |" + " --- |" * 12)
    llguidance = bench_backend("llguidance", corpus, steps=args.steps, deadline_s=args.deadline_s)
    print(summary_row(f"llguidance (all {len(corpus)})", llguidance), flush=True)
    on_subset = {"setup_s": llguidance["setup_s"],
                 "results": {name: llguidance["results"][name] for name, _ in subset}}  # fmt: skip
    print(summary_row(f"llguidance (every {args.outlines_every}th: {len(subset)})", on_subset))
    if not args.skip_outlines:
        outlines = bench_backend("outlines", subset, steps=args.steps, deadline_s=args.deadline_s)
        print(summary_row(f"outlines (every {args.outlines_every}th: {len(subset)})", outlines))
    print("\n" + bench_compile_constraint_tiny(corpus))
    print(bench_batched_fill(corpus))
    for label, run in [("llguidance", llguidance)] + (
        [] if args.skip_outlines else [("outlines", outlines)]
    ):
        compiled = sorted(r["compile_s"] for r in run["results"].values() if "compile_s" in r)
        if compiled:
            print(
                f"{label}: compiled schemas only: min {compiled[0] * 1e3:.1f} ms, median "
                f"{compiled[len(compiled) // 2] * 1e3:.1f} ms, max {compiled[-1] * 1e3:.1f} ms"
            )
    slowest = sorted(
        ((r.get("compile_s", 0.0), name) for name, r in llguidance["results"].items()), reverse=True
    )[:3]
    print("slowest llguidance compiles: " + ", ".join(f"{n} {s * 1e3:.1f} ms" for s, n in slowest))


if __name__ == "__main__":
    main()
