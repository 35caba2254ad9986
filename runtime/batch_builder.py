"""`BatchBuilder`: the scheduler's queues and how each forward's batch is formed from them.

It owns where requests wait: `waiting` (policy-ordered), the `running` decode batch (with
the requests a jump-forward extended: their forced runs are computed inside its next
forward), and the `chunked_req` whose prefill continues. Each step it forms an extend batch
under the budgets (`PrefillAdder`), or the running batch for a decode step, making room for
decode by evicting, then retracting running requests (their KV goes to the cache; they wait
to resume with the same output).

Extend budgets, per batch:
- KV: new tokens plus decode headroom must fit in the obtainable slots (free + evictable).
  Every running or admitted request reserves `ceil(remaining_new_tokens * new_token_ratio)`
  slots for its future decode steps; the ratio is an over-commit, corrected by retraction.
- `max_prefill_tokens`: new tokens computed by one extend forward.
- `chunked_prefill_size`: a prompt longer than what is left of the chunk budget is cut;
  the rest follows in later extend batches (one chunked request at a time).
- request rows of `req_to_token`.

In-batch prefix sharing (`InBatchPrefixIndex`): a waiting request whose next `min_tokens`
uncached tokens are computed by a request already admitted to the batch being formed waits
for the next batch, where it finds them in the cache (prompts are cached right after their
prefill). Two requests that share more than the cached prefix share the same cached length
`m`, so admitted requests are indexed by `(namespace, m, ids[m : m + min_tokens])` and a hit
is confirmed by comparing the first `m` tokens. No starvation: a deferral needs an admitted
request, so every batch makes progress; past the aging bound a request is deferred at most
once more.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections.abc import Callable

from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.io_struct import SchedulerCounters
from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.req import Req, ReqStatus
from radixgen.runtime.result_processor import StepResult
from radixgen.runtime.schedule_batch import ScheduleBatch
from radixgen.runtime.schedule_policy import SchedulePolicy
from radixgen.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)

# After a retraction the decode headroom ratio jumps by this much, then decays back to the
# configured value by RATIO_DECAY per decode step.
RATIO_BUMP_ON_RETRACT = 0.1
RATIO_DECAY = 0.002


class BatchBuilder:
    """Args:
    server_args: budgets, chunking, mixed chunks, in-batch sharing.
    kv: the KV manager (admission, eviction, retraction).
    policy: orders the waiting requests.
    counters: token and retraction counts go here.
    max_running_requests: rows of `req_to_token`.
    """

    def __init__(
        self,
        server_args: ServerArgs,
        *,
        kv: KVCacheManager,
        policy: SchedulePolicy,
        counters: SchedulerCounters,
        max_running_requests: int,
    ):
        self.server_args = server_args
        self.kv = kv
        self.policy = policy
        self.counters = counters
        self.max_running_requests = max_running_requests
        self.new_token_ratio = server_args.new_token_ratio
        self.waiting: list[Req] = []
        self.running = ScheduleBatch(ForwardMode.DECODE, [])
        self.chunked_req: Req | None = None

    def has_work(self) -> bool:
        return bool(self.waiting or self.running.reqs or self.chunked_req)

    def holding_kv(self) -> list[Req]:
        """The requests admitted and not released (for the integrity check)."""
        chunked = [self.chunked_req] if self.chunked_req else []
        return list(self.running.reqs) + chunked

    def num_running(self) -> int:
        return len(self.running.reqs) + (1 if self.chunked_req else 0)

    # ---- results ---------------------------------------------------------------------------

    def apply(self, result: StepResult, *, decoded: bool) -> None:
        """Requests that start decoding join the running batch; after a decode step the
        headroom ratio decays."""
        if result.to_decode is not None:
            self.running.merge(result.to_decode)
        if decoded:
            base = self.server_args.new_token_ratio
            self.new_token_ratio = max(base, self.new_token_ratio - RATIO_DECAY)

    def remove_finished(
        self, keep_waiting: Callable[[Req], bool], *, waiting_only: bool = False
    ) -> list[Req]:
        """Takes finished (aborted or failed) requests out of every queue (only the waiting
        one with `waiting_only`) and returns them; `keep_waiting(req)` decides for each
        waiting request (it may finish it first)."""
        removed = []
        still_waiting = []
        for req in self.waiting:
            (still_waiting if keep_waiting(req) else removed).append(req)
        self.waiting = still_waiting
        if waiting_only:
            return removed
        if self.chunked_req is not None and self.chunked_req.finished:
            removed.append(self.chunked_req)
            self.chunked_req = None
        keep = [i for i, req in enumerate(self.running.reqs) if not req.finished]
        if len(keep) < len(self.running.reqs):
            removed += [r for r in self.running.reqs if r.finished]
            self.running.filter(keep)
        return removed

    # ---- batches -------------------------------------------------------------------------

    def next_batch(self) -> ScheduleBatch | None:
        """An extend batch if one can be formed, else the running batch (room made for one
        more token each), else None."""
        batch = self.prefill_batch()
        if batch is not None:
            self.mix_decode_into(batch)
            return batch
        if not self.running.reqs:
            return None
        self.ensure_decode_slots()
        return self.running

    def mix_decode_into(self, batch: ScheduleBatch) -> None:
        """With enable_mixed_chunk, the running requests decode inside the extend forward."""
        if not self.server_args.enable_mixed_chunk or not self.running.reqs:
            return
        if batch.wants_all_logits:
            return  # per-token logits of the whole batch: keep prompt-logprob batches pure
        needed = sum(batch.new_token_counts()) + self.num_decode_tokens()
        if self.kv.available_size() >= needed:
            batch.mixed_decode_reqs = list(self.running.reqs)
            self.counters.mixed_steps += 1

    def num_decode_tokens(self) -> int:
        """Tokens the running batch's next forward computes (jump-forward runs included)."""
        return sum(r.num_uncommitted for r in self.running.reqs)

    def prefill_batch(self) -> ScheduleBatch | None:
        """The next extend batch (the chunked prefill in progress first, then waiting
        requests by policy)."""
        max_running = self.max_running_requests
        continuing = [self.chunked_req] if self.chunked_req else []  # it holds KV
        if not continuing and (not self.waiting or len(self.running.reqs) >= max_running):
            return None
        server_args = self.server_args
        adder = PrefillAdder(
            self.kv,
            running_reqs=self.running.reqs,
            new_token_ratio=self.new_token_ratio,
            max_prefill_tokens=server_args.max_prefill_tokens,
            chunked_prefill_size=server_args.effective_chunked_prefill_size,
        )
        now_s = time.monotonic()
        sharing = InBatchPrefixIndex(
            self.kv,
            min_tokens=server_args.in_batch_prefix_min_tokens,
            max_wait_s=server_args.schedule_max_wait_s,
            now_s=now_s,
        )
        adder.fill(
            continuing,
            lambda: self.policy.order([r for r in self.waiting if _is_ready(r)], now_s),
            sharing=sharing,
            max_running_requests=max_running,
        )
        if not adder.admitted:
            return None
        admitted_ids = {id(r) for r in adder.admitted}
        if self.chunked_req is None or id(self.chunked_req) in admitted_ids:
            self.chunked_req = adder.chunked_req
        self.waiting = [r for r in self.waiting if id(r) not in admitted_ids]
        counters = self.counters
        for req in adder.admitted:
            if not req.admitted_once:
                req.admitted_once = True
                req.cached_tokens = req.kv_committed_len
                counters.prompt_tokens += len(req.origin_input_ids)
                counters.cached_tokens += req.kv_committed_len
            counters.computed_prefill_tokens += req.extend_input_len
        return ScheduleBatch(ForwardMode.EXTEND, list(adder.admitted))

    def ensure_decode_slots(self) -> None:
        """Makes room for the running batch's next forward (one token per request, or a
        jump-forward's run): evict, then retract."""
        while self.kv.available_size() < self.num_decode_tokens():
            # Candidates: every other KV holder, and running requests but the last one (one
            # request alone always fits: longer ones are rejected up front, and a jump stays
            # within max_new_tokens).
            candidates = [self.chunked_req] if self.chunked_req else []
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
        else:
            rows = range(len(self.running.reqs))
            self.running.filter([i for i in rows if self.running.reqs[i] is not victim])
        self.kv.release(victim)  # its KV goes to the cache, evictable
        victim.set_status(ReqStatus.WAITING)
        if not victim.input_logprobs_done:  # a partial prompt-logprob pass restarts
            victim.input_token_logprobs.clear()
            victim.input_top_logprobs.clear()
        victim.num_retractions += 1
        self.waiting.insert(0, victim)
        self.counters.retractions += 1
        self.new_token_ratio = min(1.0, self.new_token_ratio + RATIO_BUMP_ON_RETRACT)
        logger.debug("retracted %s (%d tokens)", victim.rid, victim.seqlen)


def _is_ready(req: Req) -> bool:
    """Its sibling's prompt is cached (n > 1) and its constraint compiled."""
    gate = req.prefill_gate
    gate_open = gate is None or gate.prompt_published or gate.finished
    return gate_open and req.grammar_ready


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
            continuing: the chunked request in progress (none or one).
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
            if not self.kv.lora.can_admit(req):
                continue  # every LoRA slot is in use by other adapters' running requests
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


class InBatchPrefixIndex:
    """The uncached windows of the requests admitted to one extend batch.

    Args:
        kv: the KV manager (its radix cache tells how much of a candidate is cached).
        min_tokens: the shortest shared uncached prefix worth a deferral; 0 disables.
        max_wait_s: the aging bound; requests that waited longer are never deferred.
        now_s: the scheduling time of this batch.
    """

    def __init__(self, kv: KVCacheManager, *, min_tokens: int, max_wait_s: float, now_s: float):
        self.kv = kv
        self.min_tokens = min_tokens
        self.max_wait_s = max_wait_s
        self.now_s = now_s
        self.enabled = min_tokens > 0 and not kv.tree.disabled
        self._admitted: dict[tuple[str | None, int, tuple[int, ...]], list[Req]] = {}

    def _window(self, req: Req, start: int) -> tuple[str | None, int, tuple[int, ...]]:
        return req.cache_namespace, start, tuple(req.fill_slice(start, start + self.min_tokens))

    def add_admitted(self, req: Req) -> None:
        """Registers a request admitted to the batch (its `kv_committed_len` and
        `extend_input_len` are set): the tokens it computes will be cached after the batch."""
        if self.enabled and req.extend_input_len >= self.min_tokens:
            key = self._window(req, req.kv_committed_len)
            self._admitted.setdefault(key, []).append(req)

    def should_defer(self, req: Req) -> bool:
        """True when `req` (waiting, not admitted) would find at least `min_tokens` more
        tokens in the cache after this batch than now; counts the deferral on `req`."""
        if not self._admitted:
            return False
        if req.num_prefix_deferrals and req.wait_time_s(self.now_s) > self.max_wait_s:
            return False
        cached = self.kv.match_prefix(req)
        if cached + self.min_tokens > req.max_prefix_len:
            return False  # it could not reuse that many more tokens anyway
        prefix = req.fill_slice(0, cached)
        shares = any(
            other.fill_slice(0, cached) == prefix
            for other in self._admitted.get(self._window(req, cached), ())
        )
        if shares:
            req.num_prefix_deferrals += 1
        return shares
