"""`Req`: one sequence being generated (one of a request's `n` samples), its KV state and its
status (`ReqStatus`), whose transitions are all in `ALLOWED_TRANSITIONS`."""

from __future__ import annotations

import enum
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from radixgen.runtime.detokenizer import IncrementalDetokenizer
from radixgen.runtime.io_struct import TokenLogprob
from radixgen.runtime.request_schema import SamplingParams


class ReqStatus(enum.Enum):
    """Where a sequence is in the scheduler."""

    WAITING = "waiting"  # queued: new, or retracted (its KV went to the cache) to resume
    PREFILLING = "prefilling"  # in an extend batch: its prompt is computed
    CHUNKED = "chunked"  # admitted, and its prefill continues in a later extend batch
    DECODING = "decoding"  # in the running batch: one token per decode step
    # In the running batch; a jump-forward appended tokens that its next forward computes
    # as one multi-token row among the decode rows (then it samples, as DECODING does).
    JUMPED = "jumped"
    FINISHED = "finished"  # done: stop (EOS, stop id or string, constraint) or length
    ABORTED = "aborted"  # aborted by the client, or failed (e.g. its constraint)

    # Members are singletons compared by identity: hash them by identity too, in C. Enum's
    # own `__hash__` is a Python call, and `set_status` hashes twice per request per step.
    __hash__ = object.__hash__


_FINAL = {ReqStatus.FINISHED, ReqStatus.ABORTED}  # reachable from every other status
# The one place where a sequence's status may change (`Req.set_status` checks it).
ALLOWED_TRANSITIONS: dict[ReqStatus, set[ReqStatus]] = {
    ReqStatus.WAITING: {ReqStatus.PREFILLING, ReqStatus.CHUNKED} | _FINAL,
    ReqStatus.PREFILLING: {ReqStatus.DECODING, ReqStatus.WAITING} | _FINAL,
    ReqStatus.CHUNKED: {ReqStatus.PREFILLING, ReqStatus.CHUNKED, ReqStatus.WAITING} | _FINAL,
    ReqStatus.DECODING: {ReqStatus.JUMPED, ReqStatus.WAITING} | _FINAL,
    ReqStatus.JUMPED: {ReqStatus.DECODING, ReqStatus.WAITING} | _FINAL,
    ReqStatus.FINISHED: set(),
    ReqStatus.ABORTED: set(),
}


@dataclass
class Req:
    """A sequence in the scheduler.

    KV invariant: positions `[0, kv_committed_len)` of `fill_ids` have their KV slots in
    row `req_pool_idx` of `req_to_token`; the first `len(prefix_indices)` of them belong to
    the radix cache (locked through `last_node`), the rest to this request.
    """

    rid: str
    index: int  # which of the request's n samples
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    sampling_seed: int  # seed of the counter-based sampler (seed + index, or drawn)
    eos_token_ids: frozenset[int]
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int = 0
    arrival_time_s: float = field(default_factory=time.monotonic)
    # Radix cache namespace (the request's cache salt): prefixes are shared only within it.
    cache_namespace: Hashable = None  # (cache_salt, lora_path) for an adapter's requests
    # The LoRA adapter by name (None: base model) and its pool slot while admitted (-1: none).
    lora_path: str | None = None
    lora_slot: int = -1

    status: ReqStatus = ReqStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None  # set with FINISHED / ABORTED (`finish`)
    error: str | None = None

    # KV state (None / 0 while waiting).
    req_pool_idx: int | None = None
    prefix_indices: torch.Tensor | None = None  # [prefix_len] int64 slots owned by the cache
    last_node: Any = None  # radix node locked on behalf of this request
    kv_committed_len: int = 0
    # Tokens whose KV this request's next extend forward computes (a chunk of fill_ids).
    extend_input_len: int = 0

    # Accounting.
    cached_tokens: int = 0  # prefix reused at first admission (what the user sees)
    admitted_once: bool = False
    num_retractions: int = 0
    num_prefix_deferrals: int = 0  # batches it waited for a prefix another request computed
    num_sent_tokens: int = 0  # output tokens already reported
    stop_checker: IncrementalDetokenizer | None = None  # only when stop strings are set
    grammar: Any = None  # constrained-decoding matcher (radixgen.constrained), if any
    grammar_ready: bool = True  # False while its constraint compiles
    # n > 1: the sibling whose prefill must put the prompt in the cache before this one
    # is admitted, so the prompt is computed once.
    prefill_gate: Req | None = None
    prompt_published: bool = False  # its prompt is fully computed (and cached)

    # Logprobs, accumulated; the `sent` counters say what was reported.
    input_token_logprobs: list[TokenLogprob] = field(default_factory=list)
    input_top_logprobs: list[list[TokenLogprob] | None] = field(default_factory=list)
    input_logprobs_done: bool = False
    input_logprobs_sent: bool = False
    output_token_logprobs: list[TokenLogprob] = field(default_factory=list)
    output_top_logprobs: list[list[TokenLogprob]] = field(default_factory=list)

    @property
    def fill_ids(self) -> list[int]:
        """Every token whose KV must exist before the next token is sampled."""
        return self.origin_input_ids + self.output_ids

    def fill_slice(self, start: int, end: int) -> list[int]:
        """`fill_ids[start:end]` without building the whole list (decode's hot path)."""
        num_prompt = len(self.origin_input_ids)
        if start >= num_prompt:
            return self.output_ids[start - num_prompt : end - num_prompt]
        if end <= num_prompt:
            return self.origin_input_ids[start:end]
        return self.origin_input_ids[start:] + self.output_ids[: end - num_prompt]

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def num_uncommitted(self) -> int:
        """Tokens without KV yet, all computed by its next forward in the running batch: 1
        when decoding, more after a jump-forward (the forced run)."""
        return self.seqlen - self.kv_committed_len

    def set_status(self, status: ReqStatus) -> None:
        """Moves to `status`; a transition outside `ALLOWED_TRANSITIONS` is a scheduler bug."""
        if status not in ALLOWED_TRANSITIONS[self.status]:
            raise AssertionError(f"request {self.rid}: {self.status.value} -> {status.value}")
        self.status = status

    def finish(self, reason: dict[str, Any]) -> None:
        """Ends generation with `reason` (SGLang's finish-reason dict): ABORTED for an
        abort, FINISHED otherwise. Its KV is released by the scheduler's result processor."""
        self.set_status(ReqStatus.ABORTED if reason["type"] == "abort" else ReqStatus.FINISHED)
        self.finish_reason = reason

    @property
    def finished(self) -> bool:
        return self.status is ReqStatus.FINISHED or self.status is ReqStatus.ABORTED

    @property
    def wants_input_logprobs(self) -> bool:
        return (
            self.return_logprob
            and self.logprob_start_len is not None
            and not self.input_logprobs_done
        )

    @property
    def max_prefix_len(self) -> int:
        """How much of fill_ids may come from the cache.

        At least one token is always computed (its logits give the next token); prompt
        logprobs from position s need the logits at positions s-1 onwards.
        """
        limit = self.seqlen - 1
        if self.wants_input_logprobs:
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        return max(limit, 0)

    @property
    def remaining_new_tokens(self) -> int:
        return self.sampling_params.max_new_tokens - len(self.output_ids)

    def wait_time_s(self, now_s: float) -> float:
        return now_s - self.arrival_time_s
