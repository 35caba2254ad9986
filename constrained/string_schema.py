"""The regex for the string branch of a merged schema: lengths, `pattern` and `format`."""

from __future__ import annotations

from radixgen.constrained.ecma_pattern import parse_pattern
from radixgen.constrained.json_formats import FORMAT_REGEXES
from radixgen.constrained.json_string import string_regex
from radixgen.constrained.pattern_length import PatternError, cap_length, limit_length
from radixgen.constrained.pattern_tree import emit
from radixgen.constrained.schema_merge import MergedSchema
from radixgen.constrained.unsupported import UnsupportedSchemaError


def string_schema_regex(merged: MergedSchema) -> str | None:
    """JSON strings satisfying minLength/maxLength/pattern/format of `merged` (None: none do).

    Raises:
        UnsupportedSchemaError: an unknown format, pattern next to format, a pattern we cannot
            parse, or a pattern whose intersection with the lengths is not exact.
    """
    min_length, max_length = merged.min_length, merged.max_length
    if merged.format is not None:
        return _format_regex(merged, min_length, max_length)
    if merged.pattern is None:
        return string_regex(min_length, max_length)
    path = merged.keyword_paths["pattern"]
    try:
        tree = parse_pattern(merged.pattern)
    except PatternError as error:
        raise UnsupportedSchemaError("pattern", path, str(error)) from None
    return _quoted(_within_lengths(tree, min_length, max_length, "pattern", path))


def _within_lengths(tree: object, min_length: int, max_length: int | None, keyword: str, path: str):
    """`tree` within the lengths: exactly where possible, else with capped repetitions.

    The cap (`cap_length`) keeps a strict subset: every unbounded repetition gets the largest
    common count that keeps each match within `maxLength` (e.g. a Kubernetes name pattern with
    `maxLength: 253`). Only when no cap fits is the keyword refused.
    """
    try:
        return limit_length(tree, min_length, max_length)
    except PatternError as error:
        capped = cap_length(tree, min_length, max_length)
        if capped is None:
            raise UnsupportedSchemaError(keyword, path, f"with a length: {error}") from None
        return capped


def _format_regex(merged: MergedSchema, min_length: int, max_length: int | None) -> str | None:
    path = merged.keyword_paths["format"]
    if merged.format not in FORMAT_REGEXES:
        raise UnsupportedSchemaError("format", path, f"format {merged.format!r}")
    if merged.pattern is not None:
        raise UnsupportedSchemaError("pattern", path, "pattern together with format")
    regex = FORMAT_REGEXES[merged.format]
    if min_length == 0 and max_length is None:
        return f'"{regex}"'
    return _quoted(
        _within_lengths(parse_pattern(f"^{regex}$"), min_length, max_length, "format", path)
    )


def _quoted(tree: object | None) -> str | None:
    body = None if tree is None else emit(tree)
    return None if body is None else f'"{body}"'
