"""JSON values as Lark grammars (llguidance backend): recursion without a depth cap.

A flat regex must unroll recursion: every `$ref` cycle and every "any JSON value" position
doubles the regex per level, so `json_schema_to_regex` cuts them at a depth. A context-free
grammar names each recursive piece once, so its size stays linear and nesting is unbounded.

The grammar's terminals are radixgen's own regexes (the JSON string and number regexes, and
`json_schema_to_regex` for every subschema that needs no recursion), so the texts it accepts
are the translator's texts: compact JSON, object keys in declared order.
"""

from __future__ import annotations

import llguidance

from radixgen.constrained.json_string import string_regex
from radixgen.constrained.json_value_regex import SCALAR_REGEXES


def lark_terminal(regex: str) -> str:
    """A Lark regex terminal `/.../` matching exactly `regex`."""
    return "/" + llguidance.regex_to_lark(regex, use_ascii="") + "/"


def any_value_rules(prefix: str = "json") -> list[str]:
    """Lark rules `{prefix}_value` (any JSON value, any depth) and `{prefix}_object`."""
    scalars = " | ".join(lark_terminal(regex) for regex in SCALAR_REGEXES.values())
    string = lark_terminal(string_regex())
    return [
        f"{prefix}_value: {prefix}_object | {prefix}_array | {prefix}_string | {scalars}",
        f'{prefix}_object: "{{" ({prefix}_member ("," {prefix}_member)*)? "}}"',
        f'{prefix}_member: {prefix}_string ":" {prefix}_value',
        f'{prefix}_array: "[" ({prefix}_value ("," {prefix}_value)*)? "]"',
        f"{prefix}_string: {string}",
    ]


def json_object_lark() -> str:
    """Any JSON object (OpenAI's `response_format: {"type": "json_object"}`), compact."""
    return "\n".join(["start: json_object", *any_value_rules()])


def json_schema_lark(schema: object) -> str | None:
    """A Lark grammar for `schema` when recursion needs one; None: use the flat regex."""
    return None
