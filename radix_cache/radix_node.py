"""The pieces of the radix tree: `TreeNode`, `MatchResult`, `CacheStats`, key helpers.

Kept apart from `RadixCache` so that the cache file reads as the algorithm only.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

# Edges shorter than this are compared element by element when searching for a mismatch;
# longer ones are halved with C-level tuple slice comparisons first.
_LINEAR_SCAN_BELOW = 16


class TreeNode:
    """One edge of the tree: `key` tokens and their `slots`, plus lock and LRU bookkeeping.

    Namespace roots and the global root have an empty key. `parent` is None for the global
    root and for detached (evicted) nodes.
    """

    __slots__ = (
        "key",
        "slots",
        "parent",
        "children",
        "lock_ref",
        "last_access",
        "node_id",
        "namespace",
    )

    def __init__(
        self,
        *,
        key: tuple[int, ...],
        slots: torch.Tensor,
        parent: TreeNode | None,
        node_id: int,
        lock_ref: int = 0,
        last_access: int = 0,
        namespace: Hashable = None,
    ):
        self.key = key
        self.slots = slots  # [len(key)] int64, on the KV device
        self.parent = parent
        self.children: dict[int, TreeNode] = {}  # first token of the child's key -> child
        self.lock_ref = lock_ref  # running requests whose prefix passes through this node
        self.last_access = last_access  # logical clock of the last match/insert through here
        self.node_id = node_id  # creation order; breaks LRU ties deterministically
        self.namespace = namespace

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.node_id}, len={len(self.key)}, lock_ref={self.lock_ref}, "
            f"children={len(self.children)})"
        )


@dataclass(frozen=True)
class MatchResult:
    """The cached prefix of a key.

    `slots` ([prefix_len] int64, read-only: it may be a view of the tree's own tensor) are
    the KV slots of `key[:prefix_len]`; `last_node` is the node where the prefix ends, the
    one to pass to `inc_lock_ref`/`dec_lock_ref` and back to `cache_*_req`.
    """

    slots: torch.Tensor
    last_node: TreeNode

    @property
    def prefix_len(self) -> int:
        return int(self.slots.numel())


@dataclass
class CacheStats:
    """Counters since construction or the last `reset()`.

    `hit_rate` is matched tokens over looked-up tokens of `match_prefix` calls.
    """

    num_lookups: int = 0
    num_lookup_tokens: int = 0
    num_matched_tokens: int = 0
    num_inserted_tokens: int = 0
    num_evicted_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_matched_tokens / self.num_lookup_tokens if self.num_lookup_tokens else 0.0


def as_key(key: Sequence[int] | torch.Tensor, name: str = "key") -> tuple[int, ...]:
    """A tuple of token ids; edges are tuples so prefix checks are C-level comparisons."""
    if isinstance(key, tuple):
        return key
    if isinstance(key, (list, range)):
        return tuple(key)
    if isinstance(key, torch.Tensor):
        if key.dim() != 1 or key.is_floating_point() or key.is_complex():
            raise ValueError(f"{name} must be a 1-D integer tensor, got {key.dtype} {key.shape}")
        return tuple(key.tolist())
    if hasattr(key, "tolist") and hasattr(key, "ndim"):  # numpy arrays
        if key.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {key.shape}")
        return tuple(key.tolist())
    raise TypeError(f"{name} must be a list/tuple of token ids, got {type(key).__name__}")


def common_prefix_len(edge: tuple[int, ...], key: tuple[int, ...], start: int) -> int:
    """Length of the common prefix of `edge` and `key[start:]`.

    Halves the search range with slice comparisons (each runs in C), so the Python-level
    work is O(log len) and the scan at the end touches at most _LINEAR_SCAN_BELOW tokens.
    """
    lo, hi = 0, min(len(edge), len(key) - start)
    # Invariant: edge[:lo] == key[start:start+lo] and the first mismatch is at index <= hi.
    while hi - lo > _LINEAR_SCAN_BELOW:
        mid = (lo + hi) // 2
        if edge[lo:mid] == key[start + lo : start + mid]:
            lo = mid
        else:
            hi = mid
    for i in range(lo, hi):
        if edge[i] != key[start + i]:
            return i
    return hi


def concat_slots(pieces: list[torch.Tensor], empty: torch.Tensor) -> torch.Tensor:
    if not pieces:
        return empty
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def abbreviate(values: Sequence[int], max_items: int) -> str:
    shown = ", ".join(str(v) for v in values[:max_items])
    return f"[{shown}{', ...' if len(values) > max_items else ''}]"


def check_slots(slots: torch.Tensor, expected_len: int) -> None:
    if not isinstance(slots, torch.Tensor) or slots.is_floating_point() or slots.is_complex():
        raise TypeError(f"slots must be an integer torch.Tensor, got {type(slots).__name__}")
    if slots.dim() != 1 or slots.numel() != expected_len:
        raise ValueError(
            f"slots must be 1-D with one slot per token ({expected_len}), got {tuple(slots.shape)}"
        )


def check_req_args(
    token_ids: Sequence[int], slots: torch.Tensor, prefix_len: int, namespace: Hashable
) -> tuple[int, ...]:
    """Validates the arguments of `cache_*_req`; returns token_ids as a key tuple."""
    token_ids = as_key(token_ids, "token_ids")
    check_slots(slots, len(token_ids))
    if not isinstance(prefix_len, int) or not 0 <= prefix_len <= len(token_ids):
        raise ValueError(f"prefix_len must be an int in [0, {len(token_ids)}], got {prefix_len!r}")
    check_namespace(namespace)
    return token_ids


def check_namespace(namespace: Hashable) -> None:
    try:
        hash(namespace)
    except TypeError:
        raise TypeError(
            f"namespace must be hashable (str, int, tuple...), got {type(namespace).__name__}"
        ) from None


def check_node(node: TreeNode) -> None:
    if not isinstance(node, TreeNode):
        raise TypeError(
            f"node must be a TreeNode (MatchResult.last_node), got {type(node).__name__}"
        )
