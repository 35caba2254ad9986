"""`KVCacheManager`: the scheduler's one owner of KV memory.

It ties together the request-to-token rows, the slot allocator and the radix cache, and
keeps the ownership rule of `radix_cache.py`: every slot is free, held by the tree, or
held by exactly one running request (`req_to_token[row, prefix_len:kv_committed_len]`).
Every tree operation uses the request's `cache_namespace` (its cache salt), so requests
share cached prefixes only within one namespace.
"""

from __future__ import annotations

import torch

from radixgen.radix_cache.memory_pool import ReqToTokenPool, SlotAllocator
from radixgen.radix_cache.radix_cache import RadixCache
from radixgen.radix_cache.radix_node import MatchResult
from radixgen.runtime.lora.slots import LoRASlots
from radixgen.runtime.req import Req


class KVCacheManager:
    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        slot_allocator: SlotAllocator,
        tree: RadixCache,
        *,
        lora: LoRASlots | None = None,
    ):
        self.req_to_token_pool = req_to_token_pool
        self.slot_allocator = slot_allocator
        self.tree = tree
        # Adapter slots live as long as the rows (acquired in admit, released in release).
        self.lora = lora or LoRASlots(None)

    # ---- sizes -------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self.slot_allocator.capacity

    def free_size(self) -> int:
        return self.slot_allocator.available_size()

    def available_size(self) -> int:
        """Slots obtainable now: free ones plus evictable cached ones."""
        return self.slot_allocator.available_size() + self.tree.evictable_size()

    def free_rows(self) -> int:
        return self.req_to_token_pool.available_size()

    # ---- admission -----------------------------------------------------------------------

    def match_prefix(self, req: Req) -> int:
        """Length of req's cached prefix, without claiming it (for scheduling policies)."""
        return self.match_node(req).prefix_len

    def match_node(self, req: Req) -> MatchResult:
        """req's cached prefix (a `MatchResult`), in its namespace, not counted in stats."""
        key = req.fill_slice(0, req.max_prefix_len)
        return self.tree.match_prefix(key, req.cache_namespace, count_in_stats=False)

    def admit(self, req: Req) -> bool:
        """Give `req` a row, its cached prefix (locked) and its LoRA adapter's slot. False if
        no row (or adapter slot) is free."""
        if not self.lora.acquire(req):
            return False
        rows = self.req_to_token_pool.alloc(1)
        if rows is None:
            self.lora.release(req)
            return False
        key = req.fill_slice(0, req.max_prefix_len)
        match = self.tree.match_prefix(key, req.cache_namespace)
        self.tree.inc_lock_ref(match.last_node)
        req.req_pool_idx = rows[0]
        req.prefix_indices = match.slots
        req.last_node = match.last_node
        req.kv_committed_len = match.prefix_len
        if match.prefix_len:
            self.req_to_token_pool.req_to_token[req.req_pool_idx, : match.prefix_len] = (
                match.slots.to(torch.int32)
            )
        return True

    def alloc_slots(self, num_tokens: int) -> torch.Tensor | None:
        """`num_tokens` free slots, evicting cached prefixes if needed; None if impossible."""
        shortage = num_tokens - self.slot_allocator.available_size()
        if shortage > 0:
            self.tree.evict(shortage)
        return self.slot_allocator.alloc(num_tokens)

    # ---- caching and release -------------------------------------------------------------

    def _committed(self, req: Req) -> tuple[list[int], torch.Tensor]:
        token_ids = req.fill_slice(0, req.kv_committed_len)
        slots = self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_committed_len]
        return token_ids, slots

    def cache_unfinished(self, req: Req) -> None:
        """Hand req's computed KV to the tree (it stays locked for req)."""
        if self.tree.disabled:
            return  # nothing is shared; the KV stays req's own
        token_ids, slots = self._committed(req)
        result = self.tree.cache_unfinished_req(
            token_ids=token_ids,
            slots=slots,
            prefix_len=len(req.prefix_indices),
            last_node=req.last_node,
            namespace=req.cache_namespace,
        )
        # Some of req's slots may have been duplicates, replaced by the tree's own.
        self.req_to_token_pool.req_to_token[req.req_pool_idx, : result.prefix_len] = (
            result.slots.to(torch.int32)
        )
        req.prefix_indices = result.slots
        req.last_node = result.last_node

    def release(self, req: Req) -> None:
        """Req leaves the running set (finished, aborted or retracted): its KV goes to the
        tree (so a next turn or a resumed retraction can hit it), its row is freed."""
        if req.req_pool_idx is None:
            return
        token_ids, slots = self._committed(req)
        self.tree.cache_finished_req(
            token_ids=token_ids,
            slots=slots.to(torch.int64),
            prefix_len=len(req.prefix_indices),
            last_node=req.last_node,
            namespace=req.cache_namespace,
        )
        self.req_to_token_pool.free(req.req_pool_idx)
        self.lora.release(req)
        req.req_pool_idx = None
        req.prefix_indices = None
        req.last_node = None
        req.kv_committed_len = 0

    def free_pending_slot(self, req: Req) -> None:
        """Frees the slot of position `kv_committed_len` of req: written by an overlapped
        decode step launched before req finished, and never committed (a wasted row)."""
        row_slots = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        self.slot_allocator.free(row_slots[req.kv_committed_len : req.kv_committed_len + 1])

    def uncommitted_slots(self, req: Req, end: int) -> torch.Tensor:
        """A copy of the slots of req's positions `[kv_committed_len, end)` ([n] int64):
        written by a speculative verify forward for drafts not (yet) accepted."""
        row_slots = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        return row_slots[req.kv_committed_len : max(end, req.kv_committed_len)].to(torch.int64)

    def free_slots(self, slots: torch.Tensor) -> None:
        """Frees slots that no request or cache entry holds (`uncommitted_slots`)."""
        if slots.numel():
            self.slot_allocator.free(slots)

    def free_uncommitted_slots(self, req: Req, end: int) -> None:
        """Frees the slots of req's positions `[kv_committed_len, end)` (rejected drafts)."""
        self.free_slots(self.uncommitted_slots(req, end))

    def flush(self) -> None:
        """Drop every cached prefix (no request may be running)."""
        self.tree.reset()

    # ---- integrity -----------------------------------------------------------------------

    def check_integrity(self, running_reqs: list[Req]) -> None:
        """free + cached + held by requests == capacity, and no slot is counted twice.

        Raises:
            AssertionError: describing the leak or double ownership.
        """
        self.tree.check_invariants()
        owned = [
            self.req_to_token_pool.req_to_token[
                r.req_pool_idx, len(r.prefix_indices) : r.kv_committed_len
            ]
            for r in running_reqs
            if r.req_pool_idx is not None
        ]
        num_owned = sum(int(t.numel()) for t in owned)
        free = self.slot_allocator.available_size()
        cached = self.tree.total_size()
        assert free + cached + num_owned == self.capacity, (
            f"KV leak: free {free} + cached {cached} + in use {num_owned} != total {self.capacity}"
        )
        rows_in_use = sum(1 for r in running_reqs if r.req_pool_idx is not None)
        assert (
            self.req_to_token_pool.available_size() + rows_in_use == self.req_to_token_pool.size
        ), "req_to_token row leak"
        if not running_reqs:
            # Idle: every slot is exactly once in the free list or the tree.
            all_slots = torch.cat([self.slot_allocator.free_slot_indices(), self.tree.tree_slots()])
            assert int(torch.unique(all_slots).numel()) == self.capacity, "a slot is owned twice"
