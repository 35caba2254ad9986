"""Microbenchmark of the fused sampling kernel against the separate-launch torch path (on a
GPU).

    python -m radixgen.runtime.bench.sampling [--quick] [--sweep] [--json PATH]

For batch 1/64/256 x vocabulary 32,000/128,256 (`--quick`: batch 64 x 128,256 only, about a
minute on an H200; fp32 logits, as the model runner returns them) and seven batch kinds, prints
the median time of one sampling step:
- `torch`: the runtime's torch sampler, i.e. the current path: the Triton bitmask kernel
  (constrained rows), softmax, min-p / top-k / top-p (a sort, and a host sync to pick the rows
  that need it), the counter-based uniform and the inverse-CDF draw, each its own launch;
- `fused`: the same `Sampler` call with the fused kernels (the sampler's CUDA default);
- `kernel`: `fused_sample` alone.
Batch kinds: greedy; greedy_constrained (greedy, every row masked to ~1% of the vocabulary, as
a JSON grammar allows); sampled (temperature 0.7); constrained (sampled + that mask); min-p 0.05;
top-p 0.9; top-k 50 + top-p 0.9. `--json PATH` also writes the rows as JSON.
`--sweep` times splits, block size, warps, histogram block and radix bits (`SWEEP`, about a
minute) at batch 64 x 128,256.
Times are medians of triton.testing.do_bench (milliseconds in, microseconds out). It lives in
runtime/ (not beside kernels/benchmark.py) because it times the runtime's `Sampler`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math

import torch
import triton

from radixgen.kernels.fused_sampling import fused_sample
from radixgen.runtime.sampler import Sampler
from radixgen.runtime.sampling_batch_info import SamplingBatchInfo

KINDS = (
    "greedy",
    "greedy_constrained",
    "sampled",
    "constrained",
    "min_p",
    "top_p",
    "top_k_top_p",
)


def median_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def batch_info(kind: str, batch: int, vocab: int, device: str = "cuda") -> SamplingBatchInfo:
    """The sampler's per-batch tensors for one batch kind, built directly on `device`."""

    def full(value, dtype):
        return torch.full((batch,), value, dtype=dtype, device=device)

    greedy = kind.startswith("greedy")
    top_p = kind in ("top_p", "top_k_top_p")
    info = SamplingBatchInfo(
        temperatures=full(1.0 if greedy else 0.7, torch.float32).unsqueeze(1),
        top_ps=full(0.9 if top_p else 1.0, torch.float32),
        top_ks=full(50 if kind == "top_k_top_p" else vocab, torch.int64),
        min_ps=full(0.05 if kind == "min_p" else 0.0, torch.float32),
        greedy=full(greedy, torch.bool),
        seeds=torch.arange(batch, device=device, dtype=torch.int64),
        vocab_size=vocab,
        all_greedy=greedy,
        need_top_k_or_p=top_p,
        need_min_p=kind == "min_p",
    )
    if kind.endswith("constrained"):
        allowed = torch.rand(batch, math.ceil(vocab / 32) * 32, device=device) < 0.01
        bits = allowed.view(batch, -1, 32).to(torch.int64) << torch.arange(32, device=device)
        words = bits.sum(-1)
        info.vocab_bitmask = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
        info.vocab_bitmask_rows = torch.arange(batch, device=device)
    return info


def bench_case(
    kind: str, batch: int, vocab: int, device: str = "cuda", timer=median_ms
) -> tuple[float, float, float]:
    """(torch path, fused path through the Sampler, kernel alone), microseconds."""
    logits = torch.randn(batch, vocab, device=device) * 3
    info = batch_info(kind, batch, vocab, device)
    steps = torch.zeros(batch, dtype=torch.int64, device=device)
    torch_sampler, fused_sampler = Sampler("torch", device), Sampler("triton", device)
    torch_ms = timer(lambda: torch_sampler(logits, info, steps))
    fused_ms = timer(lambda: fused_sampler(logits, info, steps))
    kernel_args = kernel_arguments(info, steps)
    kernel_ms = timer(lambda: fused_sample(logits, **kernel_args))
    return torch_ms * 1e3, fused_ms * 1e3, kernel_ms * 1e3


def kernel_arguments(info: SamplingBatchInfo, steps: torch.Tensor) -> dict:
    sampled = not info.all_greedy
    return dict(
        temperatures=info.temperatures.reshape(-1).masked_fill(info.greedy, 0.0),
        seeds=info.seeds if sampled else None,
        steps=steps if sampled else None,
        top_ks=info.top_ks if info.need_top_k_or_p else None,
        top_ps=info.top_ps if info.need_top_k_or_p else None,
        min_ps=info.min_ps if info.need_min_p else None,
        bitmask=info.vocab_bitmask,
    )


SWEEP = {  # tunings tried per kind by --sweep: about a minute at batch 64 x 128,256
    "greedy": list(itertools.product((8, 16, 32, 64), (1024, 2048), (4, 8), (256,), (5,))),
    "sampled": list(itertools.product((8, 16, 32), (1024, 2048), (4, 8), (256,), (5,))),
    "top_k_top_p": list(itertools.product((8, 16, 32), (1024,), (8,), (128, 256), (5, 6))),
}


def sweep(kind: str, batch: int = 64, vocab: int = 128256) -> list[dict]:
    """Prints `kind | splits | block | warps | search block | radix bits | us` per tuning of
    SWEEP[kind] and returns the rows."""
    logits = torch.randn(batch, vocab, device="cuda") * 3
    steps = torch.zeros(batch, dtype=torch.int64, device="cuda")
    args = kernel_arguments(batch_info(kind, batch, vocab), steps)
    rows = []
    for num_splits, block_size, num_warps, search_block_size, radix_bits in SWEEP[kind]:
        tuning = dict(
            num_splits=num_splits,
            block_size=block_size,
            num_warps=num_warps,
            search_block_size=search_block_size,
            radix_bits=radix_bits,
        )
        label = " | ".join(map(str, (kind, *tuning.values())))
        try:
            us = median_ms(lambda: fused_sample(logits, **args, **tuning)) * 1e3  # noqa: B023
            print(f"{label} | {us:.1f}")
            rows.append(dict(kind=kind, **tuning, kernel_us=us))
        except Exception as error:  # a config out of registers or shared memory: go on
            print(f"{label} | {error!r:.60}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="batch 64 x 128,256 only")
    parser.add_argument("--sweep", action="store_true", help="also sweep the kernel's tuning")
    parser.add_argument("--json", help="also write the step times to this JSON file")
    args = parser.parse_args()
    rows = []
    print(
        f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}"
    )
    print("\n## one sampling step, fp32 logits: us (median)")
    print("kind | batch | vocab | torch path | fused (Sampler) | kernel alone | speed-up")
    batches = (64,) if args.quick else (1, 64, 256)
    vocabs = (128256,) if args.quick else (32000, 128256)
    for kind in KINDS:
        for batch in batches:
            for vocab in vocabs:
                torch_us, fused_us, kernel_us = bench_case(kind, batch, vocab)
                rows.append(
                    dict(kind=kind, batch=batch, vocab=vocab, torch_us=torch_us,
                         fused_us=fused_us, kernel_us=kernel_us)
                )  # fmt: skip
                print(
                    f"{kind} | {batch} | {vocab} | {torch_us:.1f} | {fused_us:.1f} | "
                    f"{kernel_us:.1f} | {torch_us / fused_us:.2f}x"
                )
    sweep_rows = []
    if args.sweep:
        print("\n## tuning sweep, batch 64 x 128256")
        print("kind | splits | block | warps | search block | radix bits | us")
        for kind in SWEEP:
            sweep_rows += sweep(kind)
    if args.json:
        device = torch.cuda.get_device_name()
        versions = dict(torch=torch.__version__, triton=triton.__version__)
        with open(args.json, "w") as out:
            json.dump(dict(device=device, **versions, rows=rows, sweep=sweep_rows), out, indent=1)


if __name__ == "__main__":
    main()
