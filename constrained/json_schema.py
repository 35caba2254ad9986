"""JSON Schema (draft 2020-12) to a regex that matches exactly the allowed JSON texts.

The rule: every keyword we accept is enforced exactly; any other keyword is rejected with an
`UnsupportedSchemaError` naming it and its JSON path. Annotations (title, description, ...)
constrain nothing and are ignored. Where several spellings of one value exist, the regex may
allow only some of them (for example integers never as `-0` or `1.0`, object keys in one
order), but it never allows a value the schema forbids.

How it works: a schema and its applicators (`allOf`, `anyOf`, `oneOf`, `$ref`) are expanded into
alternatives, each a list of applicator-free pieces that must all hold (`schema_merge`); each
alternative is merged into one `MergedSchema` and written per JSON type (`json_value_regex`,
`json_string`, `ecma_pattern`, `regex_ranges`). Subschemas are translated lazily, so recursive
`$ref`s are cut at `max_recursion_depth` expansions of one target along an instance path (deeper
instances are not produced).

Output shape (documented for users): compact by default (no whitespace between tokens); object
keys in declared `properties` order, then required keys not declared, then additional keys.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace

from radixgen.constrained.json_value_regex import (
    SCALAR_REGEXES,
    any_value_regex,
    literal_regex,
)
from radixgen.constrained.regex_ranges import (
    integer_bounds,
    integer_multiple_regex,
    integer_range_regex,
    number_range_regex,
)
from radixgen.constrained.regex_text import alternation
from radixgen.constrained.schema_containers import (
    array_schema_regex,
    object_schema_regex,
    value_spellings,
)
from radixgen.constrained.schema_disjoint import provably_disjoint
from radixgen.constrained.schema_keywords import RefDepths, check_keywords, local_piece
from radixgen.constrained.schema_merge import (
    MergeConflict,
    MergedSchema,
    Part,
    json_type,
    merge_pieces,
)
from radixgen.constrained.schema_refs import RefResolver
from radixgen.constrained.string_schema import string_schema_regex
from radixgen.constrained.unsupported import UnsupportedSchemaError

# An anyOf/oneOf/allOf product with more alternatives than this is rejected, not built.
MAX_ALTERNATIVES = 64
# A larger regex is rejected: automaton compilation time grows with it (sizes in the docs).
MAX_REGEX_CHARS = 2_000_000

# One alternative: the applicator-free pieces that must all hold, and the $ref expansion counts.
Alternative = tuple[tuple[Part, ...], RefDepths]


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
    """

    whitespace: str = ""
    max_recursion_depth: int = 3
    any_value_depth: int = 2
    allow_undeclared_properties: bool = False


def json_schema_to_regex(
    schema: object,
    whitespace: str | None = None,
    *,
    max_recursion_depth: int = 3,
    any_value_depth: int = 2,
    allow_undeclared_properties: bool = False,
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

    Returns:
        A regex (Python `re` / Rust regex-automata common dialect) for `re.fullmatch`.

    Raises:
        UnsupportedSchemaError: a keyword cannot be enforced exactly, or nothing is allowed.
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
    )
    regex = SchemaTranslator(root, options).translate(((root, "#"),), ())
    if regex is None:
        raise UnsupportedSchemaError("schema", "#", "no JSON value satisfies this schema")
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
    """Translates subschemas of one root schema; memoises by (paths, $ref depths)."""

    def __init__(self, root: object, options: SchemaRegexOptions):
        self.root = root
        self.options = options
        self.ws = options.whitespace
        self.refs = RefResolver(root)
        self._memo: dict[tuple, str | None] = {}
        self._compact: SchemaTranslator | None = None if self.ws else self

    def translate(self, parts: tuple[Part, ...], ref_depths: RefDepths) -> str | None:
        """Regex for instances satisfying all `parts` (None: no instance does)."""
        if not parts:
            return any_value_regex(self.options.any_value_depth, self.ws)
        key = (tuple(path for _, path in parts), ref_depths)
        if key not in self._memo:
            alternatives = self._expand_all(parts, ref_depths)
            regexes = [self.alternative_regex(pieces, depths) for pieces, depths in alternatives]
            self._memo[key] = alternation(regexes)
        return self._memo[key]

    def merged(self, pieces: tuple[Part, ...]) -> MergedSchema:
        try:
            return merge_pieces(list(pieces))
        except MergeConflict as conflict:
            raise UnsupportedSchemaError(conflict.keyword, conflict.path, str(conflict)) from None

    # ---- expansion of applicators into alternatives ----

    def _expand_all(self, parts: tuple[Part, ...], ref_depths: RefDepths) -> list[Alternative]:
        alternatives: list[Alternative] = [((), ref_depths)]
        for schema, path in parts:
            alternatives = self._product(alternatives, self._expand(schema, path, ref_depths), path)
        return alternatives

    def _expand(self, schema: object, path: str, ref_depths: RefDepths) -> list[Alternative]:
        if schema is True:
            return [((), ref_depths)]
        if schema is False:
            return []
        check_keywords(schema, path, is_root=schema is self.root)
        alternatives: list[Alternative] = [(((local_piece(schema, path), path),), ref_depths)]
        if "$ref" in schema:
            target, target_path = self.refs.resolve(schema["$ref"], f"{path}/$ref")
            count = dict(ref_depths).get(target_path, 0)
            if count >= self.options.max_recursion_depth:
                return []  # recursion cut: deeper instances are not produced
            deeper = tuple(sorted({**dict(ref_depths), target_path: count + 1}.items()))
            alternatives = self._product(
                alternatives, self._expand(target, target_path, deeper), path
            )
        for index, sub in enumerate(schema.get("allOf", [])):
            sub_alternatives = self._expand(sub, f"{path}/allOf/{index}", ref_depths)
            alternatives = self._product(alternatives, sub_alternatives, path)
        if "anyOf" in schema:
            union = []
            for index, sub in enumerate(schema["anyOf"]):
                union += self._expand(sub, f"{path}/anyOf/{index}", ref_depths)
            alternatives = self._product(alternatives, union, f"{path}/anyOf")
        if "oneOf" in schema:
            alternatives = self._expand_one_of(schema["oneOf"], alternatives, path, ref_depths)
        return alternatives

    def _expand_one_of(
        self, branches: list, base: list[Alternative], path: str, ref_depths: RefDepths
    ) -> list[Alternative]:
        """oneOf as anyOf, accepted only when no instance can match two branches."""
        per_branch = [
            self._product(base, self._expand(sub, f"{path}/oneOf/{index}", ref_depths), path)
            for index, sub in enumerate(branches)
        ]
        merged = [
            [self.merged(pieces) for pieces, _ in alternatives] for alternatives in per_branch
        ]
        for first in range(len(per_branch)):
            for second in range(first + 1, len(per_branch)):
                for left in merged[first]:
                    for right in merged[second]:
                        if not provably_disjoint(left, right):
                            raise UnsupportedSchemaError(
                                "oneOf",
                                path,
                                f"branches {first} and {second} may overlap; use anyOf if "
                                "they are exclusive",
                            )
        return [alternative for alternatives in per_branch for alternative in alternatives]

    def _product(
        self, left: list[Alternative], right: list[Alternative], path: str
    ) -> list[Alternative]:
        if len(left) * len(right) > MAX_ALTERNATIVES:
            raise UnsupportedSchemaError(
                "anyOf", path, f"more than {MAX_ALTERNATIVES} alternatives after expansion"
            )
        result = []
        for left_pieces, left_depths in left:
            for right_pieces, right_depths in right:
                depths = dict(left_depths)
                for target, count in right_depths:
                    depths[target] = max(depths.get(target, 0), count)
                result.append((left_pieces + right_pieces, tuple(sorted(depths.items()))))
        return result

    # ---- one alternative, per JSON type ----

    def alternative_regex(self, pieces: tuple[Part, ...], ref_depths: RefDepths) -> str | None:
        merged = self.merged(pieces)
        if merged.enum is not None:
            return self._enum_regex(merged, ref_depths)
        return self.merged_regex(merged, ref_depths)

    def merged_regex(self, merged: MergedSchema, ref_depths: RefDepths) -> str | None:
        types = sorted(merged.types)
        if "number" in merged.types:
            types.remove("integer")  # the number regex already spells every integer
        return alternation(self._type_regex(name, merged, ref_depths) for name in types)

    def _enum_regex(self, merged: MergedSchema, ref_depths: RefDepths) -> str | None:
        """The enum values that also satisfy every other keyword of the alternative."""
        candidates = [v for v in merged.enum if _type_allows(merged.types, json_type(v))]
        if not candidates:
            return None
        rest = replace(merged, enum=None)
        rest_regex = self.compact_translator().merged_regex(rest, ref_depths)
        if rest_regex is None:
            return None
        checker = re.compile(rest_regex)
        kept = [
            value for value in candidates if any(map(checker.fullmatch, value_spellings(value)))
        ]
        return alternation(literal_regex(value, self.ws) for value in kept)

    def _type_regex(self, name: str, merged: MergedSchema, ref_depths: RefDepths) -> str | None:
        if name in ("null", "boolean"):
            return SCALAR_REGEXES[name]
        if merged.multiple_of and name in ("integer", "number"):
            return _multiples_regex(merged)
        if name == "integer":
            return integer_range_regex(*integer_bounds(merged.lower, merged.upper))
        if name == "number":
            if merged.lower is None and merged.upper is None:
                return SCALAR_REGEXES["number"]
            return number_range_regex(merged.lower, merged.upper)
        if name == "string":
            return string_schema_regex(merged)
        if name == "array":
            return array_schema_regex(self, merged, ref_depths)
        return object_schema_regex(self, merged, ref_depths)

    def compact_translator(self) -> SchemaTranslator:
        """A translator with compact whitespace, for checking values against compact regexes."""
        if self._compact is None:
            self._compact = SchemaTranslator(self.root, replace(self.options, whitespace=""))
        return self._compact


def _multiples_regex(merged: MergedSchema) -> str | None:
    """Numbers divisible by every multipleOf: integers, since each divisor is an integer here."""
    path = merged.keyword_paths["multipleOf"]
    divisor = 1
    for step in merged.multiple_of:
        if step.denominator != 1 and "number" in merged.types:
            reason = "a fractional multipleOf on 'number' is not supported"
            raise UnsupportedSchemaError("multipleOf", path, reason)
        # An integer is a multiple of p/q (lowest terms) exactly when it is a multiple of p.
        divisor = math.lcm(divisor, step.numerator)
    try:
        return integer_multiple_regex(*integer_bounds(merged.lower, merged.upper), divisor)
    except ValueError as error:
        raise UnsupportedSchemaError("multipleOf", path, str(error)) from None


def _type_allows(types: frozenset[str], value_type: str) -> bool:
    return value_type in types or (value_type == "integer" and "number" in types)


__all__ = ["SchemaRegexOptions", "UnsupportedSchemaError", "json_schema_to_regex"]
