"""`SchedulePolicy`: the order in which waiting requests are offered for admission.

- `lpm` (longest prefix match): requests with the most cached tokens first, so hot prefixes
  are used before they are evicted.
- `dfs-weight`: walk the radix tree depth-first, heaviest subtree (most waiting requests)
  first, so requests sharing a prefix run together.
- `fcfs`: arrival order.

Aging bound: LPM and DFS can starve a request whose prefix is cold while hot ones keep
arriving. Any request that has waited longer than `schedule_max_wait_s` goes first, oldest
first, whatever the policy.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.req import Req

# Past this queue length, prefix-aware ordering (one tree walk per request per step) costs
# more than it saves; fall back to arrival order.
MAX_QUEUE_FOR_PREFIX_POLICY = 128


class SchedulePolicy:
    def __init__(self, policy: str, max_wait_s: float, kv: KVCacheManager):
        self.policy = policy
        self.max_wait_s = max_wait_s
        self.kv = kv

    def order(self, waiting: list[Req], now_s: float) -> list[Req]:
        """Returns `waiting` in admission order (the list itself is not modified)."""
        overdue = [r for r in waiting if r.wait_time_s(now_s) > self.max_wait_s]
        rest = [r for r in waiting if r.wait_time_s(now_s) <= self.max_wait_s]
        overdue.sort(key=lambda r: r.arrival_time_s)
        if (
            self.policy == "fcfs"
            or len(rest) > MAX_QUEUE_FOR_PREFIX_POLICY
            or self.kv.tree.disabled
        ):
            return overdue + rest
        if self.policy == "lpm":
            prefix_lens = {id(r): self.kv.match_prefix(r) for r in rest}
            # sort is stable: equal prefixes keep arrival order.
            rest.sort(key=lambda r: -prefix_lens[id(r)])
            return overdue + rest
        return overdue + self._dfs_weight_order(rest)

    def _dfs_weight_order(self, reqs: list[Req]) -> list[Req]:
        reqs_at_node: dict[int, list[Req]] = defaultdict(list)
        weight: dict[int, int] = defaultdict(int)
        children: dict[int, list[Any]] = defaultdict(list)
        tops: list[Any] = []
        for req in reqs:
            node = self.kv.match_node(req).last_node
            reqs_at_node[id(node)].append(req)
            # Walk to the root, counting this request in every ancestor's subtree weight.
            while True:
                first_visit = weight[id(node)] == 0
                weight[id(node)] += 1
                parent = node.parent
                if parent is None:
                    if first_visit:
                        tops.append(node)
                    break
                if first_visit:
                    children[id(parent)].append(node)
                node = parent
        ordered: list[Req] = []
        stack = sorted(tops, key=lambda n: weight[id(n)])
        while stack:
            node = stack.pop()
            ordered.extend(reqs_at_node[id(node)])
            # Heaviest child popped first.
            stack.extend(sorted(children[id(node)], key=lambda n: weight[id(n)]))
        return ordered
