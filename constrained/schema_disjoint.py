"""Proofs that two merged schemas share no instance, so `oneOf` can be written as `anyOf`.

Only cheap, certain proofs: different JSON types, disjoint enum/const values, disjoint numeric
ranges, and objects told apart by a required property with disjoint const/enum values (the
shape of pydantic's discriminated unions). Anything else counts as "may overlap".
"""

from __future__ import annotations

from radixgen.constrained.schema_merge import MergedSchema, Part, json_equal, json_type


def provably_disjoint(left: MergedSchema, right: MergedSchema) -> bool:
    """True only if no JSON value satisfies both `left` and `right`."""
    if left.enum is not None and right.enum is not None:
        return not any(json_equal(a, b) for a in left.enum for b in right.enum)
    shared = _possible_types(left) & _possible_types(right)
    return all(_disjoint_within_type(name, left, right) for name in shared)


def _possible_types(merged: MergedSchema) -> set[str]:
    if merged.enum is None:
        return set(merged.types)
    # An integral value is "integer", and the types always hold "integer" next to "number".
    return {json_type(value) for value in merged.enum} & set(merged.types)


def _disjoint_within_type(name: str, left: MergedSchema, right: MergedSchema) -> bool:
    if name in ("integer", "number"):
        return _ranges_disjoint(left, right) or _ranges_disjoint(right, left)
    if name == "object":
        return any(
            _values_disjoint(left.property_parts.get(key, []), right.property_parts.get(key, []))
            for key in set(left.required) & set(right.required)
        )
    return False


def _ranges_disjoint(low_side: MergedSchema, high_side: MergedSchema) -> bool:
    """Every value allowed by `low_side` lies below every value allowed by `high_side`."""
    upper, lower = low_side.upper, high_side.lower
    if upper is None or lower is None:
        return False
    if upper.value != lower.value:
        return upper.value < lower.value
    return upper.exclusive or lower.exclusive


def _values_disjoint(left_parts: list[Part], right_parts: list[Part]) -> bool:
    left_values, right_values = _allowed_values(left_parts), _allowed_values(right_parts)
    if left_values is None or right_values is None:
        return False
    return not any(json_equal(a, b) for a in left_values for b in right_values)


def _allowed_values(parts: list[Part]) -> list | None:
    """The values some part restricts the property to with const/enum (None: unrestricted)."""
    for schema, _ in parts:
        if isinstance(schema, dict):
            if "const" in schema:
                return [schema["const"]]
            if isinstance(schema.get("enum"), list):
                return schema["enum"]
    return None
