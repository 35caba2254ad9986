"""Both grammar backends on the tiny model's vocabulary: random walks through allowed tokens
always produce complete matches, llguidance never allows what the outlines automaton forbids,
grammars (EBNF, Lark, json_object), the public checker, and the --grammar-backend option."""

from __future__ import annotations

import json
import random
import re
import typing

import jsonschema
import numpy as np
import pytest
import torch

from radixgen.constrained import (
    ConstraintSpec,
    GrammarBackend,
    RegexError,
    UnsupportedSchemaError,
    allocate_token_bitmask,
    compile_constraint,
)
from radixgen.constrained.checker import tiny_tokenizer_path
from radixgen.constrained.grammar_interface import GrammarBackendName
from radixgen.runtime import server_args

BACKENDS = ["llguidance", "outlines"]
MAX_STEPS = 150
REGEXES = [
    r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    r"(cat|category|dog)s?( [a-z]{1,4})*",
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
    r"[A-Z][a-zé ]{0,12}\.",
]
SCHEMAS = [
    {
        "$defs": {"Tag": {"type": "string", "enum": ["red", "green", "blue"]}},
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": -5, "maximum": 500},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "maxItems": 3},
            "ok": {"type": "boolean"},
        },
        "required": ["id"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "x": {"type": "integer", "minimum": -99, "maximum": 99},
                "y": {"type": ["string", "null"], "maxLength": 4},
            },
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 3,
    },
    {"type": "string", "pattern": "^[a-f0-9]{2,6}$"},
    {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    backend = GrammarBackend(tiny_tokenizer_path(), grammar_backend=request.param)
    yield backend
    backend.shutdown()


def allowed_ids(matcher, bitmask) -> np.ndarray:
    matcher.fill_bitmask(bitmask, 1)
    return np.flatnonzero(np.unpackbits(bitmask[1].numpy().view(np.uint8), bitorder="little"))


class WalkTooLong(Exception):
    """A random walk that did not end within MAX_STEPS (long strings, deep nesting)."""


def random_walk(grammar, seed: int) -> str:
    """Samples uniformly among allowed tokens (EOS half the time it is allowed) to the end."""
    generator = random.Random(seed)
    matcher = grammar.new_matcher()
    bitmask = allocate_token_bitmask(2, grammar.vocab_size)
    eos_ids = set(grammar.vocab.eos_token_ids)
    for _ in range(MAX_STEPS):
        if matcher.is_terminated():
            break
        allowed = allowed_ids(matcher, bitmask).tolist()
        eos = [t for t in allowed if t in eos_ids]
        assert bool(eos) == matcher.is_accepting()
        regular = [t for t in allowed if t not in eos_ids]
        assert regular or eos, "a reachable state allows nothing"
        if eos and (generator.random() < 0.5 or not regular):
            assert matcher.accept_token(eos[0])
            break
        assert matcher.accept_token(generator.choice(regular))
    if not matcher.is_terminated():
        raise WalkTooLong(f"no end within {MAX_STEPS} steps")
    return grammar.vocab.decode(list(matcher.output_ids)).decode()


@pytest.mark.parametrize("pattern", REGEXES)
def test_random_walks_fullmatch_the_regex(backend, pattern):
    grammar = backend.compile(ConstraintSpec.regex(pattern))
    for seed in range(15):
        assert re.fullmatch(pattern, random_walk(grammar, seed))


@pytest.mark.parametrize("schema", SCHEMAS, ids=["refs-enum", "array-objects", "pattern", "oneOf"])
def test_random_walks_validate_against_the_schema(backend, schema):
    grammar = backend.compile(ConstraintSpec.json_schema(schema))
    for seed in range(15):
        jsonschema.validate(json.loads(random_walk(grammar, seed)), schema)


def test_llguidance_never_allows_a_token_the_outlines_automaton_forbids():
    outlines = GrammarBackend(tiny_tokenizer_path(), grammar_backend="outlines")
    llguidance = GrammarBackend(tiny_tokenizer_path(), grammar_backend="llguidance")
    try:
        for spec in [ConstraintSpec.json_schema(SCHEMAS[0]), ConstraintSpec.regex(REGEXES[1])]:
            strict, lazy = outlines.compile(spec), llguidance.compile(spec)
            bitmask = allocate_token_bitmask(2, strict.vocab_size)
            for seed in range(3):
                strict_matcher, lazy_matcher = strict.new_matcher(), lazy.new_matcher()
                generator = random.Random(seed)
                while not lazy_matcher.is_terminated():
                    lazy_allowed = set(allowed_ids(lazy_matcher, bitmask).tolist())
                    assert lazy_allowed <= set(allowed_ids(strict_matcher, bitmask).tolist())
                    token_id = generator.choice(sorted(lazy_allowed))
                    assert lazy_matcher.accept_token(token_id)
                    assert strict_matcher.accept_token(token_id)
    finally:
        outlines.shutdown()
        llguidance.shutdown()


def test_ebnf_lark_and_json_object_grammars():
    backend = GrammarBackend(tiny_tokenizer_path(), grammar_backend="llguidance")
    try:
        ebnf = backend.compile(ConstraintSpec.ebnf('root ::= ("yes" | "no") " because " [a-z]+'))
        lark = backend.compile(ConstraintSpec.lark('start: item ("," item)*\nitem: /[0-9]{1,2}/'))
        for seed in range(10):
            assert re.fullmatch("(yes|no) because [a-z]+", random_walk(ebnf, seed))
            assert re.fullmatch("[0-9]{1,2}(,[0-9]{1,2})*", random_walk(lark, seed))
        with pytest.raises(ValueError, match="ebnf"):
            backend.compile(ConstraintSpec.ebnf("root ::= ("))
        with pytest.raises(ValueError, match="lark"):
            backend.compile(ConstraintSpec.lark("start: undefined_rule"))
    finally:
        backend.shutdown()


def test_json_object_nests_without_a_depth_cap_on_llguidance():
    checker = compile_constraint(json_object=True, backend="llguidance")
    deep = '{"a":' + "[" * 40 + '{"b":null}' + "]" * 40 + "}"
    assert checker.fullmatch(deep) and checker.fullmatch("{}")
    assert checker.fullmatch('{"k":-1.5e3,"s":"\\u00e9\\n","t":[true,false,{}]}')
    for invalid in ["[]", '{"a":1,}', '{"a":01}', "{'a':1}", '{"a":1} ', '{"a":"\x01"}']:
        assert not checker.fullmatch(invalid)


def test_outlines_refuses_grammars_clearly():
    for kind in ("ebnf", "lark"):
        with pytest.raises(
            ValueError, match=f"{kind} constraints need grammar_backend='llguidance'"
        ):
            compile_constraint(**{kind: 'root ::= "a"'}, backend="outlines")
    # outlines takes json_object as the flat regex of {"type": "object"}
    assert re.fullmatch(ConstraintSpec.json_object().to_regex(), '{"a":[1]}')


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_checker_runs_the_engine_grammar(backend_name):
    schema = SCHEMAS[0]
    checker = compile_constraint(json_schema=schema, tokenizer="tiny", backend=backend_name)
    assert checker.fullmatch('{"id":7,"tags":["red","blue"]}')
    assert checker.fullmatch('{"id":-5,"ok":false}')
    for invalid in ['{"id":501}', '{"tags":[]}', '{"id":1,"tags":["pink"]}', '{"id":1', ""]:
        assert not checker.fullmatch(invalid)
    by_bytes = compile_constraint(regex=REGEXES[3], backend=backend_name)  # 256-byte vocabulary
    assert by_bytes.fullmatch("Héllo there.") and not by_bytes.fullmatch("hello.")
    ebnf = 'root ::= ("yes" | "no") " because " [a-z]+'
    if backend_name == "llguidance":
        assert compile_constraint(ebnf=ebnf, backend=backend_name).fullmatch("no because x")
    with pytest.raises(UnsupportedSchemaError):
        # (unknown formats are annotations; "not a date" cannot be written exactly)
        refused = {"type": "string", "not": {"format": "date"}}
        compile_constraint(json_schema=refused, backend=backend_name)
    with pytest.raises(RegexError):
        compile_constraint(regex="(unclosed", backend=backend_name)
    with pytest.raises(TypeError, match="text must be a str"):
        checker.fullmatch(b"{}")


def test_checker_arguments_are_validated():
    with pytest.raises(ValueError, match="backend must be one of"):
        compile_constraint(regex="a", backend="xgrammar")
    with pytest.raises(ValueError, match="give one of"):
        compile_constraint()
    with pytest.raises(ValueError, match="at most one"):
        compile_constraint(regex="a", choices=["a"])


def test_server_args_grammar_backend_option():
    assert typing.get_args(server_args.GrammarBackendName) == typing.get_args(GrammarBackendName)
    assert server_args.ServerArgs().grammar_backend == "llguidance"
    assert server_args.ServerArgs(grammar_backend="outlines").grammar_backend == "outlines"
    with pytest.raises(ValueError, match="grammar_backend must be one of"):
        server_args.ServerArgs(grammar_backend="xgrammar")


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_batched_fill_equals_one_row_at_a_time(backend_name):
    backend = GrammarBackend(tiny_tokenizer_path(), grammar_backend=backend_name)
    try:
        specs = [ConstraintSpec.json_schema(SCHEMAS[0]), ConstraintSpec.regex(REGEXES[0])]
        matchers = [backend.compile(spec).new_matcher() for spec in specs * 2]
        scratch = allocate_token_bitmask(2, backend.vocab.vocab_size)
        assert matchers[2].accept_token(int(allowed_ids(matchers[2], scratch)[0]))  # rows differ
        batched = allocate_token_bitmask(5, backend.vocab.vocab_size)
        backend.fill_bitmasks([(matcher, row + 1) for row, matcher in enumerate(matchers)], batched)
        for row, matcher in enumerate(matchers):
            single = allocate_token_bitmask(1, backend.vocab.vocab_size)
            matcher.fill_bitmask(single, 0)
            assert torch.equal(batched[row + 1], single[0])
        assert torch.all(batched[0] == -1)  # rows without a matcher are untouched
        with pytest.raises(ValueError, match="row 9"):
            backend.fill_bitmasks([(matchers[0], 9)], batched)
    finally:
        backend.shutdown()


def test_refused_tokens_leave_the_matcher_unchanged(backend):
    grammar = backend.compile(ConstraintSpec.regex("ab"))
    encode = compile_constraint(regex="ab", tokenizer="tiny")._encode
    (a_id,), (b_id,), (z_id,) = encode(b"a"), encode(b"b"), encode(b"z")
    eos_id = grammar.vocab.eos_token_ids[0]
    matcher = grammar.new_matcher()
    assert not matcher.accept_token(z_id) and not matcher.accept_token(eos_id)
    assert not matcher.accept_token(grammar.vocab_size)  # outside the vocabulary
    assert matcher.accept_token(a_id) and not matcher.is_accepting()
    assert not matcher.accept_token(a_id)
    assert matcher.accept_token(b_id) and matcher.is_accepting() and matcher.is_terminated()
    assert matcher.accept_token(eos_id) and not matcher.accept_token(eos_id)
    assert matcher.output_ids == (a_id, b_id)
