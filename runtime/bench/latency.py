"""`radixgen bench latency`: one static batch through the model runner, no scheduler.

A batch of `batch_size` random prompts of `input_len` tokens is prefilled in one extend
forward, then decoded greedily for `output_len` steps. Prefill ms and decode ms per step are
reported separately (the decode median, so one slow step does not move it). This isolates
the model runner (kernels, CUDA graphs) from scheduling, like SGLang's `bench_one_batch`.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, replace

from tqdm import tqdm

from radixgen.runtime.server_args import ServerArgs


@dataclass(frozen=True)
class LatencyArgs:
    batch_sizes: tuple[int, ...] = (1,)
    input_len: int = 128
    output_len: int = 256
    seed: int = 0
    warmup_steps: int = 3


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _one_batch(runner, batch_size: int, args: LatencyArgs) -> dict:
    import torch

    from radixgen.runtime.forward_batch import ForwardMode

    generator = torch.Generator().manual_seed(args.seed + batch_size)
    prompts = torch.randint(
        300, runner.vocab_size, (batch_size, args.input_len), generator=generator
    )
    rows = runner.req_to_token_pool.alloc(batch_size)
    total = batch_size * (args.input_len + args.output_len)
    slots = runner.slot_allocator.alloc(total)
    if rows is None or slots is None:
        raise ValueError(
            f"batch_size {batch_size} x {args.input_len + args.output_len} tokens does not fit "
            f"in the KV pool ({runner.max_total_num_tokens} slots, "
            f"{runner.max_running_requests} rows)"
        )
    # Each request's slots: [input_len + output_len] consecutive entries of `slots`.
    per_request = slots.view(batch_size, args.input_len + args.output_len)
    try:
        _sync(runner.device)
        start = time.perf_counter()
        batch = runner.build_forward_batch(
            mode=ForwardMode.EXTEND,
            input_ids=prompts.tolist(),
            req_pool_indices=rows,
            prefix_lens=[0] * batch_size,
            out_cache_loc=per_request[:, : args.input_len].reshape(-1),
        )
        logits = runner.forward(batch)  # [batch, vocab]
        next_ids = logits.argmax(dim=-1)
        _sync(runner.device)
        prefill_s = time.perf_counter() - start
        step_s = []
        for step in range(args.output_len):
            position = args.input_len + step
            start = time.perf_counter()
            # The host needs the ids to build the batch: the one deliberate sync per step.
            batch = runner.build_forward_batch(
                mode=ForwardMode.DECODE,
                input_ids=next_ids.view(-1, 1).tolist(),
                req_pool_indices=rows,
                prefix_lens=[position] * batch_size,
                out_cache_loc=per_request[:, position].contiguous(),
            )
            next_ids = runner.forward(batch).argmax(dim=-1)
            _sync(runner.device)
            step_s.append(time.perf_counter() - start)
    finally:
        runner.slot_allocator.free(slots)
        runner.req_to_token_pool.free(rows)
    decode_s = step_s[args.warmup_steps :] or step_s
    median_step = statistics.median(decode_s)
    return {
        "batch_size": batch_size,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "prefill_ms": 1000 * prefill_s,
        "prefill_tokens_per_s": batch_size * args.input_len / prefill_s,
        "decode_ms_per_step_median": 1000 * median_step,
        "decode_ms_per_step_mean": 1000 * statistics.fmean(decode_s),
        "decode_tokens_per_s": batch_size / median_step,
    }


def run_latency(server_args: ServerArgs, args: LatencyArgs) -> list[dict]:
    from radixgen.runtime.model_runner import ModelRunner

    tensor_parallel = None
    if server_args.tp_size > 1:  # rank 0 here, the followers spawned (runtime/tp_worker.py)
        from radixgen.runtime.tp_worker import InProcessTensorParallel

        tensor_parallel = InProcessTensorParallel(server_args)
    # A batch too large for its KV pool raises, naming it.
    runner = tensor_parallel.runner if tensor_parallel else ModelRunner(server_args)
    rows = []
    try:
        for batch_size in tqdm(args.batch_sizes, desc="batch sizes"):
            # Warm-up at this very shape: kernels compile per shape, outside the timed run.
            _one_batch(runner, batch_size, replace(args, output_len=4, warmup_steps=0))
            rows.append(_one_batch(runner, batch_size, args))
    finally:
        if tensor_parallel is not None:
            tensor_parallel.shutdown()
    return rows


def print_latency_table(rows: list[dict]) -> None:
    """One line per batch size, as SGLang's bench_one_batch prints them."""
    print(f"{'batch':>6} {'input':>6} {'output':>6} {'prefill ms':>11} {'prefill tok/s':>14} "
          f"{'decode ms/step':>15} {'decode tok/s':>13}")  # fmt: skip
    for row in rows:
        print(
            f"{row['batch_size']:>6} {row['input_len']:>6} {row['output_len']:>6} "
            f"{row['prefill_ms']:>11.2f} {row['prefill_tokens_per_s']:>14.1f} "
            f"{row['decode_ms_per_step_median']:>15.3f} {row['decode_tokens_per_s']:>13.1f}"
        )


def main_latency(server_args: ServerArgs, args: LatencyArgs, output_json: str | None) -> list[dict]:
    rows = run_latency(server_args, args)
    print_latency_table(rows)
    if output_json:
        with open(output_json, "w") as f:
            json.dump({"args": asdict(args), "results": rows}, f, indent=2)
    return rows
