"""`ResultProcessor`: what the scheduler does with a forward's logits.

Samples one token per request (constraint masks, min-token bans, seeded draws), appends it,
checks finishing and constrained jump-forward, caches prompts after their prefill, releases
finished requests' KV to the radix cache, and builds the `ReqOutput`s. The scheduler keeps
the batches: it merges the requests that start decoding into its running batch and holds
the requests a jump-forward extended (`take_jumped`) for an extend step.
"""

from __future__ import annotations

from typing import Any

import torch

from radixgen.runtime.finish_checker import check_finished, fast_finish_check
from radixgen.runtime.forward_batch import ForwardMode, host_ints_to_device
from radixgen.runtime.grammar_hook import GrammarHook
from radixgen.runtime.io_struct import ReqOutput
from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.logprobs import record_input_logprobs, record_output_logprobs
from radixgen.runtime.req import Req
from radixgen.runtime.req_output import make_req_output
from radixgen.runtime.sampler import Sampler
from radixgen.runtime.sampling_batch_info import SamplingBatchInfo, set_min_token_bans
from radixgen.runtime.schedule_batch import ScheduleBatch, last_token_rows
from radixgen.runtime.scheduler_counters import SchedulerCounters


class ResultProcessor:
    """Args:
    kv: the KV manager (prompts are cached, finished requests released).
    grammar: the constrained-decoding hook.
    sampler: the batched sampler.
    counters: generated and finished counts go here.
    reqs_by_rid: the scheduler's request table (a request leaves it when its last sample
        finishes); shared, not copied.
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
        reqs_by_rid: dict[str, list[Req]],
        vocab_size: int,
        context_length: int,
        device: Any,
    ):
        self.kv = kv
        self.grammar = grammar
        self.sampler = sampler
        self.counters = counters
        self.reqs_by_rid = reqs_by_rid
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.device = device
        self.jumped_reqs: list[Req] = []  # extended by a jump-forward, not taken yet

    def take_jumped(self) -> list[Req]:
        """The requests a jump-forward extended since the last call (they need an extend)."""
        jumped, self.jumped_reqs = self.jumped_reqs, []
        return jumped

    def process_extend(
        self, batch: ScheduleBatch, logits: torch.Tensor
    ) -> tuple[list[ReqOutput], ScheduleBatch | None]:
        """Commits an extend forward: chunked prompts are cached and wait for their next
        chunk, finished prompts are cached and sample their first token.

        Returns:
            the outputs, and the requests that now decode (a batch to merge into the
            running one), or None.
        """
        reqs = batch.reqs
        counts = [r.extend_input_len for r in reqs]
        prefix_lens = [r.kv_committed_len for r in reqs]
        if batch.wants_all_logits:
            starts = [0]
            for count in counts[:-1]:
                starts.append(starts[-1] + count)
            record_input_logprobs(reqs, logits, starts, prefix_lens)
            logits = logits[last_token_rows(counts, logits.device)]  # [batch, vocab]
        outputs = []
        sample_rows = []
        for row, (req, count) in enumerate(zip(reqs, counts, strict=True)):
            req.kv_committed_len += count
            if req.is_chunked:
                self.kv.cache_unfinished(req)
            elif req.remaining_new_tokens <= 0:
                # max_new_tokens=0: a prefill only (prompt logprobs, cache warm-up).
                req.finish_reason = {"type": "length", "length": 0}
                outputs.append(self.finish(req))
            else:
                # Its prompt goes into the cache now, not at finish: requests deferred by
                # in-batch prefix sharing and the samples of n > 1 wait for it.
                self.kv.cache_unfinished(req)
                req.prompt_published = True
                sample_rows.append(row)
        if not sample_rows:
            return outputs, None
        sampled_reqs = [reqs[i] for i in sample_rows]
        info = SamplingBatchInfo.from_reqs(sampled_reqs, self.vocab_size, self.device)
        logits = logits[torch.tensor(sample_rows, device=logits.device)]
        outputs += self.sample_and_advance(sampled_reqs, logits, info)
        keep = [i for i, r in enumerate(sampled_reqs) if not r.finished and not r.jumped]
        if not keep:
            return outputs, None
        decoding = ScheduleBatch(ForwardMode.DECODE, sampled_reqs, info)
        decoding.filter(keep)
        return outputs, decoding

    def process_decode(self, batch: ScheduleBatch, logits: torch.Tensor) -> list[ReqOutput]:
        """Commits a decode forward; finished and jumped requests leave `batch`."""
        for req in batch.reqs:
            req.kv_committed_len += 1
        outputs = self.sample_and_advance(batch.reqs, logits, batch.sampling_info)
        keep = [i for i, r in enumerate(batch.reqs) if not r.finished and not r.jumped]
        if len(keep) < batch.batch_size:
            batch.filter(keep)
        return outputs

    def sample_and_advance(
        self, reqs: list[Req], logits: torch.Tensor, info: SamplingBatchInfo
    ) -> list[ReqOutput]:
        """Samples one token per request, appends it, checks finish; returns outputs."""
        result = self.sample(reqs, logits, info, pending=0)
        if result.logprobs is not None:
            record_output_logprobs(reqs, result.logprobs, result.next_token_ids)
        next_ids = result.next_token_ids.tolist()  # the step's one deliberate host sync
        return self.advance(reqs, next_ids, launched_next=())

    def sample(self, reqs: list[Req], logits: torch.Tensor, info: SamplingBatchInfo, pending: int):
        """Launches sampling (no host sync). `pending`: tokens of each request sampled but
        not yet appended to its output_ids (1 under overlap), for the counter-based draw."""
        self.grammar.set_vocab_mask(reqs, info)
        set_min_token_bans(reqs, info)
        if info.all_greedy:
            steps = None  # greedy rows draw no random number
        else:
            steps = host_ints_to_device([len(r.output_ids) + pending for r in reqs], self.device)
        want_logprobs = any(r.return_logprob for r in reqs)
        result = self.sampler(logits, info, steps, return_logprobs=want_logprobs)
        info.record_sampled(result.next_token_ids)
        return result

    def advance(self, reqs: list[Req], next_ids: list[int], launched_next) -> list[ReqOutput]:
        """Appends each request's sampled token, checks finishing; returns outputs.
        `launched_next`: ids of the requests in a decode step launched after this one
        (overlap), whose row of it is wasted when they finish here."""
        self.counters.generated_tokens += len(next_ids)
        outputs = []
        context_length = self.context_length
        for req, token_id in zip(reqs, next_ids, strict=True):
            req.output_ids.append(token_id)
            req.jumped = False
            if req.grammar is None and fast_finish_check(req, token_id, context_length):
                # No constraint, stop string or min_new_tokens: the common decode path.
                outputs.append(make_req_output(req))
                continue
            self.grammar.accept(req, token_id)
            check_finished(req, [token_id], context_length)
            if not req.finished and self.grammar.is_terminated(req):
                req.finish_reason = {"type": "stop", "matched": None}  # the constraint is done
            if not req.finished and self.grammar.try_jump_forward(req, context_length):
                self.jumped_reqs.append(req)
            if req.finished and launched_next and id(req) in launched_next:
                # Its row in the step launched after this one is wasted: free that KV slot.
                row_slots = self.kv.req_to_token_pool.req_to_token[req.req_pool_idx]
                self.kv.slot_allocator.free(
                    row_slots[req.kv_committed_len : req.kv_committed_len + 1]
                )
            outputs.append(self.finish(req) if req.finished else make_req_output(req))
        return outputs

    def finish(self, req: Req) -> ReqOutput:
        """Releases a finished request's KV to the cache and builds its last output."""
        self.kv.release(req)
        siblings = self.reqs_by_rid.get(req.rid, [])
        if all(s.finished for s in siblings):
            self.reqs_by_rid.pop(req.rid, None)
        self.counters.finished_reqs += 1
        return make_req_output(req)
