"""Exact intersection of a pattern tree with minLength/maxLength, and a capped fallback.

`limit_length` is exact: fixed-length parts shift the bounds, a repetition of a fixed-length
item gets tighter counts, a bounded repetition of variable-length text is unrolled, and a
concatenation of several variable parts is split by the length of its first part. What it
cannot intersect exactly raises `PatternError`.

`cap_length` is for `format` regexes only (themselves strict subsets of their standards): it
bounds every unbounded repetition so that nothing longer than the limit can match, a strict
subset of the exact intersection.
"""

from __future__ import annotations

from radixgen.constrained.pattern_tree import Concat, Repeat, Union, length_range

# Splitting a concatenation by the length of its first part costs one branch per length.
_MAX_LENGTH_SPLITS = 64
# A bounded repetition of variable-length text is unrolled into at most this many copies.
_MAX_UNROLLED_COPIES = 8


class PatternError(ValueError):
    """The pattern uses a feature, or a length combination, we cannot enforce exactly."""


def limit_length(node: object, min_length: int, max_length: int | None) -> object | None:
    """`node` restricted to strings of min_length..max_length code points (None: empty)."""
    min_length = max(min_length, 0)
    low, high = length_range(node)
    if low >= min_length and (max_length is None or (high is not None and high <= max_length)):
        return node
    if (max_length is not None and low > max_length) or (high is not None and high < min_length):
        return None
    if isinstance(node, Union):
        kept = [limit_length(option, min_length, max_length) for option in node.options]
        kept = [option for option in kept if option is not None]
        return Union(tuple(kept)) if kept else None
    if isinstance(node, Repeat):
        return _limit_repeat(node, min_length, max_length)
    return _limit_concat(node, min_length, max_length)


def _limit_repeat(node: Repeat, min_length: int, max_length: int | None) -> object | None:
    item_low, item_high = length_range(node.item)
    if item_low != item_high:
        return _limit_variable_repeat(node, min_length, max_length)
    width = item_low
    fewest = max(node.min_count, -(-min_length // width))
    most = node.max_count
    if max_length is not None:
        most = max_length // width if most is None else min(most, max_length // width)
    if most is not None and most < fewest:
        return None
    return Repeat(node.item, fewest, most)


def _limit_variable_repeat(node: Repeat, min_length: int, max_length: int | None) -> object | None:
    """A bounded repetition of variable-length text, unrolled into copies (x{1,3} = x(x(x)?)?)."""
    if node.max_count == 1:
        inner = limit_length(node.item, min_length, max_length)
        if node.min_count == 0 and min_length <= 0:
            return Concat(()) if inner is None else Repeat(inner, 0, 1)
        return inner
    if node.max_count is None or node.max_count > _MAX_UNROLLED_COPIES:
        raise PatternError("cannot intersect a repetition of variable-length text with a length")
    optional_tail = None
    for _ in range(node.max_count - node.min_count):
        rest = (node.item,) if optional_tail is None else (node.item, optional_tail)
        optional_tail = Repeat(Concat(rest), 0, 1)
    copies = (node.item,) * node.min_count + (() if optional_tail is None else (optional_tail,))
    return limit_length(Concat(copies), min_length, max_length)


def _limit_concat(node: Concat, min_length: int, max_length: int | None) -> object | None:
    if not node.items:
        return None  # the empty string, already known to be out of range
    head, tail = node.items[0], Concat(node.items[1:])
    head_low, head_high = length_range(head)
    tail_low, tail_high = length_range(tail)
    if head_low == head_high:
        limited_tail = limit_length(tail, min_length - head_low, _minus(max_length, head_low))
        return None if limited_tail is None else Concat((head, limited_tail))
    if tail_low == tail_high:
        limited_head = limit_length(head, min_length - tail_low, _minus(max_length, tail_low))
        return None if limited_head is None else Concat((limited_head, tail))
    # Both vary: one branch per exact head length, up to where the tail is unconstrained.
    last_exact = min_length - tail_low if max_length is None else max_length - tail_low
    if head_high is not None:
        last_exact = min(last_exact, head_high)
    if last_exact - head_low + 1 > _MAX_LENGTH_SPLITS:
        raise PatternError("pattern too complex to intersect with minLength/maxLength")
    options = []
    for head_length in range(head_low, last_exact + 1):
        limited_head = limit_length(head, head_length, head_length)
        remaining_max = _minus(max_length, head_length)
        limited_tail = limit_length(tail, min_length - head_length, remaining_max)
        if limited_head is not None and limited_tail is not None:
            options.append(Concat((limited_head, limited_tail)))
    if max_length is None and (head_high is None or head_high > last_exact):
        longer_head = limit_length(head, last_exact + 1, None)
        if longer_head is not None:
            options.append(Concat((longer_head, tail)))
    return Union(tuple(options)) if options else None


def _minus(value: int | None, amount: int) -> int | None:
    return None if value is None else value - amount


def cap_length(node: object, min_length: int, max_length: int | None) -> object | None:
    """A strict subset of `node` within the lengths: unbounded repetitions get one common cap.

    Returns None when no cap works (the lengths cut into the bounded part of `node`).
    """
    low, _ = length_range(node)
    if max_length is None or low < min_length:
        return None

    def longest(cap: int) -> int | None:
        return length_range(_with_cap(node, cap))[1]

    if longest(0) > max_length:
        return None
    cap_low, cap_high = 0, max_length
    while cap_low < cap_high:  # the largest cap that keeps every match within max_length
        middle = (cap_low + cap_high + 1) // 2
        if longest(middle) <= max_length:
            cap_low = middle
        else:
            cap_high = middle - 1
    return _with_cap(node, cap_low)


def _with_cap(node: object, cap: int) -> object:
    """`node` with every unbounded repetition limited to `cap` extra copies."""
    if isinstance(node, Concat):
        return Concat(tuple(_with_cap(item, cap) for item in node.items))
    if isinstance(node, Union):
        return Union(tuple(_with_cap(option, cap) for option in node.options))
    if isinstance(node, Repeat):
        max_count = node.min_count + cap if node.max_count is None else node.max_count
        return Repeat(_with_cap(node.item, cap), node.min_count, max_count)
    return node
