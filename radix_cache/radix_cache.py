"""`RadixCache`: a radix tree over token ids whose nodes own KV slot indices.

Requests that share a prefix (a system prompt, an earlier chat turn, a fork of a prompt
program) reuse its KV by copying slot indices: any prefix length is reusable, down to one
token. Each edge holds a run of token ids (a tuple) and the KV slots of those tokens (an
int64 tensor slice on the KV device).

Ownership (the whole point; see docs/radix_cache.md):
- every allocated slot is owned by exactly one of: the tree, or one running request;
- a running request's row `req_to_token[row, :prefix_len]` holds tree-owned slots that the
  request keeps alive with `inc_lock_ref(last_node)`; the rest of its row is its own;
- `insert` hands slots to the tree; the ones the tree already had (the returned count) stay
  with the caller, who frees them;
- `evict` frees only unlocked tree slots, least recently used leaves first.

Namespaces (tenant, LoRA adapter, cache salt) get separate subtrees under the root, so two
requests share KV only when their namespaces are equal.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Sequence

import torch

from radixgen.radix_cache.memory_pool import SlotAllocator
from radixgen.radix_cache.radix_node import (
    CacheStats,
    MatchResult,
    TreeNode,
    abbreviate,
    as_key,
    check_namespace,
    check_node,
    check_req_args,
    check_slots,
    common_prefix_len,
    concat_slots,
)


class RadixCache:
    """Prefix cache over token ids at token granularity, with LRU eviction and locking.

    Args:
        slot_allocator: where evicted slots go back to (and whose device the slots live on).
        disabled: share nothing, with the same interface, for A/B runs: `match_prefix`
            always returns an empty prefix, the tree stays empty, and every slot stays owned
            by its request until `cache_finished_req` frees it.

    Not thread-safe: the scheduler owns it.
    """

    def __init__(self, slot_allocator: SlotAllocator, *, disabled: bool = False):
        if not isinstance(slot_allocator, SlotAllocator):
            raise TypeError(
                f"slot_allocator must be a SlotAllocator, got {type(slot_allocator).__name__}"
            )
        self.slot_allocator = slot_allocator
        self.device = slot_allocator.device
        self.disabled = disabled
        self._node_ids = itertools.count()
        self._empty_slots = torch.empty(0, dtype=torch.int64, device=self.device)
        self._init_tree()
        self.stats = CacheStats()

    def _init_tree(self) -> None:
        self._num_nodes = 0
        self.root = self._new_node(key=(), slots=self._empty_slots, parent=None)
        self._namespace_roots: dict[Hashable, TreeNode] = {}
        self._evictable_tokens = 0
        self._protected_tokens = 0
        self._clock = 0
        # Lazy LRU heap of (last_access, node_id, node) over the evictable leaves. An entry is
        # pushed whenever a node becomes an evictable leaf or gets a new last_access while
        # being one; entries that no longer describe their node are skipped when popped. So
        # every evictable leaf has a live entry and `evict` never scans the tree.
        self._leaf_heap: list[tuple[int, int, TreeNode]] = []

    def _new_node(self, **fields) -> TreeNode:
        self._num_nodes += 1
        return TreeNode(node_id=next(self._node_ids), **fields)

    @staticmethod
    def _is_evictable_leaf(node: TreeNode) -> bool:
        return (
            not node.children and node.lock_ref == 0 and node.parent is not None and bool(node.key)
        )

    def _push_if_evictable_leaf(self, node: TreeNode) -> None:
        if not self._is_evictable_leaf(node):
            return
        heapq.heappush(self._leaf_heap, (node.last_access, node.node_id, node))
        if len(self._leaf_heap) > 2 * self._num_nodes + 64:
            # Mostly stale entries (every match of a cached leaf pushes one): rebuild.
            self._leaf_heap = [
                (leaf.last_access, leaf.node_id, leaf) for leaf in self._evictable_leaves()
            ]
            heapq.heapify(self._leaf_heap)

    # ---- sizes -------------------------------------------------------------------------

    def evictable_size(self) -> int:
        """Tokens held by the tree on no running request's path (can be evicted)."""
        return self._evictable_tokens

    def protected_size(self) -> int:
        """Tokens held by the tree and locked by running requests."""
        return self._protected_tokens

    def total_size(self) -> int:
        """All tokens (= slots) the tree holds."""
        return self._evictable_tokens + self._protected_tokens

    # ---- lookup and insert -------------------------------------------------------------

    def match_prefix(
        self, key: Sequence[int], namespace: Hashable = None, *, count_in_stats: bool = True
    ) -> MatchResult:
        """Longest cached prefix of `key` in `namespace`.

        When the prefix ends inside an edge, the edge is split there so that `last_node`
        covers exactly the matched tokens (and locking it protects exactly them). Marks the
        path as recently used. The engine should match at most `len(prompt) - 1` tokens so
        that at least one token is computed to produce logits. Scheduling-policy probes pass
        `count_in_stats=False` so that `stats.hit_rate` counts admissions only.

        Returns:
            MatchResult(slots [prefix_len] int64, last_node). The slots stay owned by the
            tree: lock `last_node` before the next `evict` if the request will use them.
        """
        key = as_key(key)
        check_namespace(namespace)
        if self.disabled:
            result = MatchResult(self._empty_slots, self.root)
        else:
            result = self._match(key, namespace)
        if count_in_stats:
            self.stats.num_lookups += 1
            self.stats.num_lookup_tokens += len(key)
            self.stats.num_matched_tokens += result.prefix_len
        return result

    def _match(self, key: tuple[int, ...], namespace: Hashable) -> MatchResult:
        ns_root = self._namespace_roots.get(namespace)
        if ns_root is None:
            return MatchResult(self._empty_slots, self.root)
        _, node, pieces = self._walk(ns_root, key)
        return MatchResult(concat_slots(pieces, self._empty_slots), node)

    def _walk(
        self, node: TreeNode, key: tuple[int, ...]
    ) -> tuple[int, TreeNode, list[torch.Tensor]]:
        """Follow `key` down from `node`, splitting the edge where the match ends inside it.

        Marks the path as used now. Returns (matched tokens, last node, slot tensors of the
        path), the slots not yet concatenated so that callers pay for one cat at most.
        """
        self._clock += 1
        now = self._clock
        node.last_access = now
        pieces: list[torch.Tensor] = []
        pos = 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            edge = child.key
            if key[pos : pos + len(edge)] == edge:
                pos += len(edge)
            else:
                # The first token matched (children are keyed by it): 1 <= matched < len(edge).
                matched = common_prefix_len(edge, key, pos)
                child = self._split(child, matched)
                pos += matched
            child.last_access = now
            pieces.append(child.slots)
            node = child
        # Only the last node of the path can be a leaf; its LRU entry moves to `now`.
        self._push_if_evictable_leaf(node)
        return pos, node, pieces

    def _split(self, child: TreeNode, num_tokens: int) -> TreeNode:
        """Cut `child`'s edge after `num_tokens`; returns the new upper node."""
        parent = child.parent
        upper = self._new_node(
            key=child.key[:num_tokens],
            slots=child.slots[:num_tokens],
            parent=parent,
            # Every request locking `child` passes through the upper half too; sizes are
            # unchanged because both halves keep the same lock state.
            lock_ref=child.lock_ref,
            last_access=child.last_access,
        )
        child.key = child.key[num_tokens:]
        child.slots = child.slots[num_tokens:]
        child.parent = upper
        upper.children[child.key[0]] = child
        parent.children[upper.key[0]] = upper
        return upper

    def insert(self, key: Sequence[int], slots: torch.Tensor, namespace: Hashable = None) -> int:
        """Hand the KV slots of `key` to the tree.

        Args:
            key: token ids.
            slots: [len(key)] integer tensor, the KV slot of each token (copied; a view of
                req_to_token is fine).
            namespace: entries are shared only within equal namespaces.
        Returns:
            How many leading tokens were already cached. The tree keeps `slots[n:]`;
            `slots[:n]` stay with the caller, who frees those that are its own duplicates.
            In disabled mode the tree keeps nothing and this returns `len(key)`, so the same
            caller code frees every slot.
        Raises:
            ValueError/TypeError: `slots` is not a 1-D integer tensor of `len(key)` entries.
        """
        key = as_key(key)
        check_slots(slots, len(key))
        check_namespace(namespace)
        if self.disabled:
            return len(key)
        num_cached, _, _ = self._insert(key, slots, namespace, min_cached=0)
        return num_cached

    def _insert(
        self, key: tuple[int, ...], slots: torch.Tensor, namespace: Hashable, *, min_cached: int
    ) -> tuple[int, TreeNode, list[torch.Tensor]]:
        """Insert; returns (tokens already cached, the last node of `key`'s path, the path's
        slot tensors). The pieces are not concatenated here: a finished request's insert
        (one per request finishing, 1,024 in one step of generated-shared-prefix) has no use
        for its path's slots, and each concatenation is a device copy."""
        ns_root = self._namespace_roots.get(namespace)
        if ns_root is None:
            if not key:
                return 0, self.root, []
            ns_root = self._new_node(
                key=(), slots=self._empty_slots, parent=self.root, namespace=namespace
            )
            self._namespace_roots[namespace] = ns_root
        pos, node, pieces = self._walk(ns_root, key)
        if pos < min_cached:
            # The caller claims the tree owns slots[:min_cached] (its locked prefix), but the
            # tree does not have them: keeping them would make two owners of one slot.
            raise ValueError(
                f"prefix_len={min_cached} but only {pos} tokens of token_ids are cached in "
                f"namespace {namespace!r}: wrong namespace, token_ids or an unlocked prefix"
            )
        if pos < len(key):
            leaf = self._new_node(
                key=key[pos:],
                # Own copy: the caller's tensor is typically a view of a req_to_token row.
                slots=slots[pos:].to(device=self.device, dtype=torch.int64, copy=True),
                parent=node,
                last_access=self._clock,
            )
            node.children[leaf.key[0]] = leaf
            self._evictable_tokens += len(leaf.key)
            self.stats.num_inserted_tokens += len(leaf.key)
            pieces.append(leaf.slots)
            node = leaf
            self._push_if_evictable_leaf(leaf)
        return pos, node, pieces

    # ---- locking -----------------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect the path from `node` to the root against eviction (one more user)."""
        check_node(node)
        if node.parent is None and node.key:
            raise ValueError("node was evicted; lock the last_node right after match_prefix")
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable_tokens -= len(node.key)
                self._protected_tokens += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one `inc_lock_ref(node)`; the path becomes evictable when no user is left.

        Raises:
            ValueError: `node` is not locked.
        """
        check_node(node)
        # Ancestors carry at least the lock count of their descendants, so checking the
        # start node is enough to leave the counts untouched on a bad call.
        if node.parent is not None and node.lock_ref <= 0:
            raise ValueError(f"node {node.node_id} is not locked (dec_lock_ref without inc)")
        start = node
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable_tokens += len(node.key)
                self._protected_tokens -= len(node.key)
            node = node.parent
        # Nodes above the start node have children, so only it can become an evictable leaf.
        self._push_if_evictable_leaf(start)

    # ---- eviction ----------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` tree slots (fewer if not enough are evictable).

        Unlocked leaves go first, least recently used first; a parent whose last child is
        gone becomes a leaf candidate itself. Freed slots go back to the SlotAllocator.

        Returns:
            The number of tokens (slots) freed.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if num_tokens == 0 or self._evictable_tokens == 0:
            return 0
        heap = self._leaf_heap
        freed: list[torch.Tensor] = []
        num_freed = 0
        while num_freed < num_tokens and heap:
            last_access, _, leaf = heapq.heappop(heap)
            if last_access != leaf.last_access or not self._is_evictable_leaf(leaf):
                continue  # stale entry: the node was used, locked, grew a child or is gone
            freed.append(leaf.slots)
            num_freed += len(leaf.key)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            leaf.parent = None
            leaf.slots = self._empty_slots
            self._num_nodes -= 1
            if parent.children or parent.lock_ref > 0:
                continue
            if parent.key:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
            elif parent is not self.root:
                # An empty namespace subtree: drop it so unbounded cache salts cost nothing.
                del self._namespace_roots[parent.namespace]
                parent.parent = None
                self._num_nodes -= 1
        self._evictable_tokens -= num_freed
        self.stats.num_evicted_tokens += num_freed
        if freed:
            self.slot_allocator.free(torch.cat(freed))
        return num_freed

    def _evictable_leaves(self) -> list[TreeNode]:
        leaves = []
        stack = list(self._namespace_roots.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.lock_ref == 0 and node.key:
                leaves.append(node)
        return leaves

    # ---- request lifecycle (what the scheduler calls) ----------------------------------

    def cache_finished_req(
        self,
        *,
        token_ids: Sequence[int],
        slots: torch.Tensor,
        prefix_len: int,
        last_node: TreeNode,
        namespace: Hashable = None,
    ) -> None:
        """A request finished (or was aborted): give its KV to the tree and unlock its prefix.

        Args:
            token_ids: the request's tokens that have KV (prompt + generated, without a
                last sampled token that was never run through the model).
            slots: [len(token_ids)] its KV slots, i.e. `req_to_token[row, :len(token_ids)]`.
            prefix_len: how many leading slots are tree-owned (the request's last
                `MatchResult.prefix_len`); `slots[prefix_len:]` are the request's own.
            last_node: the node the request locked (its last `MatchResult.last_node`).
            namespace: the namespace it matched in.
        After the call the request owns no slot; the caller frees its req_to_token row.
        """
        token_ids = check_req_args(token_ids, slots, prefix_len, namespace)
        if self.disabled:
            self.slot_allocator.free(slots)
            return
        num_cached, _, _ = self._insert(token_ids, slots, namespace, min_cached=prefix_len)
        # slots[prefix_len:num_cached] are the request's copies of tokens that another
        # request cached meanwhile; the tree keeps its own, so these are freed here, once.
        self.slot_allocator.free(slots[prefix_len:num_cached])
        self.dec_lock_ref(last_node)

    def cache_unfinished_req(
        self,
        *,
        token_ids: Sequence[int],
        slots: torch.Tensor,
        prefix_len: int,
        last_node: TreeNode,
        namespace: Hashable = None,
    ) -> MatchResult:
        """A running request (a chunk of a chunked prefill) shares its KV computed so far.

        Args: as `cache_finished_req`.
        Returns:
            The request's new cached prefix: it now covers all of `token_ids`. The caller
            writes `result.slots` into `req_to_token[row, :result.prefix_len]` (some
            duplicates were freed and replaced by the tree's slots) and remembers
            `result.prefix_len` and `result.last_node` (now locked; the old one is
            unlocked). In disabled mode the slots are returned unchanged and stay the
            request's own; `last_node` is the root.
        """
        token_ids = check_req_args(token_ids, slots, prefix_len, namespace)
        if self.disabled:
            return MatchResult(slots.to(dtype=torch.int64), self.root)
        num_cached, node, pieces = self._insert(token_ids, slots, namespace, min_cached=prefix_len)
        result = MatchResult(concat_slots(pieces, self._empty_slots), node)
        self.slot_allocator.free(slots[prefix_len:num_cached])
        # Lock the new path before unlocking the old one: they overlap, and the shared part
        # must never look evictable in between.
        self.inc_lock_ref(result.last_node)
        self.dec_lock_ref(last_node)
        return result

    # ---- maintenance and debugging -----------------------------------------------------

    def reset(self) -> None:
        """Empty the tree, free every slot it holds, and zero the stats.

        Raises:
            RuntimeError: a running request still locks part of the tree.
        """
        if self._protected_tokens or any(r.lock_ref for r in self._namespace_roots.values()):
            raise RuntimeError("reset() while requests still lock cached prefixes")
        held = self.tree_slots()
        if held.numel():
            self.slot_allocator.free(held)
        self._init_tree()
        self.stats = CacheStats()

    def tree_slots(self) -> torch.Tensor:
        """All slots the tree holds, [total_size()] int64 (for integrity checks)."""
        pieces = [node.slots for node in self._all_nodes() if node.key]
        return torch.cat(pieces) if pieces else self._empty_slots

    def _all_nodes(self) -> list[TreeNode]:
        nodes = []
        stack = list(self._namespace_roots.values())
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        return nodes

    def check_invariants(self) -> None:
        """Recount the tree and compare with the incremental counters.

        Raises:
            AssertionError: with what differs. Cheap enough for an idle scheduler.
        """
        evictable = protected = 0
        nodes = self._all_nodes()
        for node in nodes:
            assert len(node.key) == node.slots.numel(), f"{node}: key/slots lengths differ"
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            for first, child in node.children.items():
                assert child.parent is node and child.key[0] == first, f"{child}: bad link"
                assert child.lock_ref <= node.lock_ref or node.parent is None, f"{child}: lock"
        assert evictable == self._evictable_tokens, (evictable, self._evictable_tokens)
        assert protected == self._protected_tokens, (protected, self._protected_tokens)
        assert len(nodes) + 1 == self._num_nodes, (len(nodes) + 1, self._num_nodes)
        live_entries = {
            id(node) for last_access, _, node in self._leaf_heap if last_access == node.last_access
        }
        for leaf in self._evictable_leaves():
            assert id(leaf) in live_entries, f"{leaf}: evictable leaf missing from the LRU heap"

    def pretty_print(self, max_tokens: int = 8) -> str:
        """The tree as indented text, one edge per line (syncs slots to the host)."""
        lines = [
            f"RadixCache(evictable={self.evictable_size()}, protected={self.protected_size()})"
        ]
        for namespace, ns_root in self._namespace_roots.items():
            lines.append(f"  namespace={namespace!r} lock_ref={ns_root.lock_ref}")
            stack = [(child, 2) for child in reversed(ns_root.children.values())]
            while stack:
                node, depth = stack.pop()
                lines.append(
                    "  " * depth + f"#{node.node_id} len={len(node.key)} lock_ref={node.lock_ref} "
                    f"t={node.last_access} tokens={abbreviate(node.key, max_tokens)} "
                    f"slots={abbreviate(node.slots.tolist(), max_tokens)}"
                )
                stack.extend((child, depth + 1) for child in reversed(node.children.values()))
        return "\n".join(lines)
