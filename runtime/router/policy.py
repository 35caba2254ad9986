"""Which replica serves a request: cache-aware (longest remembered prefix) or round robin.

Cache-aware, as SGLang's router does it:
1. If load is imbalanced (the busiest replica has more than `balance_abs_threshold` requests
   in flight beyond the idlest, and more than `balance_rel_threshold` times as many), the
   least loaded replica gets it: a hot prefix must not pin all traffic to one replica.
2. Otherwise the replica whose remembered prompts share the longest prefix with this one,
   if that prefix covers at least `cache_threshold` of the key; else the replica that
   remembers the least (most room for a new prefix).
The chosen replica's tree remembers the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from radixgen.runtime.router.prefix_tree import ApproximatePrefixTree, RoutingKey

RoutingPolicyName = Literal["cache_aware", "round_robin"]


@dataclass
class Worker:
    """One replica as the router sees it."""

    url: str
    healthy: bool = False  # until its first health check answers

    in_flight: int = 0
    consecutive_failures: int = 0
    tree: ApproximatePrefixTree = field(default_factory=ApproximatePrefixTree)


@dataclass(frozen=True)
class CacheAwareSettings:
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.5
    max_tree_elements: int = 1 << 20  # per replica

    def __post_init__(self):
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0:
            raise ValueError(
                f"balance_abs_threshold must be >= 0, got {self.balance_abs_threshold}"
            )
        if self.balance_rel_threshold < 1.0:
            raise ValueError(
                f"balance_rel_threshold must be >= 1, got {self.balance_rel_threshold}"
            )


class RoutingPolicy:
    """Picks one of the healthy `workers` for a request with routing key `key`."""

    def choose(self, workers: list[Worker], key: RoutingKey) -> Worker:
        raise NotImplementedError


class RoundRobinPolicy(RoutingPolicy):
    def __init__(self):
        self.turn = 0

    def choose(self, workers: list[Worker], key: RoutingKey) -> Worker:
        worker = workers[self.turn % len(workers)]
        self.turn += 1
        return worker


class CacheAwarePolicy(RoutingPolicy):
    def __init__(self, settings: CacheAwareSettings):
        self.settings = settings

    def choose(self, workers: list[Worker], key: RoutingKey) -> Worker:
        settings = self.settings
        loads = [worker.in_flight for worker in workers]
        least_loaded = min(workers, key=lambda worker: worker.in_flight)
        imbalanced = max(loads) - min(loads) > settings.balance_abs_threshold and max(
            loads
        ) > settings.balance_rel_threshold * min(loads)
        if imbalanced:
            chosen = least_loaded
        else:
            # Longest match; among equal matches the least loaded.
            matches = [(worker.tree.match_len(key), -worker.in_flight) for worker in workers]
            best = max(range(len(workers)), key=lambda index: matches[index])
            if key and matches[best][0] >= settings.cache_threshold * len(key):
                chosen = workers[best]
            else:
                chosen = min(
                    workers, key=lambda worker: (worker.tree.num_elements, worker.in_flight)
                )
        chosen.tree.insert(key)
        return chosen


def make_policy(name: RoutingPolicyName, settings: CacheAwareSettings) -> RoutingPolicy:
    """Raises ValueError naming `routing_policy` for an unknown name."""
    if name == "cache_aware":
        return CacheAwarePolicy(settings)
    if name == "round_robin":
        return RoundRobinPolicy()
    raise ValueError(f"routing_policy must be 'cache_aware' or 'round_robin', got {name!r}")
