"""Regexes for JSON objects, arrays, literals and "any value", given regexes for their parts.

`ws` is the regex for optional whitespace between tokens ("" for compact output). It goes
around every structural token (`{ } [ ] , :`) but never before or after the whole value.

Object members are written in declared order; each optional member may be present or absent
independently (any subset), additional members come after the declared ones. The construction
is linear in the number of members: with P0..Pn and "at least one member emitted so far" as
H, H_k = (H_{k-1} (,P_k)? | P_k), so no member regex is copied more than twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from radixgen.constrained.json_string import ALL_CODE_POINTS, code_point_unit
from radixgen.constrained.regex_ranges import NUMBER
from radixgen.constrained.regex_text import alternation, literal, optional, repeat, sequence

# Strings inside "any value": every character, written raw or with the escapes JSON requires
# (short escapes, \u00XX for control characters); other \uXXXX spellings are not produced.
# Half the size of the all-spellings string, and a third fewer automaton states per level.
_FREE_STRING = sequence('"', repeat(code_point_unit(ALL_CODE_POINTS), 0, None), '"')
SCALAR_REGEXES = {"null": "null", "boolean": "(?:true|false)", "number": NUMBER}


@dataclass(frozen=True)
class Member:
    """One declared object member: its key, the regex of its value (None: impossible)."""

    key: str
    value_regex: str | None
    required: bool


def object_regex(
    members: list[Member],
    extra_members: list[tuple[str | None, str | None]],
    ws: str,
    *,
    non_empty: bool = False,
    most_extras: int | None = None,
    most_members: int | None = None,
) -> str | None:
    """An object with `members` in order, then up to `most_extras` additional members, each
    matching one of the `extra_members` (key regex, value regex) pairs.

    `non_empty`: at least one member. `most_members`: at most that many of `members` (for
    closed objects; built by counting, so only for few members). Returns None when a required
    member is impossible.
    """
    separator = f"{ws},{ws}"
    items: list[tuple[str, bool]] = []
    for member in members:
        if member.value_regex is None:
            if member.required:
                return None
            continue
        key = literal(json.dumps(member.key, ensure_ascii=False))
        items.append((sequence(key, f"{ws}:{ws}", member.value_regex), member.required))
    one_extra = alternation(sequence(key, f"{ws}:{ws}", value) for key, value in extra_members)
    if one_extra is not None and most_extras != 0:
        more = None if most_extras is None else most_extras - 1
        extras = sequence(one_extra, repeat(sequence(separator, one_extra), 0, more))
        items.append((extras, False))
    if non_empty and not items:
        return None
    if most_members is not None:
        body = _members_counted(items, separator, 1 if non_empty else 0, most_members)
    else:
        body = _members_in_order(items, separator, at_least_one_present=non_empty)
    return sequence("\\{", ws, body, ws, "\\}")


def distinct_values_array_regex(values: list, fewest: int, most: int | None, ws: str) -> str | None:
    """An array holding each of `values` at most once, in the order given (uniqueItems), with
    `fewest` to `most` elements.

    Other orders are valid too but never produced. Counts other than "any" or "at least one"
    write out each choice (`_members_counted`): the caller keeps `values` few for those.
    """
    items = [(literal_regex(value, ws), False) for value in values]
    separator = f"{ws},{ws}"
    if fewest > 1 or (most is not None and most < len(items)):
        body = _members_counted(items, separator, fewest, len(items) if most is None else most)
    elif fewest == 1 and not items:
        return None
    else:
        body = _members_in_order(items, separator, at_least_one_present=fewest == 1)
    return sequence("\\[", ws, body, ws, "\\]")


def _members_in_order(
    items: list[tuple[str, bool]], separator: str, at_least_one_present: bool = False
) -> str:
    """Members in order, optional ones in any subset, commas only between present ones."""
    at_least_one = None  # regex for "members 0..k with at least one present"
    rest = ""
    seen_required = False
    for regex, required in items:
        if seen_required:
            rest += sequence(separator, regex) if required else optional(sequence(separator, regex))
            continue
        if at_least_one is None:
            at_least_one = regex
        elif required:
            at_least_one = alternation([sequence(at_least_one, separator, regex), regex])
        else:
            with_it = sequence(at_least_one, optional(sequence(separator, regex)))
            at_least_one = alternation([with_it, regex])
        seen_required = required
    if at_least_one is None:
        return ""
    head = at_least_one if seen_required or at_least_one_present else optional(at_least_one)
    return head + rest


def _members_counted(
    items: list[tuple[str, bool]], separator: str, fewest: int, most: int
) -> str | None:
    """Members in order with between `fewest` and `most` present (each choice written out)."""

    def rest(index: int, present: int) -> str | None:
        if index == len(items):
            return "" if fewest <= present <= most else None
        regex, required = items[index]
        lead = separator if present else ""
        with_it = None if present >= most else sequence(lead, regex, rest(index + 1, present + 1))
        without = None if required else rest(index + 1, present)
        if with_it is None or without is None:
            return with_it if without is None else without
        return alternation([with_it, without])

    return rest(0, 0)


def array_regex(
    prefix: list[str | None], items: str | None, min_items: int, max_items: int | None, ws: str
) -> str | None:
    """An array whose element i matches prefix[i], later elements `items` (None: impossible)."""
    separator = f"{ws},{ws}"

    def from_index(index: int) -> str | None:
        """Elements index.. given `index` elements already written."""
        lead = separator if index > 0 else ""
        if max_items is not None and index >= max_items:
            return "" if index >= min_items else None
        if index >= len(prefix):
            fewest = max(min_items - index, 0)
            most = None if max_items is None else max_items - index
            if index > 0:
                return repeat(sequence(lead, items), fewest, most)
            if items is None or most == 0:
                return "" if fewest == 0 else None
            later = repeat(sequence(separator, items), max(fewest - 1, 0), _minus_one(most))
            whole = sequence(items, later)
            return whole if fewest > 0 else optional(whole)
        element = sequence(lead, prefix[index], from_index(index + 1))
        if index >= min_items:
            return optional(element)
        return element

    body = from_index(0)
    return sequence("\\[", ws, body, ws, "\\]")


def literal_regex(value: object, ws: str) -> str:
    """Exactly `value`, with `ws` allowed between tokens; integral floats also written as ints."""
    if isinstance(value, dict):
        members = [
            sequence(
                literal(json.dumps(key, ensure_ascii=False)), f"{ws}:{ws}", literal_regex(v, ws)
            )
            for key, v in value.items()
        ]
        return sequence("\\{", ws, f"{ws},{ws}".join(members), ws, "\\}")
    if isinstance(value, list):
        elements = f"{ws},{ws}".join(literal_regex(element, ws) for element in value)
        return sequence("\\[", ws, elements, ws, "\\]")
    spellings = [json.dumps(value, ensure_ascii=False), json.dumps(value)]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == int(value):
        spellings += [str(int(value)), f"{int(value)}.0"]  # 2, 2.0: one value
    return alternation(literal(spelling) for spelling in spellings)


def any_value_regex(depth: int, ws: str) -> str:
    """Any JSON value with arrays/objects nested at most `depth` levels."""
    scalars = alternation([*SCALAR_REGEXES.values(), _FREE_STRING])
    if depth <= 0:
        return scalars
    return alternation([scalars, any_array_regex(depth, ws), any_object_regex(depth, ws)])


def any_array_regex(depth: int, ws: str) -> str:
    """Any JSON array, itself one of the `depth` nesting levels (depth >= 1)."""
    inner = any_value_regex(depth - 1, ws)
    elements = sequence(inner, repeat(sequence(f"{ws},{ws}", inner), 0, None))
    return sequence("\\[", ws, optional(elements), ws, "\\]")


def any_object_regex(depth: int, ws: str) -> str:
    """Any JSON object, itself one of the `depth` nesting levels (depth >= 1)."""
    member = sequence(_FREE_STRING, f"{ws}:{ws}", any_value_regex(depth - 1, ws))
    members = sequence(member, repeat(sequence(f"{ws},{ws}", member), 0, None))
    return sequence("\\{", ws, optional(members), ws, "\\}")


def _minus_one(value: int | None) -> int | None:
    return None if value is None else value - 1
