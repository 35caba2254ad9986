"""Why no value satisfies a schema: the first contradiction, named by keyword and path."""

from __future__ import annotations

from radixgen.constrained.regex_ranges import integer_bounds
from radixgen.constrained.schema_expansion import SchemaExpander, merge_alternative
from radixgen.constrained.schema_merge import NOT_TYPES, MergedSchema, json_type

_GENERIC = ("schema", "#", "no JSON value satisfies this schema")
# Required properties are searched for the contradiction this many levels deep.
_MAX_DEPTH = 8


def explain_unsatisfiable(expander: SchemaExpander, root: object) -> tuple[str, str, str]:
    """(keyword, path, reason) for a root schema whose regex came out empty."""
    return _explain(expander, ((root, "#"),), depth=0) or _GENERIC


def _explain(expander: SchemaExpander, parts: tuple, depth: int) -> tuple[str, str, str] | None:
    """The contradiction of the first alternative, if every alternative has one (else None)."""
    alternatives = expander.expand_all(parts, ())
    if not alternatives:
        path = parts[0][1] if len(parts) == 1 else "#"
        return "false", path, "the schema, or a subschema every value must satisfy, is false"
    found = [_alternative_contradiction(expander, pieces, depth) for pieces, _ in alternatives]
    return found[0] if all(found) else None


def _alternative_contradiction(
    expander: SchemaExpander, pieces: tuple, depth: int
) -> tuple[str, str, str] | None:
    schema = merge_alternative(pieces)
    paths = schema.keyword_paths
    if not schema.types:
        keyword = "type" if "type" in paths else "not"
        return keyword, paths.get("type", paths.get(NOT_TYPES, "#")), "no type is allowed"
    if schema.enum is not None and not any(json_type(v) in schema.types for v in schema.enum):
        reason = "no enum/const value is shared by all, or has an allowed type"
        return "enum", paths.get("enum", paths.get("const", "#")), reason
    reasons = [_type_contradiction(name, schema) for name in sorted(schema.types)]
    if schema.enum is None and all(reasons):
        return reasons[-1]
    if schema.types == {"object"} and depth < _MAX_DEPTH:
        for name in schema.required:  # a required property no value satisfies
            parts = tuple(schema.property_parts.get(name, schema.additional_parts))
            inner = _explain(expander, parts, depth + 1) if parts else None
            if inner is not None:
                return inner
    return None


def _type_contradiction(name: str, schema: MergedSchema) -> tuple[str, str, str] | None:
    paths = schema.keyword_paths
    if name in ("integer", "number") and schema.lower and schema.upper:
        low_keyword = "exclusiveMinimum" if schema.lower.exclusive else "minimum"
        high_keyword = "exclusiveMaximum" if schema.upper.exclusive else "maximum"
        lowest, highest = integer_bounds(schema.lower, schema.upper)
        empty = schema.lower.value > schema.upper.value or (
            schema.lower.value == schema.upper.value
            and (schema.lower.exclusive or schema.upper.exclusive)
        )
        if empty or (name == "integer" and lowest > highest):
            reason = (
                f"{low_keyword} {_number(schema.lower.value)} and {high_keyword} "
                f"{_number(schema.upper.value)} leave no {name}"
            )
            return low_keyword, paths.get(low_keyword, "#"), reason
    for kind, low, high in (
        ("string", "minLength", "maxLength"),
        ("array", "minItems", "maxItems"),
        ("object", "minProperties", "maxProperties"),
    ):
        fewest = getattr(schema, _field(low))
        most = getattr(schema, _field(high))
        if name == kind and most is not None and fewest > most:
            return low, paths.get(low, "#"), f"{low} {fewest} is above {high} {most}"
    if name == "object":
        for required in schema.required:
            parts = schema.property_parts.get(required, schema.additional_parts)
            if any(part is False for part, _ in parts):
                reason = f"property {required!r} is required but its schema is false"
                return "required", paths.get("required", "#"), reason
    return None


def _field(keyword: str) -> str:
    return {
        "minLength": "min_length", "maxLength": "max_length", "minItems": "min_items",
        "maxItems": "max_items", "minProperties": "min_properties",
        "maxProperties": "max_properties",
    }[keyword]  # fmt: skip


def _number(value) -> str:
    return str(value.numerator) if value.denominator == 1 else str(float(value))
