"""From a tokenized request to the scheduler's sequences: one `Req` per sample, and the error
outputs that answer a request the scheduler refuses."""

from __future__ import annotations

from typing import Any

from radixgen.runtime.finish_checker import make_stop_checker
from radixgen.runtime.io_struct import ReqOutput
from radixgen.runtime.req import Req
from radixgen.runtime.req_output import make_error_output
from radixgen.runtime.request_schema import GenerateReq


def error_outputs(request: GenerateReq, error: str) -> list[ReqOutput]:
    """One error output per sample (one when `n` itself is invalid)."""
    num_samples = getattr(request.sampling_params, "n", 1)
    if not isinstance(num_samples, int) or num_samples < 1:
        num_samples = 1
    return [make_error_output(request, index, error) for index in range(num_samples)]


def make_sample_reqs(
    request: GenerateReq,
    *,
    base_seed: int,
    eos_token_ids: frozenset[int],
    tokenizer: Any,
    share_prompt: bool,
) -> list[Req]:
    """The `n` sequences of a valid request; sample `i` draws with seed `base_seed + i`.

    With `share_prompt` (the radix cache is on), samples 1..n-1 wait until sample 0 has
    prefilled the prompt and put it in the cache, so the prompt is computed once.
    """
    params = request.sampling_params
    reqs = [
        Req(
            rid=request.rid,
            index=index,
            origin_input_ids=list(request.input_ids),
            sampling_params=params,
            sampling_seed=base_seed + index,
            eos_token_ids=eos_token_ids,
            return_logprob=request.return_logprob,
            logprob_start_len=request.logprob_start_len,
            top_logprobs_num=request.top_logprobs_num,
            cache_namespace=request.cache_salt,  # all n samples share it
        )
        for index in range(params.n)
    ]
    for req in reqs:
        req.stop_checker = make_stop_checker(req, tokenizer)
    if share_prompt:
        for req in reqs[1:]:
            req.prefill_gate = reqs[0]
    return reqs
