"""JSON-schema constraints end to end on the tiny model's vocabulary, on both grammar backends:
every sampled output parses and validates, with and without jump-forward."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from tokenizers import Tokenizer

from radixgen.constrained import (
    CompiledGrammar,
    ConstraintSpec,
    GrammarBackend,
    allocate_token_bitmask,
)

MAX_SAMPLE_STEPS = 120
TOKENIZER_PATH = Path(__file__).parent.parent / "runtime" / "tiny_assets" / "tokenizer.json"
SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"kind": {"enum": ["cat", "dog", "cow"]}, "legs": {"const": 4}},
        "required": ["kind", "legs"],
        "additionalProperties": False,
    },
    {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 4}, {"type": "null"}]},
    {"type": "number"},
]


@pytest.fixture(scope="module", params=["llguidance", "outlines"])
def backend(request):
    tokenizer = Tokenizer.from_file(str(TOKENIZER_PATH))
    backend = GrammarBackend(tokenizer, grammar_backend=request.param)
    yield backend
    backend.shutdown()


def sample(grammar, generator: random.Random, *, jump_forward: bool) -> bytes:
    """One output: uniform over allowed tokens, EOS taken half the time it is allowed."""
    matcher = grammar.new_matcher()
    bitmask = allocate_token_bitmask(2, grammar.vocab_size)
    eos_ids = set(grammar.vocab.eos_token_ids)
    for _ in range(MAX_SAMPLE_STEPS):
        if matcher.is_terminated():
            break
        plan = matcher.find_jump_forward() if jump_forward else None
        if plan is not None:
            matcher.apply_jump_forward(plan)
            continue
        matcher.fill_bitmask(bitmask, 1)
        allowed = np.flatnonzero(
            np.unpackbits(bitmask[1].numpy().view(np.uint8), bitorder="little")
        )
        allowed_eos = [t for t in allowed.tolist() if t in eos_ids]
        assert bool(allowed_eos) == matcher.is_accepting()
        regular = [t for t in allowed.tolist() if t not in eos_ids]
        if allowed_eos and (generator.random() < 0.5 or not regular):
            assert matcher.accept_token(allowed_eos[0])
            break
        assert matcher.accept_token(generator.choice(regular))
    assert matcher.is_terminated(), "did not finish within MAX_SAMPLE_STEPS steps"
    return grammar.vocab.decode(list(matcher.output_ids))


@pytest.mark.parametrize("schema", SCHEMAS, ids=["object", "enum-const", "anyOf", "number"])
def test_sampled_outputs_parse_and_validate(backend, schema):
    grammar = backend.compile(ConstraintSpec.json_schema(schema), timeout_s=60)
    if isinstance(grammar, CompiledGrammar):  # outlines: jump-forward needs the char automaton
        grammar.build_char_automaton()
    for seed in range(12):
        output = sample(grammar, random.Random(seed), jump_forward=seed % 2 == 1)
        jsonschema.validate(json.loads(output.decode("utf-8")), schema)
