"""Time to first token of requests whose JSON schema the server has never seen, against
unconstrained requests, on a running `radixgen serve` ([4/14]: compiles off the critical path).

Each request generates one token (so its latency is its time to first token). Requests run one
at a time, alternating unconstrained and constrained; every constrained request has a schema
with fresh property names, so no compile cache can answer it.

Usage: python scripts/bench_schema_ttft.py --base-url http://127.0.0.1:30000 [--num 20]
Prints one JSON line: median and p90 latency of each kind, and the median difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import httpx


def fresh_schema(index: int) -> dict:
    """A realistic object schema whose names no earlier request used."""
    tag = uuid.uuid4().hex[:8]
    return {
        "type": "object",
        "properties": {
            f"name_{tag}": {"type": "string", "maxLength": 40},
            f"age_{tag}": {"type": "integer", "minimum": 0, "maximum": 150},
            f"email_{tag}": {"type": "string", "format": "email"},
            f"tags_{tag}": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
            f"kind_{tag}": {"enum": ["a", "b", f"c{index}"]},
        },
        "required": [f"name_{tag}", f"age_{tag}"],
        "additionalProperties": False,
    }


def timed_request(client: httpx.Client, sampling_params: dict) -> float:
    body = {"text": "Describe a person as JSON: ", "sampling_params": sampling_params}
    start = time.perf_counter()
    response = client.post("/generate", json=body)
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:30000")
    parser.add_argument("--num", type=int, default=20)
    args = parser.parse_args()
    plain_s, schema_s = [], []
    with httpx.Client(base_url=args.base_url, timeout=120) as client:
        # One token cannot complete a schema: the budget check is off (this measures compiles).
        one_token = {"max_new_tokens": 1, "temperature": 0, "constraint_budget": False}
        for _ in range(3):  # warm-up: kernels, the grammar backend's tokenizer index
            timed_request(client, one_token)
            timed_request(client, {**one_token, "json_schema": fresh_schema(-1)})
        for index in range(args.num):
            plain_s.append(timed_request(client, one_token))
            schema_s.append(
                timed_request(client, {**one_token, "json_schema": fresh_schema(index)})
            )

    def p90(values: list[float]) -> float:
        return sorted(values)[int(0.9 * (len(values) - 1))]

    print(
        json.dumps(
            {
                "num": args.num,
                "unconstrained_ms_median": 1e3 * statistics.median(plain_s),
                "new_schema_ms_median": 1e3 * statistics.median(schema_s),
                "unconstrained_ms_p90": 1e3 * p90(plain_s),
                "new_schema_ms_p90": 1e3 * p90(schema_s),
                "extra_ms_median": 1e3 * (statistics.median(schema_s) - statistics.median(plain_s)),
            }
        )
    )


if __name__ == "__main__":
    main()
