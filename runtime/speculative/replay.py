"""Verification by replay: the plain sampler walks the verify forward's rows one position at a
time, for requests whose sampling `verify.py` does not model (a grammar mask, logprobs,
penalties, a logit bias, a min-token ban).

At position j every request still walking samples from its row j exactly as a plain decode
step would at that output position: the same `ResultProcessor.sample` (masks filled by the
matcher at its current state, bans, penalties counted from the output so far, the
counter-based draw of that position) and the same `ResultProcessor.advance` (append, the
matcher accepts, finishing, jump-forward). Row j's logits are the target's after d_1..d_j,
which the walk has appended, so the token equals what plain decoding would produce there,
sampled rows included. The request keeps walking while its token equals the next draft
(and it neither finished nor jumped forward). Each position costs one host sync; requests
that need none of this take the vectorised path (`verify.py`, one sync per step).

KV: before each position the request's committed length covers its last token and the
drafts accepted so far; the slots past it are kept aside and freed when the walk stops there
(a finish releases the request's KV to the cache, which must not see them).
"""

from __future__ import annotations

import torch

from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.logprobs import record_output_logprobs
from radixgen.runtime.req import Req, ReqStatus
from radixgen.runtime.result_processor import ResultProcessor, StepResult
from radixgen.runtime.sampling_batch_info import SamplingBatchInfo


def needs_replay(req: Req) -> bool:
    """Whether req's sampling involves state or output that `verify.py` does not model."""
    params = req.sampling_params
    return (
        req.grammar is not None
        or req.return_logprob
        or bool(params.logit_bias)
        or params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
        or params.repetition_penalty != 1.0
        or len(req.output_ids) < params.min_new_tokens
    )


def replay_verify(
    reqs: list[Req],
    drafts: list[list[int]],
    logits: torch.Tensor,  # [sum(len(draft) + 1), vocab] float32, request by request
    *,
    prefix_lens: list[int],  # each request's kv_committed_len before the verify forward
    kv: KVCacheManager,
    results: ResultProcessor,
    vocab_size: int,
) -> tuple[StepResult, list[int]]:
    """Walks every request's rows; returns the outputs and each request's accepted drafts."""
    starts = [0]
    for draft in drafts[:-1]:
        starts.append(starts[-1] + len(draft) + 1)
    accepted = [0] * len(reqs)
    walking = list(range(len(reqs)))
    result = StepResult()
    position = 0
    while walking:
        walk_reqs = [reqs[i] for i in walking]
        for i in walking:  # inputs up to d_position are real tokens with KV
            reqs[i].kv_committed_len = prefix_lens[i] + 1 + position
        rows = torch.tensor([starts[i] + position for i in walking], device=logits.device)
        info = SamplingBatchInfo.from_reqs(walk_reqs, vocab_size, logits.device)
        sampled = results.sample(walk_reqs, logits[rows], info)
        if sampled.logprobs is not None:
            record_output_logprobs(walk_reqs, sampled.logprobs, sampled.next_token_ids)
        tokens = sampled.next_token_ids.tolist()  # host sync, one per position
        # Slots past the committed length, set aside before `advance` may release the KV.
        tails = [
            kv.uncommitted_slots(reqs[i], prefix_lens[i] + len(drafts[i]) + 1) for i in walking
        ]
        result.outputs += results.advance(walk_reqs, tokens, launched_next=()).outputs
        still_walking = []
        for i, token_id, tail in zip(walking, tokens, tails, strict=True):
            req, draft = reqs[i], drafts[i]
            matches = position < len(draft) and token_id == draft[position]
            if matches and not req.finished and req.status is ReqStatus.DECODING:
                accepted[i] += 1
                still_walking.append(i)
            else:
                kv.free_slots(tail)
        walking = still_walking
        position += 1
    return result, accepted
