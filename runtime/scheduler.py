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
from typing import Any

from radixgen.radix_cache.radix_cache import RadixCache
from radixgen.runtime.batch_builder import BatchBuilder
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.grammar_hook import GrammarHook
from radixgen.runtime.io_struct import (
    FlushCacheOutput,
    LoadLoRAAdapterReq,
    LoRAAdapterOutput,
    ReqOutput,
    SchedulerCounters,
    SchedulerStats,
    UnloadLoRAAdapterReq,
)
from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.lora.slots import LoRASlots
from radixgen.runtime.overlap_decode import InflightDecode, OverlapDecoder, can_overlap
from radixgen.runtime.req import Req
from radixgen.runtime.request_schema import GenerateReq
from radixgen.runtime.result_processor import (
    ResultProcessor,
    StepResult,
    error_outputs,
    make_stop_checker,
)
from radixgen.runtime.sampler import Sampler
from radixgen.runtime.schedule_policy import SchedulePolicy
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.speculative.config import resolve_speculative_config
from radixgen.runtime.speculative.decoder import SpeculativeDecoder

logger = logging.getLogger(__name__)


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

            tokenizer = load_tokenizer(
                server_args.tokenizer_path or model_runner.model_path, server_args.chat_template
            )
        self.server_args = server_args
        self.runner = model_runner
        self.tokenizer = tokenizer
        self.device = model_runner.device
        self.vocab_size = model_runner.model_config.vocab_size
        self.context_length = model_runner.context_length
        self.eos_token_ids = frozenset(model_runner.model_config.eos_token_ids)
        tree = RadixCache(model_runner.slot_allocator, disabled=server_args.disable_radix_cache)
        self.lora = LoRASlots(model_runner.lora_manager)
        self.kv = KVCacheManager(
            model_runner.req_to_token_pool, model_runner.slot_allocator, tree, lora=self.lora
        )
        self.sampler = Sampler(server_args.sampling_backend, self.device)
        self.grammar = GrammarHook(
            tokenizer,
            vocab_size=self.vocab_size,
            eos_token_ids=sorted(self.eos_token_ids),
            compile_timeout_s=server_args.constrained_compile_timeout_s,
            jump_forward=server_args.jump_forward,
            cache_dir=server_args.constrained_cache_dir,
            grammar_backend=server_args.grammar_backend,
            context_length=self.context_length,
            constraint_budget=not server_args.disable_constraint_budget,
        )
        self.seed_rng = random.Random(server_args.seed)  # seeds of unseeded requests
        self.reqs_by_rid: dict[str, list[Req]] = {}
        self.pending_outputs: list[ReqOutput] = []
        self._abort_pending = False  # an abort since the last _drop_aborted_and_failed
        # A step ran since the last idle integrity check (`check_integrity_when_idle`).
        self.integrity_check_due = False
        overlap = server_args.enable_overlap_schedule
        self.overlap = self.device.type == "cuda" if overlap is None else overlap
        self.counters = SchedulerCounters()
        # The queues (waiting, running, chunked) and how batches are formed.
        self.batches = BatchBuilder(
            server_args,
            kv=self.kv,
            policy=SchedulePolicy(
                server_args.schedule_policy, server_args.schedule_max_wait_s, self.kv
            ),
            counters=self.counters,
            max_running_requests=model_runner.max_running_requests,
        )
        self.results = ResultProcessor(
            kv=self.kv,
            grammar=self.grammar,
            sampler=self.sampler,
            counters=self.counters,
            vocab_size=self.vocab_size,
            context_length=self.context_length,
            device=self.device,
        )
        self.overlap_decoder = OverlapDecoder(
            runner=model_runner,
            kv=self.kv,
            counters=self.counters,
            context_length=self.context_length,
            results=self.results,
        )
        speculative_config = resolve_speculative_config(server_args)
        # Speculative steps run without overlap (the next drafts need this step's acceptance).
        self.speculative = (
            None
            if speculative_config is None
            else SpeculativeDecoder(
                speculative_config,
                runner=model_runner,
                kv=self.kv,
                results=self.results,
                counters=self.counters,
                context_length=self.context_length,
            )
        )

    @property
    def inflight(self) -> InflightDecode | None:
        """The decode step launched but not processed yet (overlap only)."""
        return self.overlap_decoder.inflight

    # ---- public interface ----------------------------------------------------------------

    def add_request(self, request: GenerateReq) -> None:
        """Queues a request that `validate_request` accepted with this model's limits (the
        front end's job: the scheduler trusts the type). A request the scheduler cannot
        take now (queue full, duplicate id, constraint that fails to compile) is answered
        with an error output from the next `step()`, so one client cannot break the loop."""
        error = None
        num_queued = len(self.batches.waiting)
        if num_queued + request.sampling_params.n > self.server_args.max_queued_requests:
            error = (
                f"the queue is full ({num_queued} requests waiting, "
                f"max_queued_requests={self.server_args.max_queued_requests})"
            )
        elif request.rid in self.reqs_by_rid:
            error = f"duplicate request id {request.rid!r}"
        elif request.lora_path is not None:
            error = self.lora.unknown_adapter_error(request.lora_path)
        if error is not None:
            self.pending_outputs += error_outputs(request, error)
            return
        reqs: list[Req] = []
        try:
            reqs = self._make_sample_reqs(request)
            if request.sampling_params.has_constraint:
                for req in reqs:
                    error = self.grammar.start_compile(req)
                    if error is not None:
                        break
        except Exception as bug:  # noqa: BLE001 - this request fails, never the loop
            logger.exception("could not admit request %s", request.rid)
            error = f"the scheduler could not admit this request ({type(bug).__name__}: {bug})"
        if error is not None:
            for failed in reqs:
                self.grammar.forget(failed)
            self.pending_outputs += error_outputs(request, error)
            return
        self.reqs_by_rid[request.rid] = reqs
        self.batches.waiting.extend(reqs)

    def _make_sample_reqs(self, request: GenerateReq) -> list[Req]:
        """The `n` sequences of a request; sample `i` draws with seed `seed + i` (a drawn
        seed when the request has none). With the radix cache on, samples 1..n-1 wait until
        sample 0 has prefilled the prompt and put it in the cache, so it is computed once."""
        params = request.sampling_params
        base_seed = params.seed if params.seed is not None else self.seed_rng.getrandbits(62)
        reqs = [
            Req(
                rid=request.rid,
                index=index,
                origin_input_ids=list(request.input_ids),
                sampling_params=params,
                sampling_seed=base_seed + index,
                eos_token_ids=self.eos_token_ids,
                return_logprob=request.return_logprob,
                logprob_start_len=request.logprob_start_len,
                top_logprobs_num=request.top_logprobs_num,
                # All n samples share it; an adapter's KV differs from the base model's.
                cache_namespace=self.lora.namespace(request.cache_salt, request.lora_path),
                lora_path=request.lora_path,
            )
            for index in range(params.n)
        ]
        for req in reqs:
            req.stop_checker = make_stop_checker(req, self.tokenizer)
        if not self.kv.tree.disabled:
            for req in reqs[1:]:
                req.prefill_gate = reqs[0]
        return reqs

    def abort_request(self, rid: str) -> None:
        """Aborts every sample of `rid`; its KV is freed by the next `step()`."""
        for req in self.reqs_by_rid.get(rid, []):
            if not req.finished:
                req.finish({"type": "abort", "message": "aborted"})
                self._abort_pending = True

    def has_work(self) -> bool:
        return bool(self.batches.has_work() or self.pending_outputs or self.inflight is not None)

    def step(self) -> list[ReqOutput]:
        """Runs at most one forward. Returns the outputs produced (possibly none)."""
        outputs = self._step()
        for output in outputs:
            if output.finished:  # a request leaves the table with its last sample
                reqs = self.reqs_by_rid.get(output.rid)
                if reqs is not None and all(req.finished for req in reqs):
                    del self.reqs_by_rid[output.rid]
        self.integrity_check_due = True
        return outputs

    def _step(self) -> list[ReqOutput]:
        outputs, self.pending_outputs = self.pending_outputs, []
        overlap, batches = self.overlap_decoder, self.batches
        if self.inflight is not None and self._abort_pending:
            outputs += self._apply(overlap.resolve(batches.running), decoded=True)
        outputs += self._drop_aborted_and_failed()
        batch = None
        if self.inflight is not None:
            batch = batches.prefill_batch()
            if batch is None and self._can_overlap_decode():
                outputs += self._apply(overlap.launch(batches.running), decoded=True)
                return outputs
            outputs += self._apply(overlap.resolve(batches.running), decoded=True)
            if batch is not None:
                batches.mix_decode_into(batch)
        if batch is None:
            batch = batches.next_batch()
        if batch is None:
            return outputs
        if batch is batches.running and self._can_overlap_decode():
            outputs += self._apply(overlap.launch(batches.running), decoded=True)
            return outputs
        if batch is batches.running and self.speculative is not None:
            speculated = self.speculative.step(batch)  # None: it declined, decode plainly
            if speculated is not None:
                return outputs + self._apply(speculated, decoded=True)
        forward_batch = batch.prepare_forward(self.kv, self.runner)
        proposer = self.speculative.proposer if self.speculative is not None else None
        if batch.mode == ForwardMode.EXTEND and proposer and proposer.uses_target_hidden_states:
            # EAGLE drafts from the target's hidden states: the prompt's come from its prefill.
            logits, hidden_states = self.runner.forward(forward_batch, return_hidden_states=True)
            proposer.after_prefill(batch.reqs, forward_batch, hidden_states)
        else:
            logits = self.runner.forward(forward_batch)
        self.counters.forward_steps += 1
        self.counters.tree_attention_steps += forward_batch.shared_prefixes is not None
        if batch.mode == ForwardMode.EXTEND:
            if batch.mixed_decode_reqs:  # their rows follow the extend requests' rows
                num_extend = len(batch.reqs)
                decoded = self.results.process_decode(batches.running, logits[num_extend:])
                outputs += self._apply(decoded, decoded=True)
                logits = logits[:num_extend]
            outputs += self._apply(self.results.process_extend(batch, logits), decoded=False)
        else:
            outputs += self._apply(self.results.process_decode(batch, logits), decoded=True)
        return outputs

    def _apply(self, result: StepResult | None, *, decoded: bool) -> list[ReqOutput]:
        """Applies a processed forward (None: nothing processed): requests that start
        decoding join the running batch."""
        if result is None:
            return []
        self.batches.apply(result, decoded=decoded)
        return result.outputs

    def flush_cache(self) -> FlushCacheOutput:
        """Empties the radix cache; refused while requests are queued or running."""
        if self.has_work():
            return FlushCacheOutput(success=False, message="requests are in flight")
        self.kv.flush()
        return FlushCacheOutput(success=True)

    def update_lora_adapter(self, request: LoadLoRAAdapterReq | UnloadLoRAAdapterReq):
        """Loads or unloads an adapter at run time (unload: refused while requests use it)."""
        if isinstance(request, LoadLoRAAdapterReq):
            error = self.lora.load(request.lora_name, request.lora_path)
        else:
            queued = self.batches.waiting + self.batches.holding_kv()
            error = self.lora.unload(request.lora_name, queued)
        return LoRAAdapterOutput(
            success=error is None, message=error or "", loaded_adapters=self.lora.names()
        )

    def reset_after_warmup(self) -> None:
        """Forgets the warm-up (`runtime/warmup.py`): cache flushed, counters zeroed, decode
        headroom back to its configured ratio. Only on an idle scheduler."""
        flushed = self.flush_cache()
        if not flushed.success:
            raise ValueError(f"reset_after_warmup on a busy scheduler: {flushed.message}")
        self.counters.reset()
        self.batches.new_token_ratio = self.server_args.new_token_ratio

    def shutdown(self) -> None:
        """Stops background work (constraint compilation threads)."""
        self.grammar.shutdown()

    def check_integrity_when_idle(self) -> None:
        """`check_integrity` once per idle period (a no-op while busy or when no step ran since
        the last check); a leak is logged loudly, not raised: it is a bug but not a reason to
        stop serving. The check is O(KV capacity + radix tree), tens of milliseconds with a
        GPU-sized pool (torch.unique over every slot): the loop runs it only after a whole
        idle poll with no message, never between a step and the delivery of its outputs."""
        if not self.integrity_check_due or self.has_work():
            return
        self.integrity_check_due = False
        try:
            self.check_integrity()
        except AssertionError as error:
            logger.error("KV integrity check failed while idle: %s", error)

    def check_integrity(self) -> None:
        """Asserts that no KV slot or row leaked: free + cached + in use == total."""
        # A decode step in flight holds slots not committed yet: process it first (its
        # outputs go out with the next step).
        resolved = self.overlap_decoder.resolve(self.batches.running)
        self.pending_outputs += self._apply(resolved, decoded=True)
        self.kv.check_integrity(self.batches.holding_kv())
        self.lora.check_integrity(self.batches.holding_kv())
        if self.speculative is not None:
            self.speculative.proposer.release(self.batches.running.reqs)
            self.speculative.proposer.check_integrity()

    def get_stats(self) -> SchedulerStats:
        return self.counters.to_stats(
            num_running_reqs=self.batches.num_running(),
            num_queued_reqs=len(self.batches.waiting),
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
        # A compile finishes only waiting requests: the running batch, which may hold the
        # rows of a step in flight, is scanned only after an abort (which resolved that step).
        waiting_only = not self._abort_pending
        self._abort_pending = False
        removed = self.batches.remove_finished(self._keep_waiting, waiting_only=waiting_only)
        return [self.results.finish(req) for req in removed]

    def _keep_waiting(self, req: Req) -> bool:
        """Whether a waiting request stays queued; its constraint may have failed."""
        error = self.grammar.poll(req)
        if error is not None:
            req.error = error
            req.finish({"type": "abort", "message": error})
        if req.finished:
            self.grammar.forget(req)
        return not req.finished

    # ---- overlapped decode (runtime/overlap_decode.py) ---------------------------------------

    def _can_overlap_decode(self) -> bool:
        batches = self.batches
        if not self.overlap or not batches.running.reqs or self._abort_pending:
            return False
        if batches.chunked_req is not None:
            return False
        if self.speculative is not None and self.speculative.applies_to(batches.running):
            return False  # a speculative step comes next (it runs without overlap)
        return all(
            can_overlap(r) and not self.grammar.jumps_prevent_overlap(r)
            for r in batches.running.reqs
            if not r.finished
        )
