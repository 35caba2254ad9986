"""Regexes for the array and object branches of a merged schema (`SchemaTranslator` helpers).

Subschemas (items, property values, keys under propertyNames/patternProperties) are translated
through the translator, so recursion and memoisation stay in one place.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from radixgen.constrained.json_string import string_excluding_keys, string_regex
from radixgen.constrained.json_value_regex import (
    Member,
    any_array_regex,
    any_object_regex,
    array_regex,
    distinct_values_array_regex,
    object_regex,
)
from radixgen.constrained.regex_text import alternation, optional, repeat, sequence
from radixgen.constrained.schema_keywords import RefDepths
from radixgen.constrained.schema_merge import MergedSchema, Part, json_equal
from radixgen.constrained.schema_negation import Negated
from radixgen.constrained.schema_pattern_properties import (
    matching_pattern_parts,
    pattern_member_classes,
)
from radixgen.constrained.unsupported import UnsupportedSchemaError

if TYPE_CHECKING:
    from radixgen.constrained.json_schema import SchemaTranslator

# maxProperties below the declared members writes out each choice: only for this many members.
_MAX_COUNTED_MEMBERS = 8
# Path of the synthetic {"type": "string"} added to propertyNames (memo key, never reported).
_KEYS_ARE_STRINGS = "#(object keys)"


def array_schema_regex(
    translator: SchemaTranslator, merged: MergedSchema, ref_depths: RefDepths
) -> str | None:
    """Arrays satisfying prefixItems/items/minItems/maxItems/uniqueItems/contains (None: none)."""
    unconstrained = not (merged.prefix_parts or merged.items_parts or merged.contains)
    if unconstrained and not merged.unique_items and merged.min_items == 0:
        if merged.max_items is None:  # any array: one of the any-value nesting levels
            return any_array_regex(max(translator.options.any_value_depth, 1), translator.ws)
    if merged.contains:
        return _contains_array_regex(translator, merged, ref_depths)
    max_items = merged.max_items
    if merged.unique_items and (max_items is None or max_items > 1):
        return _unique_array_regex(translator, merged, ref_depths)
    if max_items is not None and max_items < merged.min_items:
        return None
    needed = (
        len(merged.prefix_parts) if max_items is None else min(max_items, len(merged.prefix_parts))
    )
    prefix = [
        translator.translate(tuple(parts), ref_depths) for parts in merged.prefix_parts[:needed]
    ]
    items = None
    if max_items is None or max_items > len(merged.prefix_parts):
        items = translator.translate(tuple(merged.items_parts), ref_depths)
    return array_regex(prefix, items, merged.min_items, max_items, translator.ws)


def _contains_array_regex(
    translator: SchemaTranslator, merged: MergedSchema, ref_depths: RefDepths
) -> str | None:
    """Arrays whose items satisfy `items` and between min and max of them satisfy `contains`.

    Each element either matches (items and contains: M) or not (items and not contains: N);
    the arrays are exactly N* (M N*){min,max}, written with commas between elements.
    """
    path = merged.keyword_paths["contains"]
    reason = None
    if len(merged.contains) > 1:
        reason = "more than one contains in one alternative"
    elif merged.prefix_parts or merged.unique_items:
        reason = "together with prefixItems or uniqueItems"
    if reason is not None:
        raise UnsupportedSchemaError("contains", path, reason)
    [(contains_part, fewest, most)] = merged.contains
    if most is not None and most < fewest:
        return None
    items = tuple(merged.items_parts)
    matching = translator.translate((*items, contains_part), ref_depths)
    negated = Negated(*contains_part)
    other = translator.translate((*items, (negated, contains_part[1])), ref_depths)
    if most == 0:
        return array_regex([], other, merged.min_items, merged.max_items, translator.ws)
    if merged.max_items is not None or merged.min_items > fewest:
        reason = "together with maxItems, or minItems above minContains"
        raise UnsupportedSchemaError("contains", path, reason)
    ws = translator.ws
    separator = f"{ws},{ws}"
    others_after = repeat(sequence(separator, other), 0, None)
    matching_after = sequence(separator, matching, others_after)
    starts_other = sequence(other, others_after, repeat(matching_after, fewest, most))
    later_most = None if most is None else most - 1
    starts_matching = sequence(
        matching, others_after, repeat(matching_after, max(fewest - 1, 0), later_most)
    )
    body = alternation([starts_other, starts_matching])
    if fewest == 0:
        body = optional(body)
    return sequence("\\[", ws, body, ws, "\\]")


def _unique_array_regex(
    translator: SchemaTranslator, merged: MergedSchema, ref_depths: RefDepths
) -> str | None:
    """uniqueItems is regular when the items have finitely many values: each at most once."""
    path = merged.keyword_paths["uniqueItems"]
    values = (
        None if merged.prefix_parts else _finite_values(translator, merged.items_parts, ref_depths)
    )
    if values is None:
        reason = "only for items limited to enum/const/boolean/null values, without prefixItems"
        raise UnsupportedSchemaError("uniqueItems", path, reason)
    max_items = merged.max_items
    counted = merged.min_items > 1 or (max_items is not None and max_items < len(values))
    if counted and len(values) > _MAX_COUNTED_MEMBERS:
        reason = (
            f"with minItems > 1 or maxItems below the number of distinct values, over more than"
            f" {_MAX_COUNTED_MEMBERS} values"
        )
        raise UnsupportedSchemaError("uniqueItems", path, reason)
    return distinct_values_array_regex(values, merged.min_items, max_items, translator.ws)


def _finite_values(
    translator: SchemaTranslator, parts: list[Part], ref_depths: RefDepths
) -> list | None:
    """The distinct values `parts` allow, when there are finitely many (else None)."""
    candidates = []
    for pieces, _ in (
        translator.expander.expand_all(tuple(parts), ref_depths) if parts else [((), ())]
    ):
        merged = translator.merged(pieces)
        if merged.enum is not None:
            candidates += merged.enum
        elif merged.types <= {"null", "boolean"}:
            candidates += [None] * ("null" in merged.types)
            candidates += [True, False] * ("boolean" in merged.types)
        else:
            return None
    allowed = translator.compact_translator().translate(tuple(parts), ref_depths)
    values: list = []
    for value in candidates:
        if any(json_equal(value, kept) for kept in values):
            continue
        if any(regex_matches(allowed, spelling) for spelling in value_spellings(value)):
            values.append(value)
    return values


def object_schema_regex(
    translator: SchemaTranslator, merged: MergedSchema, ref_depths: RefDepths
) -> str | None:
    """Objects satisfying properties/required/additionalProperties/propertyNames/patternProperties.

    Members come in declared order (then required-but-undeclared ones), extras after them.
    """
    if merged.max_properties == 0:  # only the empty object
        if merged.required or merged.min_properties > 0:
            return None
        return sequence("\\{", translator.ws, "\\}")
    if _any_object(merged):  # one of the any-value nesting levels, like `{}`
        return any_object_regex(max(translator.options.any_value_depth, 1), translator.ws)
    names = merged.property_names + [n for n in merged.required if n not in merged.property_parts]
    key_regex = None  # keys of additional members, built only where they may appear
    checked_names = bool(merged.property_name_parts)
    if checked_names:
        # Keys are strings: the propertyNames schema, restricted to strings.
        parts = (*merged.property_name_parts, ({"type": "string"}, _KEYS_ARE_STRINGS))
        key_regex = translator.translate(parts, ref_depths)
    members = []
    for name in names:
        parts = merged.property_parts.get(name)
        matching = matching_pattern_parts(merged, name)
        if parts is None:  # required but undeclared: patterns, else additionalProperties
            parts = matching or merged.additional_parts
        else:
            parts = parts + matching
        value = translator.translate(tuple(parts), ref_depths)
        if checked_names and not regex_matches(key_regex, value_spellings(name)[0]):
            value = None  # propertyNames forbids this name
        members.append(Member(name, value, required=name in merged.required))
    extras: list[tuple[str | None, str | None]] = []
    implicit_extras = not merged.additional_parts and (names or merged.pattern_properties)
    allow_others = not implicit_extras or translator.options.allow_undeclared_properties
    if merged.pattern_properties:
        if checked_names:
            path = merged.keyword_paths["patternProperties"]
            raise UnsupportedSchemaError("patternProperties", path, "together with propertyNames")
        extras = pattern_member_classes(translator, merged, names, ref_depths, allow_others)
    elif allow_others and (checked_names or not names or _extras_possible(merged)):
        if not checked_names:
            key_regex = string_excluding_keys(names) if names else string_regex()
        if key_regex is not None:
            value = translator.translate(tuple(merged.additional_parts), ref_depths)
            extras = [(key_regex, value)]
    extras = [(key, value) for key, value in extras if key is not None and value is not None]
    if extras and checked_names and names:
        path = merged.keyword_paths["propertyNames"]
        reason = "with both declared and additional properties"
        raise UnsupportedSchemaError("propertyNames", path, reason)
    non_empty, most_extras, most_members = _property_counts(merged, members, bool(extras))
    return object_regex(
        members,
        extras,
        translator.ws,
        non_empty=non_empty,
        most_extras=most_extras,
        most_members=most_members,
    )


def _extras_possible(merged: MergedSchema) -> bool:
    """False when additionalProperties is false: the excluded-keys regex is then not needed."""
    return not any(schema is False for schema, _ in merged.additional_parts)


def _any_object(merged: MergedSchema) -> bool:
    """Whether `merged` allows every object (nothing declared, nothing counted)."""
    declared = merged.property_names or merged.required or merged.pattern_properties
    constrained = merged.additional_parts or merged.property_name_parts
    counted = merged.min_properties or merged.max_properties is not None
    return not (declared or constrained or counted)


def _property_counts(
    merged: MergedSchema, members: list[Member], has_extras: bool
) -> tuple[bool, int | None, int | None]:
    """(at least one member, most additional members, most declared members) for the counts.

    Exact forms: counts the structure implies; at least one member; at most N additional
    members where nothing is declared (the empty object is handled by the caller); at most N
    of a few declared members where no others are allowed. A regex cannot forbid a repeated
    additional key (parsers keep one), so a minimum above 1 is never read off additional keys.
    """
    required = sum(1 for member in members if member.required)
    possible = sum(1 for member in members if member.value_regex is not None)
    fewest, most = merged.min_properties, merged.max_properties
    non_empty = fewest > required
    if fewest > max(required, 1):
        path = merged.keyword_paths["minProperties"]
        reason = "above 1 and above the number of required properties"
        raise UnsupportedSchemaError("minProperties", path, reason)
    if most is None or (not has_extras and possible <= most):
        return non_empty, None, None
    if not members:
        return non_empty, most, None
    if not has_extras and possible <= _MAX_COUNTED_MEMBERS:
        return non_empty, None, most
    path = merged.keyword_paths["maxProperties"]
    reason = "only where nothing is declared, or no other property is allowed"
    raise UnsupportedSchemaError("maxProperties", path, reason)


def regex_matches(regex: str | None, text: str) -> bool:
    return regex is not None and re.fullmatch(regex, text) is not None


def value_spellings(value: object) -> list[str]:
    """Compact spellings of an enum value to check against the other keywords' regex."""
    spellings = [json.dumps(value, ensure_ascii=False, separators=(",", ":"))]
    if isinstance(value, float) and value.is_integer():
        spellings.append(str(int(value)))  # 2.0 is an integer too
    return spellings
