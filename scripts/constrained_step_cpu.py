"""Scheduler-thread CPU per decode step at batch 64: json-array vs random ids (a profiling aid).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/constrained_step_cpu.py [--runs 3] [--overlap on]
        [--jump-forward on|off]

Runs an in-process Engine (tiny model, CPU) over 64 requests submitted at once, greedy:
- `json-array`: the bench's fixed-length schema (an array of 24 one-digit integers, llguidance,
  jump-forward and the token budget at their defaults);
- `random-ids`: unconstrained requests of the same output length (ignore_eos).
For every decode step whose batch has 64 rows it takes the scheduler thread's CPU time
(`time.thread_time`) of `Scheduler.step` minus the model's forward and the sampler (both move
with the machine's load and are not what the constrained path adds), and the mask fill alone
(`GrammarHook.set_vocab_mask`, part of the host figure). Separately, on a few such steps, it
counts Python and C calls outside the forward and the sampler (`sys.setprofile`; the mean over
`--count-steps` consecutive steps), which the load does not move. Prints medians (and means)
over steps, then medians over runs, as JSON lines and a table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time

BATCH = 64
ITEMS = 24


def measure(engine, workload: str, count_steps: int) -> dict:
    from radixgen.runtime.bench.datasets import json_array_schema

    scheduler = engine._scheduler
    runner, results, hook = scheduler.runner, scheduler.results, scheduler.grammar
    forward, sampler, step, set_mask = runner.forward, results.sampler, scheduler.step, None
    set_mask = hook.set_vocab_mask
    excluded = [0.0]  # thread CPU inside the forward and the sampler, this step
    mask_s = [0.0]
    calls = [0]
    counting = [False]

    def count(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1

    def outside(function):
        def wrapped(*args, **kwargs):
            if counting[0]:
                sys.setprofile(None)
            start = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                excluded[0] += time.thread_time() - start
                if counting[0]:
                    sys.setprofile(count)

        return wrapped

    def timed_mask(*args, **kwargs):
        start = time.thread_time()
        try:
            return set_mask(*args, **kwargs)
        finally:
            mask_s[0] += time.thread_time() - start

    host_ms, mask_ms, call_counts = [], [], []

    def timed_step():
        batch = scheduler.batches.running
        full = batch is not None and batch.batch_size == BATCH and not scheduler.batches.waiting
        counting[0] = full and len(call_counts) < count_steps and len(host_ms) >= 4
        excluded[0] = mask_s[0] = 0.0
        calls[0] = 0
        if counting[0]:
            sys.setprofile(count)
        start = time.thread_time()
        outputs = step()
        elapsed = time.thread_time() - start
        if counting[0]:
            sys.setprofile(None)
            call_counts.append(calls[0])
        elif full:
            host_ms.append(1000 * (elapsed - excluded[0]))
            mask_ms.append(1000 * mask_s[0])
        return outputs

    runner.forward = outside(forward)
    results.sampler = outside(sampler)
    scheduler.step = timed_step
    hook.set_vocab_mask = timed_mask
    params = {"temperature": 0.0, "max_new_tokens": 4 * ITEMS + 8}
    if workload == "json-array":
        params["json_schema"] = json.dumps(json_array_schema(ITEMS))
    else:
        params.update(max_new_tokens=2 * ITEMS + 1, ignore_eos=True)  # '[d,d,...]' in tokens
    prompts = [f"List {ITEMS} digits of sample {i} as a JSON array: " for i in range(BATCH)]
    try:
        outputs = engine.generate(prompts, sampling_params=params)
    finally:
        runner.forward, results.sampler, scheduler.step = forward, sampler, step
        hook.set_vocab_mask = set_mask
    engine.flush_cache()
    return {
        "workload": workload,
        "steps": len(host_ms),
        "host_ms": statistics.median(host_ms) if host_ms else None,
        "mask_ms": statistics.median(mask_ms) if mask_ms else None,
        # means too: under overlap with jump-forward, steps alternate between two kinds
        "host_ms_mean": statistics.fmean(host_ms) if host_ms else None,
        "mask_ms_mean": statistics.fmean(mask_ms) if mask_ms else None,
        "calls": statistics.fmean(call_counts) if call_counts else None,  # consecutive steps
        "tokens": sum(o["meta_info"]["completion_tokens"] for o in outputs),
        # the outputs' fingerprint: a change to the step must leave it as it was
        "outputs_sha1": hashlib.sha1(json.dumps([o["text"] for o in outputs]).encode()).hexdigest(),
        "texts": [o["text"] for o in outputs[:2]],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count-steps", type=int, default=8)
    parser.add_argument("--overlap", choices=("on", "off"), default="off")
    parser.add_argument("--jump-forward", choices=("on", "off"), default=None)
    parser.add_argument("--workloads", default="json-array,random-ids")
    args = parser.parse_args()

    from radixgen.runtime.engine import Engine

    extra = {}
    if args.jump_forward is not None:  # None: the server's default (on with llguidance)
        extra["enable_jump_forward"] = args.jump_forward == "on"
    engine = Engine(model_path="tiny", enable_overlap_schedule=args.overlap == "on", **extra)
    engine.generate(["warm up"], sampling_params={"max_new_tokens": 4})
    summary = {}
    try:
        for run in range(args.runs):
            for workload in args.workloads.split(","):
                row = measure(engine, workload, args.count_steps)
                print(json.dumps({"run": run, **row}), flush=True)
                summary.setdefault(workload, []).append(row)
    finally:
        engine.shutdown()
    print(
        "| workload | decode steps at 64 | host ms CPU / step, median (mean) "
        "| mask fill ms, median (mean) | calls / step |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for workload, rows in summary.items():

        def med(key, rows=rows):
            values = [r[key] for r in rows if r[key] is not None]
            return statistics.median(values) if values else float("nan")

        print(
            f"| {workload} | {med('steps'):.0f} | {med('host_ms'):.2f} ({med('host_ms_mean'):.2f}) "
            f"| {med('mask_ms'):.2f} ({med('mask_ms_mean'):.2f}) | {med('calls'):.0f} |"
        )


if __name__ == "__main__":
    main()
