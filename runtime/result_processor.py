"""`ResultProcessor`: what the scheduler does with a forward's logits, and the outputs.

Samples one token per request (constraint masks, min-token bans, seeded draws), appends it,
checks finishing (EOS, stop ids, stop strings, length, a complete constraint) and
constrained jump-forward, caches prompts after their prefill, releases finished requests'
KV to the radix cache, and builds the `ReqOutput`s. It returns what changed as a
`StepResult` (outputs, the requests that start decoding); the scheduler owns the batches and
applies it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from radixgen.kernels.host_copy import host_ints_to_device
from radixgen.runtime.detokenizer import IncrementalDetokenizer
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.grammar_hook import GrammarHook
from radixgen.runtime.io_struct import ReqOutput, SchedulerCounters
from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.logprobs import record_input_logprobs, record_output_logprobs
from radixgen.runtime.req import Req, ReqStatus
from radixgen.runtime.request_schema import GenerateReq
from radixgen.runtime.sampler import Sampler
from radixgen.runtime.sampling_batch_info import SamplingBatchInfo, set_min_token_bans
from radixgen.runtime.schedule_batch import ScheduleBatch, last_token_rows


@dataclass
class StepResult:
    """What processing one forward's results changed."""

    outputs: list[ReqOutput] = field(default_factory=list)
    # Requests that start decoding (a batch to merge into the running one); a jump-forward
    # may already have extended some of them (JUMPED: their next forward computes the run).
    to_decode: ScheduleBatch | None = None


class ResultProcessor:
    """Args:
    kv: the KV manager (prompts are cached, finished requests released).
    grammar: the constrained-decoding hook.
    sampler: the batched sampler.
    counters: generated and finished counts go here.
    vocab_size, context_length: of the model.
    device: where sampling runs.
    """

    def __init__(
        self,
        *,
        kv: KVCacheManager,
        grammar: GrammarHook,
        sampler: Sampler,
        counters: SchedulerCounters,
        vocab_size: int,
        context_length: int,
        device: Any,
    ):
        self.kv = kv
        self.grammar = grammar
        self.sampler = sampler
        self.counters = counters
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.device = device

    def process_extend(self, batch: ScheduleBatch, logits: torch.Tensor) -> StepResult:
        """Commits an extend forward: chunked prompts are cached and wait for their next
        chunk, finished prompts are cached and sample their first token; the requests that
        go on decoding are `to_decode`."""
        reqs = batch.reqs
        counts = [r.extend_input_len for r in reqs]
        prefix_lens = [r.kv_committed_len for r in reqs]
        if batch.wants_all_logits:
            starts = [0]
            for count in counts[:-1]:
                starts.append(starts[-1] + count)
            record_input_logprobs(reqs, logits, starts, prefix_lens)
            logits = logits[last_token_rows(counts, logits.device)]  # [batch, vocab]
        result = StepResult()
        sample_rows = []
        for row, (req, count) in enumerate(zip(reqs, counts, strict=True)):
            req.kv_committed_len += count
            if req.status is ReqStatus.CHUNKED:
                self.kv.cache_unfinished(req)
            elif req.remaining_new_tokens <= 0:
                # max_new_tokens=0: a prefill only (prompt logprobs, cache warm-up).
                req.finish({"type": "length", "length": 0})
                result.outputs.append(self.finish(req))
            else:
                # Its prompt goes into the cache now, not at finish: requests deferred by
                # in-batch prefix sharing and the samples of n > 1 wait for it.
                self.kv.cache_unfinished(req)
                req.prompt_published = True
                sample_rows.append(row)
        if not sample_rows:
            return result
        sampled_reqs = [reqs[i] for i in sample_rows]
        info = SamplingBatchInfo.from_reqs(sampled_reqs, self.vocab_size, self.device)
        logits = logits[torch.tensor(sample_rows, device=logits.device)]
        decoded = self.sample_and_advance(sampled_reqs, logits, info)
        result.outputs += decoded.outputs
        keep = [i for i, r in enumerate(sampled_reqs) if not r.finished]
        if keep:
            result.to_decode = ScheduleBatch(ForwardMode.DECODE, sampled_reqs, info)
            result.to_decode.filter(keep)
        return result

    def process_decode(self, batch: ScheduleBatch, logits: torch.Tensor) -> StepResult:
        """Commits a forward of the running batch (one token per request, or a jump-forward's
        run); finished requests leave `batch`."""
        for req in batch.reqs:
            req.kv_committed_len = req.seqlen  # every token up to the sampled one has KV now
        result = self.sample_and_advance(batch.reqs, logits, batch.sampling_info)
        keep = [i for i, r in enumerate(batch.reqs) if not r.finished]
        if len(keep) < batch.batch_size:
            batch.filter(keep)
        return result

    def sample_and_advance(
        self, reqs: list[Req], logits: torch.Tensor, info: SamplingBatchInfo
    ) -> StepResult:
        """Samples one token per request, appends it, checks finish."""
        sampled = self.sample(reqs, logits, info)
        if sampled.logprobs is not None:
            record_output_logprobs(reqs, sampled.logprobs, sampled.next_token_ids)
        next_ids = sampled.next_token_ids.tolist()  # the step's one deliberate host sync
        result = self.advance(reqs, next_ids, launched_next=())
        recount_jumped_rows(reqs, info)
        return result

    def sample(
        self,
        reqs: list[Req],
        logits: torch.Tensor,
        info: SamplingBatchInfo,
        dropped_rows: frozenset[int] = frozenset(),
    ):
        """Launches sampling (no host sync); every earlier token of `reqs` is appended (their
        matchers advanced), as the masks and the counter-based draw need. `dropped_rows`:
        rows whose sample the caller drops (overlap's stale rows): they get no mask."""
        self.grammar.set_vocab_mask(reqs, info, dropped_rows)
        set_min_token_bans(reqs, info)
        if info.all_greedy:
            steps = None  # greedy rows draw no random number
        else:
            steps = host_ints_to_device([len(r.output_ids) for r in reqs], self.device)
        want_logprobs = any(r.return_logprob for r in reqs)
        sampled = self.sampler(logits, info, steps, return_logprobs=want_logprobs)
        info.record_sampled(sampled.next_token_ids)
        return sampled

    def advance(self, reqs: list[Req], next_ids: list[int], launched_next) -> StepResult:
        """Appends each request's sampled token and checks finishing. A request that goes on
        sampling is DECODING afterwards, or JUMPED after a jump-forward appended a forced run
        (computed by its next forward in the running batch).
        `launched_next`: ids of the requests in a decode step launched after this one
        (overlap), whose row of it is wasted when they finish here."""
        self.counters.generated_tokens += len(next_ids)
        result = StepResult()
        outputs = result.outputs
        context_length = self.context_length
        for req, token_id in zip(reqs, next_ids, strict=True):
            req.output_ids.append(token_id)
            if req.grammar is None and fast_finish_check(req, token_id, context_length):
                # No constraint, stop string or min_new_tokens: the common decode path.
                if req.status is not ReqStatus.DECODING:
                    req.set_status(ReqStatus.DECODING)  # its first token, after the prefill
                outputs.append(make_req_output(req))
                continue
            # Constrained (or stop strings, min_new_tokens): per row per step at batch 64, so
            # the matcher is called directly and `req.finished` is tested once, inline.
            matcher = req.grammar
            if matcher is not None:
                matcher.accept_token(token_id)
            check_finished(req, [token_id], context_length)
            status = req.status
            finished = status is ReqStatus.FINISHED or status is ReqStatus.ABORTED
            if not finished and matcher is not None and matcher.is_terminated():
                req.finish({"type": "stop", "matched": None})  # the constraint is done
                finished = True
            if not finished:
                if status is not ReqStatus.DECODING:
                    req.set_status(ReqStatus.DECODING)  # first token, or its run is computed
                if self.grammar.try_jump_forward(req, context_length):  # JUMPED now
                    self.counters.jump_forward_tokens += req.num_uncommitted - 1
                finished = req.status is ReqStatus.FINISHED  # the jump may end it
            if finished and launched_next and id(req) in launched_next:
                self.kv.free_pending_slot(req)  # its row in the step launched after this one
            outputs.append(self.finish(req) if finished else make_req_output(req))
        return result

    def finish(self, req: Req) -> ReqOutput:
        """Releases a finished request's KV to the cache and builds its last output."""
        self.kv.release(req)
        self.counters.finished_reqs += 1
        return make_req_output(req)


def recount_jumped_rows(reqs: list[Req], info: SamplingBatchInfo) -> None:
    """Penalties count every output token: a jump-forward just appended a run (JUMPED now),
    which `record_sampled` did not see. `reqs[i]` is row i of `info`."""
    if info.has_penalties:
        rows = [row for row, req in enumerate(reqs) if req.status is ReqStatus.JUMPED]
        info.recount_rows(rows, [reqs[row] for row in rows])


# ---- finishing -------------------------------------------------------------------------------


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
    """Finishes `req` if the tokens just appended (already in `req.output_ids`) end it:
    EOS, a stop token id, a stop string, or its token limit."""
    params = req.sampling_params
    num_output = len(req.output_ids)
    if num_output >= params.min_new_tokens:
        stop_ids = params.stop_token_ids or ()
        for token in new_token_ids:
            if token in stop_ids or (not params.ignore_eos and token in req.eos_token_ids):
                req.finish({"type": "stop", "matched": token})
                return
    if req.stop_checker is not None:
        req.stop_checker.add_tokens(new_token_ids)
        if num_output >= params.min_new_tokens and req.stop_checker.matched_stop is not None:
            req.finish({"type": "stop", "matched": req.stop_checker.matched_stop})
            return
    if num_output >= params.max_new_tokens:
        req.finish({"type": "length", "length": params.max_new_tokens})
    elif req.seqlen >= context_length:
        req.finish({"type": "length", "length": num_output})


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


# ---- outputs -----------------------------------------------------------------------------


def make_req_output(req: Req) -> ReqOutput:
    """Builds req's output with the tokens (and logprobs) not reported yet, and marks them
    reported."""
    sent = req.num_sent_tokens
    output = ReqOutput(
        rid=req.rid,
        index=req.index,
        new_token_ids=req.output_ids[sent:],
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


def error_outputs(request: GenerateReq, message: str) -> list[ReqOutput]:
    """The one output per sample of a request the scheduler refuses or fails."""
    return [
        ReqOutput(
            rid=request.rid,
            index=index,
            new_token_ids=[],
            finished=True,
            finish_reason={"type": "abort", "message": message},
            prompt_tokens=len(request.input_ids),
            error=message,
        )
        for index in range(request.sampling_params.n)
    ]
