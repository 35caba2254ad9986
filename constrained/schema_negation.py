"""Exact negation of schema pieces, for `not`, `if`/`else`, overlapping `oneOf` and `contains`.

A schema expands into alternatives, each a conjunction of pieces (`schema_merge`), so its
negation is the conjunction, over alternatives, of "some keyword of some piece fails". Each
keyword fails in a way we can write as another piece: `minimum: m` fails exactly for numbers
below m, `required: [a]` for objects without `a`, `properties: {a: S}` for objects whose `a`
fails S (a `Negated` subschema, negated again when it is translated), `type` and `enum` by
exclusion, `pattern` by the complement of its language. Keywords whose failure we do not write
(`format`: our formats are strict subsets, so their complement would admit valid values;
`multipleOf`, `uniqueItems`, `propertyNames`, additional and pattern properties) are refused
with their name and path.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixgen.constrained.schema_merge import (
    ARRAY_KEYWORDS,
    NEGATION,
    NOT_PATTERNS,
    NOT_TYPES,
    NOT_VALUES,
)
from radixgen.constrained.unsupported import UnsupportedSchemaError, child_path

# Negations of bounds: keyword -> (the keyword that holds where it fails, the type it applies to).
_FLIPPED_BOUNDS = {
    "minimum": ("exclusiveMaximum", "number"),
    "exclusiveMinimum": ("maximum", "number"),
    "maximum": ("exclusiveMinimum", "number"),
    "exclusiveMaximum": ("minimum", "number"),
}
_FLIPPED_COUNTS = {
    "minLength": ("maxLength", "string"),
    "maxLength": ("minLength", "string"),
    "minItems": ("maxItems", "array"),
    "maxItems": ("minItems", "array"),
    "minProperties": ("maxProperties", "object"),
    "maxProperties": ("minProperties", "object"),
}
_REFUSED = ("format", "multipleOf", "uniqueItems", "propertyNames")


@dataclass(frozen=True, eq=False)
class Negated:
    """The instances that fail `schema` (found at `path`): a subschema to translate later."""

    schema: object
    path: str


def negate_piece(piece: dict, path: str) -> list[dict]:
    """Pieces whose union is exactly the instances failing `piece` (a merged-keyword dict).

    Raises:
        UnsupportedSchemaError: a keyword whose failure we cannot write exactly.
    """
    for keyword in _REFUSED:
        if keyword in piece:
            raise _refused(keyword, path)
    failures: list[dict] = []
    if "type" in piece:
        names = piece["type"] if isinstance(piece["type"], list) else [piece["type"]]
        failures.append({NOT_TYPES: list(names)})
    if NOT_TYPES in piece and piece[NOT_TYPES]:
        failures.append({"type": list(piece[NOT_TYPES])})
    if "enum" in piece or "const" in piece:
        values = piece["enum"] if "enum" in piece else [piece["const"]]
        failures.append({NOT_VALUES: list(values)})
    if piece.get(NOT_VALUES):
        failures.append({"enum": list(piece[NOT_VALUES])})
    if "pattern" in piece:  # the pattern language's complement (pattern_automaton)
        failures.append({"type": "string", NOT_PATTERNS: [piece["pattern"]]})
    for pattern in piece.get(NOT_PATTERNS, []):
        failures.append({"type": "string", "pattern": pattern})
    for keyword, (flipped, type_name) in _FLIPPED_BOUNDS.items():
        if keyword in piece:
            failures.append({"type": type_name, flipped: piece[keyword]})
    for keyword, (flipped, type_name) in _FLIPPED_COUNTS.items():
        if keyword not in piece:
            continue
        if keyword.startswith("min") and piece[keyword] > 0:
            failures.append({"type": type_name, flipped: piece[keyword] - 1})
        elif keyword.startswith("max"):
            failures.append({"type": type_name, flipped: piece[keyword] + 1})
    failures += _object_failures(piece, path)
    failures += _array_failures(piece, path)
    return [{**failure, NEGATION: True} for failure in failures]


def _object_failures(piece: dict, path: str) -> list[dict]:
    if "patternProperties" in piece:
        raise _refused("patternProperties", path)
    if "additionalProperties" in piece and not _trivial(piece["additionalProperties"]):
        raise _refused("additionalProperties", path)
    failures = [
        {"type": "object", "properties": {name: False}} for name in piece.get("required", [])
    ]
    for name, schema in piece.get("properties", {}).items():
        if not _trivial(schema):
            negated = Negated(schema, child_path(path, "properties", name))
            failures.append({"type": "object", "required": [name], "properties": {name: negated}})
    return failures


def _array_failures(piece: dict, path: str) -> list[dict]:
    prefix_keyword, items_keyword = piece.get(ARRAY_KEYWORDS, ("prefixItems", "items"))
    prefix = piece.get("prefixItems", [])
    failures = []
    for index, schema in enumerate(prefix):
        if not _trivial(schema):
            negated = Negated(schema, child_path(path, prefix_keyword, index))
            items = [True] * index + [negated]
            failures.append({"type": "array", "minItems": index + 1, "prefixItems": items})
    if "items" in piece and not _trivial(piece["items"]):
        if prefix:
            raise _refused(items_keyword, path, "after prefixItems")
        negated = Negated(piece["items"], child_path(path, items_keyword))
        failures.append({"type": "array", "contains": negated})
    if "contains" in piece:
        fewest, most = piece.get("minContains", 1), piece.get("maxContains")
        contains = piece["contains"]
        if fewest > 0:
            failures.append(
                {"type": "array", "contains": contains, "minContains": 0, "maxContains": fewest - 1}
            )
        if most is not None:
            failures.append({"type": "array", "contains": contains, "minContains": most + 1})
    return failures


def _trivial(schema: object) -> bool:
    return schema is True or schema == {}


def _refused(keyword: str, path: str, detail: str = "") -> UnsupportedSchemaError:
    reason = "its negation (under not, if, or an overlapping oneOf) is not written exactly"
    return UnsupportedSchemaError(keyword, path, f"{reason}{' ' + detail if detail else ''}")
