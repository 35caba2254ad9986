"""Typed messages between the front end (Engine or server) and the scheduler.

They are plain picklable dataclasses, so the server can send them over ZeroMQ
(`send_pyobj`) and the in-process Engine can hand them over directly.

Flow: front end -> `GenerateReq` (the one request type, `request_schema.py`; tokenized and
validated) / `BatchGenerateReq` / `AbortReq` / `FlushCacheReq` / `GetStatsReq` /
`CheckIntegrityReq` -> `SchedulerLoop` (`scheduler_loop.py`) -> a list of `ReqOutput` per
step / `FlushCacheOutput` / `SchedulerStats` -> front end (the server sends a step's outputs
column by column: `runtime/server/messages.py`, `StepOutputs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixgen.runtime.request_schema import GenerateReq

# One logprob entry: (logprob, token_id). logprob is None for the first prompt token, which
# has no preceding context.
TokenLogprob = tuple[float | None, int]


@dataclass
class BatchGenerateReq:
    """Several validated requests submitted at once: the scheduler sees them in one wake-up,
    so its first extend batch is full rather than whatever arrived first."""

    requests: list[GenerateReq]


@dataclass
class AbortReq:
    """Abort a request (all its `n` samples); its KV is freed."""

    rid: str


@dataclass
class FlushCacheReq:
    """Drop every cached prefix. Only honoured when no request is running or queued."""


@dataclass
class FlushCacheOutput:
    success: bool
    message: str = ""


@dataclass
class LoadLoRAAdapterReq:
    """Load a PEFT adapter folder under a name (SGLang's `/load_lora_adapter` fields)."""

    lora_name: str
    lora_path: str


@dataclass
class UnloadLoRAAdapterReq:
    """Unload an adapter; refused while requests use it."""

    lora_name: str


@dataclass
class LoRAAdapterOutput:
    success: bool
    message: str = ""
    loaded_adapters: list[str] = field(default_factory=list)


@dataclass
class GetStatsReq:
    """Ask the scheduler for a `SchedulerStats`."""


@dataclass
class CheckIntegrityReq:
    """Ask the scheduler to check that no KV slot leaked (the reply: None or the
    AssertionError)."""


@dataclass
class ReqOutput:
    """New tokens of one request (one of its `n` samples) since its previous output.

    `finish_reason` (set when `finished`) is a dict in SGLang's shape:
      {"type": "stop", "matched": <token id or stop string>} ->  EOS, stop id or stop string;
      {"type": "length", "length": <max_new_tokens>};
      {"type": "abort", "message": <why>}  -> aborted by the client or rejected (`error`).
    `error` is set when the request was rejected or failed (bad input, constraint compile
    failure); the front end reports it to the user.
    Logprob lists hold only the entries new in this output; prompt logprobs arrive once,
    with the first output after the prompt's prefill.
    """

    rid: str
    index: int  # which of the request's `n` samples
    new_token_ids: list[int]
    finished: bool
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    output_token_logprobs: list[TokenLogprob] | None = None
    output_top_logprobs: list[list[TokenLogprob]] | None = None
    input_token_logprobs: list[TokenLogprob] | None = None
    input_top_logprobs: list[list[TokenLogprob] | None] | None = None


@dataclass
class SchedulerStats:
    """A snapshot of the scheduler, for `get_stats()`, /get_server_info and /metrics."""

    num_running_reqs: int
    num_queued_reqs: int
    kv_total_slots: int
    kv_free_slots: int
    kv_cached_slots: int  # held only by the radix cache (evictable or locked by requests)
    kv_used_slots: int  # held by running requests and not (yet) in the cache
    kv_usage: float  # (total - free) / total
    cache_hit_rate: float  # cached prompt tokens / prompt tokens, over admitted requests
    num_prompt_tokens: int
    num_cached_tokens: int
    num_generated_tokens: int
    num_computed_prefill_tokens: int
    num_forward_steps: int
    num_retractions: int
    num_finished_reqs: int
    max_total_tokens: int = 0
    context_length: int = 0
    num_jump_forward_tokens: int = 0  # tokens appended by constrained jump-forward
    num_mixed_steps: int = 0  # extend forwards that also decoded the running requests
    num_tree_attention_steps: int = 0  # decode forwards that read shared prefixes once
    # Speculative decoding (runtime/speculative/): verify forwards, the requests they verified,
    # the drafts proposed and accepted, and the tokens emitted (accepted + 1 per request).
    num_spec_verify_steps: int = 0
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    num_spec_verified_reqs: int = 0  # requests in the verify forwards, summed over steps
    # Mean tokens a request gains per verify step (SGLang's accept length; 1.0 = no gain).
    spec_accept_length: float = 0.0
    # Wall seconds the scheduler loop spent inside `step()` and shipping its outputs: the same
    # workload in-process and served runs the same steps, so a difference here is per-step
    # cost, and a difference in the run's duration beyond it is outside the scheduler.
    step_time_s: float = 0.0
    deliver_time_s: float = 0.0
    # The rest of the loop's wall time: receiving and adding requests (`intake_time_s`), and
    # waiting for a message with nothing to run (`idle_time_s`; since start-up). A run's
    # duration is the four's sum plus whatever lies outside the scheduler (arrival, delivery).
    intake_time_s: float = 0.0
    idle_time_s: float = 0.0


@dataclass
class SchedulerCounters:
    """Cumulative token and step counts of a scheduler; `to_stats` snapshots them."""

    prompt_tokens: int = 0  # prompt tokens of admitted requests (first admission)
    cached_tokens: int = 0  # of those, found in the radix cache
    computed_prefill_tokens: int = 0  # tokens run through extend forwards (not jump-forward)
    generated_tokens: int = 0  # sampled tokens
    jump_forward_tokens: int = 0  # tokens appended by constrained jump-forward
    forward_steps: int = 0
    mixed_steps: int = 0  # extend forwards that also decoded the running requests
    tree_attention_steps: int = 0  # decode forwards with shared prefixes (tree attention)
    spec_verify_steps: int = 0  # speculative verify forwards
    spec_verified_reqs: int = 0  # requests in them (summed over steps)
    spec_draft_tokens: int = 0  # drafts proposed
    spec_accepted_tokens: int = 0  # drafts accepted
    spec_emitted_tokens: int = 0  # tokens appended by verify steps (accepted + the target's)
    retractions: int = 0
    finished_reqs: int = 0
    step_time_s: float = 0.0  # wall time inside Scheduler.step (SchedulerLoop)
    deliver_time_s: float = 0.0  # wall time shipping the steps' outputs (SchedulerLoop)
    intake_time_s: float = 0.0  # wall time receiving and adding requests (SchedulerLoop)
    idle_time_s: float = 0.0  # wall time waiting for a message with no work (SchedulerLoop)

    def reset(self) -> None:
        """Zeroes every count in place (the batch builder and result processor share this
        object)."""
        for name, value in vars(SchedulerCounters()).items():
            setattr(self, name, value)

    def to_stats(
        self,
        *,
        num_running_reqs: int,
        num_queued_reqs: int,
        kv_total_slots: int,
        kv_free_slots: int,
        kv_cached_slots: int,
        context_length: int,
    ) -> SchedulerStats:
        used = kv_total_slots - kv_free_slots
        return SchedulerStats(
            num_running_reqs=num_running_reqs,
            num_queued_reqs=num_queued_reqs,
            kv_total_slots=kv_total_slots,
            kv_free_slots=kv_free_slots,
            kv_cached_slots=kv_cached_slots,
            kv_used_slots=used - kv_cached_slots,
            kv_usage=used / kv_total_slots,
            cache_hit_rate=self.cached_tokens / max(self.prompt_tokens, 1),
            num_prompt_tokens=self.prompt_tokens,
            num_cached_tokens=self.cached_tokens,
            num_generated_tokens=self.generated_tokens,
            num_computed_prefill_tokens=self.computed_prefill_tokens,
            num_forward_steps=self.forward_steps,
            num_retractions=self.retractions,
            num_finished_reqs=self.finished_reqs,
            max_total_tokens=kv_total_slots,
            context_length=context_length,
            num_jump_forward_tokens=self.jump_forward_tokens,
            num_mixed_steps=self.mixed_steps,
            num_tree_attention_steps=self.tree_attention_steps,
            num_spec_verify_steps=self.spec_verify_steps,
            num_spec_draft_tokens=self.spec_draft_tokens,
            num_spec_accepted_tokens=self.spec_accepted_tokens,
            num_spec_verified_reqs=self.spec_verified_reqs,
            spec_accept_length=self.spec_emitted_tokens / max(self.spec_verified_reqs, 1),
            step_time_s=self.step_time_s,
            deliver_time_s=self.deliver_time_s,
            intake_time_s=self.intake_time_s,
            idle_time_s=self.idle_time_s,
        )
