"""The work list of `tree_decode_attention` (shared KV ranges read once for all their queries),
and its fp32 workspace.

The histories of a decode batch form a tree. Request i's history `[0, seq_len_i)` is a chain of
shared segments (position ranges whose KV slots are the same for every member request, e.g. a
system prompt held by the radix cache), tiling `[0, suffix_start_i)`, then its own suffix
`[suffix_start_i, seq_len_i)`. Requests without sharing have suffix_start 0.

`build_tree_decode_plan` turns the segments (host values) into fixed-size device tables:

- items: one token chunk of one segment times one block of up to `members_per_item` member
  requests. The kernel reads the chunk's K/V once for all `members * group_size` query rows.
  Long segments are cut into chunks so that the items fill the device.
- entries: one (request, item) partial result. Request i's entries are the consecutive indices
  `entry_offsets[i] .. entry_offsets[i + 1]` of the shared partial workspace.

Fixed capacities (`max_items`, `max_entries`, `batch_size`) make the tables' shapes, and thus
the kernels' grids, independent of the grouping: padding items have no members and an empty
range, padding requests have suffix_start 0 and no entries; `item_count` holds the number of
real items (the shared pass's programs loop over those: none runs for padding). A CUDA graph
captured with one capacity replays any grouping that fits it (`None` is returned when a
grouping does not fit).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Target of the automatic chunking: shared-pass programs per SM, what the H200 keeps resident
# (the 64-row pass takes 255 registers a thread and 80.5 KB of shared memory on sm_90a: 2 an
# SM). One wave of longer chunks beat two of shorter ones: 143.0 -> 131.2 us at 16 x 16
# sharing 2048 + 256 (1024-token chunks instead of 512; twelfth session, docs/benchmarks.md).
_PROGRAMS_PER_SM = 2
_CPU_TARGET_ITEMS = 4
_CHUNK_ALIGN = 64  # chunk lengths are multiples of the kernel's largest BLOCK_N
_MIN_CHUNK_TOKENS = 256  # shorter chunks cost more in partial writes than they gain in occupancy
_QUERY_ROWS_PER_ITEM = 64  # members_per_item * group_size, the Q tile of one item
_GRAPH_ENTRIES_PER_ROW = 8  # shared partials per row in a CUDA graph's plan (32 MB at batch 256)


@dataclass(frozen=True)
class SharedSegment:
    """Positions `[start, end)` of every member's history hold the same KV slots.

    `kv_row` is the `req_to_token` row the kernel reads the slots from (any member's row);
    `members` are batch indices, in any order.
    """

    kv_row: int
    start: int
    end: int
    members: tuple[int, ...]


@dataclass
class TreeDecodePlan:
    """Device tables of one grouping (int32, views of one packed tensor; see the module doc).

    Host ints: `batch_size`, `members_per_item`, `num_items` / `num_entries` (used),
    `max_items` / `max_entries` (capacities, fixed for a CUDA graph).
    """

    batch_size: int
    members_per_item: int
    max_items: int
    max_entries: int
    num_items: int
    num_entries: int
    packed: torch.Tensor  # [plan_size(...)] int32, every table below is a view of it
    item_kv_rows: torch.Tensor  # [max_items]
    item_kv_starts: torch.Tensor  # [max_items]
    item_kv_ends: torch.Tensor  # [max_items], == start for padding items
    item_num_members: torch.Tensor  # [max_items], 0 for padding items
    item_members: torch.Tensor  # [max_items, members_per_item] batch indices
    item_entries: torch.Tensor  # [max_items, members_per_item] entry of each member
    suffix_starts: torch.Tensor  # [batch_size] first position of each request's own suffix
    entry_offsets: torch.Tensor  # [batch_size + 1] request i's entries: [off[i], off[i+1])
    item_count: torch.Tensor  # [1] num_items, read by the kernel (its grid is fixed)

    @classmethod
    def from_packed(
        cls,
        packed: torch.Tensor,
        *,
        batch_size: int,
        members_per_item: int,
        max_items: int,
        max_entries: int,
        num_items: int = 0,
        num_entries: int = 0,
    ) -> TreeDecodePlan:
        sizes = _table_sizes(batch_size, members_per_item, max_items)
        aligned = [_aligned(size) for size in sizes]
        if packed.shape != (sum(aligned),) or packed.dtype != torch.int32:
            raise ValueError(f"packed must be an int32 [{sum(aligned)}] tensor")
        tables = [t[:size] for t, size in zip(packed.split(aligned), sizes, strict=True)]
        rows, starts, ends, counts, members, entries, suffix, offsets, item_count = tables
        return cls(
            batch_size=batch_size,
            members_per_item=members_per_item,
            max_items=max_items,
            max_entries=max_entries,
            num_items=num_items,
            num_entries=num_entries,
            packed=packed,
            item_kv_rows=rows,
            item_kv_starts=starts,
            item_kv_ends=ends,
            item_num_members=counts,
            item_members=members.view(max_items, members_per_item),
            item_entries=entries.view(max_items, members_per_item),
            suffix_starts=suffix,
            entry_offsets=offsets,
            item_count=item_count,
        )

    @classmethod
    def empty(
        cls,
        *,
        batch_size: int,
        members_per_item: int,
        max_items: int,
        max_entries: int,
        device: torch.device,
    ) -> TreeDecodePlan:
        """A plan with no shared item (every request attends over its whole history as its
        suffix): what a CUDA graph is captured with before real plans are copied in."""
        size = sum(_aligned(n) for n in _table_sizes(batch_size, members_per_item, max_items))
        packed = torch.zeros(size, dtype=torch.int32, device=device)
        return cls.from_packed(
            packed,
            batch_size=batch_size,
            members_per_item=members_per_item,
            max_items=max_items,
            max_entries=max_entries,
        )

    def same_layout(self, other: TreeDecodePlan) -> bool:
        return (self.batch_size, self.members_per_item, self.max_items, self.max_entries) == (
            other.batch_size,
            other.members_per_item,
            other.max_items,
            other.max_entries,
        )


@dataclass
class TreeDecodeWorkspace:
    """fp32 partial results and the merge's arrival counters; CUDA graphs keep one alive (the
    kernels write in place and leave the counters zero)."""

    shared_out: torch.Tensor  # [max_entries, num_heads, head_dim]
    shared_lse: torch.Tensor  # [max_entries, num_heads]
    suffix_out: torch.Tensor  # [batch, num_heads, num_kv_splits, head_dim]
    suffix_lse: torch.Tensor  # [batch, num_heads, num_kv_splits]
    merge_counters: torch.Tensor  # [batch * num_kv_heads] int32 zeros

    @classmethod
    def allocate(
        cls, *, max_entries, batch_size, num_heads, num_kv_heads, head_dim, num_kv_splits, device
    ) -> TreeDecodeWorkspace:
        def empty(*shape):
            return torch.empty(shape, dtype=torch.float32, device=device)

        return cls(
            shared_out=empty(max(max_entries, 1), num_heads, head_dim),
            shared_lse=empty(max(max_entries, 1), num_heads),
            suffix_out=empty(batch_size, num_heads, num_kv_splits, head_dim),
            suffix_lse=empty(batch_size, num_heads, num_kv_splits),
            merge_counters=torch.zeros(batch_size * num_kv_heads, dtype=torch.int32, device=device),
        )


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _table_sizes(batch_size: int, members_per_item: int, max_items: int) -> list[int]:
    block = max_items * members_per_item
    return [max_items] * 4 + [block, block, batch_size, batch_size + 1, 1]


def _aligned(num_ints: int) -> int:
    """Tables start at 16-byte boundaries: Triton specialises kernels on pointer alignment, so
    unaligned views would compile one variant per plan shape."""
    return _cdiv(num_ints, 4) * 4


def default_members_per_item(group_size: int) -> int:
    """Requests per item: a 64-row Q tile (16 requests at GQA group 4), a power of two."""
    return max(1, _QUERY_ROWS_PER_ITEM // _next_power_of_2(group_size))


@functools.cache
def default_target_items(
    num_kv_heads: int, device: torch.device, programs_per_sm: int | None = None
) -> int:
    """Shared items that give about `programs_per_sm` (default `_PROGRAMS_PER_SM`) programs
    per SM (one per KV head)."""
    if device.type != "cuda":
        return _CPU_TARGET_ITEMS
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    return _cdiv((programs_per_sm or _PROGRAMS_PER_SM) * num_sms, num_kv_heads)


def graph_plan_capacity(
    batch_size: int, *, num_kv_heads: int, device: torch.device
) -> tuple[int, int]:
    """(max_items, max_entries) of a CUDA graph's plan for `batch_size` rows.

    Items: the automatic chunking targets `default_target_items`, plus one partly filled member
    block per row at most. Entries: 8 per row (a row's levels times its segments' chunks; the
    builder lengthens the chunks of a plan that needs more, or refuses a deeper tree).
    """
    target = default_target_items(num_kv_heads, device)
    return target + batch_size, _GRAPH_ENTRIES_PER_ROW * batch_size


def _check_segments(segments: Sequence[SharedSegment], batch_size: int) -> list[int]:
    """Validates that each request's segments tile `[0, suffix_start)`; returns suffix_starts.

    Raises:
        ValueError: naming the bad segment.
    """
    suffix_starts = [0] * batch_size
    for segment in sorted(segments, key=lambda s: s.start):
        if not 0 <= segment.start < segment.end:
            raise ValueError(f"segments: empty or negative range in {segment}")
        if len(segment.members) < 1 or len(set(segment.members)) != len(segment.members):
            raise ValueError(f"segments: members must be distinct and non-empty in {segment}")
        for member in segment.members:
            if not 0 <= member < batch_size:
                raise ValueError(f"segments: member {member} outside the batch of {batch_size}")
            if suffix_starts[member] != segment.start:
                raise ValueError(
                    f"segments: request {member}'s segments must tile [0, suffix_start) in order; "
                    f"{segment} starts at {segment.start}, expected {suffix_starts[member]}"
                )
            suffix_starts[member] = segment.end
    return suffix_starts


def build_tree_decode_plan(
    segments: Sequence[SharedSegment],
    *,
    batch_size: int,
    group_size: int,
    num_kv_heads: int,
    device: torch.device,
    members_per_item: int | None = None,
    max_items: int | None = None,
    max_entries: int | None = None,
    chunk_tokens: int | None = None,
    programs_per_sm: int | None = None,
) -> TreeDecodePlan | None:
    """The device tables of `segments` (host work: a loop over items and their members).

    Args:
        segments: the shared ranges; each request's must tile `[0, suffix_start)` (a request
            in none has suffix_start 0).
        batch_size: rows of the batch (at least every member + 1; padding rows are fine).
        group_size, num_kv_heads: the attention's GQA shape (query heads per KV head).
        members_per_item: requests per item, a power of two (default: a 64-row Q tile).
        max_items, max_entries: capacities (default: exactly what the grouping needs).
        chunk_tokens: chunk length of long segments (default: fill the device, at least
            256 tokens); doubled until the items and entries fit the capacities.
        programs_per_sm: the shared pass's grid that the automatic chunking fills (default
            `_PROGRAMS_PER_SM`; a tuning override, with tree_decode_attention's).

    Returns:
        The plan, or None when the grouping does not fit the capacities.

    Raises:
        ValueError: segments that do not tile each member's prefix, or bad sizes.
    """
    members_per_item = members_per_item or default_members_per_item(group_size)
    if members_per_item & (members_per_item - 1):
        raise ValueError(f"members_per_item must be a power of two, got {members_per_item}")
    suffix_starts = _check_segments(segments, batch_size)
    blocks = [_cdiv(len(s.members), members_per_item) for s in segments]
    if chunk_tokens is None:
        work = sum(b * (s.end - s.start) for s, b in zip(segments, blocks, strict=True))
        target = default_target_items(num_kv_heads, device, programs_per_sm)
        chunk_tokens = max(_MIN_CHUNK_TOKENS, _cdiv(work, max(target, 1)))
        chunk_tokens = _cdiv(chunk_tokens, _CHUNK_ALIGN) * _CHUNK_ALIGN
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    longest = max((s.end - s.start for s in segments), default=1)
    while True:
        chunks = [_cdiv(s.end - s.start, chunk_tokens) for s in segments]
        num_items = sum(b * c for b, c in zip(blocks, chunks, strict=True))
        num_entries = sum(len(s.members) * c for s, c in zip(segments, chunks, strict=True))
        fits = (max_items is None or num_items <= max_items) and (
            max_entries is None or num_entries <= max_entries
        )
        if fits:
            break
        if chunk_tokens >= longest:
            return None
        chunk_tokens *= 2
    max_items = num_items if max_items is None else max_items
    max_entries = num_entries if max_entries is None else max_entries

    # Entries: request i's are consecutive, one per chunk of each of its segments.
    entry_counts = [0] * batch_size
    for segment, num_chunks in zip(segments, chunks, strict=True):
        for member in segment.members:
            entry_counts[member] += num_chunks
    entry_offsets = [0, *itertools.accumulate(entry_counts)]
    cursor = entry_offsets[:-1]  # next free entry of each request

    rows, starts, ends, counts = [], [], [], []
    item_members, item_entries = [], []
    for segment, num_chunks in zip(segments, chunks, strict=True):
        for block_start in range(0, len(segment.members), members_per_item):
            block = segment.members[block_start : block_start + members_per_item]
            padding = [0] * (members_per_item - len(block))
            for chunk in range(num_chunks):
                chunk_start = segment.start + chunk * chunk_tokens
                rows.append(segment.kv_row)
                starts.append(chunk_start)
                ends.append(min(chunk_start + chunk_tokens, segment.end))
                counts.append(len(block))
                item_members += [*block, *padding]
                item_entries += [cursor[member] + chunk for member in block] + padding
        for member in segment.members:
            cursor[member] += num_chunks
    tables = [
        *(rows, starts, ends, counts, item_members, item_entries, suffix_starts, entry_offsets),
        [num_items],
    ]
    sizes = _table_sizes(batch_size, members_per_item, max_items)
    packed = torch.zeros(sum(_aligned(size) for size in sizes), dtype=torch.int32)
    offset = 0
    for values, size in zip(tables, sizes, strict=True):
        packed[offset : offset + len(values)] = torch.tensor(values, dtype=torch.int32)
        offset += _aligned(size)  # the padding of each table stays 0
    if device.type == "cuda":
        # Pinned, so the copy is queued without waiting for the kernels in flight.
        packed = packed.pin_memory().to(device, non_blocking=True)
    else:
        packed = packed.to(device)
    return TreeDecodePlan.from_packed(
        packed,
        batch_size=batch_size,
        members_per_item=members_per_item,
        max_items=max_items,
        max_entries=max_entries,
        num_items=num_items,
        num_entries=num_entries,
    )
