"""Recursive JSON schemas as Lark grammars (llguidance): no depth cap, same texts as the flat
regex up to its depth, random walks validate, and a fallback to the flat regex otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from radixgen.constrained import ConstraintSpec, GrammarBackend, compile_constraint
from radixgen.constrained.checker import tiny_tokenizer_path
from radixgen.constrained.schema_lark import json_schema_lark
from tests.test_constrained_backends import WalkTooLong, random_walk

LINKED_LIST = {
    "$defs": {
        "Node": {
            "type": "object",
            "properties": {
                "v": {"type": "integer", "minimum": 0, "maximum": 9},
                "next": {"$ref": "#/$defs/Node"},
            },
            "required": ["v"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/Node",
}
FILTER = {  # a pydantic-style expression tree: a leaf object beside recursive objects
    "type": "object",
    "properties": {"filter": {"$ref": "#/$defs/Expr"}},
    "required": ["filter"],
    "$defs": {
        "Expr": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"field": {"enum": ["a", "b"]}, "value": {"type": "boolean"}},
                    "required": ["field", "value"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {"not": {"$ref": "#/$defs/Expr"}},
                    "required": ["not"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "all": {"type": "array", "items": {"$ref": "#/$defs/Expr"}, "maxItems": 2}
                    },
                    "required": ["all"],
                    "additionalProperties": False,
                },
            ]
        }
    },
}


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def nested_list(depth: int) -> dict:
    node = {"v": 0}
    for level in range(depth):
        node = {"v": level % 10, "next": node}
    return node


def test_which_schemas_become_grammars():
    grammar = json_schema_lark(LINKED_LIST)
    assert grammar is not None and grammar.count("LEAF") == 2  # one terminal, used once
    assert json_schema_lark({"type": "object", "properties": {"a": {"type": "string"}}})
    assert json_schema_lark({"type": "string", "maxLength": 3}) is None  # a leaf: the regex
    # a $ref under keywords written only as a flat regex: the flat regex decides
    with_one_of = {**LINKED_LIST, "$defs": {"Node": {"oneOf": [{"$ref": "#/$defs/Node"}]}}}
    assert json_schema_lark(with_one_of) is None
    embedded = {"$ref": "#/$defs/a", "$defs": {"a": {"$id": "other.json", "type": "integer"}}}
    assert json_schema_lark(embedded) is None  # $id below the root changes resolution


@pytest.mark.parametrize("schema", [LINKED_LIST, FILTER], ids=["list", "expression-tree"])
def test_grammar_accepts_what_the_flat_regex_accepts_and_deeper(schema):
    grammar_checker = compile_constraint(json_schema=schema, backend="llguidance")
    flat_checker = compile_constraint(json_schema=schema, backend="outlines")
    outlines = GrammarBackend(tiny_tokenizer_path(), grammar_backend="outlines")
    try:
        flat = outlines.compile(ConstraintSpec.json_schema(schema))
        for seed in range(12):  # texts of the flat regex (depth <= 3) are grammar texts too
            assert grammar_checker.fullmatch(random_walk(flat, seed))
    finally:
        outlines.shutdown()
    deep = nested_list(12) if schema is LINKED_LIST else {"filter": _deep_expression(8)}
    jsonschema.validate(deep, schema)
    assert grammar_checker.fullmatch(compact(deep)) and not flat_checker.fullmatch(compact(deep))


def _deep_expression(depth: int) -> dict:
    expression = {"field": "a", "value": True}
    for level in range(depth):
        expression = {"not": expression} if level % 2 else {"all": [expression, expression]}
    return expression


@pytest.mark.parametrize("schema", [LINKED_LIST, FILTER], ids=["list", "expression-tree"])
def test_random_walks_through_the_grammar_validate(schema):
    backend = GrammarBackend(tiny_tokenizer_path(), grammar_backend="llguidance")
    try:
        grammar = backend.compile(ConstraintSpec.json_schema(schema))
        validated = 0
        for seed in range(40):
            try:
                text = random_walk(grammar, seed)
            except WalkTooLong:  # nested past MAX_STEPS: no verdict
                continue
            jsonschema.validate(json.loads(text), schema)
            validated += 1
        assert validated >= 20
    finally:
        backend.shutdown()


def test_grammar_rejects_invalid_instances():
    checker = compile_constraint(json_schema=FILTER)
    invalid = [
        {"filter": {"not": {"field": "c", "value": True}}},
        {"filter": {"all": [{"not": {"field": "a"}}]}},
        {"filter": {"all": [{"field": "a", "value": True}] * 3}},
        {"filter": {"not": {"field": "a", "value": True}, "all": []}},
        {},
    ]
    for instance in invalid:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(instance, FILTER)
        assert not checker.fullmatch(compact(instance))
    assert not compile_constraint(json_schema=LINKED_LIST).fullmatch('{"v":1,"next":{"v":10}}')


def test_suite_grammar_schemas_accept_no_invalid_instance():
    """The JSON-Schema-Test-Suite's schemas that become Lark grammars, through llguidance."""
    from radixgen.constrained.backend_suite_report import run_backend_suite
    from radixgen.constrained.schema_suite_report import find_suite_dir

    suite_dir = find_suite_dir(Path(__file__).resolve().parents[1])
    if suite_dir is None:
        pytest.skip("JSON-Schema-Test-Suite not found beside the checkout")

    def becomes_grammar(schema: object, translation) -> bool:
        try:
            return json_schema_lark(schema, **translation.as_options()) is not None
        except ValueError:
            return False

    report = run_backend_suite(suite_dir, "llguidance", select=becomes_grammar)
    assert report.schemas_accepted >= 1 and report.invalid_total >= 1
    assert report.violations == []


def test_a_grammar_llguidance_refuses_falls_back_to_the_flat_regex(monkeypatch):
    from radixgen.constrained import llguidance_backend
    from radixgen.constrained.checker import byte_vocabulary

    monkeypatch.setattr(
        llguidance_backend, "json_schema_lark", lambda schema, **options: "start: undefined"
    )
    compiler = llguidance_backend.LLGuidanceCompiler(byte_vocabulary())
    grammar = compiler.compile(ConstraintSpec.json_schema(LINKED_LIST))
    matcher = grammar.new_matcher()
    assert all(matcher.accept_token(byte) for byte in b'{"v":1,"next":{"v":2}}')
    assert matcher.is_accepting()


@pytest.mark.slow
def test_corpus_random_walks_validate_on_llguidance():
    """Every benchmark-corpus schema (most of them as grammars): random outputs validate."""
    from radixgen.constrained.benchmark_schemas import realistic_schemas

    backend = GrammarBackend(tiny_tokenizer_path(), grammar_backend="llguidance")
    validated = 0
    try:
        for _, schema in realistic_schemas():
            try:
                grammar = backend.compile(ConstraintSpec.json_schema(schema))
            except ValueError:  # refused by the translator
                continue
            for seed in range(3):
                try:
                    text = random_walk(grammar, seed)
                except WalkTooLong:  # long strings past MAX_STEPS: no verdict
                    continue
                jsonschema.validate(json.loads(text), schema)
                validated += 1
    finally:
        backend.shutdown()
    assert validated >= 150
