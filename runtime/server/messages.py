"""Messages only the server's processes exchange (the scheduler's own are in `io_struct`).

`ProcessReady` / `ProcessFailed` travel once, on a pipe from a child to the launcher.
`WarmupDone` travels once, from the scheduler to the tokenizer manager.
Per scheduler step, one two-frame ZeroMQ message goes to the detokenizer:
`[RequestChanges, StepOutputs]` (each pickled, either frame empty when there is nothing);
the detokenizer forwards the `StepOutputs` frame unchanged (never re-pickled) with the text
deltas as a second frame: `[StepOutputs, list[str]]` to the tokenizer manager.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from radixgen.runtime.io_struct import ReqOutput

# Fields of `ReqOutput` that are None on most rows: carried per row only where set.
RARE_OUTPUT_FIELDS = (
    "finish_reason",
    "error",
    "output_token_logprobs",
    "output_top_logprobs",
    "input_token_logprobs",
    "input_top_logprobs",
)


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
class RequestChanges:
    """Requests the detokenizer must start (`specs`) or forget (`aborted_rids`), in the
    order the scheduler saw them; travels in the frame before the step's outputs."""

    specs: list[DetokenizeSpec] = field(default_factory=list)
    aborted_rids: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.specs or self.aborted_rids)


@dataclass
class StepOutputs:
    """One scheduler step's outputs, column by column: a few arrays and lists pickle in one
    go, where a `ReqOutput` per row cost ~1.5 us to pickle and ~3 us to unpickle (1024 rows:
    4.5 ms a step, in two processes on the critical path).

    Row i is sample `sample_indices[i]` of request `rids[i]`; its new tokens are
    `token_ids[token_offsets[i] : token_offsets[i + 1]]`.
    """

    rids: list[str]
    sample_indices: np.ndarray  # [rows] int32
    token_ids: np.ndarray  # [total new tokens] int32
    token_offsets: np.ndarray  # [rows + 1] int64
    finished: np.ndarray  # [rows] bool
    token_counts: np.ndarray  # [rows, 3] int32: prompt, completion, cached tokens
    rare_fields: dict[int, dict[str, Any]]  # row -> its RARE_OUTPUT_FIELDS that are set

    @classmethod
    def from_outputs(cls, outputs: list[ReqOutput]) -> StepOutputs:
        rids, indices, ids, lengths, finished, counts = [], [], [], [0], [], []
        rare_fields: dict[int, dict[str, Any]] = {}
        for row, output in enumerate(outputs):
            rids.append(output.rid)
            indices.append(output.index)
            ids += output.new_token_ids
            lengths.append(len(output.new_token_ids))
            finished.append(output.finished)
            counts.append((output.prompt_tokens, output.completion_tokens, output.cached_tokens))
            # (error implies finished; the top-logprob lists come with the token ones)
            if (
                output.finished
                or output.output_token_logprobs is not None
                or output.input_token_logprobs is not None
            ):
                rare = {name: getattr(output, name) for name in RARE_OUTPUT_FIELDS}
                rare_fields[row] = {k: v for k, v in rare.items() if v is not None}
        return cls(
            rids=rids,
            sample_indices=np.asarray(indices, dtype=np.int32),
            token_ids=np.asarray(ids, dtype=np.int32),
            token_offsets=np.cumsum(lengths, dtype=np.int64),
            finished=np.asarray(finished, dtype=bool),
            token_counts=np.asarray(counts, dtype=np.int32).reshape(-1, 3),
            rare_fields=rare_fields,
        )

    def __len__(self) -> int:
        return len(self.rids)

    def new_token_ids(self, row: int) -> list[int]:
        start, end = self.token_offsets[row], self.token_offsets[row + 1]
        return self.token_ids[start:end].tolist()

    def output(self, row: int) -> ReqOutput:
        """Row `row` as a `ReqOutput`."""
        prompt_tokens, completion_tokens, cached_tokens = self.token_counts[row].tolist()
        return ReqOutput(
            rid=self.rids[row],
            index=int(self.sample_indices[row]),
            new_token_ids=self.new_token_ids(row),
            finished=bool(self.finished[row]),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            **self.rare_fields.get(row, {}),
        )


def dump_frame(message: object | None) -> bytes:
    """A frame of a multi-frame message: the pickled message, or b"" for None."""
    return b"" if message is None else pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def load_frame(frame: bytes) -> Any:
    return None if not frame else pickle.loads(frame)


def merge_outputs(outputs: list[ReqOutput]) -> ReqOutput:
    """Consecutive outputs of one sample as one (tokens and logprobs concatenated; the rest
    from the last), for a consumer that fell behind the scheduler by several steps."""
    if len(outputs) == 1:
        return outputs[0]
    last = outputs[-1]
    merged = ReqOutput(
        rid=last.rid,
        index=last.index,
        new_token_ids=[token for output in outputs for token in output.new_token_ids],
        finished=last.finished,
        finish_reason=last.finish_reason,
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        cached_tokens=last.cached_tokens,
        error=next((o.error for o in outputs if o.error is not None), None),
    )
    for name in ("output_token_logprobs", "output_top_logprobs"):
        parts = [getattr(o, name) for o in outputs if getattr(o, name) is not None]
        if parts:
            setattr(merged, name, [entry for part in parts for entry in part])
    for name in ("input_token_logprobs", "input_top_logprobs"):
        values = (getattr(o, name) for o in outputs if getattr(o, name) is not None)
        setattr(merged, name, next(values, None))
    return merged
