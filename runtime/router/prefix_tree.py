"""`ApproximatePrefixTree`: what a replica probably has cached, from the prompts routed to it.

A radix tree over routing keys (prompt text as characters, or token ids as a tuple): the
router cannot see a replica's real radix cache, so it remembers the prompts it sent there,
as SGLang's router does. Bounded: past `max_elements` stored elements the oldest prompts are
forgotten (the replica's LRU cache forgets them too) and the tree is rebuilt from the rest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

# Keys are str (characters) or tuple[int, ...] (token ids); never compared with each other.
RoutingKey = Sequence


def common_prefix_len(a: RoutingKey, b: RoutingKey) -> int:
    limit = min(len(a), len(b))
    index = 0
    while index < limit and a[index] == b[index]:
        index += 1
    return index


class _Node:
    __slots__ = ("label", "children")

    def __init__(self, label: RoutingKey):
        self.label = label  # the edge from the parent
        self.children: dict[object, _Node] = {}  # first element of the child's label -> child


class ApproximatePrefixTree:
    """Routed prompts of one replica.

    Args:
        max_elements: characters / token ids remembered before the oldest prompts are dropped.
    """

    def __init__(self, max_elements: int = 1 << 20):
        if max_elements < 1:
            raise ValueError(f"max_elements must be >= 1, got {max_elements}")
        self.max_elements = max_elements
        self.root = _Node(())
        self.recent: deque[RoutingKey] = deque()  # inserted keys, oldest first
        self.num_elements = 0  # sum of the lengths of `recent`

    def match_len(self, key: RoutingKey) -> int:
        """Length of the longest prefix of `key` that some remembered prompt starts with."""
        node, matched = self.root, 0
        while matched < len(key):
            child = node.children.get(key[matched])
            if child is None:
                return matched
            common = common_prefix_len(child.label, key[matched:])
            matched += common
            if common < len(child.label):
                return matched
            node = child
        return matched

    def insert(self, key: RoutingKey) -> None:
        """Remembers `key`; forgets the oldest keys beyond `max_elements`."""
        if not key:
            return
        self._insert(key)
        self.recent.append(key)
        self.num_elements += len(key)
        if self.num_elements > self.max_elements:
            # Down to 3/4 of the bound, then one rebuild: amortised over many inserts.
            while self.recent and self.num_elements > self.max_elements * 3 // 4:
                self.num_elements -= len(self.recent.popleft())
            self.root = _Node(())
            for kept in self.recent:
                self._insert(kept)

    def _insert(self, key: RoutingKey) -> None:
        node, position = self.root, 0
        while position < len(key):
            child = node.children.get(key[position])
            if child is None:
                node.children[key[position]] = _Node(key[position:])
                return
            common = common_prefix_len(child.label, key[position:])
            if common < len(child.label):  # split the edge at the divergence
                middle = _Node(child.label[:common])
                child.label = child.label[common:]
                middle.children[child.label[0]] = child
                node.children[middle.label[0]] = middle
                child = middle
            node, position = child, position + common
