"""JSON schemas as Lark grammars (llguidance backend): structure as rules, leaves as regexes.

A flat regex must unroll recursion: every `$ref` cycle and every "any JSON value" position
doubles the regex per level, so `json_schema_to_regex` cuts them at a depth. A context-free
grammar names each recursive piece once, so its size stays linear and nesting is unbounded.
Writing the structure (objects, arrays, unions, references) as rules is also cheaper than
translating it into one regex, so llguidance gets a grammar wherever this module covers the
schema's structure, recursive or not.

The grammar's terminals are radixgen's own regexes (the JSON string and number regexes, and
`json_schema_to_regex` for every subschema whose keywords are not structural here), and the
structure follows the translator's output shape (compact JSON, object keys in declared order,
optional members present or absent, no undeclared members), so the texts it accepts are the
translator's texts, except that nesting through references and any-value positions is
unbounded.
"""

from __future__ import annotations

import json

import llguidance

from radixgen.constrained.json_schema import json_schema_to_regex
from radixgen.constrained.json_string import string_regex
from radixgen.constrained.json_value_regex import SCALAR_REGEXES
from radixgen.constrained.schema_keywords import dialect_of
from radixgen.constrained.schema_refs import RefResolver
from radixgen.constrained.unsupported import UnsupportedSchemaError


def lark_terminal(regex: str) -> str:
    """A Lark regex terminal `/.../` matching exactly `regex`."""
    return "/" + llguidance.regex_to_lark(regex, use_ascii="") + "/"


def any_value_rules(prefix: str = "json") -> list[str]:
    """Lark rules `{prefix}_value` (any JSON value, any depth), `{prefix}_object`,
    `{prefix}_array`, `{prefix}_string` and `{prefix}_scalar` (null, booleans, numbers)."""
    scalars = " | ".join(lark_terminal(regex) for regex in SCALAR_REGEXES.values())
    string = lark_terminal(string_regex())
    return [
        f"{prefix}_value: {prefix}_object | {prefix}_array | {prefix}_string | {prefix}_scalar",
        f"{prefix}_scalar: {scalars}",
        f'{prefix}_object: "{{" ({prefix}_member ("," {prefix}_member)*)? "}}"',
        f'{prefix}_member: {prefix}_string ":" {prefix}_value',
        f'{prefix}_array: "[" ({prefix}_value ("," {prefix}_value)*)? "]"',
        f"{prefix}_string: {string}",
    ]


def json_object_lark() -> str:
    """Any JSON object (OpenAI's `response_format: {"type": "json_object"}`), compact."""
    return "\n".join(["start: json_object", *any_value_rules()])


def json_schema_lark(
    schema: object, *, allow_undeclared_properties: bool = False, assert_formats: bool = True
) -> str | None:
    """A Lark grammar for `schema`; None: use `json_schema_to_regex`'s flat regex (the two
    options are that function's; with undeclared properties allowed, objects that declare
    properties without `additionalProperties` are left to the flat regex).

    The structural keywords written here, exactly: `$ref` alone, `anyOf`, objects with
    `properties`/`required`/`additionalProperties: false` (absent: no undeclared members, as the
    translator writes them), arrays with `items`/`minItems`/`maxItems`, any-value `{}`. A
    subschema with other keywords and no `$ref` inside becomes one terminal (the translator's
    regex); one with a `$ref` inside, a document with embedded resources (`$id` below the root,
    dynamic references), or a root that is itself a leaf, all give None.

    A subschema the translator refuses sends the whole schema to the flat translation, which
    raises `UnsupportedSchemaError` naming its full path.
    """
    if not isinstance(schema, dict) or _has_embedded_resources(schema):
        return None
    try:
        options = {
            "allow_undeclared_properties": allow_undeclared_properties,
            "assert_formats": assert_formats,
        }
        return _LarkWriter(schema, options).grammar()
    except _NotStructural:
        return None


# Keys that change how `$ref`s resolve below the root: the flat translator decides.
_RESOURCE_KEYWORDS = frozenset(
    {"$id", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"}
)


def _has_embedded_resources(root: dict) -> bool:
    stack = [value for key, value in root.items() if key not in ("$id", "$schema")]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            if _RESOURCE_KEYWORDS & current.keys():
                return True
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)
    return False


# Keywords that constrain nothing, at a structural node (the translator decides elsewhere).
_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
     "writeOnly", "$defs", "definitions", "discriminator", "$anchor"}
)  # fmt: skip
_ROOT_ONLY = frozenset({"$schema", "$id"})


class _NotStructural(Exception):
    """A subschema uses keywords this module does not write (the flat regex decides)."""


def _constraining_keys(node: dict, is_root: bool) -> set[str]:
    ignored = _ANNOTATIONS | (_ROOT_ONLY if is_root else frozenset())
    return {key for key in node if key not in ignored and not key.startswith("x-")}


def _refs_in(node: object) -> list[str]:
    """Every `$ref` (and `$dynamicRef`) value inside `node`, not following references."""
    found, stack = [], [node]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            for key, value in current.items():
                if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                    found.append(value)
                else:
                    stack.append(value)
        elif isinstance(current, list):
            stack.extend(current)
    return found


class _LarkWriter:
    """Writes one rule per `$ref` target and one terminal per `$ref`-free subschema."""

    def __init__(self, root: dict, translation_options: dict[str, bool]) -> None:
        self.root = root
        self.translation_options = translation_options  # json_schema_to_regex's, for leaves
        self.resolver = RefResolver(root, dialect_of(root))
        self.rules: list[str] = []
        self._rule_by_path: dict[str, str] = {}
        self._terminal_by_regex: dict[str, str] = {}
        self._bracket_terminals: set[str] = set()  # terminals that may contain `{` or `[`
        self._uses_any_value = False

    def grammar(self) -> str:
        start = self.expression(self.root, "#")
        if start in self._terminal_by_regex.values():
            raise _NotStructural("#")  # one terminal: the flat regex itself
        rules = [f"start: {start}", *self.rules]
        if self._uses_any_value:
            rules += any_value_rules()
        return "\n".join(rules)

    def expression(self, node: object, path: str) -> str:
        """A Lark expression matching exactly the (compact) texts radixgen writes for `node`.

        Objects, arrays and unions are written as rules wherever their keywords allow, so
        that punctuation is always its own lexeme; other `$ref`-free subschemas become one
        terminal each.
        """
        if node is True or node == {}:
            self._uses_any_value = True
            return "json_value"
        if not isinstance(node, dict):
            raise _NotStructural(path)
        try:
            return self._structural(node, path)
        except _NotStructural:
            if _refs_in(node):
                raise
            return self._leaf(node, path)

    def _structural(self, node: dict, path: str) -> str:
        keys = _constraining_keys(node, is_root=node is self.root)
        if not keys:  # annotations only
            self._uses_any_value = True
            return "json_value"
        if keys == {"$ref"}:
            return self._reference(node["$ref"], path)
        if keys == {"anyOf"} and isinstance(node["anyOf"], list) and node["anyOf"]:
            branches = [self.expression(sub, f"{path}/anyOf/{i}")
                        for i, sub in enumerate(node["anyOf"])]  # fmt: skip
            self._check_lexemes_apart(branches, path)
            return "(" + " | ".join(branches) + ")"
        if node.get("type", "object") == "object" and keys <= {"type", "properties", "required",
                                                               "additionalProperties"}:  # fmt: skip
            return self._or_other_types(self._object(node, path), node, "object")
        if node.get("type", "array") == "array" and keys <= {"type", "items", "minItems",
                                                             "maxItems"}:  # fmt: skip
            return self._or_other_types(self._array(node, path), node, "array")
        raise _NotStructural(path)

    def _or_other_types(self, structure: str, node: dict, json_type: str) -> str:
        """Without `type`, object (array) keywords leave every other JSON type allowed."""
        if "type" in node:
            return structure
        self._uses_any_value = True
        other = "json_array" if json_type == "object" else "json_object"
        return f"({structure} | {other} | json_string | json_scalar)"

    def _check_lexemes_apart(self, branches: list[str], path: str) -> None:
        """llguidance lexes greedily: a terminal that may begin with `{` or `[` would swallow
        the `{`/`[` lexeme of another branch, silently losing that branch's texts."""
        bracket_terminal = any(
            name in branch for branch in branches for name in self._bracket_terminals
        )
        bracket_literal = any(
            '"{"' in branch or '"["' in branch or "json_value" in branch for branch in branches
        )
        if bracket_terminal and bracket_literal:
            raise _NotStructural(path)

    def _leaf(self, node: dict, path: str) -> str:
        leaf = dict(node)
        if "$schema" in self.root:  # the dialect the root selects applies to every subschema
            leaf["$schema"] = self.root["$schema"]
        try:
            regex = json_schema_to_regex(leaf, **self.translation_options)
        except UnsupportedSchemaError:  # the flat translation reports it with its full path
            raise _NotStructural(path) from None
        # One terminal per distinct regex: llguidance merges identical lexemes, and a terminal
        # merged away would never match.
        name = self._terminal_by_regex.get(regex)
        if name is None:
            name = self._terminal_by_regex[regex] = f"LEAF{len(self._terminal_by_regex)}"
            self.rules.append(f"{name}: {lark_terminal(regex)}")
            if "\\{" in regex or "\\[" in regex:
                self._bracket_terminals.add(name)
        return name

    def _reference(self, ref: str, path: str) -> str:
        target, target_path = self.resolver.resolve(ref, f"{path}/$ref")
        name = self._rule_by_path.get(target_path)
        if name is None:
            name = f"ref{len(self._rule_by_path)}"
            self._rule_by_path[target_path] = name  # before the body: recursion refers to it
            self.rules.append(f"{name}: {self.expression(target, target_path)}")
        return name

    def _object(self, node: dict, path: str) -> str:
        properties = node.get("properties", {})
        required = node.get("required", [])
        if (
            not isinstance(properties, dict)
            or not isinstance(required, list)
            or not set(required) <= set(properties)
            or node.get("additionalProperties", False) is not False
            or (not properties and "additionalProperties" not in node)
            or (
                "additionalProperties" not in node
                and self.translation_options["allow_undeclared_properties"]
            )
        ):
            raise _NotStructural(path)  # extra members: the flat translator decides
        members = []
        for name, sub in properties.items():
            key = json.dumps(name, ensure_ascii=False)
            if any(ord(char) < 0x20 for char in key):
                raise _NotStructural(path)
            value = self.expression(sub, f"{path}/properties/{name}")
            members.append(
                (f"{json.dumps(key + ':', ensure_ascii=False)} {value}", name in required)
            )
        body = _members_in_order(members)
        if body is None:
            return '"{" "}"'
        if all(not is_required for _, is_required in members):
            return f'"{{" ({body})? "}}"'
        return f'"{{" {body} "}}"'

    def _array(self, node: dict, path: str) -> str:
        min_items, max_items = node.get("minItems", 0), node.get("maxItems")
        counts = [min_items] + ([] if max_items is None else [max_items])
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
            raise _NotStructural(path)  # malformed: the flat translation reports it
        if max_items is not None and max_items < min_items:
            raise _NotStructural(path)  # no array fits: the flat translation says so
        item = self.expression(node.get("items", True), f"{path}/items")
        if max_items == 0:
            return '"[" "]"'
        more_min = max(min_items - 1, 0)
        more = f"{more_min},{'' if max_items is None else max_items - 1}"
        elements = f'{item} ("," {item}){{{more}}}'
        return f'"[" {elements} "]"' if min_items else f'"[" ({elements})? "]"'


def _members_in_order(members: list[tuple[str, bool]]) -> str | None:
    """Lark for members in declared order, separated by commas, each optional one present or
    absent: alternatives by the first member present, each followed by the rest."""
    if not members:
        return None

    def rest(start: int) -> str:
        return " ".join(
            f'("," {member})' + ("" if is_required else "?")
            for member, is_required in members[start:]
        )

    alternatives = []
    for index, (member, is_required) in enumerate(members):
        alternatives.append(f"{member} {rest(index + 1)}".strip())
        if is_required:
            break  # a required member is always the first one present, or comes later
    return "(" + " | ".join(alternatives) + ")"
