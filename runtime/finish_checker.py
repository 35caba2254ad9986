"""When a sequence is done: EOS, a stop token id, a stop string, or its token limit."""

from __future__ import annotations

from typing import Any

from radixgen.runtime.detokenizer import IncrementalDetokenizer
from radixgen.runtime.req import Req


def make_stop_checker(req: Req, tokenizer: Any) -> IncrementalDetokenizer | None:
    """A detokenizer following req's output, only if req has stop strings."""
    stops = req.sampling_params.stop_strings
    if not stops or tokenizer is None:
        return None
    checker = IncrementalDetokenizer(
        tokenizer,
        req.origin_input_ids,
        skip_special_tokens=req.sampling_params.skip_special_tokens,
        stop_strings=stops,
    )
    # A resumed (retracted) request already has output: replay it.
    if req.output_ids:
        checker.add_tokens(req.output_ids)
    return checker


def check_finished(req: Req, new_token_ids: list[int], context_length: int) -> None:
    """Sets `req.finish_reason` if the tokens just appended end the sequence.

    `new_token_ids` are the tokens appended this step (already in `req.output_ids`).
    """
    params = req.sampling_params
    num_output = len(req.output_ids)
    if num_output >= params.min_new_tokens:
        stop_ids = params.stop_token_ids or ()
        for token in new_token_ids:
            if token in stop_ids:
                req.finish_reason = {"type": "stop", "matched": token}
                return
            if not params.ignore_eos and token in req.eos_token_ids:
                req.finish_reason = {"type": "stop", "matched": token}
                return
    if req.stop_checker is not None:
        req.stop_checker.add_tokens(new_token_ids)
        if num_output >= params.min_new_tokens and req.stop_checker.matched_stop is not None:
            req.finish_reason = {"type": "stop", "matched": req.stop_checker.matched_stop}
            return
    if num_output >= params.max_new_tokens:
        req.finish_reason = {"type": "length", "length": params.max_new_tokens}
    elif req.seqlen >= context_length:
        req.finish_reason = {"type": "length", "length": num_output}


def fast_finish_check(req: Req, token_id: int, context_length: int) -> bool:
    """True when `token_id` (just appended) certainly does not end req, decided cheaply.

    Covers requests without stop strings and past min_new_tokens whose token is no EOS or
    stop id and that are below both length limits; anything else returns False and goes
    through `check_finished`. Called once per request per decode step.
    """
    params = req.sampling_params
    if req.stop_checker is not None or params.stop_token_ids:
        return False
    if not params.ignore_eos and token_id in req.eos_token_ids:
        return False
    num_output = len(req.output_ids)
    return (
        num_output < params.max_new_tokens
        and num_output >= params.min_new_tokens
        and len(req.origin_input_ids) + num_output < context_length
    )
