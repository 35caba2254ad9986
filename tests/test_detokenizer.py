"""Incremental detokenization with the tiny byte-level BPE tokenizer."""

from __future__ import annotations

import pytest

from radixgen.runtime.detokenizer import (
    IncrementalDetokenizer,
    add_tokens_batch,
    find_stop,
    partial_stop_suffix_len,
)

TEXT = "héllo 世界 🎉 naïve → done"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from radixgen.runtime.tokenizer import load_tokenizer

    return load_tokenizer(tiny_model_path)


def stream(tokenizer, ids, **kwargs):
    detok = IncrementalDetokenizer(tokenizer, **kwargs)
    deltas = [detok.add_tokens([i], finished=(n == len(ids) - 1)) for n, i in enumerate(ids)]
    return detok, deltas


def test_multibyte_characters_are_never_split(tokenizer):
    ids = tokenizer.encode(TEXT)
    # The tokenizer really splits characters across tokens here.
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    detok, deltas = stream(tokenizer, ids)
    assert "".join(deltas) == TEXT
    assert not any("\ufffd" in delta for delta in deltas)
    assert detok.text == TEXT


def test_prompt_context_does_not_leak_into_output(tokenizer):
    prompt = tokenizer.encode("say:")
    ids = tokenizer.encode(" hi there")
    detok = IncrementalDetokenizer(tokenizer, prompt)
    assert detok.add_tokens(ids, finished=True) == " hi there"


def test_stop_string_across_token_boundary_is_trimmed_and_held_back(tokenizer):
    text = "alpha beta gamma delta"
    ids = tokenizer.encode(text)
    detok, deltas = stream(tokenizer, ids, stop_strings=["a gam"])
    assert detok.text == "alpha bet"
    assert detok.matched_stop == "a gam"
    assert "".join(deltas) == "alpha bet"
    # Nothing emitted was ever part of the stop string.
    assert not any("gam" in delta for delta in deltas)


def test_text_after_stop_is_ignored(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, stop_strings=["STOP"])
    detok.add_tokens(tokenizer.encode("abc STOP"))
    assert detok.add_tokens(tokenizer.encode(" more"), finished=True) == ""
    assert detok.text == "abc "


def test_partial_stop_is_released_when_it_does_not_complete(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, stop_strings=["xyz"])
    first = detok.add_tokens(tokenizer.encode("ab x"))
    assert first == "ab "
    rest = detok.add_tokens(tokenizer.encode("w"), finished=True)
    assert first + rest == "ab xw"


def test_helpers():
    assert find_stop("one two three", ["three", "two"]) == (4, "two")
    assert find_stop("one", ["x"]) is None
    assert partial_stop_suffix_len("hello wor", ["world", "xx"]) == 3
    assert partial_stop_suffix_len("hello", ["xyz"]) == 0


def test_invalid_bytes_do_not_stall_the_stream(tokenizer):
    # A lone continuation byte is invalid for good; the text after it streams normally.
    lone = next(i for i in range(tokenizer.vocab_size) if tokenizer.decode([i]) == "\ufffd")
    ids = [lone] + tokenizer.encode(" and then some words")
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.add_tokens([i]) for i in ids]
    assert deltas[0] == ""  # the lone byte might still start a character
    assert "".join(deltas) == tokenizer.decode(ids)  # all streamed before finishing
    assert detok.add_tokens([], finished=True) == ""


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_add_tokens_batch_matches_one_stream_at_a_time(tokenizer, skip_special_tokens):
    texts = [TEXT, "stop here: the end", "naïve → 🎉 ok", "a"]
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    options = {"skip_special_tokens": skip_special_tokens, "stop_strings": ["here", "ok"]}
    one_by_one = [IncrementalDetokenizer(tokenizer, **options) for _ in texts]
    batched = [IncrementalDetokenizer(tokenizer, **options) for _ in texts]
    longest = max(len(seq) for seq in ids)
    for step in range(longest):
        # Streams that ended drop out; one stream appears twice (two steps in one message).
        live = [i for i, seq in enumerate(ids) if step < len(seq)]
        rows = live + live[:1]
        new = [[seq[step]] for seq in (ids[i] for i in live)] + [[ids[live[0]][step]]]
        ends = [step == len(ids[i]) - 1 for i in live] + [False]
        ends[0] = False  # the stream seen twice finishes on its second row at most
        expected = [
            one_by_one[i].add_tokens(t, finished=e) for i, t, e in zip(rows, new, ends, strict=True)
        ]
        got = add_tokens_batch(tokenizer, [batched[i] for i in rows], new, ends)
        assert got == expected
    for reference, stream in zip(one_by_one, batched, strict=True):
        assert stream.text == reference.text and stream.matched_stop == reference.matched_stop
