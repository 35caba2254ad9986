"""`bench serving`'s HTTP client with and without idle connections kept (a profiling aid, not a
test).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_client_pool.py [--num-prompts 1024]

Starts `radixgen serve` (tiny model on the CPU) and sends `--num-prompts` requests of 8 random
token ids and 2 new tokens at once, three times: the client's connection pool keeping every
finished request's connection (`max_keepalive_connections=None`, as `bench serving` did before
the seventh session), keeping none (what it does now), and keeping all again. Prints the wall
time and the client's own CPU seconds of each run. The server's work is the same in all three;
the difference is httpcore 1.0's pool, which walks every connection for every idle one each
time a request starts or ends.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

from radixgen.runtime.bench.datasets import DatasetArgs, build_dataset
from radixgen.runtime.bench.serving import ServingArgs, run_serving
from radixgen.runtime.server.subprocess_launcher import ServerProcess


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-prompts", type=int, default=1024)
    args = parser.parse_args()
    requests = build_dataset(
        DatasetArgs(
            dataset="random-ids",
            num_prompts=args.num_prompts,
            random_input_len=8,
            random_output_len=2,
        )
    )
    limits = httpx.Limits
    flags = ["--model-path", "tiny", "--log-level", "warning"]
    flags += ["--max-running-requests", str(2 * args.num_prompts)]
    with ServerProcess(flags) as server:
        serving = ServingArgs(base_url=server.base_url)
        asyncio.run(run_serving(serving, requests[:4]))  # warm
        for kept in (None, 0, None):
            # run_serving builds its pool with httpx.Limits: swap in the pool size under test.
            httpx.Limits = lambda kept=kept, **_: limits(
                max_connections=None, max_keepalive_connections=kept
            )
            try:
                start, cpu = time.perf_counter(), time.process_time()
                summary, _ = asyncio.run(run_serving(serving, requests))
                wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
            finally:
                httpx.Limits = limits
            print(
                f"idle connections kept: {'all' if kept is None else kept:>3}: "
                f"{wall_s:6.2f} s wall, client CPU {cpu_s:6.2f} s, "
                f"{summary['successful_requests']}/{len(requests)} requests succeeded"
            )


if __name__ == "__main__":
    main()
