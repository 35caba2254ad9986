"""Parser for JSON Schema `pattern`s (ECMA-262 syntax) into a whole-string `pattern_tree`.

A pattern constrains the decoded string value and matches anywhere in it unless anchored, while
our regex must match the whole encoded literal. So the pattern is parsed into a small tree
(code point sets, concatenation, union, repetition) and unanchored ends get "any characters";
`pattern_tree.emit` writes each code point set as one JSON-encoded unit, and
`pattern_length.limit_length` intersects the tree with minLength/maxLength exactly.

Supported: literals, escapes (\\d \\D \\w \\W \\s \\S \\t \\n \\r \\f \\v \\0 \\xHH \\uHHHH \\u{H..}
and escaped punctuation), classes with ranges and negation, `.`, groups (plain, `(?:`, named),
`|`, greedy and lazy quantifiers, `^`/`$` anywhere (mid-pattern ones, as in `(^|\\.)example$`,
are read by the automaton), and lookaheads right after a leading `^` (also ending in `$`). Code
points are matched as Unicode code points (the `u` flag semantics). Rejected: other lookaround,
backreferences, word boundaries, `\\p{..}`, `\\cX`.
"""

from __future__ import annotations

from radixgen.constrained.pattern_automaton import And, Leaf, Not, language_tree
from radixgen.constrained.pattern_length import PatternError
from radixgen.constrained.pattern_tree import (
    ANY_TEXT,
    Anchor,
    CodePoints,
    Concat,
    Ranges,
    Repeat,
    Union,
)
from radixgen.constrained.regex_text import complement_ranges, normalize_ranges

__all__ = ["PatternError", "parse_pattern"]

_DIGITS: Ranges = ((0x30, 0x39),)
_WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE: Ranges = tuple(
    normalize_ranges(
        [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A)]
        + [(0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)]
        + [(0xFEFF, 0xFEFF)]
    )
)
_LINE_TERMINATORS = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))
_CONTROL_ESCAPES = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C, "v": 0x0B, "0": 0x00}
_SYNTAX_CHARS = set("^$\\.*+?()[]{}|/-")


def parse_pattern(pattern: str) -> object:
    """The search semantics of `pattern` as a whole-string tree.

    Lookaheads right after a leading `^` (`^(?=.*[0-9])(?!.*admin).{8,}$`, the usual password
    rules) assert something about the whole string, so they are intersections of languages:
    the result is then computed by automaton (`pattern_automaton`), still exactly.
    """
    parser = _Parser(pattern)
    try:
        alternatives = parser.parse_top_level()
    except IndexError:  # the pattern ended inside a construct
        raise PatternError(f"pattern {pattern!r} ends too early") from None
    languages, plain = [], True
    for anchored_start, lookaheads, body, anchored_end in alternatives:
        items = (
            ([] if anchored_start else [ANY_TEXT]) + [body] + ([] if anchored_end else [ANY_TEXT])
        )
        parts = [Leaf(Concat(tuple(items)))]
        parts += [Leaf(tree) if positive else Not(Leaf(tree)) for positive, tree in lookaheads]
        plain = plain and not lookaheads
        languages.append(parts[0] if len(parts) == 1 else And(tuple(parts)))
    if plain:
        trees = [language.tree for language in languages]
        tree = trees[0] if len(trees) == 1 else Union(tuple(trees))
        if not parser.has_anchors:
            return tree
        languages = [Leaf(tree)]  # anchors mid-pattern: the automaton removes them
    # A or B = not (not A and not B): the language algebra has only And and Not.
    either = languages[0] if len(languages) == 1 else Not(And(tuple(Not(x) for x in languages)))
    tree = language_tree(either)
    return CodePoints(()) if tree is None else tree  # an empty class: no string matches


class _Parser:
    """Recursive-descent parser for the supported ECMA-262 subset."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        self.index = 0
        self.has_anchors = False  # `^`/`$` inside the pattern, not only at its ends

    def parse_top_level(self) -> list[tuple[bool, list, object, bool]]:
        """(anchored at the start, lookaheads, body, anchored at the end) per alternative."""
        alternatives = []
        while True:
            anchored_start = self._take("^")
            lookaheads = []
            while anchored_start and self.pattern.startswith(("(?=", "(?!"), self.index):
                lookaheads.append(self._parse_lookahead())
            body, anchored_end = self._parse_sequence(top_level=True)
            alternatives.append((anchored_start, lookaheads, body, anchored_end))
            if not self._take("|"):
                break
        if self.index != len(self.pattern):
            self._fail("unbalanced ')'")
        return alternatives

    def _parse_lookahead(self) -> tuple[bool, object]:
        """(positive, the strings from here that satisfy it) for `(?=...)` or `(?!...)`."""
        positive = self.pattern[self.index + 2] == "="
        self.index += 3
        options = []
        while True:
            body, anchored_end = self._parse_sequence(top_level=True, closing=")")
            options.append(body if anchored_end else Concat((body, ANY_TEXT)))
            if not self._take("|"):
                break
        if not self._take(")"):
            self._fail("missing ')' after a lookahead")
        return positive, options[0] if len(options) == 1 else Union(tuple(options))

    def _parse_alternation(self) -> object:
        options = [self._parse_sequence(top_level=False)[0]]
        while self._take("|"):
            options.append(self._parse_sequence(top_level=False)[0])
        return options[0] if len(options) == 1 else Union(tuple(options))

    def _parse_sequence(self, top_level: bool, closing: str = "") -> tuple[object, bool]:
        items = []
        while self.index < len(self.pattern) and self._peek() not in "|)":
            if self._peek() == "$":
                self.index += 1
                at_end = self.index == len(self.pattern) or self._peek() in "|" + closing
                if top_level and at_end:
                    return Concat(tuple(items)), True
                items.append(Anchor(at_start=False))  # mid-pattern: read by the automaton
                self.has_anchors = True
                continue
            if self._peek() == "^":
                self.index += 1
                items.append(Anchor(at_start=True))
                self.has_anchors = True
                continue
            items.append(self._parse_quantified())
        return Concat(tuple(items)), False

    def _parse_quantified(self) -> object:
        atom = self._parse_atom()
        while self.index < len(self.pattern) and self._peek() in "*+?{":
            char = self._peek()
            if char == "{":
                bounds = self._parse_braces()
                if bounds is None:
                    break
                low, high = bounds
            else:
                self.index += 1
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
            self._take("?")  # lazy: same language
            atom = Repeat(atom, low, high)
        return atom

    def _parse_braces(self) -> tuple[int, int | None] | None:
        end = self.pattern.find("}", self.index)
        body = self.pattern[self.index + 1 : end] if end != -1 else ""
        low_text, comma, high_text = body.partition(",")
        if end == -1 or not low_text.isdigit() or (high_text and not high_text.isdigit()):
            self._fail("a '{' that is not a quantifier")
        self.index = end + 1
        low = int(low_text)
        high = int(high_text) if high_text else (None if comma else low)
        if high is not None and high < low:
            self._fail("quantifier {n,m} with m < n")
        return low, high

    def _parse_atom(self) -> object:
        char = self._peek()
        if char == "(":
            return self._parse_group()
        if char == "[":
            return CodePoints(self._parse_class())
        if char == ".":
            self.index += 1
            return CodePoints(tuple(complement_ranges(_LINE_TERMINATORS)))
        if char == "\\":
            return CodePoints(self._parse_escape(in_class=False))
        if char in "*+?{}]":
            self._fail(f"unexpected {char!r}")
        self.index += 1
        code_point = ord(char)
        return CodePoints(((code_point, code_point),))

    def _parse_group(self) -> object:
        self.index += 1
        if self.pattern.startswith("?:", self.index):
            self.index += 2
        elif self.pattern.startswith("?<", self.index) and self.pattern[self.index + 2] not in "=!":
            close = self.pattern.find(">", self.index)
            if close == -1:
                self._fail("a group name without '>'")
            self.index = close + 1
        elif self._peek() == "?":
            self._fail("lookaround is supported only right after a leading '^'")
        inner = self._parse_alternation()
        if not self._take(")"):
            self._fail("missing ')'")
        return inner

    def _parse_class(self) -> Ranges:
        self.index += 1
        negated = self._take("^")
        ranges: list[tuple[int, int]] = []
        while not self._take("]"):
            if self.index >= len(self.pattern):
                self._fail("missing ']'")
            low_set = self._parse_class_atom()
            is_range = self._peek() == "-" and self.pattern[self.index + 1 : self.index + 2] != "]"
            if is_range and len(low_set) == 1 and low_set[0][0] == low_set[0][1]:
                self.index += 1
                high_set = self._parse_class_atom()
                if len(high_set) != 1 or high_set[0][0] != high_set[0][1]:
                    self._fail("class range with a class escape as its end")
                if high_set[0][0] < low_set[0][0]:
                    self._fail("class range out of order")
                ranges.append((low_set[0][0], high_set[0][0]))
            else:
                ranges.extend(low_set)
        ranges = normalize_ranges(ranges)
        return tuple(complement_ranges(ranges) if negated else ranges)

    def _parse_class_atom(self) -> Ranges:
        if self._peek() == "\\":
            return self._parse_escape(in_class=True)
        code_point = ord(self._peek())
        self.index += 1
        return ((code_point, code_point),)

    def _parse_escape(self, in_class: bool) -> Ranges:
        self.index += 1
        if self.index >= len(self.pattern):
            self._fail("pattern ends with '\\'")
        char = self._peek()
        self.index += 1
        classes = {"d": _DIGITS, "w": _WORD, "s": _SPACE}
        if char.lower() in classes:
            ranges = classes[char.lower()]
            return tuple(complement_ranges(ranges)) if char.isupper() else ranges
        if char in _CONTROL_ESCAPES and not (char == "0" and self._peek_is_digit()):
            return _single(_CONTROL_ESCAPES[char])
        if char == "b" and in_class:
            return _single(0x08)
        if char == "x":
            return _single(self._parse_hex(2))
        if char == "u":
            if self._take("{"):
                end = self.pattern.find("}", self.index)
                if end == -1:
                    self._fail("missing '}' in \\u{...}")
                value = self._hex_value(self.pattern[self.index : end])
                self.index = end + 1
                return _single(value)
            return _single(self._parse_hex(4))
        if char in _SYNTAX_CHARS or (char.isascii() and not char.isalnum() and char != "_"):
            return _single(ord(char))  # an escaped punctuation character is itself
        self._fail(f"escape '\\{char}' is not supported")

    def _parse_hex(self, width: int) -> int:
        value = self._hex_value(self.pattern[self.index : self.index + width])
        self.index += width
        return value

    def _hex_value(self, text: str) -> int:
        if not text or any(char not in "0123456789abcdefABCDEF" for char in text):
            self._fail(f"bad hex escape {text!r}")
        return int(text, 16)

    def _peek_is_digit(self) -> bool:
        return self.index < len(self.pattern) and self.pattern[self.index].isdigit()

    def _peek(self) -> str:
        return self.pattern[self.index]

    def _take(self, text: str) -> bool:
        if self.pattern.startswith(text, self.index):
            self.index += len(text)
            return True
        return False

    def _fail(self, reason: str):
        raise PatternError(f"pattern {self.pattern!r} at offset {self.index}: {reason}")


def _single(code_point: int) -> Ranges:
    return ((code_point, code_point),)
