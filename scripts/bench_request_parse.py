"""The HTTP process's own work on one `/generate` request body, step by step (CPU; a
profiling aid, not a test).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_request_parse.py [--input-len 2176]

A generated-shared-prefix-sized request (2,048 + 128 token ids, streamed, greedy): JSON
parsing, the nesting-depth guard, the body's pydantic model, the validated `GenerateReq`, and
its pickle for the scheduler. Microseconds per request, the median of 5 runs of 200. At 1,024
requests submitted at once (the served benchmark), their sum is event-loop time before the
last request reaches the scheduler.
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import statistics
import timeit

from radixgen.runtime.request_schema import json_depth
from radixgen.runtime.server.native_api import GenerateBody, build_request


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input-len", type=int, default=2176)
    args = parser.parse_args()
    rng = random.Random(0)
    params = {"max_new_tokens": 256, "temperature": 0.0, "ignore_eos": True}
    ids = [rng.randrange(32000) for _ in range(args.input_len)]
    raw = json.dumps({"input_ids": ids, "sampling_params": params, "stream": True}).encode()
    data = json.loads(raw)
    body = GenerateBody.model_validate(data)
    request = build_request(input_ids=list(body.input_ids), sampling_params=params, stream=True)
    steps = {
        "json.loads": lambda: json.loads(raw),
        "json_depth": lambda: json_depth(data),
        "GenerateBody.model_validate": lambda: GenerateBody.model_validate(data),
        "build_request (GenerateReq, validated)": lambda: build_request(
            input_ids=list(body.input_ids), sampling_params=params, stream=True
        ),
        "pickle.dumps (to the scheduler)": lambda: pickle.dumps(request),
    }
    total = 0.0
    for name, step in steps.items():
        us = statistics.median(timeit.repeat(step, number=200, repeat=5)) / 200 * 1e6
        total += us
        print(f"{name:40s} {us:8.1f} us")
    print(f"{'total':40s} {total:8.1f} us ({len(raw)} bytes of JSON)")


if __name__ == "__main__":
    main()
