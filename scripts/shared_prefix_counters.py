"""Prefill work of a shared-prefix workload through the Engine: deterministic counters, no
timing, so it runs on CPU with the tiny model.

`groups` system prompts of `system-len` random token ids, `per-group` questions of
`question-len` each, shuffled (groups interleaved, as a server receives them) and submitted
as one batch. Prints the scheduler's prefill counters next to the ideal (each system prompt
computed once).

    python scripts/shared_prefix_counters.py --groups 8 --per-group 8 --system-len 256 \
        --question-len 16 --output-len 4 [--option in_batch_prefix_min_tokens=0 ...]
"""

from __future__ import annotations

import argparse
import json
import random

from radixgen.runtime.engine import Engine


def make_prompts(args: argparse.Namespace) -> list[list[int]]:
    rng = random.Random(args.seed)

    def random_ids(n: int) -> list[int]:
        return [rng.randrange(10, 250) for _ in range(n)]

    prompts = []
    for _ in range(args.groups):
        system = random_ids(args.system_len)
        prompts += [system + random_ids(args.question_len) for _ in range(args.per_group)]
    rng.shuffle(prompts)
    return prompts


def parse_option(text: str) -> tuple[str, object]:
    name, _, value = text.partition("=")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--per-group", type=int, default=8)
    parser.add_argument("--system-len", type=int, default=256)
    parser.add_argument("--question-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--option", action="append", default=[], help="a ServerArgs field, NAME=VALUE (JSON)"
    )
    args = parser.parse_args()
    options = {
        "model_path": "tiny",
        "dtype": "float32",
        "max_total_tokens": 65536,
        "max_prefill_tokens": 16384,
        "chunked_prefill_size": 16384,
    }
    options.update(parse_option(text) for text in args.option)
    prompts = make_prompts(args)
    engine = Engine(**options)
    try:
        engine.generate(
            input_ids=prompts,
            sampling_params={
                "max_new_tokens": args.output_len,
                "temperature": 0,
                "ignore_eos": True,
            },
        )
        engine.check_integrity()
        stats = engine.get_stats()
    finally:
        engine.shutdown()
    ideal = args.groups * args.system_len + len(prompts) * args.question_len
    report = {
        name: stats[name]
        for name in (
            "num_prompt_tokens",
            "num_cached_tokens",
            "num_computed_prefill_tokens",
            "cache_hit_rate",
            "num_forward_steps",
        )
    }
    report["ideal_computed_prefill_tokens"] = ideal
    report["ideal_cache_hit_rate"] = 1 - ideal / stats["num_prompt_tokens"]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
