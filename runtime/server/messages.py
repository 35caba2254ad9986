"""Messages only the server's processes exchange (the scheduler's own are in `io_struct`).

`ProcessReady` / `ProcessFailed` travel once, on a pipe from a child to the launcher.
`DetokenizeSpec` and `BatchStrOutput` travel over ZeroMQ around the detokenizer process;
`WarmupDone` from the scheduler to the tokenizer manager, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixgen.runtime.io_struct import ReqOutput


@dataclass
class ProcessReady:
    name: str
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProcessFailed:
    name: str
    traceback: str


@dataclass(frozen=True)
class ServedModelInfo:
    """What the scheduler tells the front end once the model is loaded."""

    model_path: str
    served_model_name: str
    context_length: int
    vocab_size: int
    max_total_tokens: int
    max_running_requests: int


@dataclass(frozen=True)
class WarmupDone:
    """The scheduler finished its start-up warm-up (or skipped it): the tokenizer manager
    starts admitting requests and `/health` answers 200."""

    num_requests: int
    duration_s: float


@dataclass
class DetokenizeSpec:
    """How to detokenize one request; the scheduler forwards it ahead of the request's outputs.

    It travels on the scheduler -> detokenizer socket, so it always arrives before the first
    `ReqOutput` of its request.
    """

    rid: str
    num_samples: int  # the request's `n`
    prompt_tail_ids: list[int]  # the last prompt tokens, decoding context for the first output
    skip_special_tokens: bool
    stop_strings: list[str]


@dataclass
class BatchStrOutput:
    """One scheduler step's outputs after detokenization (what the tokenizer manager reads).

    `text_deltas[i]` is the text new in `outputs[i]`: stop strings trimmed, possibly "" while
    a multi-byte character is incomplete.
    """

    outputs: list[ReqOutput]
    text_deltas: list[str]
