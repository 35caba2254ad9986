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
    try:
        tree = limit_length(parse_pattern(merged.pattern), min_length, max_length)
    except PatternError as error:
        raise UnsupportedSchemaError(
            "pattern", merged.keyword_paths["pattern"], str(error)
        ) from None
    return _quoted(tree)


def _format_regex(merged: MergedSchema, min_length: int, max_length: int | None) -> str | None:
    path = merged.keyword_paths["format"]
    if merged.format not in FORMAT_REGEXES:
        raise UnsupportedSchemaError("format", path, f"format {merged.format!r}")
    if merged.pattern is not None:
        raise UnsupportedSchemaError("pattern", path, "pattern together with format")
    regex = FORMAT_REGEXES[merged.format]
    if min_length == 0 and max_length is None:
        return f'"{regex}"'
    tree = parse_pattern(f"^{regex}$")
    try:
        return _quoted(limit_length(tree, min_length, max_length))
    except PatternError as error:
        # Formats are strict subsets anyway: bound their repetitions instead.
        capped = cap_length(tree, min_length, max_length)
        if capped is None:
            raise UnsupportedSchemaError("format", path, f"with a length: {error}") from None
        return _quoted(capped)


def _quoted(tree: object | None) -> str | None:
    body = None if tree is None else emit(tree)
    return None if body is None else f'"{body}"'
