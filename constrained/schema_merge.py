"""Conjunction of JSON Schema pieces into one `MergedSchema` (what `allOf` means).

A piece is a schema object stripped of its applicators (`allOf`/`anyOf`/`oneOf`/`$ref`); the
translator expands those into alternatives, each a list of pieces that must all hold. Merging is
exact: bounds take the tighter side, `type` and `enum` intersect, and subschemas (properties,
items) are not merged here but collected as lists of parts that must all hold, translated later.
What cannot be merged exactly (two different `pattern`s or `format`s) raises `MergeConflict`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction

from radixgen.constrained.regex_ranges import Bound
from radixgen.constrained.unsupported import child_path

ALL_TYPES = frozenset({"null", "boolean", "object", "array", "string", "number", "integer"})
# Keys of synthetic pieces (built by negation, never read from a user's schema): the types a
# piece excludes, and the values it excludes.
NOT_TYPES = "not:type"
NOT_VALUES = "not:enum"
NOT_PATTERNS = "not:pattern"
# Marks a piece built by negation: its keywords are tests, not annotations (unevaluated*).
NEGATION = "not:negation"
# Piece key naming the keywords an array-form `items` came from (for error paths).
ARRAY_KEYWORDS = "array:keywords"

# A subschema still to be translated, with its JSON path for error messages.
Part = tuple[object, str]


class MergeConflict(ValueError):
    """Two pieces constrain one keyword in ways we cannot combine exactly."""

    def __init__(self, keyword: str, path: str, reason: str):
        super().__init__(reason)
        self.keyword = keyword
        self.path = path


@dataclass
class MergedSchema:
    """Everything one alternative of a schema demands of an instance."""

    # "number" without "integer" means non-integer numbers only.
    types: frozenset[str] = ALL_TYPES
    enum: list | None = None  # the only allowed values; None: not restricted
    excluded: list = field(default_factory=list)  # values that are not allowed
    multiple_of: list[Fraction] = field(default_factory=list)  # every divisor that applies
    lower: Bound | None = None
    upper: Bound | None = None
    min_length: int = 0
    max_length: int | None = None
    patterns: list[str] = field(default_factory=list)  # every pattern must match
    not_patterns: list[str] = field(default_factory=list)  # none of these may match
    format: str | None = None
    property_names: list[str] = field(default_factory=list)  # declared order
    property_parts: dict[str, list[Part]] = field(default_factory=dict)
    additional_parts: list[Part] = field(default_factory=list)  # schema for undeclared keys
    property_name_parts: list[Part] = field(default_factory=list)  # schema every key obeys
    pattern_properties: list[tuple[str, Part]] = field(default_factory=list)  # (pattern, schema)
    # (patterns, path) of each piece whose additionalProperties constrains: it must see them all
    additional_scopes: list[tuple[frozenset[str], str]] = field(default_factory=list)
    required: list[str] = field(default_factory=list)
    min_properties: int = 0
    max_properties: int | None = None
    prefix_parts: list[list[Part]] = field(default_factory=list)
    items_parts: list[Part] = field(default_factory=list)  # schema after the prefix
    min_items: int = 0
    max_items: int | None = None
    unique_items: bool = False
    # (schema some items must match, fewest, most matching items; None: no limit)
    contains: list[tuple[Part, int, int | None]] = field(default_factory=list)
    keyword_paths: dict[str, str] = field(default_factory=dict)  # keyword -> where it was set


def merge_pieces(pieces: list[Part]) -> MergedSchema:
    """The conjunction of schema pieces (dicts with no applicator keywords)."""
    merged = MergedSchema()
    for piece, path in pieces:
        _merge_piece(merged, piece, path)
    # additionalProperties applies to the keys its own piece does not declare; merged, it is
    # applied relative to every piece's patterns, so each such piece must list them all.
    patterns = {pattern for pattern, _ in merged.pattern_properties}
    for scope, path in merged.additional_scopes:
        if not patterns <= scope:
            reason = "additionalProperties next to patternProperties of another schema"
            raise MergeConflict("patternProperties", path, reason)
    return merged


def _merge_piece(merged: MergedSchema, piece: dict, path: str) -> None:
    for keyword in piece:
        merged.keyword_paths.setdefault(keyword, path)
    if "type" in piece:
        declared = piece["type"]
        names = {declared} if isinstance(declared, str) else set(declared)
        if "number" in names:
            names.add("integer")
        keep = set(merged.types) & names
        if "number" in merged.types and "integer" in names:
            keep.add("integer")
        merged.types = frozenset(keep)
    if NOT_TYPES in piece:
        excluded = set(piece[NOT_TYPES])
        if "number" in excluded:
            excluded.add("integer")
        merged.types = frozenset(merged.types - excluded)
    merged.excluded.extend(piece.get(NOT_VALUES, []))
    for keyword in ("enum", "const"):
        if keyword in piece:
            values = piece["enum"] if keyword == "enum" else [piece["const"]]
            if merged.enum is None:
                merged.enum = list(values)
            else:
                merged.enum = [v for v in merged.enum if any(json_equal(v, w) for w in values)]
    _merge_numbers(merged, piece)
    if "multipleOf" in piece:
        merged.multiple_of.append(exact_decimal(piece["multipleOf"]))
    merged.min_length = max(merged.min_length, piece.get("minLength", 0))
    merged.max_length = _smaller(merged.max_length, piece.get("maxLength"))
    merged.min_items = max(merged.min_items, piece.get("minItems", 0))
    merged.max_items = _smaller(merged.max_items, piece.get("maxItems"))
    merged.min_properties = max(merged.min_properties, piece.get("minProperties", 0))
    merged.max_properties = _smaller(merged.max_properties, piece.get("maxProperties"))
    merged.unique_items = merged.unique_items or piece.get("uniqueItems", False) is True
    if "pattern" in piece and piece["pattern"] not in merged.patterns:
        merged.patterns.append(piece["pattern"])
    merged.not_patterns.extend(piece.get(NOT_PATTERNS, []))
    if "format" in piece:
        if merged.format is not None and merged.format != piece["format"]:
            raise MergeConflict("format", path, "cannot intersect two different formats exactly")
        merged.format = piece["format"]
    for name in piece.get("required", []):
        if name not in merged.required:
            merged.required.append(name)
    _merge_object_members(merged, piece, path)
    _merge_array_items(merged, piece, path)


def _merge_numbers(merged: MergedSchema, piece: dict) -> None:
    for keyword, exclusive in (("minimum", False), ("exclusiveMinimum", True)):
        if keyword in piece:
            bound = Bound(exact_decimal(piece[keyword]), exclusive)
            if merged.lower is None or _tighter_lower(bound, merged.lower):
                merged.lower = bound
    for keyword, exclusive in (("maximum", False), ("exclusiveMaximum", True)):
        if keyword in piece:
            bound = Bound(exact_decimal(piece[keyword]), exclusive)
            if merged.upper is None or _tighter_lower(_negate(bound), _negate(merged.upper)):
                merged.upper = bound


def _merge_object_members(merged: MergedSchema, piece: dict, path: str) -> None:
    for pattern, schema in piece.get("patternProperties", {}).items():
        part = (schema, child_path(path, "patternProperties", pattern))
        merged.pattern_properties.append((pattern, part))
    additional_schema = piece.get("additionalProperties", True)
    if not (additional_schema is True or additional_schema == {}):
        scope = frozenset(piece.get("patternProperties", {}))
        merged.additional_scopes.append((scope, path))
    properties = piece.get("properties", {})
    has_additional = "additionalProperties" in piece
    additional = (piece.get("additionalProperties"), f"{path}/additionalProperties")
    for name in merged.property_names:
        if name in properties:
            merged.property_parts[name].append(
                (properties[name], child_path(path, "properties", name))
            )
        elif has_additional:
            merged.property_parts[name].append(additional)
    for name, schema in properties.items():
        if name not in merged.property_parts:
            merged.property_names.append(name)
            # Earlier pieces saw this key as undeclared.
            merged.property_parts[name] = list(merged.additional_parts)
            merged.property_parts[name].append((schema, child_path(path, "properties", name)))
    if has_additional:
        merged.additional_parts.append(additional)
    if "propertyNames" in piece:
        merged.property_name_parts.append((piece["propertyNames"], f"{path}/propertyNames"))


def _merge_array_items(merged: MergedSchema, piece: dict, path: str) -> None:
    prefix_keyword, items_keyword = piece.get(ARRAY_KEYWORDS, ("prefixItems", "items"))
    prefix = piece.get("prefixItems", [])
    has_items = "items" in piece
    items = (piece.get("items"), f"{path}/{items_keyword}")
    for index in range(max(len(prefix), len(merged.prefix_parts))):
        if index >= len(merged.prefix_parts):
            merged.prefix_parts.append(list(merged.items_parts))
        if index < len(prefix):
            prefix_path = f"{path}/{prefix_keyword}/{index}"
            merged.prefix_parts[index].append((prefix[index], prefix_path))
        elif has_items:
            merged.prefix_parts[index].append(items)
    if has_items:
        merged.items_parts.append(items)
    if "contains" in piece:
        contains = (piece["contains"], f"{path}/contains")
        fewest = piece.get("minContains", 1)
        merged.contains.append((contains, fewest, piece.get("maxContains")))


def json_equal(left: object, right: object) -> bool:
    """JSON Schema equality: numbers by value, booleans distinct from numbers."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, (int, float)) and isinstance(right, (int, float)):
        return left == right
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(json_equal, left, right))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(json_equal(left[k], right[k]) for k in left)
    return type(left) is type(right) and left == right


def json_type(value: object) -> str:
    """The JSON Schema type name of a Python JSON value ('integer' for integral numbers)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "integer" if float(value).is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise TypeError(f"not a JSON value: {json.dumps(value, default=repr)}")


def exact_decimal(number: int | float) -> Fraction:
    """The decimal the schema wrote: 1.1 is 11/10, not the nearest binary float."""
    return Fraction(repr(number)) if isinstance(number, float) else Fraction(number)


def _tighter_lower(candidate: Bound, current: Bound) -> bool:
    if candidate.value != current.value:
        return candidate.value > current.value
    return candidate.exclusive and not current.exclusive


def _negate(bound: Bound) -> Bound:
    return Bound(-bound.value, bound.exclusive)


def _smaller(current: int | None, new: int | None) -> int | None:
    if new is None:
        return current
    return new if current is None else min(current, new)
