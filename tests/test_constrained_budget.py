"""Valid at the token budget: shortest completions and budget-aware masks, on both backends.

Matchers are walked with adversarial random tokens (any allowed non-EOS token, so strings
grow until the budget steps in); the Engine tests run the tiny model end to end."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from radixgen.constrained import ConstraintSpec, GrammarBackend, allocate_token_bitmask
from radixgen.constrained.checker import tiny_tokenizer_path
from radixgen.runtime.engine import Engine

LONG_STRING_SCHEMA = {
    "type": "object",
    "properties": {"note": {"type": "string", "minLength": 2}, "n": {"type": "integer"}},
    "required": ["note", "n"],
    "additionalProperties": False,
}
LONG_FREE_REGEX = "id-[a-z ]{3,}(-x|-yy)"


@pytest.fixture(scope="module", params=["outlines", "llguidance"])
def backend(request):
    backend = GrammarBackend(
        tiny_tokenizer_path(),
        grammar_backend=request.param,
        jump_forward=False,
        constraint_budget=True,
    )
    yield backend
    backend.shutdown()


def random_walk(backend, grammar, budget: int | None, steps: int, seed: int) -> str:
    """Samples uniformly among the allowed non-EOS tokens for `steps` steps (or until the
    constraint ends), telling the matcher its budget; returns the output text."""
    rng = random.Random(seed)
    matcher, bitmask = grammar.new_matcher(), allocate_token_bitmask(1, grammar.vocab_size)
    eos = set(grammar.vocab.eos_token_ids)
    for step in range(steps):
        matcher.set_token_budget(None if budget is None else budget - step)
        bitmask.fill_(-1)
        backend.fill_bitmasks([(matcher, 0)], bitmask)
        bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
        allowed = [t for t in np.flatnonzero(bits[: grammar.vocab_size]).tolist() if t not in eos]
        if not allowed:
            break
        assert matcher.accept_token(rng.choice(allowed))
        if matcher.is_terminated():
            break
    text = grammar.vocab.decode(list(matcher.output_ids)).decode("utf-8", errors="replace")
    return text if matcher.is_accepting() else text + "<cut>"


def test_long_string_under_a_small_budget_is_always_valid_json(backend):
    grammar = backend.compile(ConstraintSpec.json_schema(json.dumps(LONG_STRING_SCHEMA)))
    needed = grammar.new_matcher().min_completion_tokens()
    assert needed is not None and needed > 0
    for seed in range(12):
        budget = needed + seed % 6
        text = random_walk(backend, grammar, budget, budget, seed)
        jsonschema.validate(json.loads(text), LONG_STRING_SCHEMA)
    # The same walks without the budget are cut mid-string: the test above could fail.
    cut = [random_walk(backend, grammar, None, needed + 2, seed) for seed in range(4)]
    assert all(text.endswith("<cut>") for text in cut)


def test_regex_with_a_long_free_part_fullmatches_at_the_budget(backend):
    grammar = backend.compile(ConstraintSpec.regex(LONG_FREE_REGEX))
    needed = grammar.new_matcher().min_completion_tokens()
    for seed in range(12):
        budget = needed + seed % 5
        assert re.fullmatch(LONG_FREE_REGEX, random_walk(backend, grammar, budget, budget, seed))


def test_outlines_distances_are_the_exact_shortest_token_paths():
    """The table against a brute-force BFS over every token of the tiny vocabulary."""
    backend = GrammarBackend(
        tiny_tokenizer_path(),
        grammar_backend="outlines",
        jump_forward=False,
        constraint_budget=True,
    )
    grammar = backend.compile(ConstraintSpec.regex("[0-9]{7}(ab|c)"))
    automaton, table = grammar.automaton, grammar.completion_table
    tokens = np.flatnonzero(
        np.unpackbits(
            grammar.token_mask(automaton.initial_state).numpy().view(np.uint8), bitorder="little"
        )
    )
    distance = {}
    frontier = [automaton.initial_state]
    reverse: dict[int, set[int]] = {}
    while frontier:  # forward closure, then a BFS backwards from the accepting states
        state = frontier.pop()
        if state in distance:
            continue
        distance[state] = None
        for token_id in automaton.allowed_token_ids(state).tolist():
            target = automaton.next_state(state, token_id)
            reverse.setdefault(target, set()).add(state)
            frontier.append(target)
    layer = [s for s in distance if automaton.is_accepting(s)]
    for depth in range(100):
        for state in layer:
            distance[state] = depth
        layer = {p for s in layer for p in reverse.get(s, ()) if distance[p] is None}
    assert tokens.size > 0 and len(distance) > 3
    assert {s: table.min_tokens(s) for s in distance} == distance
    backend.shutdown()


@pytest.fixture(scope="module", params=["outlines", "llguidance"])
def engine(request, tiny_model_path):
    with Engine(model_path=tiny_model_path, dtype="float32", grammar_backend=request.param) as e:
        yield e


def sampled(engine, max_new_tokens: int, **constraint) -> list[dict]:
    params = {"max_new_tokens": max_new_tokens, "temperature": 1.0, "n": 6, "seed": 3}
    return engine.generate("Note:", {**params, **constraint})


def test_engine_outputs_cut_by_max_new_tokens_are_valid(engine):
    schema = json.dumps(LONG_STRING_SCHEMA)
    outs = sampled(engine, 14, json_schema=schema)
    for out in outs:
        jsonschema.validate(json.loads(out["text"]), LONG_STRING_SCHEMA)
        assert len(out["output_ids"]) <= 14
    # finish_reason stays honest: outputs that used the whole budget say "length"
    assert any(out["meta_info"]["finish_reason"]["type"] == "length" for out in outs)
    for out in sampled(engine, 9, regex=LONG_FREE_REGEX):
        assert re.fullmatch(LONG_FREE_REGEX, out["text"]), out["text"]
    # Opted out: the same requests are truncated as before.
    raw = sampled(engine, 14, json_schema=schema, constraint_budget=False)
    assert not all(_is_json(out["text"]) for out in raw)
    engine.check_integrity()


def test_engine_refuses_a_budget_below_the_shortest_match(engine):
    with pytest.raises(ValueError, match=r"max_new_tokens.*needs \d+ tokens"):
        engine.generate("x", {"max_new_tokens": 2, "json_schema": json.dumps(LONG_STRING_SCHEMA)})
    # opted out: accepted and truncated
    out = engine.generate(
        "x",
        {"max_new_tokens": 2, "json_schema": LONG_STRING_SCHEMA, "constraint_budget": False},
    )
    assert out["meta_info"]["finish_reason"]["type"] == "length"


def test_server_flag_disables_the_budget(tiny_model_path):
    with Engine(
        model_path=tiny_model_path,
        dtype="float32",
        grammar_backend="outlines",
        disable_constraint_budget=True,
    ) as engine:
        out = engine.generate("x", {"max_new_tokens": 2, "json_schema": LONG_STRING_SCHEMA})
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert not _is_json(out["text"])


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_dsl_gen_takes_constraint_budget(engine):
    import radixgen as rg

    @rg.function
    def note(s, budget: bool):
        s += "Note: " + rg.gen(
            "json", json_schema=LONG_STRING_SCHEMA, max_tokens=12, constraint_budget=budget
        )

    kept = note.run(budget=True, backend=engine, temperature=1.0, seed=4)
    jsonschema.validate(json.loads(kept["json"]), LONG_STRING_SCHEMA)
    with pytest.raises(TypeError, match="constraint_budget"):
        rg.gen("x", regex="a", constraint_budget="no")


def test_docs_budget_example_runs():
    docs = Path(__file__).resolve().parents[1] / "docs" / "constrained.md"
    section = docs.read_text().split("## Valid at the token budget")[1]
    exec(section.split("```python")[1].split("```")[0], {})


@pytest.mark.parametrize("backend_name", ["outlines", "llguidance"])
def test_jump_forward_predicts_the_completion_left_after_it(backend_name):
    """The hook takes a jump only if a completion still fits after it: the prediction must
    equal the distance once the jump is applied."""
    backend = GrammarBackend(
        tiny_tokenizer_path(), grammar_backend=backend_name, constraint_budget=True
    )
    grammar = backend.compile(ConstraintSpec.json_schema(json.dumps(LONG_STRING_SCHEMA)))
    if backend_name == "outlines":
        grammar.build_char_automaton()  # normally built in the background
    matcher = grammar.new_matcher()
    plan = matcher.find_jump_forward()  # '{"note":"' is forced at the start
    assert plan is not None and plan.append_ids
    predicted = matcher.min_completion_tokens_after(plan)
    matcher.apply_jump_forward(plan)
    assert predicted == matcher.min_completion_tokens() and predicted > 0
    backend.shutdown()


def test_llguidance_builds_a_budget_table_only_for_requests_with_a_budget():
    """The table (~0.1 s of Python at 128k) held the GIL against the scheduler's steps even
    when no request used it: it is now built on the first budgeted request's demand."""
    backend = GrammarBackend(
        tiny_tokenizer_path(), grammar_backend="llguidance", constraint_budget=True
    )
    unused = backend.compile(ConstraintSpec.regex("[a-c]{2,5}x"))
    matcher = unused.new_matcher()  # a budget-free request: fills its mask, advances
    matcher.set_token_budget(None)
    backend.fill_bitmasks([(matcher, 0)], allocate_token_bitmask(1, unused.vocab_size))
    # One table thread builds in submission order: had `unused`'s table been submitted at its
    # compile, it would be built by the time this later one is.
    used = backend.compile(ConstraintSpec.regex("[0-9]{3}"))
    used.wait_for_budget_table()
    assert used.completion_table is not None and unused.completion_table is None
    # On demand (a budgeted request's poll), it is built and exact.
    assert not unused.budget_table_ready() or unused.completion_table is not None
    assert unused.new_matcher().min_completion_tokens() >= 1
    assert unused.budget_table_ready() and unused.completion_table is not None
    backend.shutdown()


def test_llguidance_budget_above_max_reach_never_restricts_and_at_it_does():
    """A budget above the table's `max_reach` is dropped per step (no state's mask could be
    restricted by it); one token less restricts some state."""
    backend = GrammarBackend(
        tiny_tokenizer_path(), grammar_backend="llguidance", constraint_budget=True
    )
    grammar = backend.compile(ConstraintSpec.regex(LONG_FREE_REGEX))
    grammar.wait_for_budget_table()
    table = grammar.completion_table
    num_states = len(table.distance)
    assert all(table.budget_mask(s, table.max_reach + 1) is None for s in range(num_states))
    assert any(table.budget_mask(s, table.max_reach) is not None for s in range(num_states))
    matcher = grammar.new_matcher()
    assert matcher.min_completion_tokens() is not None  # reads the table
    matcher.set_token_budget(table.max_reach + 1)
    unrestricted = matcher._token_budget is None
    matcher.set_token_budget(table.max_reach)
    assert unrestricted and matcher._token_budget == table.max_reach
    backend.shutdown()
