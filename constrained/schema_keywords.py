"""Which JSON Schema keywords we enforce, which we ignore, and checks of their values.

Unknown keywords are annotations (JSON Schema's rule, and the `jsonschema` library's): vendor
extensions, `_format`, `readonly`, misspellings... are ignored. So are unknown `format` values.
Known assertion keywords are enforced exactly or refused by the translator with their path.

Older drafts are read in their own meaning: draft-4 `id` and boolean `exclusiveMinimum`/
`exclusiveMaximum`, `dependencies`, array-form `items` with `additionalItems`; `$schema`
selects the dialect where drafts disagree (`$ref` siblings are ignored up to draft 7; keywords
introduced in 2019-09 are plain annotations in older drafts).
"""

from __future__ import annotations

import enum

from radixgen.constrained.json_formats import FORMAT_REGEXES
from radixgen.constrained.schema_merge import ALL_TYPES, ARRAY_KEYWORDS
from radixgen.constrained.unsupported import UnsupportedSchemaError

# ($ref target path, expansions so far) pairs along one instance path, sorted.
RefDepths = tuple[tuple[str, int], ...]


class Dialect(enum.IntEnum):
    """The JSON Schema draft a document is written in (from its root `$schema`)."""

    DRAFT4 = 4
    DRAFT6 = 6
    DRAFT7 = 7
    DRAFT2019 = 2019
    DRAFT2020 = 2020


def dialect_of(root: object) -> Dialect:
    """The dialect named by the root `$schema`; 2020-12 when absent or unknown."""
    uri = root.get("$schema", "") if isinstance(root, dict) else ""
    uri = uri if isinstance(uri, str) else ""
    for marker, dialect in (
        ("draft-04", Dialect.DRAFT4),
        ("draft-03", Dialect.DRAFT4),
        ("draft-06", Dialect.DRAFT6),
        ("draft-07", Dialect.DRAFT7),
        ("2019-09", Dialect.DRAFT2019),
    ):
        if marker in uri:
            return dialect
    return Dialect.DRAFT2020


APPLICATORS = frozenset({"$ref", "allOf", "anyOf", "oneOf"})
_COUNTS = (
    "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
    "minContains", "maxContains",
)  # fmt: skip
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
LOCAL = frozenset(
    {"type", "enum", "const", "pattern", "format", "properties", "required"}
    | {"additionalProperties", "propertyNames", "patternProperties", "prefixItems", "items"}
    | {"uniqueItems", "multipleOf", "contains"}
    | {*_COUNTS, *_BOUNDS}
)
# Keywords that appeared in 2019-09: annotations (ignored) in older drafts.
_SINCE_2019 = frozenset(
    {
        "minContains", "maxContains", "dependentRequired", "dependentSchemas", "prefixItems",
        "unevaluatedProperties", "unevaluatedItems", "$anchor", "$dynamicRef", "$recursiveRef",
    }
)  # fmt: skip
# Known keywords we never enforce: refused wherever they appear.
_REFUSED = {
    "$recursiveRef": "dynamic references are not supported",
}
# Keywords whose values are subschemas: a single schema, a list, or a map of them.
SUBSCHEMA_KEYWORDS = frozenset(
    {
        "not", "if", "then", "else", "additionalProperties", "additionalItems", "items",
        "contains", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
    }
)  # fmt: skip
SUBSCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
SUBSCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
)


def effective_keywords(schema: dict, dialect: Dialect) -> dict:
    """`schema` as the dialect reads it: `$ref` alone up to draft 7, newer keywords dropped."""
    if dialect <= Dialect.DRAFT7 and "$ref" in schema:
        return {"$ref": schema["$ref"]}
    if dialect < Dialect.DRAFT2019:
        return {keyword: value for keyword, value in schema.items() if keyword not in _SINCE_2019}
    return schema


def check_keywords(schema: object, path: str) -> None:
    """Raise for keywords we refuse and for malformed keyword values."""
    if not isinstance(schema, dict):
        raise ValueError(f"schema at {path} must be an object or a boolean, got {schema!r}")
    for keyword, reason in _REFUSED.items():
        if keyword in schema:
            raise UnsupportedSchemaError(keyword, path, reason)
    for keyword in APPLICATORS & schema.keys():
        _check_applicator(keyword, schema[keyword], path)
    _check_values(schema, path)


def local_piece(schema: dict, path: str, assert_formats: bool = True) -> dict:
    """The keywords of `schema` that `schema_merge` combines, normalised to 2020-12 forms."""
    piece = {keyword: value for keyword, value in schema.items() if keyword in LOCAL}
    for keyword in _COUNTS:
        if keyword in piece:
            piece[keyword] = int(piece[keyword])
    if piece.get("uniqueItems") is False:
        del piece["uniqueItems"]
    known_format = isinstance(piece.get("format"), str) and piece["format"] in FORMAT_REGEXES
    if "format" in piece and (not assert_formats or not known_format):
        del piece["format"]  # an unknown format is an annotation
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(piece.get(exclusive), bool):  # draft 4: a flag on minimum/maximum
            if piece.pop(exclusive) and bound in piece:
                piece[exclusive] = piece.pop(bound)
    if "contains" not in piece:
        piece.pop("minContains", None)
        piece.pop("maxContains", None)
    if isinstance(piece.get("items"), list):  # draft 4 to 2019-09 tuple form
        piece["prefixItems"] = piece.pop("items")
        if "additionalItems" in schema:
            piece["items"] = schema["additionalItems"]
        piece[ARRAY_KEYWORDS] = ("items", "additionalItems")
    if _constrains_nothing("patternProperties", piece.get("patternProperties", {})):
        piece.pop("patternProperties", None)
    return piece


def _check_applicator(keyword: str, value: object, path: str) -> None:
    if keyword == "$ref":
        if not isinstance(value, str):
            raise ValueError(f"schema at {path}: '$ref' must be a string")
        return
    if not isinstance(value, list) or not value:
        raise ValueError(f"schema at {path}: {keyword!r} must be a non-empty array")


def _check_values(schema: dict, path: str) -> None:
    def malformed(keyword: str, expected: str):
        raise ValueError(f"schema at {path}: {keyword!r} must be {expected}")

    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not all(isinstance(name, str) and name in ALL_TYPES for name in names):
            malformed("type", f"one of {sorted(ALL_TYPES)} or an array of them")
    if "enum" in schema and not isinstance(schema["enum"], list):
        malformed("enum", "an array")
    for keyword in _COUNTS:
        if keyword in schema:
            value = schema[keyword]
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not is_number or value < 0 or not float(value).is_integer():
                malformed(keyword, "a non-negative integer")
    for keyword in _BOUNDS:
        if keyword in schema:
            value = schema[keyword]
            is_flag = isinstance(value, bool) and keyword.startswith("exclusive")
            if not is_flag and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                malformed(keyword, "a number")
    if "multipleOf" in schema:
        value = schema["multipleOf"]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            malformed("multipleOf", "a positive number")
    if "pattern" in schema and not isinstance(schema["pattern"], str):
        malformed("pattern", "a string")
    maps = ("properties", "patternProperties", "dependentRequired", "dependentSchemas")
    for keyword in (*maps, "dependencies"):
        if keyword in schema and not isinstance(schema[keyword], dict):
            malformed(keyword, "an object")
    for keyword in ("required",):
        value = schema.get(keyword, [])
        if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
            malformed(keyword, "an array of strings")
    for keyword in ("additionalProperties", "propertyNames", "contains", "not", "if"):
        if keyword in schema and not isinstance(schema[keyword], (dict, bool)):
            malformed(keyword, "a schema")
    if "items" in schema and not isinstance(schema["items"], (dict, bool, list)):
        malformed("items", "a schema or an array of schemas")
    if "prefixItems" in schema and not isinstance(schema["prefixItems"], list):
        malformed("prefixItems", "an array of schemas")


def constrains_nothing(schema: object) -> bool:
    """True for the schemas every instance satisfies that we recognise: true and {}."""
    return schema is True or schema == {}


def _constrains_nothing(keyword: str, value: object) -> bool:
    """True or {}; for the keyword maps, a map whose every entry is true, {} or []."""
    if constrains_nothing(value):
        return True
    if keyword in ("patternProperties", "dependentRequired", "dependentSchemas"):
        return isinstance(value, dict) and all(
            entry is True or entry == {} or entry == [] for entry in value.values()
        )
    return False
