"""The `--speculative-*` flags, resolved once into a `SpeculativeConfig` (torch-free).

The flags are SGLang's. With `--speculative-eagle-topk 1` (a chain, the only tree shape
supported so far) the relation is `num_draft_tokens = num_steps + 1`: a verify forward
computes, per request, its last sampled token plus `num_steps` drafted tokens. Either flag
alone determines the other; both given must agree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

DEFAULT_NUM_STEPS = 4
# The default batch-size cap keeps a verify forward within this many tokens (batch x
# num_draft_tokens): an 8B decode step on the H200 streams its 15 GB of weights in >= 3.5 ms,
# the time of ~170 tokens of compute at 790 TFLOP/s, so up to ~128 tokens a verify forward
# costs about a decode step; beyond, rejected drafts cost real compute. A cost model until
# `scripts/bench_speculative.py verify-cost` measures it (docs/engine.md; on the CPU, tiny
# gained up to batch 32: docs/benchmarks.md).
DEFAULT_MAX_VERIFY_TOKENS = 128
# Below this mean accept length (tokens per request per verify step) speculation backs off:
# on the CPU (tiny, batch 1) NGRAM at 1.71 was 0.93x plain decoding (sampled text), at 3.36
# 1.78x (greedy code); a verify forward costs 1.4-1.8 decode steps there (docs/benchmarks.md).
DEFAULT_MIN_ACCEPT_LENGTH = 2.0
DEFAULT_NGRAM_MIN_WINDOW = 1
DEFAULT_NGRAM_MAX_WINDOW = 12


class SpeculativeAlgorithm(enum.Enum):
    NGRAM = "NGRAM"  # prompt lookup: the continuation of an earlier match of the last tokens
    STANDALONE = "STANDALONE"  # a small draft model with its own KV
    EAGLE = "EAGLE"  # a one-layer draft head on the target's last hidden states


# The algorithms that draft with a model in speculative_draft_model_path.
DRAFT_MODEL_ALGORITHMS = (SpeculativeAlgorithm.STANDALONE, SpeculativeAlgorithm.EAGLE)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Resolved speculative options (see `resolve_speculative_config`)."""

    algorithm: SpeculativeAlgorithm
    num_steps: int  # tokens drafted per request per verify step (at most)
    num_draft_tokens: int  # tokens per request in a verify forward: num_steps + 1
    max_batch_size: int  # running batches larger than this decode without speculation
    ngram_min_window: int  # shortest suffix that must match earlier in the sequence
    ngram_max_window: int  # longest suffix tried (the longest match wins)
    min_accept_length: float  # below it (a moving average), speculation backs off; 0: never
    draft_model_path: str | None = None


def resolve_speculative_config(args: Any) -> SpeculativeConfig | None:
    """The speculative options of a `ServerArgs` (None: speculation off).

    Raises:
        ValueError: naming the flag: an unknown algorithm, a topk other than 1, draft and
            step counts that disagree, sizes below 1, speculative flags without
            `--speculative-algorithm`.
    """
    name = args.speculative_algorithm
    if name is None:
        given = [
            flag
            for flag in (
                "speculative_num_steps",
                "speculative_num_draft_tokens",
                "speculative_eagle_topk",
                "speculative_draft_model_path",
                "speculative_max_batch_size",
                "speculative_min_accept_length",
            )
            if getattr(args, flag) is not None
        ]
        if given:
            raise ValueError(f"{given} need speculative_algorithm (NGRAM, STANDALONE or EAGLE)")
        return None
    choices = [a.value for a in SpeculativeAlgorithm]
    if not isinstance(name, str) or name.upper() not in choices:
        raise ValueError(f"speculative_algorithm must be one of {choices} (any case), got {name!r}")
    algorithm = SpeculativeAlgorithm(name.upper())
    topk = args.speculative_eagle_topk
    if topk is not None and topk != 1:
        raise ValueError(
            f"speculative_eagle_topk must be 1 (a chain of drafts; trees are not supported "
            f"yet), got {topk}"
        )
    steps, draft_tokens = args.speculative_num_steps, args.speculative_num_draft_tokens
    if steps is None and draft_tokens is None:
        steps = DEFAULT_NUM_STEPS
    if steps is None:
        steps = draft_tokens - 1
    if draft_tokens is None:
        draft_tokens = steps + 1
    if draft_tokens != steps + 1:
        raise ValueError(
            f"with speculative_eagle_topk 1, speculative_num_draft_tokens must be "
            f"speculative_num_steps + 1 = {steps + 1}, got {draft_tokens}"
        )
    if steps < 1:
        raise ValueError(
            f"speculative_num_steps must be >= 1 (speculative_num_draft_tokens >= 2), got {steps}"
        )
    max_batch_size = args.speculative_max_batch_size
    if max_batch_size is None:
        max_batch_size = max(1, DEFAULT_MAX_VERIFY_TOKENS // draft_tokens)
    if max_batch_size < 1:
        raise ValueError(f"speculative_max_batch_size must be >= 1, got {max_batch_size}")
    min_window = args.speculative_ngram_min_match_window_size
    max_window = args.speculative_ngram_max_match_window_size
    if not 1 <= min_window <= max_window:
        raise ValueError(
            "speculative_ngram_min_match_window_size must be >= 1 and <= "
            f"speculative_ngram_max_match_window_size, got {min_window} and {max_window}"
        )
    has_draft_model = args.speculative_draft_model_path is not None
    if has_draft_model and algorithm is SpeculativeAlgorithm.NGRAM:
        raise ValueError("speculative_draft_model_path is for STANDALONE and EAGLE, not NGRAM")
    if not has_draft_model and algorithm in DRAFT_MODEL_ALGORITHMS:
        raise ValueError(
            f"speculative_algorithm={algorithm.value!r} needs speculative_draft_model_path"
            + (" (an EAGLE head's folder)" if algorithm is SpeculativeAlgorithm.EAGLE else "")
        )
    min_accept_length = args.speculative_min_accept_length
    if min_accept_length is None:
        min_accept_length = DEFAULT_MIN_ACCEPT_LENGTH
    if min_accept_length < 0:
        raise ValueError(f"speculative_min_accept_length must be >= 0, got {min_accept_length}")
    return SpeculativeConfig(
        algorithm=algorithm,
        num_steps=steps,
        num_draft_tokens=draft_tokens,
        max_batch_size=max_batch_size,
        ngram_min_window=min_window,
        ngram_max_window=max_window,
        min_accept_length=min_accept_length,
        draft_model_path=args.speculative_draft_model_path,
    )
