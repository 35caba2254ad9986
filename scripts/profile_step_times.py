"""Where the in-process Engine's wall time goes, step by step (a profiling aid, not a test).

    python3 scripts/profile_step_times.py --model-path /tmp/llama-3.1-8b --load-format dummy \
        [--dataset generated-shared-prefix] [--disable-tree-attention] [--profile-steps 12] \
        [--out $OUT]

Runs `bench offline`'s workload (generated-shared-prefix by default) once, timing every
`Scheduler.step` call in the scheduler thread with its running batch size and whether it ran a
forward, and prints the steps grouped (prefill / decode by batch size): count, total and median
milliseconds. The decode steps' wall is what the GPU kernels of `profile_decode_step.py` are
compared with: the difference is host time the device waited on. Then the same prompts run
again (their prefixes now cached) with `cProfile` on in the scheduler thread for
`--profile-steps` decode steps at the full batch (0: no second run): the functions by
cumulative time. The time outside the steps is split in three: before the first step (the
caller builds and submits the requests), between steps (the scheduler loop's intake and
delivery) and after the last (the caller folds in and decodes the outputs).
The eight slowest steps are listed; JSON (every step) to --out/profile_step_times.json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time
from collections import defaultdict


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--dataset", default="generated-shared-prefix")
    parser.add_argument("--disable-tree-attention", action="store_true")
    parser.add_argument("--disable-overlap-schedule", action="store_true")
    parser.add_argument("--profile-steps", type=int, default=12)
    parser.add_argument("--set", nargs="*", default=[], help="DatasetArgs fields, KEY=INT")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()

    from radixgen.runtime.bench.datasets import DatasetArgs, build_dataset
    from radixgen.runtime.bench.offline import with_model_vocab
    from radixgen.runtime.engine import Engine
    from radixgen.runtime.scheduler import Scheduler

    # (seconds, running rows before and after, forwards, tree steps)
    records: list[tuple[float, int, int, int, int]] = []
    step_starts: list[float] = []  # perf_counter at each step's start, beside `records`
    profile = {"left": 0, "profiler": cProfile.Profile(), "min_rows": 1}
    original_step = Scheduler.step

    def timed_step(self):
        # Wraps the real step (this script only): its wall and what it did.
        forwards, tree = self.counters.forward_steps, self.counters.tree_attention_steps
        rows = len(self.batches.running.reqs)
        profiling = profile["left"] > 0 and rows >= profile["min_rows"]
        if profiling:
            profile["profiler"].enable()
        start = time.perf_counter()
        outputs = original_step(self)
        elapsed = time.perf_counter() - start
        step_starts.append(start)
        if profiling:
            profile["profiler"].disable()
            profile["left"] -= 1
        records.append(
            (
                elapsed,
                rows,
                len(self.batches.running.reqs),
                self.counters.forward_steps - forwards,
                self.counters.tree_attention_steps - tree,
            )
        )
        return outputs

    Scheduler.step = timed_step
    engine = Engine(
        model_path=args.model_path,
        load_format=args.load_format,
        enable_tree_attention=False if args.disable_tree_attention else None,
        enable_overlap_schedule=False if args.disable_overlap_schedule else None,
    )
    try:
        fields = {k: int(v) for k, v in (kv.split("=") for kv in args.set)}
        dataset = DatasetArgs(dataset=args.dataset, **fields)
        requests = build_dataset(with_model_vocab(dataset, engine))
        params = [
            {"max_new_tokens": r.output_len, "temperature": 0.0, "ignore_eos": True}
            for r in requests
        ]
        ids = [r.input_ids for r in requests]
        engine.generate(input_ids=[i[:64] for i in ids[:4]], sampling_params=params[:4])
        engine.flush_cache()
        records.clear()
        step_starts.clear()
        start = time.perf_counter()
        engine.generate(input_ids=ids, sampling_params=params)
        end = time.perf_counter()
        duration = end - start
        run_records, run_starts = list(records), list(step_starts)
        if args.profile_steps > 0:
            profile["left"] = args.profile_steps
            profile["min_rows"] = len(ids)
            engine.generate(input_ids=ids, sampling_params=params)  # prefixes cached: decode
    finally:
        engine.shutdown()
        Scheduler.step = original_step

    groups: dict[str, list[float]] = defaultdict(list)
    for seconds, rows, rows_after, forwards, tree in run_records:
        if forwards == 0:
            kind = "no forward"
        elif rows == 0 or rows_after > rows:  # requests joined: a prefill ran
            kind = "prefill (or mixed)"
        else:
            kind = f"decode rows {rows:>5}{' tree' if tree else ''}"
        groups[kind].append(seconds)
    summary = {
        kind: {
            "steps": len(times),
            "total_s": sum(times),
            "median_ms": 1e3 * statistics.median(times),
        }
        for kind, times in sorted(groups.items())
    }
    print(f"duration {duration:.2f} s, steps {len(run_records)}")
    # The caller's side: building and submitting the requests before the first step, folding
    # in outputs after the last; between steps, the scheduler loop's intake and delivery.
    outside = {
        "before_first_step_s": run_starts[0] - start,
        "between_steps_s": (run_starts[-1] - run_starts[0]) - sum(r[0] for r in run_records[:-1]),
        "after_last_step_s": end - run_starts[-1] - run_records[-1][0],
    }
    print("outside steps: " + ", ".join(f"{k} {v:.3f}" for k, v in outside.items()))
    slowest = sorted(range(len(run_records)), key=lambda i: -run_records[i][0])[:8]
    print("slowest steps (index: ms, rows before -> after):")
    for i in sorted(slowest):
        seconds, rows, rows_after = run_records[i][:3]
        print(f"  {i}: {1e3 * seconds:.1f} ms, {rows} -> {rows_after}")
    for kind, row in summary.items():
        print(f"{kind:<28} {row['steps']:>5} {row['total_s']:>8.2f} s {row['median_ms']:>8.2f} ms")
    text = io.StringIO()
    if args.profile_steps > 0:
        pstats.Stats(profile["profiler"], stream=text).sort_stats("cumulative").print_stats(40)
        print(text.getvalue())
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "profile_step_times.json"), "w") as f:
        json.dump(
            {
                "args": vars(args),
                "duration_s": duration,
                "outside_steps": outside,
                "groups": summary,
                # Every step in order: (ms, running rows before, after, forwards, tree steps).
                "steps": [(round(1e3 * r[0], 3), *r[1:]) for r in run_records],
                "cprofile": text.getvalue(),
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
