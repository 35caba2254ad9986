"""Regex token automata: outlines-core's end-of-match defect is worked around; masks are exact."""

from __future__ import annotations

import random
import re
from importlib.metadata import version

import numpy as np
import pytest
import torch

from radixgen.constrained import (
    ConstraintSpec,
    RegexError,
    TokenVocabulary,
    allocate_token_bitmask,
    compile_regex,
)
from radixgen.constrained.grammar import CompiledGrammar
from radixgen.constrained.regex_index import build_index_vocabulary

MERGED_TOKENS = [
    "ab", "bc", "abc", "1.", ".5", "15", "12", "00", '{"', '":', ' "', '",', "name", "true",
    "e+", "-1", "é", "ab1", "a.b", "\\u", "\\n", "héllo", "},", '"}',
]  # fmt: skip
EOS_ID = 0

# Regexes where outlines-core 0.2.14 drops transitions (end-of-match or leftmost-first cuts).
NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
DEFECT_CASES = [
    (r"a(bc)?", ["a", "abc"]),
    (r"[0-9]+(\.[0-9]+)?", ["1", "1.5", "15.05"]),
    (r"a|ab", ["a", "ab"]),
    (r"(a|ab)(c|bcd)", ["ac", "abc", "abcd"]),
    (NUMBER, ["1.5", "-1", "0", "12e+5", "1.5E-00"]),
    (r"a*", ["", "a", "aaa"]),
    (r'\{"name": "[a-zé]*"\}', ['{"name": ""}', '{"name": "héllo"}']),
]


def make_vocabulary() -> TokenVocabulary:
    """Every printable ASCII char, the two UTF-8 bytes of 'é' alone, and some merged tokens."""
    pieces = [bytes([b]) for b in range(32, 127)] + [b"\n", b"\xc3", b"\xa9"]
    pieces += [t.encode() for t in MERGED_TOKENS]
    token_bytes = {i + 1: raw for i, raw in enumerate(pieces)}  # id 0 is EOS
    return TokenVocabulary(
        token_bytes=token_bytes,
        eos_token_ids=(EOS_ID,),
        vocab_size=len(pieces) + 3,  # padded: ids past the tokenizer are never allowed
        encoding="byte_level",
    )


VOCAB = make_vocabulary()
BYTES_TO_ID = {raw: i for i, raw in VOCAB.token_bytes.items()}


def tokenizations(text: str) -> list[list[int]]:
    """Byte-by-byte and greedy longest-match tokenisations of `text`."""
    raw = text.encode()
    single = [BYTES_TO_ID[raw[i : i + 1]] for i in range(len(raw))]
    greedy, position = [], 0
    while position < len(raw):
        length = max(
            n
            for n in range(1, len(raw) - position + 1)
            if raw[position : position + n] in BYTES_TO_ID
        )
        greedy.append(BYTES_TO_ID[raw[position : position + length]])
        position += length
    return [single, greedy]


@pytest.mark.skipif(version("outlines-core") != "0.2.14", reason="documents 0.2.14's behaviour")
def test_raw_outlines_core_index_has_the_defect():
    import outlines_core

    plain = {raw: [i] for i, raw in VOCAB.token_bytes.items()}
    index = outlines_core.Index("a(bc)?", outlines_core.Vocabulary(EOS_ID, plain))
    after_a = index.get_next_state(index.get_initial_state(), BYTES_TO_ID[b"a"])
    assert index.get_next_state(after_a, BYTES_TO_ID[b"b"]) is None  # "abc" unreachable by bytes
    number = outlines_core.Index(r"[0-9]+(\.[0-9]+)?", outlines_core.Vocabulary(EOS_ID, plain))
    after_1 = number.get_next_state(number.get_initial_state(), BYTES_TO_ID[b"1"])
    assert number.get_next_state(after_1, BYTES_TO_ID[b"."]) is None  # "1.5" rejected


@pytest.mark.parametrize(("pattern", "texts"), DEFECT_CASES)
def test_automaton_accepts_every_tokenisation_of_matching_text(pattern, texts):
    automaton = compile_regex(pattern, VOCAB)
    for text in texts:
        assert re.fullmatch(pattern, text)
        for token_ids in tokenizations(text):
            state = automaton.initial_state
            for token_id in token_ids:
                state = automaton.next_state(state, token_id)
                assert state is not None, (pattern, text, token_ids)
            assert automaton.is_accepting(state), (pattern, text)


def test_automaton_rejects_non_matching_text():
    automaton = compile_regex(r"[0-9]+(\.[0-9]+)?", VOCAB)
    state = automaton.next_state(automaton.initial_state, BYTES_TO_ID[b"1."])
    assert state is not None and not automaton.is_accepting(state)  # "1." is only a prefix
    assert automaton.next_state(state, BYTES_TO_ID[b"."]) is None
    assert automaton.next_state(automaton.initial_state, BYTES_TO_ID[b"a"]) is None


def unpack(row: torch.Tensor) -> np.ndarray:
    """Allowed token ids of one packed bitmask row."""
    bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits)


RANDOM_WALK_PATTERNS = [
    NUMBER,
    r"a(bc)?d?",
    r'\{"name": "[a-zé ]{0,6}", "n": (true|-?[0-9]{1,3})\}',
    r"(ab|a\.b|[0-9]{2,4}){1,3}",
    r"[^\n]{0,5}x",  # negated classes and "." could consume the END sentinel
    r".{0,3}",
]


@pytest.mark.parametrize("pattern", RANDOM_WALK_PATTERNS)
def test_random_walk_over_allowed_tokens_always_matches(pattern):
    grammar = CompiledGrammar(automaton=compile_regex(pattern, VOCAB), vocab=VOCAB)
    bitmask = allocate_token_bitmask(3, VOCAB.vocab_size)
    generator = random.Random(pattern)
    for _ in range(40):
        matcher = grammar.new_matcher()
        text = b""
        for _step in range(40):
            matcher.fill_bitmask(bitmask, 1)
            allowed = unpack(bitmask[1])
            assert allowed.max(initial=0) < VOCAB.vocab_size - 2  # padded ids never allowed
            complete = re.fullmatch(pattern, text.decode("utf-8", "replace")) is not None
            assert (EOS_ID in allowed) == complete == matcher.is_accepting()
            if complete and (generator.random() < 0.3 or len(allowed) == 1):
                assert matcher.accept_token(EOS_ID) and matcher.is_terminated()
                break
            choice = int(generator.choice([t for t in allowed if t != EOS_ID]))
            assert matcher.accept_token(choice)
            text += VOCAB.token_bytes[choice]
        if matcher.is_terminated():
            assert re.fullmatch(pattern, text.decode("utf-8"))


def test_disallowed_token_and_early_eos_are_refused_without_changing_state():
    grammar = CompiledGrammar(automaton=compile_regex("ab", VOCAB), vocab=VOCAB)
    matcher = grammar.new_matcher()
    assert not matcher.accept_token(EOS_ID)
    assert not matcher.accept_token(BYTES_TO_ID[b"b"])
    assert not matcher.accept_token(VOCAB.vocab_size + 5)
    assert matcher.accept_token(BYTES_TO_ID[b"ab"]) and matcher.is_accepting()
    assert matcher.is_terminated()  # complete, and no token can extend "ab"
    assert matcher.accept_token(EOS_ID) and matcher.is_terminated()
    assert not matcher.accept_token(BYTES_TO_ID[b"a"])  # nothing after EOS


def test_choices_compile_to_escaped_alternation():
    choices = ["a.b", "a+b", "-1", "(x)", "é|", "ab"]
    pattern = ConstraintSpec.choices(choices).to_regex()
    for choice in choices:
        assert re.fullmatch(pattern, choice)
    assert not re.fullmatch(pattern, "axb")
    automaton = compile_regex(pattern, VOCAB)
    for choice in ["a.b", "ab"]:
        for token_ids in tokenizations(choice):
            state = automaton.initial_state
            for token_id in token_ids:
                state = automaton.next_state(state, token_id)
            assert automaton.is_accepting(state)


@pytest.mark.parametrize("pattern", ["(", "a{2,", "^a$", "[a-z&&[^b]]", "(?=a)b", ""])
def test_invalid_regex_gets_a_clear_error(pattern):
    with pytest.raises(RegexError, match="regex"):
        compile_regex(pattern, VOCAB)


def test_regex_the_vocabulary_cannot_spell_is_rejected():
    with pytest.raises(RegexError, match="vocabulary"):
        compile_regex("ü", VOCAB)


def test_index_vocabulary_excludes_sentinel_lead_byte_tokens():
    vocab = TokenVocabulary({1: b"a", 2: b"\xf4", 3: b"\xf4\x8f"}, (0,), 4, "byte_level")
    automaton = compile_regex("a", vocab, build_index_vocabulary(vocab))
    after_a = automaton.next_state(automaton.initial_state, 1)
    assert automaton.is_accepting(after_a)
    assert automaton.next_state(after_a, 2) is None and automaton.next_state(after_a, 3) is None


def test_top_level_number_schema_accepts_decimals():
    pattern = ConstraintSpec.json_schema({"type": "number"}).to_regex()
    automaton = compile_regex(pattern, VOCAB)
    for text in ["1.5", "-1.5", "15.05", "0", "1e+5"]:
        assert re.fullmatch(pattern, text)
        for token_ids in tokenizations(text):
            state = automaton.initial_state
            for token_id in token_ids:
                state = automaton.next_state(state, token_id)
                assert state is not None, (text, token_ids)
            assert automaton.is_accepting(state), text


@pytest.mark.parametrize("padding", [0, 3, 32 - (len(VOCAB.token_bytes) + 1) % 32])
def test_guide_written_masks_equal_numpy_packed_masks(padding):
    vocab = TokenVocabulary(
        dict(VOCAB.token_bytes), (EOS_ID,), len(VOCAB.token_bytes) + 1 + padding, "byte_level"
    )
    grammar = CompiledGrammar(automaton=compile_regex(RANDOM_WALK_PATTERNS[2], vocab), vocab=vocab)
    generator = random.Random(padding)
    matcher = grammar.new_matcher()
    for _ in range(30):
        state = matcher._states[-1]
        from_guide = grammar._mask_from_guide(state, matcher._guide)
        from_index = grammar._mask_from_index(state)
        assert torch.equal(from_guide, from_index)
        allowed = [t for t in unpack(from_index).tolist() if t != EOS_ID]
        if not allowed:
            break
        assert matcher.accept_token(generator.choice(allowed))
