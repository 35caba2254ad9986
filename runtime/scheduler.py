"""`Scheduler`: continuous batching over the model runner, one forward per `step()`.

Each step either runs an extend batch (new prompts, or the next chunk of a long one; cached
prefixes come from the radix cache, so only uncached tokens are computed) or one decode step
of the running batch. Extend goes first when something can be admitted. When a decode step
finds no free KV slot, the cache is evicted first, then running requests are retracted:
their KV goes to the cache and they wait to resume with the same output.

Used in-process by `Engine` (on a background thread) and by the server's scheduler process.
Not thread-safe: one caller drives it.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import torch

from radixgen.radix_cache.radix_cache import RadixCache
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.grammar_hook import GrammarHook
from radixgen.runtime.in_batch_prefix import InBatchPrefixIndex
from radixgen.runtime.io_struct import ReqOutput, SchedulerStats, TokenizedGenerateReq
from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.overlap_decode import InflightDecode, OverlapDecoder, can_overlap
from radixgen.runtime.prefill_adder import PrefillAdder
from radixgen.runtime.req import Req
from radixgen.runtime.req_output import make_error_output
from radixgen.runtime.request_intake import error_outputs, make_sample_reqs
from radixgen.runtime.request_validation import validate_request
from radixgen.runtime.result_processor import ResultProcessor
from radixgen.runtime.sampler import Sampler
from radixgen.runtime.schedule_batch import ScheduleBatch
from radixgen.runtime.schedule_policy import SchedulePolicy
from radixgen.runtime.scheduler_counters import SchedulerCounters
from radixgen.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)

# After a retraction the decode headroom ratio jumps by this much, then decays back to the
# configured value by RATIO_DECAY per decode step.
RATIO_BUMP_ON_RETRACT = 0.1
RATIO_DECAY = 0.002


class Scheduler:
    """Args:
    server_args: the runtime options.
    model_runner: a ready `ModelRunner` (built from server_args when None).
    tokenizer: for stop strings and constraints (loaded from the model folder when None).
    """

    def __init__(self, server_args: ServerArgs, model_runner=None, tokenizer: Any = None):
        if model_runner is None:
            from radixgen.runtime.model_runner import ModelRunner

            model_runner = ModelRunner(server_args)
        if tokenizer is None:
            from radixgen.runtime.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(server_args.tokenizer_path or model_runner.model_path)
        self.server_args = server_args
        self.runner = model_runner
        self.tokenizer = tokenizer
        self.device = model_runner.device
        self.vocab_size = model_runner.model_config.vocab_size
        self.context_length = model_runner.context_length
        self.eos_token_ids = frozenset(model_runner.model_config.eos_token_ids)
        tree = RadixCache(model_runner.slot_allocator, disabled=server_args.disable_radix_cache)
        self.kv = KVCacheManager(model_runner.req_to_token_pool, model_runner.slot_allocator, tree)
        self.policy = SchedulePolicy(
            server_args.schedule_policy, server_args.schedule_max_wait_s, self.kv
        )
        self.sampler = Sampler()
        self.grammar = GrammarHook(
            tokenizer,
            vocab_size=self.vocab_size,
            eos_token_ids=sorted(self.eos_token_ids),
            compile_timeout_s=server_args.constrained_compile_timeout_s,
            jump_forward=server_args.enable_jump_forward,
            grammar_backend=server_args.grammar_backend,
        )
        self.seed_rng = random.Random(server_args.seed)  # seeds of unseeded requests
        self.new_token_ratio = server_args.new_token_ratio

        self.waiting: list[Req] = []
        self.running = ScheduleBatch(ForwardMode.DECODE, [])
        self.chunked_req: Req | None = None
        self.jump_forward_reqs: list[Req] = []  # hold KV; their jumped tokens need an extend
        self.reqs_by_rid: dict[str, list[Req]] = {}
        self.pending_outputs: list[ReqOutput] = []
        self._abort_pending = False  # an abort since the last _drop_aborted_and_failed
        overlap = server_args.enable_overlap_schedule
        self.overlap = self.device.type == "cuda" if overlap is None else overlap
        self.counters = SchedulerCounters()
        self.results = ResultProcessor(
            kv=self.kv,
            grammar=self.grammar,
            sampler=self.sampler,
            counters=self.counters,
            reqs_by_rid=self.reqs_by_rid,
            vocab_size=self.vocab_size,
            context_length=self.context_length,
            device=self.device,
        )
        self.overlap_decoder = OverlapDecoder(
            runner=model_runner,
            kv=self.kv,
            counters=self.counters,
            context_length=self.context_length,
            sample=self.results.sample,
            advance_decoded=self._advance_decoded,
        )

    @property
    def inflight(self) -> InflightDecode | None:
        """The decode step launched but not processed yet (overlap only)."""
        return self.overlap_decoder.inflight

    # ---- public interface ----------------------------------------------------------------

    def add_request(self, request: TokenizedGenerateReq) -> None:
        """Queues a request. A bad request is not raised but answered with an error output
        from the next `step()`, so one client cannot break the loop."""
        error = validate_request(
            request,
            vocab_size=self.vocab_size,
            context_length=self.context_length,
            kv_capacity=self.kv.capacity,
            num_queued=len(self.waiting),
            max_queued=self.server_args.max_queued_requests,
        )
        if error is None and request.rid in self.reqs_by_rid:
            error = f"duplicate request id {request.rid!r}"
        if error is not None:
            self.pending_outputs += error_outputs(request, error)
            return
        params = request.sampling_params
        base_seed = params.seed if params.seed is not None else self.seed_rng.getrandbits(62)
        reqs = make_sample_reqs(
            request,
            base_seed=base_seed,
            eos_token_ids=self.eos_token_ids,
            tokenizer=self.tokenizer,
            share_prompt=not self.kv.tree.disabled,
        )
        if params.has_constraint:
            for req in reqs:
                error = self.grammar.start_compile(req)
                if error is not None:
                    for failed in reqs:
                        self.grammar.forget(failed)
                        self.pending_outputs.append(make_error_output(request, failed.index, error))
                    return
        self.reqs_by_rid[request.rid] = reqs
        self.waiting.extend(reqs)

    def abort_request(self, rid: str) -> None:
        """Aborts every sample of `rid`; its KV is freed by the next `step()`."""
        for req in self.reqs_by_rid.get(rid, []):
            if not req.finished:
                req.finish_reason = {"type": "abort", "message": "aborted"}
                self._abort_pending = True

    def has_work(self) -> bool:
        return bool(
            self.waiting
            or self.running.reqs
            or self.chunked_req
            or self.jump_forward_reqs
            or self.pending_outputs
            or self.inflight is not None
        )

    def step(self) -> list[ReqOutput]:
        """Runs at most one forward. Returns the outputs produced (possibly none)."""
        outputs = self._step()
        if not self.has_work():
            self._check_integrity_when_idle()
        return outputs

    def _step(self) -> list[ReqOutput]:
        outputs, self.pending_outputs = self.pending_outputs, []
        if self.inflight is not None and (
            self._abort_pending or self.grammar.has_pending_compiles()
        ):
            outputs += self.overlap_decoder.resolve(self.running)
        outputs += self._drop_aborted_and_failed()
        batch = None
        if self.inflight is not None:
            batch = self._get_prefill_batch()
            if batch is None and self._can_overlap_decode():
                outputs += self.overlap_decoder.launch(self.running)
                return outputs
            outputs += self.overlap_decoder.resolve(self.running)
            if batch is not None:
                self._maybe_mix_decode(batch)
        if batch is None:
            batch = self._get_next_batch()
        if batch is None:
            return outputs
        if batch is self.running and self._can_overlap_decode():
            outputs += self.overlap_decoder.launch(self.running)
            return outputs
        forward_batch = batch.prepare_forward(self.kv, self.runner)
        logits = self.runner.forward(forward_batch)
        self.counters.forward_steps += 1
        if batch.mode == ForwardMode.EXTEND:
            if batch.mixed_decode_reqs:  # their rows follow the extend requests' rows
                num_extend = len(batch.reqs)
                outputs += self._process_decode(self.running, logits[num_extend:])
                logits = logits[:num_extend]
            outputs += self._process_extend(batch, logits)
        else:
            outputs += self._process_decode(batch, logits)
        return outputs

    def flush_cache(self) -> bool:
        """Empties the radix cache; refused (False) while requests are queued or running."""
        if self.has_work():
            return False
        self.kv.flush()
        return True

    def shutdown(self) -> None:
        """Stops background work (constraint compilation threads)."""
        self.grammar.shutdown()

    def _check_integrity_when_idle(self) -> None:
        # A leak is a bug but not a reason to stop serving: log it loudly.
        try:
            self.check_integrity()
        except AssertionError as error:
            logger.error("KV integrity check failed while idle: %s", error)

    def check_integrity(self) -> None:
        """Asserts that no KV slot or row leaked: free + cached + in use == total."""
        # A decode step in flight holds slots not committed yet: process it first (its
        # outputs go out with the next step).
        self.pending_outputs += self.overlap_decoder.resolve(self.running)
        live = list(self.running.reqs) + self.jump_forward_reqs
        live += [self.chunked_req] if self.chunked_req else []
        self.kv.check_integrity(live)

    def get_stats(self) -> SchedulerStats:
        return self.counters.to_stats(
            num_running_reqs=len(self.running.reqs)
            + len(self.jump_forward_reqs)
            + (1 if self.chunked_req else 0),
            num_queued_reqs=len(self.waiting),
            kv_total_slots=self.kv.capacity,
            kv_free_slots=self.kv.free_size(),
            kv_cached_slots=self.kv.tree.total_size(),
            context_length=self.context_length,
        )

    # ---- scheduling ------------------------------------------------------------------------

    def _drop_aborted_and_failed(self) -> list[ReqOutput]:
        # Queued or running requests finish here only by an abort or a failed compile: skip
        # the scans (O(requests) each step) when neither can have happened.
        if not self._abort_pending and not self.grammar.has_pending_compiles():
            return []
        self._abort_pending = False
        outputs = []
        still_waiting = []
        for req in self.waiting:
            error = self.grammar.poll(req)
            if error is not None:
                req.error = error
                req.finish_reason = {"type": "abort", "message": error}
            if req.finished:
                self.grammar.forget(req)
                outputs.append(self.results.finish(req))
            else:
                still_waiting.append(req)
        self.waiting = still_waiting
        if self.chunked_req is not None and self.chunked_req.finished:
            outputs.append(self.results.finish(self.chunked_req))
            self.chunked_req = None
        outputs += [self.results.finish(r) for r in self.jump_forward_reqs if r.finished]
        self.jump_forward_reqs = [r for r in self.jump_forward_reqs if not r.finished]
        keep = [i for i, req in enumerate(self.running.reqs) if not req.finished]
        if len(keep) < len(self.running.reqs):
            outputs += [self.results.finish(r) for r in self.running.reqs if r.finished]
            self.running.filter(keep)
        return outputs

    def _get_next_batch(self) -> ScheduleBatch | None:
        batch = self._get_prefill_batch()
        if batch is not None:
            self._maybe_mix_decode(batch)
            return batch
        if not self.running.reqs:
            return None
        self._ensure_decode_slots()
        return self.running

    def _maybe_mix_decode(self, batch: ScheduleBatch) -> None:
        """With enable_mixed_chunk, the running requests decode inside the extend forward."""
        if not self.server_args.enable_mixed_chunk or not self.running.reqs:
            return
        if batch.wants_all_logits:
            return  # per-token logits of the whole batch: keep prompt-logprob batches pure
        needed = sum(batch.new_token_counts()) + len(self.running.reqs)
        if self.kv.available_size() >= needed:
            batch.mixed_decode_reqs = list(self.running.reqs)
            self.counters.mixed_steps += 1

    def _is_ready(self, req: Req) -> bool:
        gate = req.prefill_gate
        gate_open = gate is None or gate.prompt_published or gate.finished
        return gate_open and req.grammar_ready

    def _get_prefill_batch(self) -> ScheduleBatch | None:
        max_running = self.runner.max_running_requests
        # Requests that hold KV and need an extend first: the chunked prefill in progress,
        # then requests whose output a jump-forward extended.
        continuing = ([self.chunked_req] if self.chunked_req else []) + self.jump_forward_reqs
        if not continuing and (not self.waiting or len(self.running.reqs) >= max_running):
            return None
        adder = PrefillAdder(
            self.kv,
            running_reqs=self.running.reqs,
            new_token_ratio=self.new_token_ratio,
            max_prefill_tokens=self.server_args.max_prefill_tokens,
            chunked_prefill_size=self.server_args.effective_chunked_prefill_size,
        )
        now_s = time.monotonic()
        sharing = InBatchPrefixIndex(
            self.kv,
            min_tokens=self.server_args.in_batch_prefix_min_tokens,
            max_wait_s=self.server_args.schedule_max_wait_s,
            now_s=now_s,
        )
        adder.fill(
            continuing,
            lambda: self.policy.order([r for r in self.waiting if self._is_ready(r)], now_s),
            sharing=sharing,
            max_running_requests=max_running,
        )
        if not adder.admitted:
            return None
        admitted_ids = {id(r) for r in adder.admitted}
        if self.chunked_req is None or id(self.chunked_req) in admitted_ids:
            self.chunked_req = adder.chunked_req
        jumped_ids = {id(r) for r in self.jump_forward_reqs}
        self.jump_forward_reqs = [r for r in self.jump_forward_reqs if id(r) not in admitted_ids]
        self.waiting = [r for r in self.waiting if id(r) not in admitted_ids]
        for req in adder.admitted:
            if not req.admitted_once:
                req.admitted_once = True
                req.cached_tokens = req.kv_committed_len
                self.counters.prompt_tokens += len(req.origin_input_ids)
                self.counters.cached_tokens += req.kv_committed_len
            if id(req) in jumped_ids:
                self.counters.jump_forward_tokens += req.extend_input_len
            else:
                self.counters.computed_prefill_tokens += req.extend_input_len
        return ScheduleBatch(ForwardMode.EXTEND, list(adder.admitted))

    def _ensure_decode_slots(self) -> None:
        """Makes room for one new token per running request: evict, then retract."""
        while self.kv.available_size() < len(self.running.reqs):
            # Candidates: every other KV holder, and running requests but the last one (one
            # request alone always fits: longer ones are rejected up front).
            candidates = self.jump_forward_reqs + ([self.chunked_req] if self.chunked_req else [])
            if len(self.running.reqs) > 1:
                candidates += self.running.reqs
            if not candidates:
                return
            # Cheapest to redo: the fewest generated tokens (then the longest prompt, which
            # is most likely to be found in the cache again).
            victim = min(candidates, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))
            self._retract(victim)

    def _retract(self, victim: Req) -> None:
        if victim is self.chunked_req:
            self.chunked_req = None
        elif victim in self.jump_forward_reqs:
            self.jump_forward_reqs.remove(victim)
        else:
            rows = range(len(self.running.reqs))
            self.running.filter([i for i in rows if self.running.reqs[i] is not victim])
        self.kv.release(victim)  # its KV goes to the cache, evictable
        victim.is_chunked = victim.jumped = False
        if not victim.input_logprobs_done:  # a partial prompt-logprob pass restarts
            victim.input_token_logprobs.clear()
            victim.input_top_logprobs.clear()
        victim.num_retractions += 1
        self.waiting.insert(0, victim)
        self.counters.retractions += 1
        self.new_token_ratio = min(1.0, self.new_token_ratio + RATIO_BUMP_ON_RETRACT)
        logger.debug("retracted %s (%d tokens)", victim.rid, victim.seqlen)

    # ---- overlapped decode (runtime/overlap_decode.py) ---------------------------------------

    def _can_overlap_decode(self) -> bool:
        if not self.overlap or not self.running.reqs or self._abort_pending:
            return False
        if self.chunked_req is not None or self.jump_forward_reqs:
            return False
        return all(can_overlap(r) for r in self.running.reqs if not r.finished)

    # ---- results (runtime/result_processor.py) ----------------------------------------------

    def _process_extend(self, batch: ScheduleBatch, logits: torch.Tensor) -> list[ReqOutput]:
        outputs, decoding = self.results.process_extend(batch, logits)
        if decoding is not None:
            self.running.merge(decoding)
        self.jump_forward_reqs += self.results.take_jumped()
        return outputs

    def _process_decode(self, batch: ScheduleBatch, logits: torch.Tensor) -> list[ReqOutput]:
        outputs = self.results.process_decode(batch, logits)
        self.jump_forward_reqs += self.results.take_jumped()
        self._decay_new_token_ratio()
        return outputs

    def _advance_decoded(self, reqs: list[Req], next_ids: list[int], launched_next):
        """Appends the tokens of an overlapped decode step (`OverlapDecoder`)."""
        outputs = self.results.advance(reqs, next_ids, launched_next=launched_next)
        self.jump_forward_reqs += self.results.take_jumped()
        self._decay_new_token_ratio()
        return outputs

    def _decay_new_token_ratio(self) -> None:
        """After a decode step: back towards the configured ratio (it rises on retraction)."""
        base = self.server_args.new_token_ratio
        self.new_token_ratio = max(base, self.new_token_ratio - RATIO_DECAY)
