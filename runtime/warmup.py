"""Start-up warm-up: real requests through the scheduler before the first user's request.

On CUDA the first request of each shape compiles Triton kernels inside its forward (extend
attention per grid-size class, the fused sampling kernel per variant, the vocab mask, the
grammar backend's vocabulary index): a fresh server ran its first benchmark about 2x slower
than its second (H200, 2026-12-01). The Engine and the server's scheduler process therefore
run a fixed set of short requests first, through the same `Scheduler.step()` users get, and
report ready (Engine constructor returns, `/health` answers 200) only afterwards. Decode CUDA
graphs are captured earlier, when the `ModelRunner` is built.

Warm-up leaves nothing behind: every request finishes (its KV is released), the radix cache
is flushed (slots back to the allocator, hit counters zeroed) and the scheduler's counters
and decode headroom ratio are reset (`Scheduler.reset_after_warmup`). Its requests carry
explicit seeds, so the seed stream of unseeded user requests is untouched.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

from radixgen.kernels.extend_attention_configs import extend_lengths_per_config
from radixgen.kernels.extend_attention_hopper import MIN_EXTEND_LEN as HOPPER_MIN_EXTEND_LEN
from radixgen.runtime.request_schema import (
    GenerateReq,
    ModelLimits,
    RequestFieldError,
    SamplingParams,
    validate_request,
)
from radixgen.runtime.scheduler import Scheduler

logger = logging.getLogger(__name__)

# Ids below this are often special or byte tokens; warm-up prompts use ordinary ones.
_FIRST_ORDINARY_ID = 300
# Tokens each warm-up request generates: enough to run decode steps (and graph replays).
WARMUP_NEW_TOKENS = 8
# Prompt lengths of the extend rounds on CUDA, one batch each, besides one per row of the
# extend kernel's config table (`extend_lengths_per_config`: the launcher picks its tiles by
# the batch's longest run): 8 tokens (one row block) and 200 (a few).
CUDA_PROMPT_LENS = (8, 200)
# A constraint whose mask is applied both by the vocab-mask kernel (greedy) and inside the
# fused sampling kernel (sampled).
WARMUP_REGEX = "[0-9]{1,6}"
# A compile slower than this (a cold grammar backend indexing a 128k vocabulary) stops the
# warm-up of constraints only: the server still starts.
CONSTRAINT_WAIT_S = 60.0
# An unconstrained round with no output for this long is stuck (a scheduler bug, or a pool
# that cannot hold it): aborted with a warning rather than hanging the start-up.
STALL_S = 120.0


class WarmupError(RuntimeError):
    """A warm-up request failed: the model or a kernel is broken, so the process must not
    report healthy."""


@dataclass(frozen=True)
class WarmupPlan:
    """Which requests warm-up runs, as rounds; each round is submitted at once (one extend
    batch), then decoded to the end.

    Attributes:
        prompt_lens: prompt lengths of the extend rounds, one round (batch) each, since the
            kernel variant follows the batch's longest prompt (clipped to what the model
            holds). Their prompts share a prefix, so later rounds extend a cached one.
        fresh_prompt_lens: extend rounds whose prompts share nothing with the others: a
            prefix-free batch of MIN_EXTEND_LEN tokens or more takes the Hopper extend kernel
            on sm_90 (kernels/extend_attention_hopper.py).
        sampler_paths: a round per sampler path (`SAMPLER_ROUNDS`).
        constrained: a round per regex-constrained path (`CONSTRAINED_ROUNDS`).
    The first round is always one short greedy request.
    """

    prompt_lens: tuple[int, ...]
    sampler_paths: bool
    constrained: bool
    fresh_prompt_lens: tuple[int, ...] = ()

    @classmethod
    def for_device(cls, device_type: str, head_dim: int = 128) -> WarmupPlan:
        if device_type == "cuda":
            lengths = CUDA_PROMPT_LENS + extend_lengths_per_config(head_dim)
            return cls(
                prompt_lens=lengths,
                sampler_paths=True,
                constrained=True,
                fresh_prompt_lens=(HOPPER_MIN_EXTEND_LEN,),
            )
        # On the CPU nothing compiles (torch backends): one short request checks the model
        # end to end, at ~40 ms for the tiny model.
        return cls(prompt_lens=(), sampler_paths=False, constrained=False)


@dataclass(frozen=True)
class WarmupReport:
    num_requests: int
    duration_s: float


# On CUDA the fused sampling kernels sample every batch (runtime/sampler.py); their compiled
# variants follow whether the batch samples, carries a vocabulary mask, and which filters any
# row uses (min-p; top-k or top-p). A round per combination a server commonly sees compiles
# them all before /health turns 200.
SAMPLER_ROUNDS = {
    "sampled": ({"temperature": 0.7}, None),
    "top-k-top-p": ({"temperature": 0.7, "top_p": 0.9, "top_k": 20}, None),
    "min-p-penalties": (
        {"temperature": 0.7, "min_p": 0.1, "frequency_penalty": 0.5, "repetition_penalty": 1.1},
        None,
    ),
    "min-p-top-p": ({"temperature": 0.7, "min_p": 0.05, "top_p": 0.9}, None),
}
CONSTRAINED_ROUNDS = {
    "regex-greedy": ({"temperature": 0.0}, WARMUP_REGEX),
    "regex-sampled": ({"temperature": 0.7}, WARMUP_REGEX),
    "regex-top-p": ({"temperature": 0.7, "top_p": 0.9}, WARMUP_REGEX),
    "regex-min-p": ({"temperature": 0.7, "min_p": 0.05}, WARMUP_REGEX),
    "regex-min-p-top-p": ({"temperature": 0.7, "min_p": 0.05, "top_p": 0.9}, WARMUP_REGEX),
}


def warmup_rounds(
    plan: WarmupPlan, *, context_length: int, kv_capacity: int, vocab_size: int
) -> list[list[GenerateReq]]:
    """The warm-up requests, in rounds. Each request fits the context and half the KV pool,
    each round the pool (a tiny `max_total_tokens` still starts); requests that cannot fit
    at all are left out, and so are rounds left empty."""
    room = min(context_length, kv_capacity // 2)  # tokens one request may hold
    new_tokens = max(1, min(WARMUP_NEW_TOKENS, room // 2))
    max_prompt = max(1, room - new_tokens)
    short = min(8, max_prompt)
    greedy = {"temperature": 0.0}

    def request(name: str, prompt_len: int, sampling: dict, regex: str | None = None):
        return _request(f"warmup-{name}", prompt_len, new_tokens, vocab_size, sampling, regex)

    rounds = [[request("first", short, greedy)]]
    # An extend batch per prompt length (greedy: the lengths are what compiles here).
    for length in sorted({min(n, max_prompt) for n in plan.prompt_lens} - {short}):
        rounds.append([request(f"extend-{length}", length, greedy)])
    for length in sorted({min(n, max_prompt) for n in plan.fresh_prompt_lens}):
        fresh = _request(
            f"warmup-fresh-{length}", length, new_tokens, vocab_size, greedy, first_id_offset=1
        )
        rounds.append([fresh])
    if plan.sampler_paths:
        rounds += [[request(name, short, *path)] for name, path in SAMPLER_ROUNDS.items()]
    if plan.constrained:
        rounds += [[request(name, short, *path)] for name, path in CONSTRAINED_ROUNDS.items()]
    limits = ModelLimits(
        vocab_size=vocab_size, context_length=context_length, kv_capacity=kv_capacity
    )
    fitting = [[r for r in requests if _fits(r, limits)] for requests in rounds]
    return [requests for requests in fitting if requests]


def _fits(request: GenerateReq, limits: ModelLimits) -> bool:
    try:
        validate_request(request, limits)
    except RequestFieldError:
        return False
    return True


def _request(
    rid: str,
    prompt_len: int,
    new_tokens: int,
    vocab_size: int,
    sampling: dict,
    regex: str | None = None,
    first_id_offset: int = 0,
) -> GenerateReq:
    # A deterministic spread of ordinary ids (not one repeated token); a test model's
    # vocabulary may be smaller than the first ordinary id: then any id of it. An offset
    # changes every id, so the prompt shares no prefix with the others.
    first = _FIRST_ORDINARY_ID if vocab_size > 2 * _FIRST_ORDINARY_ID else 0
    span = vocab_size - first
    input_ids = [first + (i * 7919 + first_id_offset) % span for i in range(prompt_len)]
    params = SamplingParams(
        max_new_tokens=new_tokens,
        ignore_eos=regex is None,
        seed=0,
        regex=regex,
        **sampling,
    )
    return GenerateReq(input_ids=input_ids, sampling_params=params, rid=rid)


def warm_up(scheduler: Scheduler, plan: WarmupPlan | None = None) -> WarmupReport:
    """Runs the warm-up requests to completion on an idle `scheduler`, then resets it.

    Args:
        scheduler: a scheduler with nothing queued or running.
        plan: what to run (default: `WarmupPlan.for_device` of the scheduler's device).

    Raises:
        ValueError: the scheduler is not idle.
        WarmupError: an unconstrained warm-up request failed.
    """
    if scheduler.has_work():
        raise ValueError("warm_up needs an idle scheduler (requests are queued or running)")
    if plan is None:
        head_dim = scheduler.runner.model_config.head_dim
        plan = WarmupPlan.for_device(scheduler.device.type, head_dim)
    start = time.perf_counter()
    rounds = warmup_rounds(
        plan,
        context_length=scheduler.context_length,
        kv_capacity=scheduler.kv.capacity,
        vocab_size=scheduler.vocab_size,
    )
    adapters = scheduler.lora.names()
    if adapters:  # the LoRA kernels compile for the extend tiles and decode rows too:
        # the first and extend rounds again (one prompt length each), under the first adapter
        extend_rounds = [
            requests
            for requests in rounds
            if requests[0].rid == "warmup-first" or requests[0].rid.startswith("warmup-extend-")
        ]
        rounds += [
            [dataclasses.replace(r, rid=f"{r.rid}-lora", lora_path=adapters[0]) for r in requests]
            for requests in extend_rounds
        ]
    for requests in rounds:
        constrained = any(r.sampling_params.has_constraint for r in requests)
        error = _run_round(scheduler, requests, CONSTRAINT_WAIT_S if constrained else None)
        if error is not None and not constrained:
            raise WarmupError(f"warm-up request failed: {error}")
        if error is not None:
            logger.warning("warm-up of constrained decoding skipped: %s", error)
    scheduler.reset_after_warmup()
    report = WarmupReport(
        num_requests=sum(len(requests) for requests in rounds),
        duration_s=time.perf_counter() - start,
    )
    logger.info("warm-up: %d requests in %.2f s", report.num_requests, report.duration_s)
    return report


def _run_round(
    scheduler: Scheduler, requests: list[GenerateReq], compile_wait_s: float | None
) -> str | None:
    """Runs `requests` until the scheduler is idle; returns the first error, or None.

    Steps that produce nothing (a constraint compiling on the backend's threads) are waited
    for up to `compile_wait_s` (None: `STALL_S`), then the round's requests are aborted: a
    start-up never hangs on its warm-up."""
    for request in requests:
        scheduler.add_request(request)
    wait_s = STALL_S if compile_wait_s is None else compile_wait_s
    last_progress = time.monotonic()
    error = None
    while scheduler.has_work():
        outputs = scheduler.step()
        for output in outputs:
            if output.error is not None and error is None:
                error = output.error
        if outputs:
            last_progress = time.monotonic()
            continue
        time.sleep(0.001)  # nothing ran: yield the CPU
        if time.monotonic() - last_progress > wait_s:
            for request in requests:
                scheduler.abort_request(request.rid)
            last_progress = float("inf")  # abort once; the aborts finish the round
            if compile_wait_s is not None:
                error = error or f"constraint compile slower than {compile_wait_s} s"
            else:
                logger.warning("warm-up round made no progress for %.0f s: aborted", STALL_S)
    return error
