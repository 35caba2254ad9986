"""Where an offline Engine run spends its time, step by step (a profiling aid, not a test).

    python3 scripts/step_breakdown.py --model-path /tmp/llama-3.1-8b --load-format dummy \
        --num-prompts 256 --input-len 512 --output-len 256 [--cuda-graph-max-bs 256]

Runs `Engine.generate` over random prompts (greedy, ignore_eos) with timers wrapped around
the scheduler thread's phases, and prints one table row per step kind:
- `forward`: `runner.forward` returning (launches; a CUDA-graph replay returns at once);
- `sample+wait`: the sampler plus a device sync, i.e. the rest of the GPU work;
- `host`: everything else inside `Scheduler.step` (batch building, finish checks, outputs);
- `dispatch`: the scheduler thread between steps (inbox, handing outputs to callers).
The sync makes the device wait visible; it adds nothing the step did not already wait for
(the step's `.tolist()` of the sampled ids syncs anyway), except under the overlapped
schedule, which it defeats: measure that with `--no-sync` (then "host" holds the wait).
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--cuda-graph-max-bs", type=int, default=None)
    parser.add_argument("--overlap", choices=("on", "off"), default=None)
    parser.add_argument(
        "--no-sync", action="store_true", help="no device sync after sampling (keeps overlap)"
    )
    args = parser.parse_args()

    import torch

    from radixgen.runtime.engine import Engine

    extra = {}
    if args.cuda_graph_max_bs is not None:
        extra["cuda_graph_max_bs"] = args.cuda_graph_max_bs
    if args.overlap is not None:
        extra["enable_overlap_schedule"] = args.overlap == "on"
    engine = Engine(model_path=args.model_path, load_format=args.load_format, **extra)
    scheduler = engine._scheduler
    cuda = scheduler.device.type == "cuda"
    rng = random.Random(0)
    vocab = min(len(engine.tokenizer), scheduler.vocab_size)
    prompts = [
        [rng.randrange(3, vocab) for _ in range(args.input_len)] for _ in range(args.num_prompts)
    ]
    params = {"max_new_tokens": args.output_len, "temperature": 0.0, "ignore_eos": True}
    engine.generate(input_ids=[p[:32] for p in prompts[:4]], sampling_params=params)
    engine.flush_cache()

    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    current: dict[str, float] = {}
    runner, sampler, step = scheduler.runner, scheduler.sampler, scheduler.step
    # The loop's output hand-off: the in-process transport's deliver(); an older engine
    # (perf_base.tar in scripts/h200.sh) has SchedulerThread._dispatch instead.
    transport = getattr(engine, "_transport", None) or engine._loop
    deliver_name = "deliver" if hasattr(transport, "deliver") else "_dispatch"
    runner_forward, transport_deliver = runner.forward, getattr(transport, deliver_name)

    def timed_forward(forward_batch):
        start = time.perf_counter()
        logits = runner_forward(forward_batch)
        current["forward"] += time.perf_counter() - start
        kind = forward_batch.mode.value
        if kind == "decode":
            graphed = runner.cuda_graph_runner is not None and (
                runner.cuda_graph_runner.can_run(forward_batch)
            )
            kind += " (graph)" if graphed else " (eager)"
        current["kind"] = kind
        current["batch"] = forward_batch.batch_size
        return logits

    def timed_sampler(*sampler_args, **sampler_kwargs):
        start = time.perf_counter()
        result = sampler(*sampler_args, **sampler_kwargs)
        if cuda and not args.no_sync:
            torch.cuda.synchronize()
        current["sample+wait"] += time.perf_counter() - start
        return result

    def timed_step():
        current.clear()
        current.update({"forward": 0.0, "sample+wait": 0.0})
        start = time.perf_counter()
        outputs = step()
        elapsed = time.perf_counter() - start
        if "kind" in current:
            row = totals[current["kind"]]
            row["steps"] += 1
            row["batch"] += current["batch"]
            row["total"] += elapsed
            row["forward"] += current["forward"]
            row["sample+wait"] += current["sample+wait"]
            row["host"] += elapsed - current["forward"] - current["sample+wait"]
        return outputs

    def timed_deliver(outputs):
        start = time.perf_counter()
        gone = transport_deliver(outputs)
        totals["(between steps)"]["dispatch"] += time.perf_counter() - start
        return gone

    runner.forward, scheduler.step = timed_forward, timed_step
    scheduler.results.sampler = timed_sampler  # the sampler is called from ResultProcessor
    setattr(transport, deliver_name, timed_deliver)
    start = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=params)
    wall_s = time.perf_counter() - start
    engine.shutdown()

    print(f"{args.num_prompts} x {args.input_len}/{args.output_len}: {wall_s:.2f} s wall")
    header = ("kind", "steps", "mean bs", "ms/step", "forward", "sample+wait", "host", "total s")
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for kind, row in sorted(totals.items()):
        steps = row.get("steps", 0)
        if not steps:
            print(f"| {kind} | | | | | | dispatch {1000 * row['dispatch']:.0f} ms | |")
            continue
        per_step = {k: 1000 * row[k] / steps for k in ("total", "forward", "sample+wait", "host")}
        print(
            f"| {kind} | {steps:.0f} | {row['batch'] / steps:.0f} | {per_step['total']:.2f} | "
            f"{per_step['forward']:.2f} | {per_step['sample+wait']:.2f} | {per_step['host']:.2f} "
            f"| {row['total']:.2f} |"
        )


if __name__ == "__main__":
    main()
