"""`radixgen bench latency`: one static batch through the model runner, no scheduler.

A batch of `batch_size` random prompts of `input_len` tokens is prefilled in one extend
forward (in several, of whole prompts, where the batch holds more than `max_prefill_tokens`:
one forward over 256 x 1024 tokens would need ~14 GiB for a single 8B activation), then decoded
greedily for `output_len` steps. Prefill ms and decode ms per step are reported separately (the
decode median, so one slow step does not move it). This isolates the model runner (kernels,
CUDA graphs) from scheduling, like SGLang's `bench_one_batch`.

`decode_ms_per_step_median` is the synced step: the host builds each step from the previous
step's ids read back, so its batch building (~0.3 ms on the H200 at batch 1) is inside the
step while the device waits. `decode_ms_per_step_overlapped_median` decodes the same positions
again with the ids left on the device, the host one step ahead (as the engine's overlapped
decode runs), timed between step starts on the device: the kernels' step, host work hidden;
`overlapped_same_tokens` checks that both runs decoded the same greedy tokens, and
`greedy_tokens_digest` (a hash of the first token and every step's) tells two trees or two
launch settings that decoded the same tokens apart from ones that did not.
"""

from __future__ import annotations

import hashlib
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


class _StepClock:
    """Marks on the device's timeline: CUDA events (read after one sync at the end), or on
    the CPU, where every op runs when it is called, the host clock."""

    def __init__(self, device, count: int):
        import torch

        self.cuda = device.type == "cuda"
        self.marks = (
            [torch.cuda.Event(enable_timing=True) for _ in range(count)] if self.cuda else []
        )

    def mark(self, index: int) -> None:
        if self.cuda:
            self.marks[index].record()
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self) -> list[float]:
        pairs = zip(self.marks[:-1], self.marks[1:], strict=True)
        if self.cuda:
            return [start.elapsed_time(end) for start, end in pairs]
        return [1000 * (end - start) for start, end in pairs]


def _overlapped_decode(runner, first_ids, rows, per_request, args: LatencyArgs):
    """The decode steps again, the host never waiting for a step's ids: each step's input ids
    are the previous step's argmax on the device, so the host builds step N+1 (and launches
    its graph replay) while the device runs step N, as the engine's overlapped decode does
    (runtime/overlap_decode.py). Same positions as the synced run, whose KV slots it
    rewrites. Returns (ms between consecutive step starts on the device, [steps, batch] ids).
    """
    import torch

    from radixgen.runtime.forward_batch import ForwardMode

    batch_size = len(rows)
    clock = _StepClock(runner.device, args.output_len + 1)
    next_ids, sampled = first_ids, []  # [batch] int64 on the device
    for step in range(args.output_len):
        position = args.input_len + step
        batch = runner.build_forward_batch(
            mode=ForwardMode.DECODE,
            input_ids=next_ids,
            req_pool_indices=rows,
            prefix_lens=[position] * batch_size,
            out_cache_loc=per_request[:, position].contiguous(),
        )
        clock.mark(step)
        next_ids = runner.forward(batch).argmax(dim=-1)
        sampled.append(next_ids)
    clock.mark(args.output_len)
    _sync(runner.device)
    return clock.intervals_ms(), torch.stack(sampled).tolist()


def _one_batch(runner, batch_size: int, args: LatencyArgs, overlapped: bool = False) -> dict:
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
        per_forward = max(1, runner.server_args.max_prefill_tokens // args.input_len)
        first_ids = []
        for group in range(0, batch_size, per_forward):
            requests = slice(group, group + per_forward)
            group_rows = rows[requests]
            batch = runner.build_forward_batch(
                mode=ForwardMode.EXTEND,
                input_ids=prompts[requests].tolist(),
                req_pool_indices=group_rows,
                prefix_lens=[0] * len(group_rows),
                out_cache_loc=per_request[requests, : args.input_len].reshape(-1),
            )
            first_ids.append(runner.forward(batch).argmax(dim=-1))  # [requests]
        next_ids = first_ids = torch.cat(first_ids)
        synced_ids = []
        _sync(runner.device)
        prefill_s = time.perf_counter() - start
        step_s, phases_s = [], []
        for step in range(args.output_len):
            position = args.input_len + step
            start = time.perf_counter()
            # The host needs the ids to build the batch: the one deliberate sync per step.
            host_ids = next_ids.view(-1, 1).tolist()
            read = time.perf_counter()
            batch = runner.build_forward_batch(
                mode=ForwardMode.DECODE,
                input_ids=host_ids,
                req_pool_indices=rows,
                prefix_lens=[position] * batch_size,
                out_cache_loc=per_request[:, position].contiguous(),
            )
            built = time.perf_counter()
            next_ids = runner.forward(batch).argmax(dim=-1)
            launched = time.perf_counter()
            _sync(runner.device)
            end = time.perf_counter()
            step_s.append(end - start)
            phases_s.append((read - start, built - read, launched - built, end - launched))
            synced_ids.append(next_ids)
        if overlapped:
            overlapped_ms, overlapped_ids = _overlapped_decode(
                runner, first_ids, rows, per_request, args
            )
    finally:
        runner.slot_allocator.free(slots)
        runner.req_to_token_pool.free(rows)
    decode_s = step_s[args.warmup_steps :] or step_s
    median_step = statistics.median(decode_s)
    phases = phases_s[args.warmup_steps :] or phases_s
    row = {
        "batch_size": batch_size,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "prefill_ms": 1000 * prefill_s,
        "prefill_tokens_per_s": batch_size * args.input_len / prefill_s,
        "decode_ms_per_step_median": 1000 * median_step,
        "decode_ms_per_step_mean": 1000 * statistics.fmean(decode_s),
        "decode_tokens_per_s": batch_size / median_step,
        # Where the synced step's host time goes (medians, ms): reading the ids back, building
        # the batch, launching the forward (graph replay) and argmax, then waiting for the
        # device. Until the launch ends the device has only the step's small copies to run.
        "synced_step_phases_ms": {
            name: 1000 * statistics.median(phase[i] for phase in phases)
            for i, name in enumerate(("read_ids", "build", "launch", "wait"))
        },
        "greedy_tokens_digest": hashlib.sha256(
            json.dumps([first_ids.tolist()] + [ids.tolist() for ids in synced_ids]).encode()
        ).hexdigest()[:16],
    }
    if overlapped:
        # The step as the engine runs it: the host's per-step work hidden behind the device.
        overlapped_ms = overlapped_ms[args.warmup_steps :] or overlapped_ms
        row["decode_ms_per_step_overlapped_median"] = statistics.median(overlapped_ms)
        # Greedy over the same positions: the overlapped run must decode the same tokens.
        row["overlapped_same_tokens"] = overlapped_ids == [ids.tolist() for ids in synced_ids]
    return row


def run_latency(server_args: ServerArgs, args: LatencyArgs) -> list[dict]:
    from radixgen.runtime.model_runner import ModelRunner

    tensor_parallel = None
    if server_args.tp_size > 1:  # rank 0 here, the followers spawned (runtime/tp_worker.py)
        from radixgen.runtime.tp_worker import InProcessTensorParallel

        tensor_parallel = InProcessTensorParallel(server_args)
    # A batch too large for its KV pool raises, naming it.
    runner = tensor_parallel.runner if tensor_parallel else ModelRunner(server_args)
    # Also the overlapped step (device-resident ids), except under tensor parallelism: its
    # runner takes host ids, which it broadcasts to its followers.
    overlapped = tensor_parallel is None
    rows = []
    try:
        for batch_size in tqdm(args.batch_sizes, desc="batch sizes"):
            # Warm-up at this very shape: kernels compile per shape, outside the timed run.
            _one_batch(runner, batch_size, replace(args, output_len=4, warmup_steps=0))
            rows.append(_one_batch(runner, batch_size, args, overlapped))
    finally:
        if tensor_parallel is not None:
            tensor_parallel.shutdown()
    return rows


def print_latency_table(rows: list[dict]) -> None:
    """One line per batch size, as SGLang's bench_one_batch prints them (and the synced step's
    host time before its forward is launched: read ids + build + launch)."""
    print(f"{'batch':>6} {'input':>6} {'output':>6} {'prefill ms':>11} {'prefill tok/s':>14} "
          f"{'decode ms/step':>15} {'decode tok/s':>13} {'overlapped ms/step':>19} "
          f"{'host ms/step':>13}")  # fmt: skip
    for row in rows:
        overlapped = row.get("decode_ms_per_step_overlapped_median")
        phases = row["synced_step_phases_ms"]
        host = phases["read_ids"] + phases["build"] + phases["launch"]
        print(
            f"{row['batch_size']:>6} {row['input_len']:>6} {row['output_len']:>6} "
            f"{row['prefill_ms']:>11.2f} {row['prefill_tokens_per_s']:>14.1f} "
            f"{row['decode_ms_per_step_median']:>15.3f} {row['decode_tokens_per_s']:>13.1f} "
            f"{'-' if overlapped is None else f'{overlapped:.3f}':>19} {host:>13.3f}"
        )


def main_latency(server_args: ServerArgs, args: LatencyArgs, output_json: str | None) -> list[dict]:
    rows = run_latency(server_args, args)
    print_latency_table(rows)
    if output_json:
        with open(output_json, "w") as f:
            json.dump({"args": asdict(args), "results": rows}, f, indent=2)
    return rows
