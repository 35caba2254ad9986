"""radixgen.radix_cache: token-level KV pools and the radix tree that shares KV.

Imports nothing else of radixgen.
"""

from radixgen.radix_cache.memory_pool import KVBudget, ReqToTokenPool, SlotAllocator, TokenToKVPool

__all__ = ["KVBudget", "ReqToTokenPool", "SlotAllocator", "TokenToKVPool"]
