"""`PrefillAdder`: admits waiting requests into one extend batch under the token budgets.

Budgets, per extend batch:
- KV: new tokens plus decode headroom must fit in the obtainable slots (free + evictable).
  Every running or admitted request reserves `ceil(remaining_new_tokens * new_token_ratio)`
  slots for its future decode steps; the ratio is an over-commit, corrected by retraction.
- `max_prefill_tokens`: new tokens computed by one extend forward.
- `chunked_prefill_size`: a prompt longer than what is left of the chunk budget is cut;
  the rest follows in later extend batches (one chunked request at a time).
- request rows of `req_to_token`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable

from radixgen.runtime.in_batch_prefix import InBatchPrefixIndex
from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.req import Req, ReqStatus


class AddResult(enum.Enum):
    ADDED = "added"  # keep offering requests
    BUDGET_FULL = "budget_full"  # stop: no room for this one (or the chunk budget is used up)


def decode_headroom(req: Req, new_token_ratio: float) -> int:
    """Slots reserved for req's future decode steps."""
    return math.ceil(max(req.remaining_new_tokens, 0) * new_token_ratio)


class PrefillAdder:
    def __init__(
        self,
        kv: KVCacheManager,
        *,
        running_reqs: list[Req],
        new_token_ratio: float,
        max_prefill_tokens: int,
        chunked_prefill_size: int | None,
    ):
        self.kv = kv
        self.new_token_ratio = new_token_ratio
        self.rem_input_tokens = max_prefill_tokens
        self.rem_chunk_tokens = chunked_prefill_size  # None: no chunking
        self.num_running = len(running_reqs)
        self.reserved_tokens = sum(decode_headroom(r, new_token_ratio) for r in running_reqs)
        self.planned_tokens = 0  # slots the admitted requests will allocate for this batch
        self.admitted: list[Req] = []
        self.chunked_req: Req | None = None  # the admitted request whose prefill continues

    def _remaining_total(self) -> int:
        return self.kv.available_size() - self.planned_tokens - self.reserved_tokens

    def fill(
        self,
        continuing: list[Req],
        order_waiting: Callable[[], list[Req]],
        *,
        sharing: InBatchPrefixIndex,
        max_running_requests: int,
    ) -> None:
        """Forms the batch: the continuing requests (they hold KV) first; if they all fit
        whole, the waiting requests in `order_waiting()`'s order until a budget is full.

        Args:
            continuing: the chunked request in progress, then jump-forward-extended ones.
            order_waiting: the ready waiting requests in policy order (called only when
                waiting requests may join).
            sharing: in-batch prefix sharing; skips requests that should wait a batch.
            max_running_requests: running plus admitted requests stay within it.
        """
        for req in continuing:
            self.add(req)
        for req in self.admitted:
            sharing.add_admitted(req)
        if len(self.admitted) < len(continuing) or self.chunked_req is not None:
            return  # nothing overtakes a continuing request that is still waiting for room
        for req in order_waiting():
            if self.num_running + len(self.admitted) >= max_running_requests:
                return
            if self.admitted and req.wants_input_logprobs != self.admitted[0].wants_input_logprobs:
                # Prompt logprobs need every token's logits: keep such batches apart so the
                # others still get last-token logits only.
                continue
            if sharing.should_defer(req):
                continue  # the next batch finds the shared prefix in the cache
            result = self.add(req)
            if self.admitted and self.admitted[-1] is req:
                sharing.add_admitted(req)
            if result == AddResult.BUDGET_FULL:
                return

    def add(self, req: Req) -> AddResult:
        """Offers `req` (waiting, or the chunked request continuing its prefill)."""
        is_new = req.req_pool_idx is None
        if is_new and not self.kv.admit(req):
            return AddResult.BUDGET_FULL  # no request row free
        extend_len = req.seqlen - req.kv_committed_len
        budget = self.rem_input_tokens
        if self.rem_chunk_tokens is not None:
            budget = min(budget, self.rem_chunk_tokens)
        if extend_len > budget:
            if self.rem_chunk_tokens is not None and budget > 0:
                extend_len = budget  # chunk it
            elif self.admitted or budget <= 0:
                return self._reject(req, is_new)
            # else: the first request of the batch always goes, however long.
        headroom = decode_headroom(req, self.new_token_ratio)
        if extend_len + headroom > self._remaining_total():
            return self._reject(req, is_new)
        req.extend_input_len = extend_len
        is_chunked = req.kv_committed_len + extend_len < req.seqlen
        req.set_status(ReqStatus.CHUNKED if is_chunked else ReqStatus.PREFILLING)
        self.planned_tokens += extend_len
        self.reserved_tokens += headroom
        self.rem_input_tokens -= extend_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_len
        self.admitted.append(req)
        if is_chunked:
            self.chunked_req = req
            return AddResult.BUDGET_FULL
        return AddResult.ADDED

    def _reject(self, req: Req, is_new: bool) -> AddResult:
        if is_new:
            self.kv.release(req)  # unlock the prefix it matched and free its row
        return AddResult.BUDGET_FULL
