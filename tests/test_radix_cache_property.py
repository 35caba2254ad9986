"""Property tests: random request lifecycles against a plain dict reference of cached prefixes.

The reference maps (namespace, prefix tuple) -> KV slot of the prefix's last token, for every
cached prefix. After every step we check that:
- every slot is exactly one of free / held by the tree / held by a live request (none lost);
- the tree holds exactly the reference's prefixes with the same slots;
- locked prefixes (live requests, lock holders) are never evicted;
- a match equals the longest cached prefix in the reference.
"""

from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixgen.radix_cache import RadixCache, ReqToTokenPool, SlotAllocator, TreeNode

NUM_SLOTS = 48
MAX_RUNNING = 4
MAX_LEN = 12
NAMESPACES = (None, "tenant-a")

# A 3-token alphabet makes shared prefixes, splits and duplicates frequent.
token_lists = st.lists(st.integers(0, 2), min_size=0, max_size=MAX_LEN)
namespaces = st.sampled_from(NAMESPACES)

SETTINGS = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass
class LiveRequest:
    tokens: list[int]
    row: int
    namespace: object
    prefix_len: int  # req_to_token[row, :prefix_len] is tree-owned (when the cache is enabled)
    last_node: TreeNode


def tree_contents(cache: RadixCache) -> dict:
    """(namespace, prefix) -> slot for every prefix the tree holds (reads the tree directly)."""
    contents = {}
    for namespace, ns_root in cache._namespace_roots.items():
        stack = [(child, ()) for child in ns_root.children.values()]
        while stack:
            node, prefix = stack.pop()
            for token, slot in zip(node.key, node.slots.tolist(), strict=True):
                prefix = prefix + (token,)
                contents[(namespace, prefix)] = slot
            stack.extend((child, prefix) for child in node.children.values())
    return contents


class RadixCacheMachine(RuleBasedStateMachine):
    DISABLED = False

    def __init__(self):
        super().__init__()
        self.allocator = SlotAllocator(NUM_SLOTS)
        self.cache = RadixCache(self.allocator, disabled=self.DISABLED)
        self.pool = ReqToTokenPool(MAX_RUNNING, MAX_LEN)
        self.reference: dict = {}
        self.requests: list[LiveRequest] = []
        self.lock_holders: list[tuple[TreeNode, list[int], list[int], object]] = []

    # ---- reference model -----------------------------------------------------------------

    def reference_match(self, tokens, namespace) -> list[int]:
        slots = []
        for end in range(1, len(tokens) + 1):
            slot = self.reference.get((namespace, tuple(tokens[:end])))
            if slot is None:
                break
            slots.append(slot)
        return slots

    def reference_insert(self, tokens, slots: list[int], namespace) -> int:
        num_cached = len(self.reference_match(tokens, namespace))
        if self.DISABLED:
            return len(tokens)
        for end in range(num_cached + 1, len(tokens) + 1):
            self.reference[(namespace, tuple(tokens[:end]))] = slots[end - 1]
        return num_cached

    def row_slots(self, request: LiveRequest, length: int) -> torch.Tensor:
        return self.pool.req_to_token[request.row, :length]

    def alloc_with_eviction(self, num_tokens: int) -> torch.Tensor | None:
        shortfall = num_tokens - self.allocator.available_size()
        if shortfall > 0:
            self.evict(shortfall)
        return self.allocator.alloc(num_tokens)

    # ---- rules -----------------------------------------------------------------------------

    @rule(tokens=token_lists, namespace=namespaces)
    def match(self, tokens, namespace):
        result = self.cache.match_prefix(tokens, namespace=namespace)
        assert result.slots.tolist() == self.reference_match(tokens, namespace)

    @rule(tokens=token_lists, namespace=namespaces)
    def insert(self, tokens, namespace):
        slots = self.alloc_with_eviction(len(tokens))
        if slots is None:
            return
        expected = self.reference_insert(tokens, slots.tolist(), namespace)
        num_cached = self.cache.insert(tokens, slots, namespace=namespace)
        assert num_cached == expected
        self.allocator.free(slots[:num_cached])

    @rule(tokens=token_lists, namespace=namespaces)
    def lock(self, tokens, namespace):
        result = self.cache.match_prefix(tokens, namespace=namespace)
        self.cache.inc_lock_ref(result.last_node)
        locked_tokens = tokens[: result.prefix_len]
        self.lock_holders.append(
            (result.last_node, locked_tokens, result.slots.tolist(), namespace)
        )

    @precondition(lambda self: self.lock_holders)
    @rule(index=st.integers(0, 100))
    def unlock(self, index):
        node, _, _, _ = self.lock_holders.pop(index % len(self.lock_holders))
        self.cache.dec_lock_ref(node)

    @rule(num_tokens=st.integers(0, NUM_SLOTS))
    def evict(self, num_tokens):
        evictable = self.cache.evictable_size()
        before = tree_contents(self.cache)
        num_freed = self.cache.evict(num_tokens)
        assert num_freed >= min(num_tokens, evictable)
        assert num_freed <= evictable
        after = tree_contents(self.cache)
        assert after.items() <= before.items()
        assert len(before) - len(after) == num_freed
        self.reference = after

    @precondition(lambda self: len(self.requests) < MAX_RUNNING)
    @rule(tokens=token_lists.filter(lambda t: len(t) > 0), namespace=namespaces)
    def admit(self, tokens, namespace):
        """Match all but the last token, lock, allocate the rest, fill a req_to_token row."""
        match = self.cache.match_prefix(tokens[:-1], namespace=namespace)
        assert match.slots.tolist() == self.reference_match(tokens[:-1], namespace)
        self.cache.inc_lock_ref(match.last_node)
        new_slots = self.alloc_with_eviction(len(tokens) - match.prefix_len)
        if new_slots is None:
            self.cache.dec_lock_ref(match.last_node)
            return
        row = self.pool.alloc(1)[0]
        self.pool.req_to_token[row, : match.prefix_len] = match.slots.to(torch.int32)
        self.pool.req_to_token[row, match.prefix_len : len(tokens)] = new_slots.to(torch.int32)
        self.requests.append(LiveRequest(tokens, row, namespace, match.prefix_len, match.last_node))

    @precondition(lambda self: self.requests)
    @rule(index=st.integers(0, 100), data=st.data())
    def cache_chunk(self, index, data):
        request = self.requests[index % len(self.requests)]
        length = data.draw(st.integers(request.prefix_len, len(request.tokens)))
        chunk_slots = self.row_slots(request, length)
        self.reference_insert(request.tokens[:length], chunk_slots.tolist(), request.namespace)
        result = self.cache.cache_unfinished_req(
            token_ids=request.tokens[:length],
            slots=chunk_slots,
            prefix_len=request.prefix_len,
            last_node=request.last_node,
            namespace=request.namespace,
        )
        assert result.prefix_len == length
        self.pool.req_to_token[request.row, :length] = result.slots.to(torch.int32)
        request.prefix_len, request.last_node = result.prefix_len, result.last_node

    @precondition(lambda self: self.requests)
    @rule(index=st.integers(0, 100), data=st.data())
    def finish(self, index, data):
        """Finish (or abort after `length` tokens): the tree takes what it can, we free the rest."""
        request = self.requests.pop(index % len(self.requests))
        length = data.draw(st.integers(request.prefix_len, len(request.tokens)))
        slots = self.row_slots(request, len(request.tokens)).clone()
        self.reference_insert(request.tokens[:length], slots[:length].tolist(), request.namespace)
        self.cache.cache_finished_req(
            token_ids=request.tokens[:length],
            slots=slots[:length],
            prefix_len=request.prefix_len,
            last_node=request.last_node,
            namespace=request.namespace,
        )
        self.allocator.free(slots[length:])  # computed-but-uncached tail stays the caller's
        self.pool.free(request.row)

    # ---- invariants --------------------------------------------------------------------------

    @invariant()
    def every_slot_has_exactly_one_owner(self):
        owned = [self.allocator.free_slot_indices(), self.cache.tree_slots()]
        for request in self.requests:
            own_from = 0 if self.DISABLED else request.prefix_len
            owned.append(self.row_slots(request, len(request.tokens))[own_from:].long())
        everything = torch.cat(owned).sort().values
        assert torch.equal(everything, torch.arange(1, NUM_SLOTS)), "slot lost or owned twice"

    @invariant()
    def tree_equals_reference(self):
        assert tree_contents(self.cache) == self.reference
        self.cache.check_invariants()

    @invariant()
    def locked_prefixes_survive_and_are_counted(self):
        if self.DISABLED:
            assert self.cache.total_size() == 0
            return
        locked = [
            (
                request.namespace,
                request.tokens[: request.prefix_len],
                self.row_slots(request, request.prefix_len).tolist(),
            )
            for request in self.requests
        ]
        locked += [(namespace, tokens, slots) for _, tokens, slots, namespace in self.lock_holders]
        protected_prefixes = set()
        for namespace, tokens, slots in locked:
            assert self.reference_match(tokens, namespace) == slots
            protected_prefixes.update(
                (namespace, tuple(tokens[:end])) for end in range(1, len(tokens) + 1)
            )
        assert self.cache.protected_size() == len(protected_prefixes)


class DisabledRadixCacheMachine(RadixCacheMachine):
    DISABLED = True


TestRadixCacheProperties = RadixCacheMachine.TestCase
TestRadixCacheProperties.settings = SETTINGS
TestDisabledRadixCacheProperties = DisabledRadixCacheMachine.TestCase
TestDisabledRadixCacheProperties.settings = SETTINGS
