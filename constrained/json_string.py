"""Regexes for JSON string literals: characters, escapes, lengths and key sets.

A JSON string is `"` + units + `"`, where each unit encodes exactly one code point: a raw
character, a short escape (`\\n`, `\\"`, ...), `\\uXXXX` for a BMP character, or a `\\uD8xx\\uDCxx`
surrogate pair for an astral one. Lone surrogates are never produced. Because each unit is one
code point, `unit{m,n}` is exactly a string of m..n code points, which is how JSON Schema
counts `minLength`/`maxLength`.

Strings with a `pattern`, and object keys that must avoid a set of declared names, are written
from code point sets (see `code_point_unit`): raw characters plus the escapes that control
characters, `"` and `\\` need, and `\\/`; non-ASCII characters are then written raw, not as
`\\uXXXX`. Every value still has a spelling; only some alternative spellings are not produced.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from radixgen.constrained.regex_text import (
    MAX_CODE_POINT,
    alternation,
    char_class,
    intersect_ranges,
    literal,
    optional,
    repeat,
    sequence,
    subtract_ranges,
)

_HEX = "[0-9a-fA-F]"
_ESCAPED_BMP = (
    "\\x5cu(?:[0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}"
    "|[dD][89abAB][0-9a-fA-F]{2}\\x5cu[dD][c-fC-F][0-9a-fA-F]{2})"
)
# One encoded code point, any spelling JSON allows.
STRING_UNIT = f'(?:[^"\\x5c\\x00-\\x1f]|\\x5c["\\x5c/bfnrt]|{_ESCAPED_BMP})'
QUOTE = '"'

_CONTROL = (0x00, 0x1F)
_SHORT_ESCAPES = {0x22: '"', 0x5C: "\\", 0x2F: "/", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r"}
_SHORT_ESCAPES[0x09] = "t"
ALL_CODE_POINTS = ((0, MAX_CODE_POINT),)


def string_regex(min_length: int = 0, max_length: int | None = None) -> str | None:
    """Any JSON string of `min_length` to `max_length` code points."""
    return sequence(QUOTE, repeat(STRING_UNIT, min_length, max_length), QUOTE)


def code_point_unit(ranges: Sequence[tuple[int, int]]) -> str | None:
    """One encoded unit whose decoded code point lies in `ranges`."""
    raw = subtract_ranges(ranges, [_CONTROL, (0x22, 0x22), (0x5C, 0x5C)])
    options = [char_class(raw)] if raw else []
    letters = [
        letter
        for code_point, letter in sorted(_SHORT_ESCAPES.items())
        if intersect_ranges(ranges, [(code_point, code_point)])
    ]
    if letters:
        options.append(literal("\\") + char_class([(ord(c), ord(c)) for c in letters]))
    controls = intersect_ranges(ranges, [_CONTROL])
    for high_nibble in (0, 1):
        low_nibbles = intersect_ranges(controls, [(16 * high_nibble, 16 * high_nibble + 15)])
        if low_nibbles:
            hex_class = _hex_digit_class(
                [(low - 16 * high_nibble, high - 16 * high_nibble) for low, high in low_nibbles]
            )
            options.append(literal(f"\\u00{high_nibble}") + hex_class)
    return alternation(options)


def string_excluding_keys(keys: Iterable[str]) -> str:
    """A JSON string (quotes included) whose decoded value is none of `keys`."""
    trie: dict = {}
    for key in keys:
        node = trie
        for char in key:
            node = node.setdefault(char, {})
        node[""] = {}
    any_units = repeat(code_point_unit(ALL_CODE_POINTS), 0, None)
    return QUOTE + _trie_complement(trie, any_units) + QUOTE


def _trie_complement(node: dict, any_units: str) -> str:
    """Encoded strings that, read from trie `node`, do not spell a complete key."""
    children = sorted(char for char in node if char)
    options = []
    for char in children:
        code_point = ord(char)
        unit = code_point_unit([(code_point, code_point)])
        options.append(sequence(unit, _trie_complement(node[char], any_units)))
    others = subtract_ranges(ALL_CODE_POINTS, [(ord(c), ord(c)) for c in children])
    options.append(sequence(code_point_unit(others), any_units))
    result = alternation(options)
    return result if "" in node else optional(result)


def _hex_digit_class(values: Sequence[tuple[int, int]]) -> str:
    """A class matching hex digits with the given values, in either letter case."""
    digits = "".join(
        f"{value:x}{value:X}" if value >= 10 else str(value)
        for low, high in values
        for value in range(low, high + 1)
    )
    return "[" + "".join(sorted(set(digits))) + "]" if len(digits) > 1 else digits
