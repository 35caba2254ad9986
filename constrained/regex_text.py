"""Small builders for regex text in the dialect shared by Python `re` and Rust regex-automata.

The dialect is deliberately narrow: literals, `(?:...)` groups, `|`, character classes,
`?`, `*`, `+` and `{m,n}`. No lookaround, no backreferences, no `\\u` escapes (interegular,
which parses our output into a character automaton, rejects them), no `\\x{...}` (Python `re`
rejects it). ASCII punctuation and control characters are written as `\\xNN`, which all three
parsers accept; non-ASCII characters are written as themselves.

`None` stands for the empty language ("matches nothing"). Every builder propagates it, so a
schema branch that can never be satisfied disappears instead of needing a never-matching regex
(Rust has no portable spelling of one).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# Characters that can be written bare outside a class in all three parsers.
_BARE_LITERAL = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_,:;'\"=<>!@%/`"
)

_SURROGATES = (0xD800, 0xDFFF)
MAX_CODE_POINT = 0x10FFFF


def escape_char(code_point: int) -> str:
    """One code point as regex text, valid both inside and outside a character class."""
    char = chr(code_point)
    if char in _BARE_LITERAL or code_point > 0x7F:
        return char
    return f"\\x{code_point:02x}"


def literal(text: str) -> str:
    """A regex matching exactly `text`."""
    return "".join(escape_char(ord(char)) for char in text)


def char_class(ranges: Sequence[tuple[int, int]]) -> str | None:
    """A character class for inclusive code point `ranges` (sorted or not, may overlap).

    Surrogate code points are dropped: they are not characters in Rust (or in valid UTF-8).
    A class reaching the top of Unicode is written negated (`[^...]`): interegular expands
    ranges character by character, so `[\ue000-\U0010ffff]` would take it seconds.
    """
    ranges = normalize_ranges(subtract_ranges(ranges, [_SURROGATES]))
    if not ranges:
        return None
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return escape_char(ranges[0][0])
    if ranges[-1][1] == MAX_CODE_POINT:
        excluded = subtract_ranges(complement_ranges(ranges), [_SURROGATES])
        if excluded:
            return "[^" + _class_body(excluded) + "]"
    return "[" + _class_body(ranges) + "]"


def _class_body(ranges: Sequence[tuple[int, int]]) -> str:
    parts = []
    for low, high in ranges:
        if low == high:
            parts.append(escape_char(low))
        elif high == low + 1:
            parts.append(escape_char(low) + escape_char(high))
        else:
            parts.append(f"{escape_char(low)}-{escape_char(high)}")
    return "".join(parts)


def normalize_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged, non-empty inclusive ranges."""
    merged: list[tuple[int, int]] = []
    for low, high in sorted(r for r in ranges if r[0] <= r[1]):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def subtract_ranges(
    ranges: Iterable[tuple[int, int]], removed: Iterable[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Code points in `ranges` but not in `removed`."""
    result = normalize_ranges(ranges)
    for cut_low, cut_high in normalize_ranges(removed):
        next_result = []
        for low, high in result:
            if high < cut_low or low > cut_high:
                next_result.append((low, high))
                continue
            if low < cut_low:
                next_result.append((low, cut_low - 1))
            if high > cut_high:
                next_result.append((cut_high + 1, high))
        result = next_result
    return result


def intersect_ranges(
    left: Iterable[tuple[int, int]], right: Iterable[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Code points in both `left` and `right`."""
    right = normalize_ranges(right)
    return normalize_ranges(
        (max(a, c), min(b, d)) for a, b in normalize_ranges(left) for c, d in right
    )


def complement_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """All code points not in `ranges`."""
    return subtract_ranges([(0, MAX_CODE_POINT)], ranges)


def group(regex: str) -> str:
    """`regex` wrapped so that a quantifier or concatenation applies to all of it."""
    if _is_atom(regex):
        return regex
    return f"(?:{regex})"


def alternation(options: Iterable[str | None]) -> str | None:
    """Union of the options; `None` options are dropped, duplicates kept once."""
    kept: list[str] = []
    for option in options:
        if option is not None and option not in kept:
            kept.append(option)
    if not kept:
        return None
    if len(kept) == 1:
        return kept[0]
    return "(?:" + "|".join(kept) + ")"


def sequence(*parts: str | None) -> str | None:
    """Concatenation; empty if any part is empty.

    Parts need no grouping: no builder here returns a top-level `|` (alternation groups itself).
    """
    if any(part is None for part in parts):
        return None
    return "".join(parts)


def optional(regex: str | None) -> str:
    """`regex` or nothing."""
    if regex is None or regex == "":
        return ""
    return group(regex) + "?"


def repeat(regex: str | None, min_count: int, max_count: int | None) -> str | None:
    """`regex` repeated between `min_count` and `max_count` (None: unbounded) times."""
    if max_count is not None and max_count < min_count:
        return None
    if regex is None:
        return "" if min_count == 0 else None
    if max_count == 0 or regex == "":
        return ""
    if (min_count, max_count) == (1, 1):
        return regex
    atom = group(regex)
    if max_count is None:
        suffix = {0: "*", 1: "+"}.get(min_count, f"{{{min_count},}}")
    elif min_count == max_count:
        suffix = f"{{{min_count}}}"
    elif (min_count, max_count) == (0, 1):
        suffix = "?"
    else:
        suffix = f"{{{min_count},{max_count}}}"
    return atom + suffix


def _is_atom(regex: str) -> bool:
    """True when `regex` is one escaped char, one class, or one balanced group."""
    if len(regex) == 1 and regex not in "()|":
        return True
    if len(regex) == 4 and regex.startswith("\\x"):
        return True
    if regex.startswith("[") and regex.endswith("]") and _closing_bracket(regex) == len(regex) - 1:
        return True
    if regex.startswith("(") and regex.endswith(")"):
        return _closing_paren(regex) == len(regex) - 1
    return False


def _closing_bracket(regex: str) -> int:
    """Index of the `]` closing the class that opens at index 0."""
    index = 1
    while index < len(regex):
        if regex[index] == "\\":
            index += 2
            continue
        if regex[index] == "]":
            return index
        index += 1
    return -1


def _closing_paren(regex: str) -> int:
    """Index of the `)` closing the group that opens at index 0 (escapes and classes skipped)."""
    depth = 0
    index = 0
    while index < len(regex):
        char = regex[index]
        if char == "\\":
            index += 2
            continue
        if char == "[":
            index += _closing_bracket(regex[index:]) + 1
            continue
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    return -1
