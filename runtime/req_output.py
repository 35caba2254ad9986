"""`make_req_output`: what a request reports after a step (only what is new since last time)."""

from __future__ import annotations

from radixgen.runtime.io_struct import ReqOutput
from radixgen.runtime.req import Req
from radixgen.runtime.request_schema import GenerateReq


def make_req_output(req: Req) -> ReqOutput:
    """Builds req's output with the tokens (and logprobs) not reported yet, and marks them
    reported."""
    sent = req.num_sent_tokens
    new_ids = req.output_ids[sent:]
    output = ReqOutput(
        rid=req.rid,
        index=req.index,
        new_token_ids=new_ids,
        finished=req.finished,
        finish_reason=req.finish_reason,
        prompt_tokens=len(req.origin_input_ids),
        completion_tokens=len(req.output_ids),
        cached_tokens=req.cached_tokens,
        error=req.error,
    )
    if req.return_logprob:
        output.output_token_logprobs = req.output_token_logprobs[sent:]
        if req.top_logprobs_num:
            output.output_top_logprobs = req.output_top_logprobs[sent:]
        if req.logprob_start_len is not None and req.input_logprobs_done:
            if not req.input_logprobs_sent:
                output.input_token_logprobs = req.input_token_logprobs
                output.input_top_logprobs = req.input_top_logprobs
                req.input_logprobs_sent = True
    req.num_sent_tokens = len(req.output_ids)
    return output


def make_error_output(request: GenerateReq, index: int, message: str) -> ReqOutput:
    """The one output of a rejected request sample."""
    return ReqOutput(
        rid=request.rid,
        index=index,
        new_token_ids=[],
        finished=True,
        finish_reason={"type": "abort", "message": message},
        prompt_tokens=len(request.input_ids) if isinstance(request.input_ids, list) else 0,
        error=message,
    )
