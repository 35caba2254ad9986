"""The shared prefixes of a decode batch, read from the radix cache, for tree attention.

Every running request holds a lock on `last_node`, the radix node where its cached prefix ends.
The path from its namespace root down to `last_node` is that prefix, and
`req_to_token[row, :prefix_len]` holds exactly those nodes' slots (`KVCacheManager` keeps it so,
also when the tree replaces duplicate slots). So two requests whose paths pass through one node
have the same slots over that node's positions: the node is a `SharedSegment` of both.
Namespaces (`cache_salt`, adapters) have separate subtrees, so requests of two namespaces never
share a node.

Host work per decode step: one walk up each request's path (a few nodes) and a dict update per
(request, node); consecutive nodes held by the same requests merge into one segment. No loop over
tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixgen.kernels.tree_decode_plan import SharedSegment
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.req import Req

# Tree attention pays one more launch and a merge per layer; below this much shared prefix per
# request the plain decode kernel is used.
MIN_SHARED_TOKENS = 64
# ... and unless sharing saves at least this fraction of the plain kernel's KV reads. The ninth
# session's H200 sweep (docs/benchmarks.md): pairs sharing 512 of 768 tokens (a third of the
# reads saved) ran 0.82x the plain kernel, groups of 4 sharing 2048 of 2176 (71% saved) 1.66x,
# groups of 16 (88-93%) 2.6-3.5x; the plain kernel also gets L2 hits on shared KV.
MIN_SAVED_READ_FRACTION = 0.5


def shared_prefix_segments(
    reqs: Sequence[Req],
    *,
    min_shared_tokens: int = MIN_SHARED_TOKENS,
    min_saved_fraction: float = 0.0,
) -> tuple[SharedSegment, ...] | None:
    """The cached prefixes that several of `reqs` (batch rows, in order) hold.

    Returns:
        The segments of the radix nodes held by >= 2 rows (members are row indices), or None
        when no row shares at least `min_shared_tokens` tokens with another, or when reading
        each segment once saves less than `min_saved_fraction` of the rows' KV reads (each
        row's whole history: what plain decode attention reads).
    """
    node_rows: dict[object, list[int]] = {}  # node -> rows whose prefix passes through it
    node_range: dict[object, tuple[int, int]] = {}  # node -> (start, end) positions
    for row, req in enumerate(reqs):
        path = []
        node = req.last_node
        # Namespace roots and the global root have empty keys: the path stops there.
        while node is not None and node.key:
            path.append(node)
            node = node.parent
        end = sum(len(n.key) for n in path)
        for node in path:  # deepest first
            rows = node_rows.get(node)
            if rows is None:
                node_rows[node] = [row]
                node_range[node] = (end - len(node.key), end)
            else:
                rows.append(row)
            end -= len(node.key)

    shared = sorted(
        (node for node, rows in node_rows.items() if len(rows) > 1),
        key=lambda node: node_range[node][0],
    )
    if not shared or max(node_range[node][1] for node in shared) < min_shared_tokens:
        return None
    # A node held by as many rows as its parent is held by the same rows: one segment.
    segment_of: dict[object, list] = {}  # node -> [kv_row, start, end, rows] (mutable)
    segments = []
    for node in shared:
        rows = node_rows[node]
        start, end = node_range[node]
        parent_segment = segment_of.get(node.parent)
        if parent_segment is not None and len(parent_segment[3]) == len(rows):
            parent_segment[2] = end
            segment_of[node] = parent_segment
            continue
        segment = [reqs[rows[0]].req_pool_idx, start, end, rows]
        segment_of[node] = segment
        segments.append(segment)
    if min_saved_fraction > 0:
        saved = sum((len(rows) - 1) * (end - start) for _, start, end, rows in segments)
        # A decode row reads its prompt and outputs so far (its last token's KV included).
        reads = sum(req.seqlen for req in reqs)
        if saved < min_saved_fraction * reads:
            return None
    return tuple(
        SharedSegment(kv_row=kv_row, start=start, end=end, members=tuple(rows))
        for kv_row, start, end, rows in segments
    )


def decode_shared_prefixes(
    runner, reqs: Sequence[Req], mode: ForwardMode
) -> tuple[SharedSegment, ...] | None:
    """The batch's shared prefixes when `runner` runs tree attention and the batch decodes."""
    if mode != ForwardMode.DECODE or not runner.tree_attention_enabled:
        return None
    return shared_prefix_segments(
        reqs, min_shared_tokens=MIN_SHARED_TOKENS, min_saved_fraction=MIN_SAVED_READ_FRACTION
    )
