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

from radixgen.runtime.request_schema import GenerateReq, SamplingParams
from radixgen.runtime.scheduler import Scheduler

logger = logging.getLogger(__name__)

# Ids below this are often special or byte tokens; warm-up prompts use ordinary ones.
_FIRST_ORDINARY_ID = 300
# Tokens each warm-up request generates: enough to run decode steps (and graph replays).
WARMUP_NEW_TOKENS = 8
# Prompt lengths of the batched extend round on CUDA. The extend kernel's grid has
# ceil(len / BLOCK_M) row blocks, and Triton specialises a kernel on integer arguments that
# equal 1 or divide by 16: 8 tokens (one block), 200 (a few), 1024 and 2048 (16 blocks at
# BLOCK_M 64 or 128) compile every class that common prompts hit.
CUDA_PROMPT_LENS = (8, 200, 1024, 2048)
# A constraint whose mask is applied both by the vocab-mask kernel (greedy) and inside the
# fused sampling kernel (sampled).
WARMUP_REGEX = "[0-9]{1,6}"
# A compile slower than this (a cold grammar backend indexing a 128k vocabulary) stops the
# warm-up of constraints only: the server still starts.
CONSTRAINT_WAIT_S = 60.0


class WarmupError(RuntimeError):
    """A warm-up request failed: the model or a kernel is broken, so the process must not
    report healthy."""


@dataclass(frozen=True)
class WarmupPlan:
    """Which requests warm-up runs, as rounds; each round is submitted at once (one extend
    batch), then decoded to the end.

    Attributes:
        prompt_lens: prompt lengths of the batched extend round (clipped to what the model
            holds); empty: no such round.
        sampler_paths: a round per sampler path (`SAMPLER_ROUNDS`).
        constrained: a round per regex-constrained path (`CONSTRAINED_ROUNDS`).
    The first round is always one short greedy request.
    """

    prompt_lens: tuple[int, ...]
    sampler_paths: bool
    constrained: bool

    @classmethod
    def for_device(cls, device_type: str) -> WarmupPlan:
        if device_type == "cuda":
            return cls(prompt_lens=CUDA_PROMPT_LENS, sampler_paths=True, constrained=True)
        # On the CPU nothing compiles (torch backends): one short request checks the model
        # end to end, at ~40 ms for the tiny model.
        return cls(prompt_lens=(), sampler_paths=False, constrained=False)


@dataclass(frozen=True)
class WarmupReport:
    num_requests: int
    duration_s: float


# The sampler picks one path per batch (runtime/sampler.py): the fused kernel only when every
# row samples without top-k/top-p/min-p, the vocab-mask kernel only when the fused kernel is
# not used. So each path gets a round (a batch) of its own.
SAMPLER_ROUNDS = {
    "sampled": ({"temperature": 0.7}, None),  # the fused sampling kernel
    "top-k-top-p": ({"temperature": 0.7, "top_p": 0.9, "top_k": 20}, None),  # torch
    "min-p-penalties": (
        {"temperature": 0.7, "min_p": 0.1, "frequency_penalty": 0.5, "repetition_penalty": 1.1},
        None,
    ),  # torch, penalties
}
CONSTRAINED_ROUNDS = {
    "regex-greedy": ({"temperature": 0.0}, WARMUP_REGEX),  # the vocab-mask kernel
    "regex-sampled": ({"temperature": 0.7}, WARMUP_REGEX),  # the fused kernel with its mask
}


def warmup_rounds(
    plan: WarmupPlan, *, context_length: int, kv_capacity: int, vocab_size: int
) -> list[list[GenerateReq]]:
    """The warm-up requests, in rounds. Prompts are clipped so that each request fits the
    context and each round fits half the KV pool (a small `max_total_tokens` still starts)."""
    max_prompt = max(1, min(context_length, kv_capacity // 2) - WARMUP_NEW_TOKENS - 1)
    short = min(8, max_prompt)
    greedy = {"temperature": 0.0}
    rounds = [[_request("warmup-first", short, vocab_size, greedy)]]
    # One extend batch of every prompt length (greedy: the lengths are what compiles here).
    budget = kv_capacity // 2
    extend_round = []
    for index, length in enumerate(sorted({min(n, max_prompt) for n in plan.prompt_lens})):
        budget -= length + WARMUP_NEW_TOKENS
        if budget < 0 and extend_round:
            break
        extend_round.append(_request(f"warmup-extend-{index}", length, vocab_size, greedy))
    if extend_round:
        rounds.append(extend_round)
    if plan.sampler_paths:
        rounds += [
            [_request(f"warmup-{name}", short, vocab_size, sampling, regex)]
            for name, (sampling, regex) in SAMPLER_ROUNDS.items()
        ]
    if plan.constrained:
        rounds += [
            [_request(f"warmup-{name}", short, vocab_size, sampling, regex)]
            for name, (sampling, regex) in CONSTRAINED_ROUNDS.items()
        ]
    return rounds


def _request(
    rid: str, prompt_len: int, vocab_size: int, sampling: dict, regex: str | None = None
) -> GenerateReq:
    # A deterministic spread of ordinary ids (not one repeated token); a test model's
    # vocabulary may be smaller than the first ordinary id: then any id of it.
    first = _FIRST_ORDINARY_ID if vocab_size > 2 * _FIRST_ORDINARY_ID else 0
    span = vocab_size - first
    input_ids = [first + (i * 7919) % span for i in range(prompt_len)]
    params = SamplingParams(
        max_new_tokens=WARMUP_NEW_TOKENS,
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
    plan = plan or WarmupPlan.for_device(scheduler.device.type)
    start = time.perf_counter()
    rounds = warmup_rounds(
        plan,
        context_length=scheduler.context_length,
        kv_capacity=scheduler.kv.capacity,
        vocab_size=scheduler.vocab_size,
    )
    adapters = scheduler.lora.names()
    if adapters:  # the LoRA kernels compile for the extend tiles and decode rows too
        rounds.append(
            [
                dataclasses.replace(request, rid=f"{request.rid}-lora", lora_path=adapters[0])
                for request in rounds[-1 if len(rounds) == 1 else 1]
            ]
        )
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
    scheduler: Scheduler, requests: list[GenerateReq], timeout_s: float | None
) -> str | None:
    """Runs `requests` until the scheduler is idle; returns the first error, or None."""
    for request in requests:
        scheduler.add_request(request)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    error = None
    while scheduler.has_work():
        outputs = scheduler.step()
        for output in outputs:
            if output.error is not None and error is None:
                error = output.error
        if not outputs:
            # Nothing ran (a constraint compiling on the backend's threads): yield the CPU.
            time.sleep(0.001)
            if deadline is not None and time.monotonic() > deadline:
                for request in requests:
                    scheduler.abort_request(request.rid)
                deadline = None
                error = error or f"constraint compile slower than {timeout_s} s"
    return error
