"""The tree a `pattern` (or a format regex) is parsed into, and its regex over JSON units.

Nodes: `CodePoints` (one character from a set), `Concat`, `Union`, `Repeat`. `emit` writes each
code point set as one JSON-encoded unit (`json_string.code_point_unit`), so the regex matches the
encoded string body, and lengths in the tree are lengths in code points, as JSON Schema counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixgen.constrained.json_string import ALL_CODE_POINTS, code_point_unit
from radixgen.constrained.regex_text import alternation, repeat, sequence

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class CodePoints:
    """One character whose code point lies in `ranges`."""

    ranges: Ranges


@dataclass(frozen=True)
class Concat:
    """The items one after another (no items: the empty string)."""

    items: tuple


@dataclass(frozen=True)
class Union:
    """Any one of the options."""

    options: tuple


@dataclass(frozen=True)
class Repeat:
    """`item` repeated min_count..max_count times (None: unbounded)."""

    item: object
    min_count: int
    max_count: int | None


@dataclass(frozen=True)
class Anchor:
    """`^` (at_start) or `$` inside a pattern: zero-width, only the automaton reads it."""

    at_start: bool


ANY_TEXT = Repeat(CodePoints(ALL_CODE_POINTS), 0, None)


def length_range(node: object) -> tuple[int, int | None]:
    """Fewest and most code points `node` matches (None: unbounded)."""
    if isinstance(node, CodePoints):
        return 1, 1
    if isinstance(node, Concat):
        low, high = 0, 0
        for item in node.items:
            item_low, item_high = length_range(item)
            low += item_low
            high = None if high is None or item_high is None else high + item_high
        return low, high
    if isinstance(node, Union):
        ranges = [length_range(option) for option in node.options]
        highs = [high for _, high in ranges]
        return min(low for low, _ in ranges), None if None in highs else max(highs)
    item_low, item_high = length_range(node.item)
    if node.max_count is None:
        return item_low * node.min_count, None if item_high != 0 else 0
    return item_low * node.min_count, None if item_high is None else item_high * node.max_count


def emit(node: object) -> str | None:
    """Regex text over encoded units for `node`."""
    if isinstance(node, CodePoints):
        return code_point_unit(node.ranges)
    if isinstance(node, Concat):
        return sequence(*(emit(item) for item in node.items)) if node.items else ""
    if isinstance(node, Union):
        return alternation(emit(option) for option in node.options)
    return repeat(emit(node.item), node.min_count, node.max_count)
