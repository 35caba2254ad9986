"""Jump-forward never changes text, keeps the tokenizer's own ids, and stops at every choice."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from radixgen.constrained import ConstraintSpec, GrammarBackend, allocate_token_bitmask

TOKENIZER_PATH = Path(__file__).parent.parent / "runtime" / "tiny_assets" / "tokenizer.json"
TOKENIZER = Tokenizer.from_file(str(TOKENIZER_PATH))
BACKEND = GrammarBackend(TOKENIZER, grammar_backend="outlines")  # char-automaton jump-forward
EOS_ID = BACKEND.vocab.eos_token_ids[0]

PERSON = (
    r'\{"name": "[A-Za-z ]{1,20}", "age": (0|[1-9][0-9]{0,2}), '
    r'"city": "(Paris|London|Berlin)", "tags": \[("[a-z]+"(, "[a-z]+")*)?\]\}'
)
# (constraint, a target document it admits)
DOCUMENTS = [
    (
        ConstraintSpec.regex(PERSON),
        '{"name": "Ada Lovelace", "age": 36, "city": "London", "tags": ["math", "poetry"]}',
    ),
    (ConstraintSpec.regex(PERSON), '{"name": "Bo", "age": 0, "city": "Berlin", "tags": []}'),
    (ConstraintSpec.choices(["yes, definitely", "no way", "maybe"]), "yes, definitely"),
    (
        ConstraintSpec.regex(r'\{"emoji": "😀", "values": \[-?[0-9]+(, -?[0-9]+)*\]\}'),
        '{"emoji": "😀", "values": [12345, -7, 0]}',
    ),
    (ConstraintSpec.regex(r'[{\[]"identifier": (true|false)[}\]]'), '["identifier": false]'),
    (  # longer than the 64-token re-tokenisation window
        ConstraintSpec.regex(r'\[(\{"id": [0-9]{1,3}, "label": "[a-z]{1,9}"\}(, )?){1,20}\]'),
        "["
        + ", ".join(
            f'{{"id": {7 * i}, "label": "{"abcdefghijk"[i % 5 : i % 5 + 4]}"}}' for i in range(14)
        )
        + "]",
    ),
]


def text_of(token_ids) -> str:
    return BACKEND.vocab.decode(list(token_ids)).decode("utf-8")


def allowed_ids(matcher) -> np.ndarray:
    bitmask = allocate_token_bitmask(1, BACKEND.vocab.vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    return np.flatnonzero(np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little"))


def run(grammar, choose_token, *, jump_forward: bool, max_steps: int = 200):
    """Drives a matcher like the engine does; returns (output ids, decode steps, jumps)."""
    grammar.build_char_automaton()  # normally built in the background after compiling
    matcher = grammar.new_matcher()
    decode_steps, jumps = 0, []
    while not matcher.is_terminated() and decode_steps < max_steps:
        if jump_forward:
            plan = matcher.find_jump_forward()
            if plan is not None:
                before = text_of(matcher.output_ids)
                matcher.apply_jump_forward(plan)
                after = text_of(matcher.output_ids)
                assert after == before + plan.appended_text  # emitted text never changes
                assert plan.appended_text
                jumps.append(plan)
                continue
        allowed = allowed_ids(matcher)
        token_id = choose_token(matcher.output_ids, allowed)
        assert token_id in allowed
        assert matcher.accept_token(token_id)
        decode_steps += 1
    return matcher.output_ids, decode_steps, jumps


def scripted_model(target_ids: list[int]):
    """A 'model' that always prefers the tokenizer's own tokenisation of the target document."""

    def choose(output_ids, allowed):
        position = len(output_ids)
        assert list(output_ids) == target_ids[:position], "output left the natural tokenisation"
        return target_ids[position] if position < len(target_ids) else EOS_ID

    return choose


@pytest.mark.parametrize(("spec", "document"), DOCUMENTS)
def test_scripted_model_output_is_identical_with_and_without_jump_forward(spec, document):
    grammar = BACKEND.compile(spec)
    assert re.fullmatch(spec.to_regex(), document)
    target_ids = TOKENIZER.encode(document).ids
    plain_ids, plain_steps, _ = run(grammar, scripted_model(target_ids), jump_forward=False)
    jumped_ids, jumped_steps, jumps = run(grammar, scripted_model(target_ids), jump_forward=True)
    assert list(plain_ids) == list(jumped_ids) == target_ids
    assert jumps and jumped_steps < plain_steps  # model steps saved


BOUNDED_PATTERNS = [  # bounded repetition, so a random model always finishes
    r'\{"name": "[A-Za-z ]{1,8}", "age": (0|[1-9][0-9]{0,2}), "city": "(Paris|London|Berlin)", '
    r'"tags": \[("[a-z]{1,4}"(, "[a-z]{1,4}"){0,2})?\]\}',
    r'\{"emoji": "😀", "values": \[-?[0-9]{1,4}(, -?[0-9]{1,4}){0,2}\], "ok": (true|false)\}',
    r"(yes|no|maybe)( because [a-z ]{1,6})?",
]


@pytest.mark.parametrize("pattern", BOUNDED_PATTERNS)
def test_random_model_with_jump_forward_always_satisfies_the_constraint(pattern):
    grammar = BACKEND.compile(ConstraintSpec.regex(pattern))
    total_jumps = 0
    for seed in range(8):
        generator = random.Random(seed)

        def choose(output_ids, allowed, generator=generator):
            if EOS_ID in allowed and (generator.random() < 0.5 or len(allowed) == 1):
                return EOS_ID
            return int(generator.choice([t for t in allowed if t != EOS_ID]))

        output_ids, _, jumps = run(grammar, choose, jump_forward=True)
        assert re.fullmatch(pattern, text_of(output_ids)), text_of(output_ids)
        total_jumps += len(jumps)
    assert total_jumps


def test_forced_spans_appear_exactly_and_stop_at_choices():
    grammar = BACKEND.compile(ConstraintSpec.regex(r'\{"count": [0-9]+, "unit": "(kg|g)"\}'))
    grammar.build_char_automaton()
    matcher = grammar.new_matcher()
    plan = matcher.find_jump_forward()
    assert plan.retract_tokens == 0 and plan.appended_text == '{"count":'  # " " may merge
    matcher.apply_jump_forward(plan)
    for token_id in TOKENIZER.encode(" 12").ids:
        assert matcher.accept_token(token_id)
    assert matcher.find_jump_forward() is None  # more digits may follow: never cut a number
    assert matcher.accept_token(TOKENIZER.encode(",").ids[0])
    plan = matcher.find_jump_forward()
    matcher.apply_jump_forward(plan)
    assert text_of(matcher.output_ids).startswith('{"count": 12, "unit":')
    assert plan.appended_text.startswith(' "unit"')


def test_retracts_a_token_the_tokenizer_would_merge_with_forced_text():
    grammar = BACKEND.compile(ConstraintSpec.regex(r'[{\[]"identifier": (true|false)[}\]]'))
    grammar.build_char_automaton()
    matcher = grammar.new_matcher()
    brace = TOKENIZER.token_to_id("{")
    assert matcher.accept_token(brace)
    plan = matcher.find_jump_forward()
    assert plan.retract_tokens == 1  # "{" is re-tokenised with the forced '"identifier...'
    assert plan.append_ids[0] == TOKENIZER.token_to_id('{"')
    matcher.apply_jump_forward(plan)
    assert text_of(matcher.output_ids) == "{" + plan.appended_text
    assert text_of(matcher.output_ids).startswith('{"identifier":')
    assert list(matcher.output_ids) == TOKENIZER.encode(text_of(matcher.output_ids)).ids


def test_no_jump_forward_when_disabled_or_complete():
    backend = GrammarBackend(TOKENIZER, jump_forward=False, grammar_backend="outlines")
    grammar = backend.compile(ConstraintSpec.choices(["only option"]))
    assert grammar.build_char_automaton() is None
    assert grammar.new_matcher().find_jump_forward() is None
    grammar = BACKEND.compile(ConstraintSpec.choices(["only option"]))
    grammar.build_char_automaton()
    matcher = grammar.new_matcher()
    plan = matcher.find_jump_forward()
    assert plan.appended_text == "only option"  # nothing may follow: the whole text is stable
    matcher.apply_jump_forward(plan)
    assert matcher.is_terminated() and matcher.find_jump_forward() is None


LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def build_llama3_style_tokenizer() -> Tokenizer:
    """Byte-level BPE behind Llama-3's pre-tokenizer regex (digits in runs of 1-3, one
    punctuation character glued to the letters after it), trained on local text."""
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    corpus = [document for _, document in DOCUMENTS] * 30 + [PERSON, "Paris London Berlin 2024"]
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def test_scripted_equivalence_with_a_llama3_style_pre_tokenizer():
    tokenizer = build_llama3_style_tokenizer()
    backend = GrammarBackend(
        tokenizer, eos_token_ids=[tokenizer.token_to_id("<|eos|>")], grammar_backend="outlines"
    )
    try:
        for spec, document in DOCUMENTS:
            grammar = backend.compile(spec)
            grammar.build_char_automaton()
            target = tokenizer.encode(document).ids
            eos_id = backend.vocab.eos_token_ids[0]
            outputs = []
            for enabled in (False, True):
                matcher, steps = grammar.new_matcher(), 0
                while not matcher.is_terminated():
                    plan = matcher.find_jump_forward() if enabled else None
                    if plan is not None:
                        matcher.apply_jump_forward(plan)
                        continue
                    position = len(matcher.output_ids)
                    assert list(matcher.output_ids) == target[:position]
                    assert matcher.accept_token(
                        target[position] if position < len(target) else eos_id
                    )
                    steps += 1
                outputs.append((list(matcher.output_ids), steps))
            assert outputs[0][0] == outputs[1][0] == target
            assert outputs[1][1] < outputs[0][1]
    finally:
        backend.shutdown()


def test_char_automaton_built_in_a_subprocess_matches_and_times_out_cleanly():
    from radixgen.constrained import CompiledGrammar

    compiled = BACKEND.compile(ConstraintSpec.regex(r'\{"count": [0-9]+, "unit": "(kg|g)"\}'))

    def fresh_grammar():
        return CompiledGrammar(
            automaton=compiled.automaton,
            vocab=compiled.vocab,
            boundary_tokenizer=compiled.boundary_tokenizer,
        )

    in_thread = fresh_grammar().build_char_automaton()
    in_subprocess = fresh_grammar().build_char_automaton(subprocess_timeout_s=60)
    for chars in (in_thread, in_subprocess):
        assert chars.forced_text(chars.initial_state) == '{"count": '
    for prefix in [
        '{"count": 1',
        '{"count": 12, ',
        '{"count": 1, "unit": "k',
        '{"count": 1, "unit": "g"}',
    ]:
        states = [
            chars.step_text(chars.initial_state, prefix) for chars in (in_thread, in_subprocess)
        ]
        assert in_thread.forced_text(states[0]) == in_subprocess.forced_text(states[1])
        assert in_thread.is_accepting(states[0]) == in_subprocess.is_accepting(states[1])

    too_slow = fresh_grammar()
    assert too_slow.build_char_automaton(subprocess_timeout_s=0.001) is None
    matcher = too_slow.new_matcher()
    assert matcher.find_jump_forward() is None  # no jump-forward, masks unaffected
    assert matcher.accept_token(TOKENIZER.token_to_id('{"'))


def test_llguidance_refused_plan_leaves_the_matcher_unchanged():
    from radixgen.constrained.jump_forward import JumpForward

    backend = GrammarBackend(TOKENIZER, grammar_backend="llguidance")
    matcher = backend.compile(ConstraintSpec.regex(r"\[[0-9](,[0-9]){2}\]")).new_matcher()
    assert matcher.accept_token(TOKENIZER.token_to_id("["))
    before = allowed_ids(matcher)
    digit, bracket = TOKENIZER.token_to_id("5"), TOKENIZER.token_to_id("]")
    bad = JumpForward(retract_tokens=0, append_ids=(digit, bracket), appended_text="5]")
    with pytest.raises(ValueError, match="not allowed"):
        matcher.apply_jump_forward(bad)  # "5" is consumed, then "]" refused: "5" is undone
    assert list(matcher.output_ids) == [TOKENIZER.token_to_id("[")]
    assert np.array_equal(allowed_ids(matcher), before)
    assert matcher.accept_token(digit) and not matcher.accept_token(bracket)


def test_memo_encoder_answers_like_the_tokenizer_and_stays_bounded():
    from radixgen.constrained.llguidance_backend import MemoEncoder

    calls = []

    def encode(text: bytes) -> list[int]:
        calls.append(text)
        return TOKENIZER.encode(text.decode(), add_special_tokens=False).ids

    memo = MemoEncoder(encode, max_text_bytes=8, max_entries=2)
    for text in (b'",', b'",', b'"}', b'"}', b"a long text", b"a long text", b"x", b"x"):
        ids = memo(text)
        assert ids == TOKENIZER.encode(text.decode()).ids
        ids.append(-1)  # a caller's list is its own: the memo is not changed
    # kept: the two short texts; not kept: the long one, and "x" past max_entries
    assert calls == [b'",', b'"}', b"a long text", b"a long text", b"x", b"x"]
