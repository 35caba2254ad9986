"""Token -> bytes extraction for byte-level BPE and SentencePiece tokenizers built locally."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from radixgen.constrained import load_vocabulary
from radixgen.constrained.vocabulary import byte_level_char_to_byte

CORPUS = [
    'def f(x):\n    return {"name": "Zoë", "age": 42, "tags": ["a", "b"]}\n',
    "The quick brown fox jumps over the lazy dog. 3.14159 and -17e3; 中文 ünïcödé ☃ 😀\n",
    "SELECT id, name FROM users WHERE age >= 18 AND city = 'Paris';\n",
] * 20
SAMPLES = [
    '{"name": "Zoë", "age": 42}',
    "  leading spaces and\ttabs\nnew lines",
    "emoji 😀 snowman ☃ and 中文",
    "rare bytes: \x00\x7f ~`^",
]


def build_byte_level_bpe() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def build_sentencepiece_bpe() -> Tokenizer:
    """Llama-2 style: '▁' for spaces, byte-fallback pieces <0x00>..<0xFF> in the model vocab."""
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizers.Replace(" ", "▁")
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>"], show_progress=False)
    trained.train_from_iterator(CORPUS, trainer)
    learned = json.loads(trained.to_str())["model"]
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    pieces += [p for p, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]) if p != "<unk>"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tokenizer = Tokenizer(
        models.BPE(
            vocab={p: i for i, p in enumerate(pieces)},
            merges=merges,
            unk_token="<unk>",
            byte_fallback=True,
        )
    )
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tokenizer


def test_byte_level_table_is_a_bijection_over_256_bytes():
    table = byte_level_char_to_byte()
    assert sorted(table.values()) == list(range(256))
    assert table["Ġ"] == ord(" ") and table["Ċ"] == ord("\n") and table["a"] == ord("a")


def test_byte_level_bpe_tokens_spell_the_text_and_specials_are_excluded():
    tokenizer = build_byte_level_bpe()
    vocab = load_vocabulary(tokenizer)
    assert vocab.encoding == "byte_level"
    eos_id = tokenizer.token_to_id("<|endoftext|>")
    pad_id = tokenizer.token_to_id("<|pad|>")
    assert vocab.eos_token_ids == (eos_id,)
    assert eos_id not in vocab.token_bytes and pad_id not in vocab.token_bytes
    assert vocab.vocab_size == tokenizer.get_vocab_size()
    for text in SAMPLES:
        ids = tokenizer.encode(text).ids
        assert vocab.decode(ids) == text.encode()
    # all 256 single bytes are tokens of a byte-level vocabulary
    assert {raw for raw in vocab.token_bytes.values() if len(raw) == 1} == {
        bytes([b]) for b in range(256)
    }


def test_sentencepiece_pieces_map_spaces_and_byte_fallback():
    tokenizer = build_sentencepiece_bpe()
    vocab = load_vocabulary(tokenizer)
    assert vocab.encoding == "sentencepiece"
    assert vocab.eos_token_ids == (tokenizer.token_to_id("</s>"),)
    assert vocab.token_bytes[tokenizer.token_to_id("<0xE4>")] == b"\xe4"
    for text in SAMPLES:
        ids = tokenizer.encode(text).ids
        assert vocab.decode(ids) == text.encode()  # '▁' -> space; unseen chars via bytes
    # special tokens (declared as such) carry no text
    for special in ("<unk>", "<s>", "</s>"):
        assert tokenizer.token_to_id(special) not in vocab.token_bytes


def test_transformers_fast_tokenizer_and_explicit_overrides(tmp_path):
    from transformers import PreTrainedTokenizerFast

    backend = build_byte_level_bpe()
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")
    hf.add_tokens(["<custom word>"])  # a non-special added token keeps its literal text
    vocab = load_vocabulary(hf, vocab_size=512)
    assert vocab.vocab_size == 512
    assert vocab.eos_token_ids == (hf.eos_token_id,)
    assert vocab.token_bytes[hf.convert_tokens_to_ids("<custom word>")] == b"<custom word>"
    pad = backend.token_to_id("<|pad|>")
    overridden = load_vocabulary(hf, eos_token_ids=[pad])
    assert overridden.eos_token_ids == (pad,)
    assert overridden.fingerprint != vocab.fingerprint

    path = tmp_path / "tokenizer.json"
    backend.save(str(path))
    from_file = load_vocabulary(str(tmp_path))
    assert from_file.token_bytes == load_vocabulary(backend).token_bytes


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="tokenizer must be"):
        load_vocabulary(42)
    with pytest.raises(ValueError, match="tokenizer.json"):
        load_vocabulary("/nonexistent/folder")
    with pytest.raises(ValueError, match="vocab_size"):
        load_vocabulary(build_byte_level_bpe(), vocab_size=10)


def test_tiny_model_tokenizer():
    from pathlib import Path

    path = Path(__file__).parent.parent / "runtime" / "tiny_assets" / "tokenizer.json"
    vocab = load_vocabulary(str(path))
    tokenizer = Tokenizer.from_file(str(path))
    assert vocab.encoding == "byte_level" and vocab.vocab_size == 32000
    assert tokenizer.token_to_id("<|endoftext|>") in vocab.eos_token_ids
    text = '{"name": "Zoë", "emoji": "😀"}\n'
    assert vocab.decode(tokenizer.encode(text).ids) == text.encode()
