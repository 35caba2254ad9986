"""radixgen.radix_cache: token-level KV pools and the radix tree that shares KV.

Imports nothing else of radixgen.
"""

from radixgen.radix_cache.memory_pool import KVBudget, ReqToTokenPool, SlotAllocator, TokenToKVPool
from radixgen.radix_cache.radix_cache import RadixCache
from radixgen.radix_cache.radix_node import CacheStats, MatchResult, TreeNode

__all__ = [
    "CacheStats",
    "KVBudget",
    "MatchResult",
    "RadixCache",
    "ReqToTokenPool",
    "SlotAllocator",
    "TokenToKVPool",
    "TreeNode",
]
