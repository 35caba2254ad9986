"""Benchmark of RadixCache on the host: match_prefix + insert of many requests, then evict.

Workload: `num_requests` requests in `num_groups` groups; the requests of a group share a
`system_len`-token system prompt and each adds its own `suffix_len` random tokens. Each
request does what the scheduler does: match_prefix, allocate slots for the unmatched tail,
insert, free the duplicates. Then 100 evictions of `suffix_len` tokens (one request's room),
and one eviction of `evict_tokens` tokens.

Run: OMP_NUM_THREADS=1 python scripts/bench_radix_cache.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from radixgen.radix_cache.memory_pool import SlotAllocator
from radixgen.radix_cache.radix_cache import RadixCache


def _percentile(values_us: list[float], fraction: float) -> float:
    ordered = sorted(values_us)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _random_tokens(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    return [rng.randrange(vocab_size) for _ in range(length)]


def run_benchmark(args: argparse.Namespace) -> dict[str, float]:
    rng = random.Random(args.seed)
    system_prompts = [
        _random_tokens(rng, args.system_len, args.vocab_size) for _ in range(args.num_groups)
    ]
    # Through a tensor so that every request has its own int objects, as token ids coming
    # from a tokenizer do; shared objects would make the tuple comparisons identity checks.
    requests = [
        torch.tensor(
            system_prompts[i % args.num_groups]
            + _random_tokens(rng, args.suffix_len, args.vocab_size)
        ).tolist()
        for i in range(args.num_requests)
    ]
    num_slots = args.num_groups * args.system_len + args.num_requests * args.suffix_len + 1
    allocator = SlotAllocator(num_slots)
    cache = RadixCache(allocator)

    match_us, insert_us, hit_match_us = [], [], []
    for request in requests:
        start = time.perf_counter_ns()
        match = cache.match_prefix(request)
        matched = time.perf_counter_ns()
        slots = allocator.alloc(len(request) - match.prefix_len)
        num_cached = cache.insert(request, torch.cat([match.slots, slots]))
        inserted = time.perf_counter_ns()
        allocator.free(slots[: num_cached - match.prefix_len])
        match_us.append((matched - start) / 1e3)
        insert_us.append((inserted - matched) / 1e3)
        if match.prefix_len >= args.system_len:
            hit_match_us.append((matched - start) / 1e3)

    # Small evictions, as the scheduler makes room for one request at a time.
    start = time.perf_counter_ns()
    num_small_evictions = 100
    for _ in range(num_small_evictions):
        cache.evict(args.suffix_len)
    evict_one_request_us = (time.perf_counter_ns() - start) / 1e3 / num_small_evictions

    total_tokens = cache.total_size()
    start = time.perf_counter_ns()
    num_evicted = cache.evict(args.evict_tokens)
    evict_ms = (time.perf_counter_ns() - start) / 1e6
    cache.check_invariants()
    if allocator.available_size() + cache.total_size() != allocator.capacity:
        raise AssertionError("slots were lost during the benchmark")
    return {
        "requests": len(requests),
        "cached_tokens_before_evict": total_tokens,
        "hit_rate": cache.stats.hit_rate,
        "match_us_mean": statistics.fmean(match_us),
        "insert_us_mean": statistics.fmean(insert_us),
        "match_2k_hit_us_median": statistics.median(hit_match_us),
        "match_2k_hit_us_p90": _percentile(hit_match_us, 0.9),
        "match_2k_hit_count": len(hit_match_us),
        "evict_suffix_len_tokens_us": evict_one_request_us,
        "evicted_tokens": num_evicted,
        "evict_ms": evict_ms,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--num-groups", type=int, default=64)
    parser.add_argument("--system-len", type=int, default=2048)
    parser.add_argument("--suffix-len", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=32_000)
    parser.add_argument("--evict-tokens", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("num_requests", "num_groups", "system_len", "suffix_len", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    results = run_benchmark(args)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, args {vars(args)}")
    for name, value in results.items():
        print(f"{name:>28}: {value:.3f}" if isinstance(value, float) else f"{name:>28}: {value}")


if __name__ == "__main__":
    main()
