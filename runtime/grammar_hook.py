"""`GrammarHook`: the scheduler's one point of contact with `radixgen.constrained`.

A constrained request (regex, json_schema or choices) waits in the queue until its grammar
is compiled (on the backend's worker threads, off the scheduler's critical path). Then each
step its matcher fills the request's row of a packed vocab bitmask, which the sampler
applies, and it advances on every sampled token. A failed or timed-out compile fails that
request alone.

Budget: unless disabled (server flag or the request's `constraint_budget=False`), each
matcher is told its remaining token budget before it fills its row, so an output cut by
`max_new_tokens` or the context is still a complete match (constrained/completion_budget.py);
a request whose budget cannot hold the shortest match is refused once its grammar is ready.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from radixgen.kernels.host_copy import host_ints_to_device
from radixgen.runtime.req import Req, ReqStatus
from radixgen.runtime.sampling_batch_info import SamplingBatchInfo

# Our own deadline on top of the backend's, in case a compile never reports back.
TIMEOUT_GRACE_S = 5.0
# A jump-forward pays only for runs of 2+ forced tokens. A forced token costs a forward either
# way (its KV must be computed), and a one-token jump turns the request's next forward into
# a 2-token extend row, which takes the whole batch off its decode CUDA graph, and under the
# overlapped schedule also wastes the row launched before the jump was found. A lone forced
# token is left to the mask, which allows only it: sampled in an ordinary decode step.
MIN_JUMP_TOKENS = 2


class GrammarHook:
    def __init__(
        self,
        tokenizer: Any,
        *,
        vocab_size: int,
        eos_token_ids: list[int],
        compile_timeout_s: float,
        jump_forward: bool,
        cache_dir: str | None = None,
        grammar_backend: str = "llguidance",
        context_length: int | None = None,
        constraint_budget: bool = True,
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.compile_timeout_s = compile_timeout_s
        self.jump_forward = jump_forward
        self.cache_dir = cache_dir
        self.grammar_backend = grammar_backend  # "llguidance" or "outlines"
        self.context_length = context_length  # None: only max_new_tokens bounds outputs
        self.constraint_budget = constraint_budget  # the server's switch; requests may opt out
        self._backend = None  # built on the first constrained request (it indexes the vocab)
        self._pending: dict[int, tuple[Any, float]] = {}  # id(req) -> (future, started_s)
        self._bitmask: torch.Tensor | None = None  # [capacity, ceil(vocab / 32)] int32, host
        # Recorded after the last copy of `_bitmask` to the device (CUDA only).
        self._bitmask_copied: torch.cuda.Event | None = None

    def _get_backend(self):
        if self._backend is None:
            from radixgen.constrained import GrammarBackend

            self._backend = GrammarBackend(
                self.tokenizer,
                vocab_size=self.vocab_size,
                eos_token_ids=self.eos_token_ids,
                jump_forward=self.jump_forward,
                cache_dir=self.cache_dir,
                grammar_backend=self.grammar_backend,
                constraint_budget=self.constraint_budget,
            )
        return self._backend

    def start_compile(self, req: Req) -> str | None:
        """Starts compiling req's constraint. Returns an error message, or None."""
        from radixgen.constrained import ConstraintSpec

        params = req.sampling_params
        try:
            spec = ConstraintSpec.from_sampling_params(
                regex=params.regex,
                json_schema=params.json_schema,
                choices=params.choices,
                ebnf=params.ebnf,
                lark=params.lark,
                json_object=params.json_object,
                structural_tag=params.structural_tag,
            )
            future = self._get_backend().compile_async(spec, timeout_s=self.compile_timeout_s)
        except (ValueError, TypeError) as error:
            return f"invalid constraint: {error}"
        req.grammar_ready = False
        self._pending[id(req)] = (future, time.monotonic())
        return None

    def poll(self, req: Req) -> str | None:
        """Checks req's compile; on success `req.grammar` gets a matcher and
        `req.grammar_ready` turns True. Returns an error message, or None."""
        entry = self._pending.get(id(req))
        if entry is None:
            return None
        future, started_s = entry
        # A budgeted request also waits for the budget table (built after the compile, off
        # this thread); one without a budget starts as soon as the grammar compiled.
        table_pending = (
            future.done()
            and future.exception() is None
            and self._budget_enforced(req)
            and not future.result().budget_table_ready()
        )
        if not future.done() or table_pending:
            if time.monotonic() - started_s > self.compile_timeout_s + TIMEOUT_GRACE_S:
                self.forget(req)
                return f"constraint compile timed out after {self.compile_timeout_s} s"
            return None
        del self._pending[id(req)]
        try:
            matcher = future.result().new_matcher()
        except Exception as error:  # any compile failure fails this request alone
            return f"invalid constraint: {error}"
        # A request resumed after retraction replays its output through the fresh matcher.
        for token_id in req.output_ids:
            matcher.accept_token(token_id)
        error = self._check_budget(req, matcher)
        if error is not None:
            return error
        req.grammar = matcher
        req.grammar_ready = True
        return None

    def _budget_enforced(self, req: Req) -> bool:
        return self.constraint_budget and req.sampling_params.constraint_budget

    def remaining_tokens(self, req: Req) -> int:
        """Tokens req may still generate, this step's included (max_new_tokens and context)."""
        remaining = req.sampling_params.max_new_tokens - len(req.output_ids)
        if self.context_length is not None:
            remaining = min(remaining, self.context_length - req.seqlen)
        return remaining

    def _check_budget(self, req: Req, matcher) -> str | None:
        """The refusal of a request whose budget is below its constraint's shortest match."""
        if not self._budget_enforced(req):
            return None
        needed = matcher.min_completion_tokens()
        remaining = self.remaining_tokens(req)
        if needed is None or needed <= remaining:
            return None
        return (
            f"max_new_tokens too small for the constraint: its shortest match needs {needed} "
            f"tokens, only {remaining} remain (max_new_tokens="
            f"{req.sampling_params.max_new_tokens}); raise max_new_tokens, or set "
            "constraint_budget=false to accept a truncated output"
        )

    def has_pending_compiles(self) -> bool:
        return bool(self._pending)

    def forget(self, req: Req) -> None:
        entry = self._pending.pop(id(req), None)
        if entry is not None:
            entry[0].cancel()

    def set_vocab_mask(
        self, reqs: list[Req], info: SamplingBatchInfo, dropped_rows: frozenset[int] = frozenset()
    ) -> None:
        """Fills this step's bitmask for the constrained rows (the sampler's mask hook).

        Rows of finished requests stay all-allowed: under the overlapped schedule a request
        that its previous step finished still has a (wasted) row here, and its matcher may
        admit nothing more. So do `dropped_rows`, whose samples the caller drops (overlap's
        rows of requests that jumped forward after the launch: with jump-forward on, a
        constrained row about every second step), so their fills would be wasted.

        One batched fill, one asynchronous copy, no host sync: under overlap this runs while
        the device computes the step's forward, and the copy is queued on the same stream as
        the sampling kernel, so only sampling waits for it.
        """
        rows, matchers = [], []  # the constrained rows, and (matcher, row) pairs
        budgeted = self.constraint_budget
        for row, req in enumerate(reqs):  # one pass, no per-row calls beyond the budget's
            matcher = req.grammar
            status = req.status  # `req.finished`, inline (an enum's hash is a Python call)
            if matcher is None or status is ReqStatus.FINISHED or status is ReqStatus.ABORTED:
                continue
            if row in dropped_rows:
                continue
            rows.append(row)
            matchers.append((matcher, row))
            # A matcher's budget stays None unless enforced (both switches are fixed for a
            # request's life), so only budgeted requests are told theirs, every step.
            if budgeted and req.sampling_params.constraint_budget:
                matcher.set_token_budget(self.remaining_tokens(req))
        if not rows:
            info.vocab_bitmask = info.vocab_bitmask_rows = None
            return
        device = info.top_ps.device
        bitmask = self._host_bitmask(len(reqs), rows)  # [batch, ceil(vocab / 32)]
        # One call for the batch: llguidance fills the rows on parallel threads.
        self._get_backend().fill_bitmasks(matchers, bitmask)
        info.vocab_bitmask = bitmask.to(device, non_blocking=True)
        if device.type == "cuda":
            self._bitmask_copied = torch.cuda.Event()
            self._bitmask_copied.record()
        # From pinned memory: a pageable copy would wait for the forward in flight.
        info.vocab_bitmask_rows = host_ints_to_device(rows, device)

    def _host_bitmask(self, batch_size: int, constrained_rows: list[int]) -> torch.Tensor:
        """The first `batch_size` rows of the one persistent host bitmask (pinned when CUDA
        exists), every row outside `constrained_rows` set to all-allowed (the fused sampler
        reads every row). Constrained rows are left as they are: both backends overwrite a
        whole row. Resetting the whole buffer with torch's `fill_` cost ~2 ms a step on the
        H200 host at batch 64 (py-spy, scripts/profile_json_serving.sh); numpy writes only
        the unconstrained rows, on this thread.

        Reuse is safe because the host waits for the previous step's copy to the device
        before overwriting the buffer (`_bitmask_copied`). Without overlap that copy is long
        done (the step's sampled ids reached the host after it); under overlap the next fill
        also comes after the host waited for the previous step's sampled ids, which the
        stream orders after that copy. So the wait is a guard that costs nothing, not a stall.
        """
        if self._bitmask_copied is not None:
            self._bitmask_copied.synchronize()
            self._bitmask_copied = None
        if self._bitmask is None or self._bitmask.shape[0] < batch_size:
            from radixgen.constrained import allocate_token_bitmask

            capacity = max(batch_size, 2 * (0 if self._bitmask is None else len(self._bitmask)))
            self._bitmask = allocate_token_bitmask(capacity, self.vocab_size)
        bitmask = self._bitmask[:batch_size]
        if len(constrained_rows) < batch_size:
            unconstrained = np.ones(batch_size, dtype=bool)
            unconstrained[constrained_rows] = False
            bitmask.numpy()[unconstrained] = -1
        return bitmask

    def may_jump_forward(self, req: Req) -> bool:
        """Whether `try_jump_forward` may ever extend req."""
        return (
            self.jump_forward
            and req.grammar is not None
            and not req.return_logprob
            and req.stop_checker is None
        )

    def jumps_prevent_overlap(self, req: Req) -> bool:
        """Whether req may jump forward with a plan that retracts its last token: it then does
        not overlap (the step launched ahead computed that token's KV, and the jump would
        rewrite it). Plans that only append (llguidance) overlap."""
        grammar = req.grammar  # asked per row per step: the class attribute decides first
        return (
            grammar is not None and grammar.jump_forward_may_retract and self.may_jump_forward(req)
        )

    def try_jump_forward(self, req: Req, context_length: int) -> bool:
        """Appends the text the constraint forces next (req is JUMPED then; it may finish
        instead, when the constraint or its budget ends). The run is computed by req's next
        forward in the running batch, as one multi-token row beside the decode rows.

        Only plans that re-tokenise at most the token just sampled (not yet reported) are
        taken, so a client never sees a token change; requests with logprobs or stop
        strings sample every token.
        """
        if not self.may_jump_forward(req):
            return False
        matcher, params = req.grammar, req.sampling_params  # per constrained row per step
        plan = matcher.find_jump_forward()
        if plan is None or plan.retract_tokens > 1:
            return False
        if len(plan.append_ids) - plan.retract_tokens < MIN_JUMP_TOKENS:
            return False
        new_len = len(req.output_ids) - plan.retract_tokens + len(plan.append_ids)
        if new_len > params.max_new_tokens:
            return False
        prompt_len = len(req.origin_input_ids)
        if prompt_len + new_len >= context_length:
            return False
        # (a budgeted request's table is built: `poll` waited for it)
        budgeted = self._budget_enforced(req) and matcher.min_completion_tokens() is not None
        if budgeted:  # leave room for a complete match
            needed = matcher.min_completion_tokens_after(plan)
            left = min(params.max_new_tokens - new_len, context_length - prompt_len - new_len)
            if needed is None or needed > left:
                return False
        matcher.apply_jump_forward(plan)
        del req.output_ids[len(req.output_ids) - plan.retract_tokens :]
        req.output_ids.extend(plan.append_ids)
        if matcher.is_terminated():
            req.finish({"type": "stop", "matched": None})
            return False
        if new_len >= params.max_new_tokens:  # `req.remaining_new_tokens <= 0`
            req.finish({"type": "length", "length": params.max_new_tokens})
            return False
        req.set_status(ReqStatus.JUMPED)
        return True

    def shutdown(self) -> None:
        if self._backend is not None:
            self._backend.shutdown()
