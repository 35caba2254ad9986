"""The regex for the string branch of a merged schema: lengths, `pattern`s, `format`, exclusions.

One `pattern` (or one `format`) is parsed into a tree and intersected with the lengths. Several
patterns, a `pattern` next to a `format`, patterns that must fail (negation) and excluded values
next to any of these are combined exactly as languages (`pattern_automaton`) first.
"""

from __future__ import annotations

import functools

from radixgen.constrained.ecma_pattern import parse_pattern
from radixgen.constrained.json_formats import ENCODED_FORMATS, FORMAT_REGEXES
from radixgen.constrained.json_string import string_regex
from radixgen.constrained.pattern_automaton import And, Leaf, Not, language_tree
from radixgen.constrained.pattern_length import PatternError, cap_length, limit_length
from radixgen.constrained.pattern_tree import ANY_TEXT, CodePoints, Concat, Repeat, Union, emit
from radixgen.constrained.schema_merge import NOT_PATTERNS, NOT_VALUES, MergedSchema
from radixgen.constrained.unsupported import UnsupportedSchemaError

# Lengths up to this are intersected inside the automaton (states grow with the length).
_MAX_LENGTH_IN_AUTOMATON = 64


def string_schema_regex(merged: MergedSchema, excluded: list[str] = ()) -> str | None:
    """JSON strings satisfying the string keywords of `merged`, none equal to `excluded`.

    Raises:
        UnsupportedSchemaError: a pattern we cannot parse, a combination too large to write, or
            lengths that cut a pattern in a way we cannot write (not even as a capped subset).
    """
    min_length, max_length = merged.min_length, merged.max_length
    paths = merged.keyword_paths
    positive: list[tuple[object, str, str]] = []  # (tree, keyword, path)
    for pattern in merged.patterns:
        positive.append((_parse(pattern, "pattern", paths["pattern"]), "pattern", paths["pattern"]))
    if merged.format is not None:
        positive.append((_format_tree(merged.format), "format", paths["format"]))
    negative = [
        (_parse(pattern, "not", paths[NOT_PATTERNS]), "not", paths[NOT_PATTERNS])
        for pattern in merged.not_patterns
    ]
    if excluded:
        literals = Union(tuple(_literal_tree(value) for value in excluded))
        negative.append((literals, "not", paths.get(NOT_VALUES, "#")))
    if not positive and not negative:
        return string_regex(min_length, max_length)
    if len(positive) == 1 and not negative:
        tree, keyword, path = positive[0]
        if keyword == "format":
            try:
                return _format_regex(merged.format, min_length, max_length)
            except UnsupportedSchemaError as error:  # (cached without the schema's path)
                raise type(error)(keyword, path, error.reason) from None
    else:
        keyword, path = (positive or negative)[0][1:]
        parts = [Leaf(tree) for tree, _, _ in positive] or [Leaf(ANY_TEXT)]
        parts += [Not(Leaf(tree)) for tree, _, _ in negative]
        if max_length is not None and max_length <= _MAX_LENGTH_IN_AUTOMATON:
            # Short enough to count in the automaton: the written tree is then exact.
            parts.append(Leaf(Repeat(ANY_TEXT.item, min_length, max_length)))
        try:
            tree = language_tree(And(tuple(parts)))
        except PatternError as error:
            raise UnsupportedSchemaError(keyword, path, str(error)) from None
        if tree is None:
            return None
    return _quoted(_within_lengths(tree, min_length, max_length, keyword, path))


@functools.lru_cache(maxsize=64)
def _format_tree(format_name: str) -> object:
    """The parsed tree of a `format`'s regex (immutable, so shared between schemas)."""
    return parse_pattern(f"^{FORMAT_REGEXES[format_name]}$")


@functools.lru_cache(maxsize=256)
def _format_regex(format_name: str, min_length: int, max_length: int | None) -> str | None:
    """A JSON string of `format` within the lengths. Cached: the same in every schema, and
    parsing plus re-emitting a format with escapes (email) took ~17 ms of a person schema's
    ~18 ms translation (CPU machine), on the critical path of each never-seen schema."""
    plain_text = format_name not in ENCODED_FORMATS
    if plain_text and min_length == 0 and max_length is None:
        return f'"{FORMAT_REGEXES[format_name]}"'  # ASCII without '"' or '\': as is
    tree = _format_tree(format_name)
    return _quoted(_within_lengths(tree, min_length, max_length, "format", "#"))


def _parse(pattern: str, keyword: str, path: str) -> object:
    try:
        return parse_pattern(pattern)
    except PatternError as error:
        raise UnsupportedSchemaError(keyword, path, str(error)) from None


def _literal_tree(text: str) -> object:
    return Concat(tuple(CodePoints(((ord(char), ord(char)),)) for char in text))


def _within_lengths(tree: object, min_length: int, max_length: int | None, keyword: str, path: str):
    """`tree` within the lengths: exactly where possible, else with capped repetitions.

    The cap (`cap_length`) keeps a strict subset: every unbounded repetition gets the largest
    common count that keeps each match within `maxLength` (e.g. a Kubernetes name pattern with
    `maxLength: 253`). Only when no cap fits is the keyword refused.
    """
    if min_length == 0 and max_length is None:
        return tree
    try:
        return limit_length(tree, min_length, max_length)
    except PatternError as error:
        capped = cap_length(tree, min_length, max_length)
        if capped is None:
            raise UnsupportedSchemaError(keyword, path, f"with a length: {error}") from None
        return capped


def _quoted(tree: object | None) -> str | None:
    body = None if tree is None else emit(tree)
    return None if body is None else f'"{body}"'
