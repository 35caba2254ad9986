"""`patternProperties`: which schemas apply to which keys, as classes of keys.

JSON Schema applies every `patternProperties` schema whose pattern matches a key, and
`additionalProperties` only to keys that match no pattern and are not declared. So keys fall into
classes, one per set S of matching patterns: the keys matching exactly the patterns of S (and no
declared name) take the conjunction of S's schemas; the keys matching none take
`additionalProperties`. Each class's key language is an automaton combination
(`pattern_automaton`) of the patterns and their complements. Declared names that match a
pattern take that pattern's schema too.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import TYPE_CHECKING

from radixgen.constrained.ecma_pattern import parse_pattern
from radixgen.constrained.pattern_automaton import And, Leaf, Not, language_tree
from radixgen.constrained.pattern_length import PatternError
from radixgen.constrained.pattern_tree import CodePoints, Concat, Union, emit
from radixgen.constrained.schema_keywords import RefDepths
from radixgen.constrained.schema_merge import MergedSchema, Part
from radixgen.constrained.unsupported import UnsupportedSchemaError

if TYPE_CHECKING:
    from radixgen.constrained.json_schema import SchemaTranslator

# 2**n - 1 classes of keys for n patterns: more patterns are refused.
MAX_PATTERNS = 4


def matching_pattern_parts(merged: MergedSchema, name: str) -> list[Part]:
    """The schemas of the patterns that `name` matches."""
    encoded = json.dumps(name, ensure_ascii=False)
    return [
        part
        for pattern, part in merged.pattern_properties
        if re.fullmatch(_key_regex(_parse(pattern, merged)), encoded)
    ]


def pattern_member_classes(
    translator: SchemaTranslator,
    merged: MergedSchema,
    names: list[str],
    ref_depths: RefDepths,
    allow_others: bool,
) -> list[tuple[str | None, str | None]]:
    """(key regex, value regex) per class of additional keys (None: the class is empty).

    `allow_others`: produce keys matching no pattern (with `additionalProperties`, or any value
    where it is absent and undeclared properties are allowed).
    """
    path = merged.keyword_paths["patternProperties"]
    by_pattern: dict[str, list[Part]] = {}  # one pattern may come from several schemas
    for pattern, part in merged.pattern_properties:
        by_pattern.setdefault(pattern, []).append(part)
    patterns = list(by_pattern.items())
    if len(patterns) > MAX_PATTERNS:
        reason = f"more than {MAX_PATTERNS} patterns"
        raise UnsupportedSchemaError("patternProperties", path, reason)
    trees = [_parse(pattern, merged) for pattern, _ in patterns]
    not_declared = [Not(Leaf(_names_tree(names)))] if names else []
    classes = []
    for size in range(len(patterns) + 1):
        for chosen in itertools.combinations(range(len(patterns)), size):
            if not chosen and not allow_others:
                continue
            keys = [
                Leaf(trees[i]) if i in chosen else Not(Leaf(trees[i])) for i in range(len(trees))
            ]
            try:
                key_tree = language_tree(And(tuple(keys + not_declared)))
            except PatternError as error:
                raise UnsupportedSchemaError("patternProperties", path, str(error)) from None
            if key_tree is None:
                continue
            parts = [part for i in chosen for part in patterns[i][1]]
            if not chosen:
                parts = merged.additional_parts
            value = translator.translate(tuple(parts), ref_depths)
            classes.append((_key_regex(key_tree), value))
    return classes


def _parse(pattern: str, merged: MergedSchema) -> object:
    try:
        return parse_pattern(pattern)
    except PatternError as error:
        path = merged.keyword_paths["patternProperties"]
        raise UnsupportedSchemaError("patternProperties", path, str(error)) from None


def _names_tree(names: list[str]) -> object:
    return Union(
        tuple(Concat(tuple(CodePoints(((ord(c), ord(c)),)) for c in name)) for name in names)
    )


def _key_regex(tree: object) -> str | None:
    body = emit(tree)
    return None if body is None else f'"{body}"'
