"""In-batch prefix sharing: waiting requests that share an uncached prefix with a request
already admitted to the extend batch being formed wait for the next batch.

Requests admitted into one extend batch each compute their uncached tokens: a prefix they
share is not in the radix cache until the batch has run and its prompts are inserted
(`KVCacheManager.cache_unfinished` right after the prefill). So when a candidate's next
`min_tokens` uncached tokens equal those an admitted request computes from the same
position, the candidate is deferred; in the next batch it finds them in the cache.

Two requests that share more than the cached prefix share the same cached length `m` (if
one had more cached, the other would find that token too), so admitted requests are indexed
by `(namespace, m, ids[m : m + min_tokens])` and a hit is confirmed by comparing the first
`m` tokens. Only requests of one cache namespace are grouped: a request never waits for a
prefix it could not reuse.

No starvation: a deferral needs an admitted request, so every batch makes progress, and the
batch after a deferral caches at least `min_tokens` more of the deferred request's prompt.
A request that has waited longer than the aging bound is deferred only if it never was
before (so it waits at most one more batch): requests of a group first seen after the bound
still share its prefix.
"""

from __future__ import annotations

from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.req import Req


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
