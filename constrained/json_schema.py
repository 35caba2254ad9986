"""JSON Schema (draft 2020-12, 2019-09, 7, 6, 4) to a regex matching exactly the allowed texts.

The rule: every keyword we accept is enforced exactly: no value the schema forbids ever matches.
A known assertion keyword we cannot write exactly, in the form given, is refused with an
`UnsupportedSchemaError` naming it and its JSON path; a schema no value satisfies raises its
subclass `UnsatisfiableSchemaError` naming the contradiction. Unknown keywords are annotations
and are ignored, as JSON Schema says. Where several spellings of one value exist, the regex may
allow only some of them (for example integers never as `-0` or `1.0`, object keys in one
order).

How it works: a schema and its applicators are expanded into alternatives, each a list of
applicator-free pieces that must all hold (`schema_expansion`, with exact negation for `not`,
`if`, `oneOf` in `schema_negation`); each alternative is merged into one `MergedSchema`
(`schema_merge`) and written per JSON type (`schema_containers`, `schema_scalars`,
`string_schema`). Subschemas are translated lazily, so recursive `$ref`s are cut at
`max_recursion_depth` expansions of one target along an instance path (deeper instances are not
produced).

Output shape (documented for users): compact by default (no whitespace between tokens); object
keys in declared `properties` order, then required keys not declared, then additional keys.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

from radixgen.constrained.json_value_regex import any_value_regex, literal_regex
from radixgen.constrained.regex_text import alternation
from radixgen.constrained.schema_containers import (
    array_schema_regex,
    object_schema_regex,
    value_spellings,
)
from radixgen.constrained.schema_diagnosis import explain_unsatisfiable
from radixgen.constrained.schema_expansion import SchemaExpander, merge_alternative
from radixgen.constrained.schema_keywords import RefDepths, dialect_of
from radixgen.constrained.schema_merge import NOT_VALUES, MergedSchema, Part, json_equal, json_type
from radixgen.constrained.schema_scalars import scalar_regex
from radixgen.constrained.unsupported import UnsatisfiableSchemaError, UnsupportedSchemaError

# A larger regex is rejected: automaton compilation time grows with it (sizes in the docs).
MAX_REGEX_CHARS = 2_000_000


@dataclass(frozen=True)
class SchemaRegexOptions:
    """How the regex is written.

    whitespace: regex for optional whitespace between tokens ("" = compact).
    max_recursion_depth: expansions of one recursive `$ref` target along an instance path.
    any_value_depth: container nesting allowed where the schema allows any JSON value.
    allow_undeclared_properties: follow JSON Schema's default for objects that declare
        properties but say nothing about others (any extra property with any value). When
        False, such objects get no extra properties; objects declaring no properties at all,
        and `additionalProperties` given explicitly, are unaffected.
    assert_formats: enforce known `format`s (the format-assertion vocabulary). False reads
        every `format` as an annotation, as JSON Schema 2019-09+ does by default.
    """

    whitespace: str = ""
    max_recursion_depth: int = 3
    any_value_depth: int = 2
    allow_undeclared_properties: bool = False
    assert_formats: bool = True


def json_schema_to_regex(
    schema: object,
    whitespace: str | None = None,
    *,
    max_recursion_depth: int = 3,
    any_value_depth: int = 2,
    allow_undeclared_properties: bool = False,
    assert_formats: bool = True,
) -> str:
    """Translate a JSON Schema into a regex matching exactly the JSON texts it allows.

    Args:
        schema: a dict (or bool), a JSON string, or a pydantic model class.
        whitespace: regex for optional whitespace between JSON tokens; None means none (compact).
        max_recursion_depth: how many times one `$ref` target may nest inside itself.
        any_value_depth: nesting depth of arrays/objects where any JSON value is allowed.
        allow_undeclared_properties: allow extra properties in objects that declare properties
            but not `additionalProperties` (JSON Schema's default). False (the default)
            produces only the declared ones there, a strict subset that keeps output focused.
        assert_formats: enforce the `format`s we know (default); False ignores every `format`.

    Returns:
        A regex (Python `re` / Rust regex-automata common dialect) for `re.fullmatch`.

    Raises:
        UnsupportedSchemaError: a keyword cannot be enforced exactly (named with its path).
        UnsatisfiableSchemaError: (a subclass) no value satisfies the schema, e.g.
            `minimum: 10, maximum: 1`; names the contradicting keyword and its path.
        ValueError: `schema` or `whitespace` is malformed.
    """
    root = _load_schema(schema)
    if whitespace is not None:
        if not isinstance(whitespace, str):
            raise TypeError(f"whitespace must be a regex string or None, got {whitespace!r}")
        try:
            re.compile(whitespace)
        except re.error as error:
            raise ValueError(f"whitespace is not a valid regex: {error}") from error
    for name, value in (
        ("max_recursion_depth", max_recursion_depth),
        ("any_value_depth", any_value_depth),
    ):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    options = SchemaRegexOptions(
        whitespace=f"(?:{whitespace})" if whitespace else "",
        max_recursion_depth=max_recursion_depth,
        any_value_depth=any_value_depth,
        allow_undeclared_properties=bool(allow_undeclared_properties),
        assert_formats=bool(assert_formats),
    )
    translator = SchemaTranslator(root, options)
    try:
        regex = translator.translate(((root, "#"),), ())
    except RecursionError:
        # Subschemas are translated recursively; a schema nested this deep is refused whole.
        raise UnsupportedSchemaError("schema", "#", "nested too deeply to translate") from None
    if regex is None:
        raise UnsatisfiableSchemaError(*explain_unsatisfiable(translator.expander, root))
    if len(regex) > MAX_REGEX_CHARS:
        reason = f"the regex would have {len(regex)} characters (limit {MAX_REGEX_CHARS})"
        raise UnsupportedSchemaError("schema", "#", reason)
    return regex


def _load_schema(schema: object) -> object:
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except json.JSONDecodeError as error:
            raise ValueError(f"schema is not valid JSON: {error}") from error
    if isinstance(schema, (dict, bool)):
        return schema
    raise TypeError(
        f"schema must be a dict, a JSON string or a pydantic model class, got {type(schema)}"
    )


class SchemaTranslator:
    """Translates subschemas of one root schema; memoises by (parts, $ref depths)."""

    def __init__(self, root: object, options: SchemaRegexOptions):
        self.root = root
        self.options = options
        self.ws = options.whitespace
        self.expander = SchemaExpander(
            root,
            dialect_of(root),
            max_recursion_depth=options.max_recursion_depth,
            assert_formats=options.assert_formats,
        )
        # Keyed by each part's path and identity (synthetic parts share paths with real ones);
        # the value keeps the parts alive so that identities stay unique.
        self._memo: dict[tuple, tuple[str | None, tuple[Part, ...]]] = {}
        self._compact: SchemaTranslator | None = None if self.ws else self

    def translate(self, parts: tuple[Part, ...], ref_depths: RefDepths) -> str | None:
        """Regex for instances satisfying all `parts` (None: no instance does)."""
        if not parts:
            return any_value_regex(self.options.any_value_depth, self.ws)
        key = (tuple((path, _identity(schema)) for schema, path in parts), ref_depths)
        if key not in self._memo:
            alternatives = self.expander.expand_all(parts, ref_depths)
            regexes = [self.alternative_regex(pieces, depths) for pieces, depths in alternatives]
            self._memo[key] = (alternation(regexes), parts)
        return self._memo[key][0]

    def merged(self, pieces: tuple[Part, ...]) -> MergedSchema:
        return merge_alternative(pieces)

    # ---- one alternative, per JSON type ----

    def alternative_regex(self, pieces: tuple[Part, ...], ref_depths: RefDepths) -> str | None:
        merged = self.merged(pieces)
        if merged.enum is not None:
            return self._enum_regex(merged, ref_depths)
        return self.merged_regex(merged, ref_depths)

    def merged_regex(self, merged: MergedSchema, ref_depths: RefDepths) -> str | None:
        types = sorted(merged.types)
        if "number" in merged.types and "integer" in merged.types:
            types.remove("integer")  # the number regex already spells every integer
        _check_excluded_containers(merged)
        return alternation(self._type_regex(name, merged, ref_depths) for name in types)

    def _enum_regex(self, merged: MergedSchema, ref_depths: RefDepths) -> str | None:
        """The enum values that also satisfy every other keyword of the alternative."""
        candidates = [
            value
            for value in merged.enum
            if json_type(value) in merged.types
            and not any(json_equal(value, excluded) for excluded in merged.excluded)
        ]
        if not candidates:
            return None
        rest = replace(merged, enum=None, excluded=[])
        rest_regex = self.compact_translator().merged_regex(rest, ref_depths)
        if rest_regex is None:
            return None
        checker = re.compile(rest_regex)
        kept = [
            value for value in candidates if any(map(checker.fullmatch, value_spellings(value)))
        ]
        return alternation(literal_regex(value, self.ws) for value in kept)

    def _type_regex(self, name: str, merged: MergedSchema, ref_depths: RefDepths) -> str | None:
        if name == "array":
            return array_schema_regex(self, merged, ref_depths)
        if name == "object":
            return object_schema_regex(self, merged, ref_depths)
        return scalar_regex(name, merged)

    def compact_translator(self) -> SchemaTranslator:
        """A translator with compact whitespace, for checking values against compact regexes."""
        if self._compact is None:
            self._compact = SchemaTranslator(self.root, replace(self.options, whitespace=""))
        return self._compact


def _check_excluded_containers(merged: MergedSchema) -> None:
    """A negated array/object `const` would need a regex for "any value but this one"."""
    for value in merged.excluded:
        if json_type(value) in ("array", "object") and json_type(value) in merged.types:
            path = merged.keyword_paths.get(NOT_VALUES, "#")
            reason = "excluding an array or object value (not/oneOf/if of a const or enum)"
            raise UnsupportedSchemaError("not", path, reason)


def _identity(schema: object) -> object:
    """A memo key for a part's schema: booleans by value, anything else by identity."""
    return schema if isinstance(schema, bool) else id(schema)


__all__ = [
    "SchemaRegexOptions",
    "UnsatisfiableSchemaError",
    "UnsupportedSchemaError",
    "json_schema_to_regex",
]
