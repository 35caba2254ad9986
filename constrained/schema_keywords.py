"""Which JSON Schema keywords we enforce, ignore or reject, and checks of their values."""

from __future__ import annotations

from radixgen.constrained.schema_merge import ALL_TYPES, NOT_TYPES
from radixgen.constrained.unsupported import UnsupportedSchemaError

# ($ref target path, expansions so far) pairs along one instance path, sorted.
RefDepths = tuple[tuple[str, int], ...]

# Keywords that constrain nothing (annotations, containers, declarations).
IGNORED = frozenset(
    {
        "title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
        "writeOnly", "$schema", "$anchor", "$dynamicAnchor", "$defs", "definitions",
        "contentMediaType", "contentEncoding", "contentSchema", "discriminator", "$vocabulary",
    }
)  # fmt: skip
APPLICATORS = frozenset({"$ref", "allOf", "anyOf", "oneOf"})
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
LOCAL = frozenset(
    {"type", "enum", "const", "pattern", "format", "properties", "required"}
    | {"additionalProperties", "propertyNames", "patternProperties", "prefixItems", "items"}
    | {"uniqueItems", "multipleOf"}
    | {*_COUNTS, *_BOUNDS}
)
# Accepted only with a value that constrains nothing.
_TRIVIAL_ONLY = frozenset(
    {
        "dependentRequired", "dependentSchemas",
        "unevaluatedProperties", "unevaluatedItems",
    }
)  # fmt: skip
# Without in-place applicators, unevaluated* sees exactly what these keywords see.
_UNEVALUATED_AS = {"unevaluatedProperties": "additionalProperties", "unevaluatedItems": "items"}
_IN_PLACE_APPLICATORS = frozenset(
    {"allOf", "anyOf", "oneOf", "not", "$ref", "$dynamicRef", "if", "dependentSchemas", "contains"}
)


def check_keywords(schema: object, path: str, is_root: bool) -> None:
    """Raise for keywords we cannot enforce exactly and for malformed keyword values."""
    if not isinstance(schema, dict):
        raise ValueError(f"schema at {path} must be an object or a boolean, got {schema!r}")
    for keyword, value in schema.items():
        if keyword in IGNORED or keyword in LOCAL or keyword.startswith("x-"):
            continue
        if keyword == "$id" and is_root:
            continue
        if keyword in APPLICATORS:
            _check_applicator(keyword, value, path)
            continue
        if keyword in _TRIVIAL_ONLY and _constrains_nothing(keyword, value):
            continue
        if keyword in ("minContains", "maxContains") and "contains" not in schema:
            continue  # without `contains` these have no effect
        if keyword in ("then", "else") and "if" not in schema:
            continue
        if keyword == "if" and "then" not in schema and "else" not in schema:
            continue
        if keyword == "uniqueItems" and value is False:
            continue
        if keyword == "not" and _negated_types(value) is not None:
            continue
        if keyword in _UNEVALUATED_AS and not _IN_PLACE_APPLICATORS & schema.keys():
            if not isinstance(value, (dict, bool)):
                raise ValueError(f"schema at {path}: {keyword!r} must be a schema")
            continue
        raise UnsupportedSchemaError(keyword, path)
    _check_values(schema, path)


def local_piece(schema: dict, path: str) -> dict:
    """The keywords of `schema` that `schema_merge` combines, with counts as ints."""
    piece = {keyword: value for keyword, value in schema.items() if keyword in LOCAL}
    for keyword in _COUNTS:
        if keyword in piece:
            piece[keyword] = int(piece[keyword])
    if "uniqueItems" in piece and piece["uniqueItems"] is False:
        del piece["uniqueItems"]
    if "not" in schema:
        piece[NOT_TYPES] = _negated_types(schema["not"])
    if _constrains_nothing("patternProperties", piece.get("patternProperties", {})):
        # Ignored: it only allows keys, and we produce none beyond the others (a subset).
        piece.pop("patternProperties", None)
    for keyword, same_as in _UNEVALUATED_AS.items():
        # check_keywords allowed it only without in-place applicators; next to `same_as`,
        # everything is already evaluated and it has no effect.
        if keyword in schema and same_as not in schema:
            piece[same_as] = schema[keyword]
    return piece


def _negated_types(value: object) -> list[str] | None:
    """The types `not` excludes, when it is only a type test (true/{}: every type)."""
    if value is False:
        return []
    if value is True or value == {}:
        return sorted(ALL_TYPES)
    if not isinstance(value, dict) or not set(value) <= IGNORED | {"type"}:
        return None
    if "type" not in value:
        return sorted(ALL_TYPES)
    names = value["type"] if isinstance(value["type"], list) else [value["type"]]
    if not all(isinstance(name, str) and name in ALL_TYPES for name in names):
        return None
    return list(names)


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
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                malformed(keyword, "a number")
    if "multipleOf" in schema:
        value = schema["multipleOf"]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            malformed("multipleOf", "a positive number")
    for keyword in ("pattern", "format"):
        if keyword in schema and not isinstance(schema[keyword], str):
            malformed(keyword, "a string")
    if "properties" in schema and not isinstance(schema["properties"], dict):
        malformed("properties", "an object")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        malformed("required", "an array of strings")
    if "patternProperties" in schema and not isinstance(schema["patternProperties"], dict):
        malformed("patternProperties", "an object of schemas")
    for keyword in ("additionalProperties", "items", "propertyNames"):
        if keyword in schema and isinstance(schema[keyword], list):
            raise UnsupportedSchemaError(keyword, path, "array form (use prefixItems)")
        if keyword in schema and not isinstance(schema[keyword], (dict, bool)):
            malformed(keyword, "a schema")
    if "prefixItems" in schema and not isinstance(schema["prefixItems"], list):
        malformed("prefixItems", "an array of schemas")


def _constrains_nothing(keyword: str, value: object) -> bool:
    """True or {}; for the keyword maps, a map whose every entry is true, {} or []."""
    if value is True or value == {}:
        return True
    if keyword in ("patternProperties", "dependentRequired", "dependentSchemas"):
        return isinstance(value, dict) and all(
            entry is True or entry == {} or entry == [] for entry in value.values()
        )
    return False
