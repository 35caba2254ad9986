"""Where a batch-1 decode step's time goes on the GPU (a profiling aid, not a test).

    python3 scripts/profile_decode_step.py --model-path /tmp/llama-3.1-8b --load-format dummy \
        [--quantization fp8|awq] [--kv-cache-dtype fp8_e4m3] [--lora] [--batch-size 1] \
        [--input-len 128] [--shared-prefix-len 2048 --groups 64] [--tree-attention] [--out $OUT]

Runs one warm greedy `Engine.generate` (128-token prompts by default, 129 new tokens: 128
decode steps)
under `torch.profiler` and prints the GPU kernels per decode step, grouped by name: count per
step, microseconds per step, share of the step. Kernels replayed from CUDA graphs are traced
too. "step wall" is the generate's duration over its steps; "kernels" the summed kernel time
per step; the difference is time the GPU sat idle (launch gaps, host work, syncs). The prefill
is profiled on its own too and its kernels subtracted (by name), so a large batch's prefill does
not drown the steps. `--lora`: every
request uses one random rank-16 adapter on all linear modules (as scripts/bench_lora.py's).
`--shared-prefix-len N --groups G`: the requests fall into G groups whose prompts start with
the same N tokens (then `--input-len` own tokens), as generated-shared-prefix's; with
`--tree-attention` decode reads each group's prefix once (`enable_tree_attention`).
JSON to --out/profile_decode_step[_QUANT][_lora]_bsN.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--kv-cache-dtype", default=None)
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--lora", action="store_true", help="one random rank-16 adapter")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--shared-prefix-len", type=int, default=0, help="tokens per group")
    parser.add_argument("--groups", type=int, default=1, help="groups sharing a prefix")
    parser.add_argument("--tree-attention", action="store_true")
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from radixgen.runtime.engine import Engine

    options = {"load_format": args.load_format}
    if args.quantization:
        options["quantization"] = args.quantization
    if args.kv_cache_dtype:
        options["kv_cache_dtype"] = args.kv_cache_dtype
    adapter = None
    if args.lora:
        import sys
        import tempfile
        from pathlib import Path

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_lora import RANK, write_random_adapter

        folder = Path(tempfile.mkdtemp(prefix="radixgen-lora-")) / "adapter0"
        num_layers = json.loads(Path(args.model_path, "config.json").read_text())
        write_random_adapter(folder, num_layers=num_layers["num_hidden_layers"], seed=0)
        options |= {
            "lora_paths": [f"adapter0={folder}"],
            "max_lora_rank": RANK,
            "lora_target_modules": ["all"],
        }
        adapter = ["adapter0"] * args.batch_size
    options["enable_tree_attention"] = args.tree_attention  # on CUDA the default is on
    prefixes = [
        [2000 + (g * 17 + j * 7) % 30000 for j in range(args.shared_prefix_len)]
        for g in range(args.groups)
    ]
    prompts = [
        prefixes[i % args.groups] + [1000 + (i * 31 + j) % 20000 for j in range(args.input_len)]
        for i in range(args.batch_size)
    ]
    params = {"max_new_tokens": args.steps + 1, "temperature": 0.0, "ignore_eos": True}
    with Engine(model_path=args.model_path, **options) as engine:

        def profiled_generate(new_tokens: int):  # -> (profile, seconds), the cache flushed after
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                engine.generate(
                    input_ids=prompts,
                    sampling_params={**params, "max_new_tokens": new_tokens},
                    lora_path=adapter,
                )
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - start
            engine.flush_cache()
            return prof, seconds

        # warm: graphs, kernels
        engine.generate(input_ids=prompts, sampling_params=params, lora_path=adapter)
        engine.flush_cache()
        prefill_prof, prefill_s = profiled_generate(1)
        prof, total_s = profiled_generate(args.steps + 1)
    step_us = (total_s - prefill_s) / args.steps * 1e6
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for events, sign in ((prof.events(), 1), (prefill_prof.events(), -1)):
        for event in events:
            if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
                row = kernels[event.name[:90]]
                row[0] += sign
                row[1] += sign * event.device_time  # us
    rows = sorted(
        ((name, row) for name, row in kernels.items() if row[1] > 0), key=lambda item: -item[1][1]
    )
    kernel_us = sum(total for _, (_, total) in rows) / args.steps
    print(
        f"step wall {step_us:.1f} us, kernels {kernel_us:.1f} us per step "
        f"(idle {step_us - kernel_us:.1f} us); prefill {prefill_s * 1e3:.1f} ms"
    )
    print(f"{'kernel':90s} {'n/step':>7s} {'us/step':>8s} {'share':>6s}")
    for name, (count, total) in rows[:40]:
        per_step = total / args.steps
        print(f"{name:90s} {count / args.steps:7.2f} {per_step:8.1f} {per_step / step_us:6.1%}")
    suffix = (f"_{args.quantization}" if args.quantization else "") + ("_lora" if args.lora else "")
    suffix += f"_kv{args.kv_cache_dtype}" if args.kv_cache_dtype else ""
    suffix += f"_shared{args.shared_prefix_len}x{args.groups}" if args.shared_prefix_len else ""
    suffix += "_tree" if args.tree_attention else ""
    path = os.path.join(args.out, f"profile_decode_step{suffix}_bs{args.batch_size}.json")
    with open(path, "w") as file:
        json.dump(
            {
                "batch_size": args.batch_size,
                "quantization": args.quantization,
                "kv_cache_dtype": args.kv_cache_dtype,
                "input_len": args.input_len,
                "shared_prefix_len": args.shared_prefix_len,
                "groups": args.groups,
                "tree_attention": args.tree_attention,
                "step_wall_us": step_us,
                "kernel_us_per_step": kernel_us,
                "kernels": [
                    {"name": n, "per_step": c / args.steps, "us_per_step": t / args.steps}
                    for n, (c, t) in rows
                ],
            },
            file,
            indent=1,
        )


if __name__ == "__main__":
    main()
