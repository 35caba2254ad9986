"""Synthetic benchmark workloads, built offline and deterministically from a seed.

Each workload is a list of `BenchRequest`s: token ids (or text) plus the output length to
force. Nothing is downloaded: prompts are random token ids, as in the usual serving
benchmarks' `random` datasets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import numpy as np

DatasetName = Literal[
    "random-ids",
    "generated-shared-prefix",
    "multi-turn",
    "json",
    "json-array",
    "json-keys",
    "sharegpt",
]
# ShareGPT replies are measured in characters; ~4 characters a token (English text) turns them
# into the output length to force, as no tokenizer is at hand on the client.
SHAREGPT_CHARS_PER_TOKEN = 4

# Token ids below this are left out of random prompts: they are often special or control
# tokens in real vocabularies (and byte tokens in byte-level BPE).
_FIRST_ORDINARY_ID = 300


@dataclass
class BenchRequest:
    input_ids: list[int] | None  # the prompt as ids (None for text prompts)
    output_len: int  # tokens to generate (ignore_eos forces exactly this many)
    text: str | None = None
    json_schema: dict | None = None
    # multi-turn: conversation index and turn; later turns are built from earlier answers.
    conversation: int | None = None
    turn: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids) if self.input_ids is not None else 0


@dataclass(frozen=True)
class DatasetArgs:
    """Every knob of every workload; defaults follow the common serving benchmarks."""

    dataset: DatasetName = "random-ids"
    num_prompts: int = 1000
    vocab_size: int = 32000
    seed: int = 0
    # random-ids
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 1.0  # lengths drawn uniformly from [ratio * len, len]
    # generated-shared-prefix
    gsp_num_groups: int = 64
    gsp_prompts_per_group: int = 16
    gsp_system_prompt_len: int = 2048
    gsp_question_len: int = 128
    gsp_output_len: int = 256
    # multi-turn
    num_conversations: int = 32
    num_turns: int = 4
    turn_input_len: int = 128
    turn_output_len: int = 64
    # json
    json_output_len: int = 128
    # json-array: an array of exactly this many one-digit integers, so every constrained
    # output has (nearly) the same length, for TPOT against unconstrained runs of that length
    json_array_items: int = 24
    # sharegpt: a local ShareGPT-format file (a JSON list of {"conversations": [{"from":
    # "human"|"gpt", "value": text}, ...]}); each conversation's first human turn is a prompt
    dataset_path: str | None = None
    sharegpt_output_len: int | None = None  # None: the first reply's length (chars / 4)

    def __post_init__(self):
        if not 0.0 < self.random_range_ratio <= 1.0:
            raise ValueError(f"random_range_ratio must be in (0, 1], got {self.random_range_ratio}")
        if self.vocab_size <= _FIRST_ORDINARY_ID:
            raise ValueError(f"vocab_size must be > {_FIRST_ORDINARY_ID}, got {self.vocab_size}")


def _lengths(rng: np.random.Generator, length: int, ratio: float, count: int) -> np.ndarray:
    low = max(1, int(length * ratio))
    return rng.integers(low, length + 1, size=count)


def _ids(rng: np.random.Generator, vocab_size: int, count: int) -> list[int]:
    return rng.integers(_FIRST_ORDINARY_ID, vocab_size, size=count).tolist()


def random_ids(args: DatasetArgs) -> list[BenchRequest]:
    rng = np.random.default_rng(args.seed)
    in_lens = _lengths(rng, args.random_input_len, args.random_range_ratio, args.num_prompts)
    out_lens = _lengths(rng, args.random_output_len, args.random_range_ratio, args.num_prompts)
    return [
        BenchRequest(input_ids=_ids(rng, args.vocab_size, int(n_in)), output_len=int(n_out))
        for n_in, n_out in zip(in_lens, out_lens, strict=True)
    ]


def generated_shared_prefix(args: DatasetArgs) -> list[BenchRequest]:
    """`num_groups` system prompts, each shared by `prompts_per_group` questions.

    Requests are shuffled so that a cache-unaware scheduler sees groups interleaved.
    """
    rng = np.random.default_rng(args.seed)
    requests = []
    for _group in range(args.gsp_num_groups):
        system = _ids(rng, args.vocab_size, args.gsp_system_prompt_len)
        for _ in range(args.gsp_prompts_per_group):
            question = _ids(rng, args.vocab_size, args.gsp_question_len)
            requests.append(
                BenchRequest(input_ids=system + question, output_len=args.gsp_output_len)
            )
    order = rng.permutation(len(requests))
    return [requests[i] for i in order]


def multi_turn(args: DatasetArgs) -> list[BenchRequest]:
    """Turn t of a conversation = all earlier prompts and answers + a new user message.

    Only each turn's *new* user message is stored here; the client prepends the history
    (with the answers the server really gave) when it sends the turn.
    """
    rng = np.random.default_rng(args.seed)
    return [
        BenchRequest(
            input_ids=_ids(rng, args.vocab_size, args.turn_input_len),
            output_len=args.turn_output_len,
            conversation=conversation,
            turn=turn,
        )
        for conversation in range(args.num_conversations)
        for turn in range(args.num_turns)
    ]


JSON_BENCH_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "active"],
    "additionalProperties": False,
}


def json_workload(args: DatasetArgs) -> list[BenchRequest]:
    rng = np.random.default_rng(args.seed)
    subjects = ["customer", "employee", "student", "patient", "author", "driver"]
    return [
        BenchRequest(
            input_ids=None,
            text=(
                f"Describe a fictional {subjects[i % len(subjects)]} number "
                f"{int(rng.integers(1, 10_000))} as a JSON object: "
            ),
            output_len=args.json_output_len,
            json_schema=JSON_BENCH_SCHEMA,
        )
        for i in range(args.num_prompts)
    ]


def json_array_schema(num_items: int) -> dict:
    digit = {"type": "integer", "minimum": 0, "maximum": 9}
    return {"type": "array", "items": digit, "minItems": num_items, "maxItems": num_items}


def json_array_workload(args: DatasetArgs) -> list[BenchRequest]:
    """Constrained outputs of fixed length: `[d,d,...,d]` with `json_array_items` digits."""
    schema = json_array_schema(args.json_array_items)
    return [
        BenchRequest(
            input_ids=None,
            text=f"List {args.json_array_items} digits of sample {i} as a JSON array: ",
            output_len=4 * args.json_array_items + 8,  # room; the schema ends it earlier
            json_schema=schema,
        )
        for i in range(args.num_prompts)
    ]


# A key-heavy record: ten required properties with long names and one-token values, in the
# declared order, so most of each output is text the schema forces (what jump-forward skips).
JSON_KEYS_SCHEMA = {
    "type": "object",
    "properties": {
        **{
            f"{name}_status": {"type": "boolean"}
            for name in ("billing_account", "shipping_address", "customer_contact", "order_history")
        },
        **{
            f"{name}_priority": {"enum": ["low", "high"]}
            for name in ("support_ticket", "refund_request", "account_security")
        },
        **{
            f"{name}_score": {"type": "integer", "minimum": 0, "maximum": 9}
            for name in ("satisfaction_survey", "delivery_experience", "product_quality")
        },
    },
    "additionalProperties": False,
}
JSON_KEYS_SCHEMA["required"] = list(JSON_KEYS_SCHEMA["properties"])


def json_keys_workload(args: DatasetArgs) -> list[BenchRequest]:
    """Key-heavy constrained outputs (`JSON_KEYS_SCHEMA`): the jump-forward benchmark."""
    return [
        BenchRequest(
            input_ids=None,
            text=f"Summarise support case {i} as a JSON record: ",
            output_len=256,  # room; the schema ends every output well before
            json_schema=JSON_KEYS_SCHEMA,
        )
        for i in range(args.num_prompts)
    ]


def sharegpt(args: DatasetArgs) -> list[BenchRequest]:
    """The first human turn of each conversation of `dataset_path`, with its reply's length
    as the output length, for the first `num_prompts` conversations that have both.

    Raises:
        ValueError: no --dataset-path, or a file that is not ShareGPT-shaped.
    """
    if args.dataset_path is None:
        raise ValueError("the sharegpt dataset needs --dataset-path FILE (nothing is downloaded)")
    with open(args.dataset_path) as file:
        conversations = json.load(file)
    if not isinstance(conversations, list):
        raise ValueError(f"{args.dataset_path}: expected a JSON list of conversations")
    requests = []
    for entry in conversations:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        prompt, reply = turns[0].get("value"), turns[1].get("value")
        if turns[0].get("from") != "human" or not prompt or not isinstance(reply, str):
            continue
        output_len = args.sharegpt_output_len or max(1, len(reply) // SHAREGPT_CHARS_PER_TOKEN)
        requests.append(BenchRequest(input_ids=None, text=prompt, output_len=output_len))
        if len(requests) == args.num_prompts:
            break
    if not requests:
        raise ValueError(f"{args.dataset_path}: no conversation with a human turn and a reply")
    return requests


def build_dataset(args: DatasetArgs) -> list[BenchRequest]:
    builders = {
        "sharegpt": sharegpt,
        "random-ids": random_ids,
        "generated-shared-prefix": generated_shared_prefix,
        "multi-turn": multi_turn,
        "json": json_workload,
        "json-array": json_array_workload,
        "json-keys": json_keys_workload,
    }
    if args.dataset not in builders:
        raise ValueError(f"dataset must be one of {sorted(builders)}, got {args.dataset!r}")
    return builders[args.dataset](args)


def describe(requests: list[BenchRequest]) -> str:
    in_lens = [r.prompt_len for r in requests]
    out_lens = [r.output_len for r in requests]
    return json.dumps(
        {
            "requests": len(requests),
            "input_tokens": int(sum(in_lens)),
            "output_tokens": int(sum(out_lens)),
        }
    )
