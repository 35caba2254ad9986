"""The raw bytes of every token of a local Hugging Face tokenizer.

Constraints are automata over bytes, so each token id must be mapped to exactly the bytes it
adds to the output. Two encodings of token strings are common:

- byte-level BPE (GPT-2, Llama-3, Qwen): every byte is stored as one printable unicode character
  (GPT-2's `bytes_to_unicode` table, e.g. "Ġ" for a space); the inverse table gives the bytes;
- SentencePiece (Llama-2, Mistral, Gemma): "▁" stands for a space and `<0xAB>` pieces are
  single raw bytes (byte fallback); other pieces are plain UTF-8.

Special tokens (EOS, chat markers) carry no text: they are excluded, and the end-of-sequence ids
are kept apart so that a matcher can allow them only where the constraint may end.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SENTENCEPIECE_SPACE = "\u2581"  # "▁"
_BYTE_FALLBACK_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
# Names models use for their end-of-sequence token(s) when no tokenizer config says which it is.
_EOS_TOKEN_NAMES = (
    "</s>",
    "<eos>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
)


def byte_level_char_to_byte() -> dict[str, int]:
    """GPT-2's inverse byte table: the printable character standing for each of the 256 bytes.

    Printable Latin-1 bytes stand for themselves; the 68 others (control characters, space, ...)
    are mapped in order to the characters from U+0100 upwards.
    """
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    char_to_byte = {chr(b): b for b in printable}
    next_code_point = 256
    for b in range(256):
        if b not in printable:
            char_to_byte[chr(next_code_point)] = b
            next_code_point += 1
    return char_to_byte


@dataclass(frozen=True)
class TokenVocabulary:
    """Token id -> raw bytes for the regular (non-special) tokens of one tokenizer.

    Attributes:
        token_bytes: regular token id -> the bytes it appends to the output.
        eos_token_ids: ids that end generation; allowed only where the constraint may end.
        vocab_size: width of the logits row (>= every token id; the model may pad it).
        encoding: "byte_level" or "sentencepiece", how token strings were decoded.
    """

    token_bytes: dict[int, bytes]
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    encoding: str
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        if not self.eos_token_ids and not self.token_bytes:
            raise ValueError("token_bytes is empty: the tokenizer has no regular tokens")
        largest_id = max([*self.token_bytes, *self.eos_token_ids], default=-1)
        if self.vocab_size <= largest_id:
            raise ValueError(
                f"vocab_size={self.vocab_size} must exceed the largest id {largest_id}"
            )
        digest = hashlib.sha256()
        digest.update(f"{self.vocab_size}|{sorted(self.eos_token_ids)}|".encode())
        for token_id in sorted(self.token_bytes):
            digest.update(token_id.to_bytes(4, "little") + self.token_bytes[token_id] + b"\x00")
        object.__setattr__(self, "fingerprint", digest.hexdigest()[:16])

    def decode(self, token_ids: list[int]) -> bytes:
        """The bytes of a sequence of regular token ids (EOS ids add nothing)."""
        token_bytes = self.token_bytes  # a list, not a generator: called per row per step
        return b"".join([token_bytes.get(t, b"") for t in token_ids])


def load_vocabulary(
    tokenizer: Any,
    *,
    vocab_size: int | None = None,
    eos_token_ids: list[int] | None = None,
) -> TokenVocabulary:
    """Builds the byte vocabulary of a local tokenizer, without any network access.

    Args:
        tokenizer: a transformers `PreTrainedTokenizer(Fast)`, a `tokenizers.Tokenizer`, or the
            path of a `tokenizer.json` file.
        vocab_size: logits width; defaults to one past the largest token id.
        eos_token_ids: ids that end generation; defaults to the tokenizer's EOS token, or the
            special tokens with a conventional end-of-sequence name.

    Raises:
        TypeError: tokenizer is none of the accepted kinds.
        ValueError: the tokenizer's token encoding is not byte-level BPE or SentencePiece.
    """
    backend, special_ids, hf_eos_id = _unwrap_tokenizer(tokenizer)
    if backend is not None:
        description = json.loads(backend.to_str())
        id_to_token = {i: t for t, i in backend.get_vocab(with_added_tokens=True).items()}
        added = backend.get_added_tokens_decoder()
        special_ids |= {i for i, tok in added.items() if tok.special}
        literal_added = {i: tok.content for i, tok in added.items() if not tok.special}
        encoding = _detect_encoding(description, id_to_token)
    else:  # a slow transformers tokenizer: no tokenizer.json to inspect
        id_to_token = {i: t for t, i in tokenizer.get_vocab().items()}
        literal_added = {
            i: tok.content
            for i, tok in tokenizer.added_tokens_decoder.items()
            if i not in special_ids and not tok.special
        }
        encoding = _detect_encoding({}, id_to_token)

    decode_piece = _byte_level_decoder() if encoding == "byte_level" else _sentencepiece_decoder()
    token_bytes: dict[int, bytes] = {}
    for token_id, piece in id_to_token.items():
        if token_id in special_ids:
            continue
        raw = literal_added[token_id].encode() if token_id in literal_added else decode_piece(piece)
        if raw:  # an empty token would let the automaton loop without progress
            token_bytes[token_id] = raw

    if eos_token_ids is None:
        if hf_eos_id is not None:
            eos_token_ids = [hf_eos_id]
        else:
            eos_token_ids = [i for i, t in id_to_token.items() if t in _EOS_TOKEN_NAMES]
    for eos_id in eos_token_ids:
        token_bytes.pop(eos_id, None)
    largest_id = max(id_to_token, default=-1)
    return TokenVocabulary(
        token_bytes=token_bytes,
        eos_token_ids=tuple(sorted(set(eos_token_ids))),
        vocab_size=vocab_size if vocab_size is not None else largest_id + 1,
        encoding=encoding,
    )


def load_tokenizer_file(path: str | Path):
    """A `tokenizers.Tokenizer` from a tokenizer.json file or a folder holding one."""
    from tokenizers import Tokenizer

    file = Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"tokenizer path {str(path)!r} has no tokenizer.json")
    return Tokenizer.from_file(str(file))


def _unwrap_tokenizer(tokenizer: Any) -> tuple[Any, set[int], int | None]:
    """(tokenizers.Tokenizer or None for slow tokenizers, special ids, the HF eos id or None)."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, (str, Path)):
        return load_tokenizer_file(tokenizer), set(), None
    if isinstance(tokenizer, Tokenizer):
        return tokenizer, set(), None
    if hasattr(tokenizer, "all_special_ids") and hasattr(tokenizer, "get_vocab"):
        special_ids = set(tokenizer.all_special_ids)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        return backend, special_ids, tokenizer.eos_token_id
    raise TypeError(
        "tokenizer must be a transformers tokenizer, a tokenizers.Tokenizer or a tokenizer.json "
        f"path, got {type(tokenizer).__name__}"
    )


def _detect_encoding(description: dict, id_to_token: dict[int, str]) -> str:
    """ "byte_level" or "sentencepiece", from the tokenizer.json decoder, else from the pieces."""
    text = json.dumps(description.get("decoder")) + json.dumps(description.get("pre_tokenizer"))
    if '"ByteLevel"' in text:
        return "byte_level"
    if '"Metaspace"' in text or SENTENCEPIECE_SPACE in text or '"ByteFallback"' in text:
        return "sentencepiece"
    if description.get("model", {}).get("type") == "WordPiece":
        raise ValueError("WordPiece tokenizers are not supported: their pieces lose spaces")
    pieces = list(id_to_token.values())
    if sum(SENTENCEPIECE_SPACE in p for p in pieces) > sum("Ġ" in p for p in pieces):
        return "sentencepiece"
    if any("Ġ" in p for p in pieces):
        return "byte_level"
    raise ValueError("tokenizer encoding is neither byte-level BPE nor SentencePiece")


def _byte_level_decoder():
    char_to_byte = byte_level_char_to_byte()

    def decode(piece: str) -> bytes:
        try:
            return bytes(char_to_byte[c] for c in piece)
        except KeyError:  # a piece outside the byte alphabet (rare added words): plain UTF-8
            return piece.encode()

    return decode


def _sentencepiece_decoder():
    def decode(piece: str) -> bytes:
        byte_piece = _BYTE_FALLBACK_PIECE.match(piece)
        if byte_piece:
            return bytes([int(byte_piece.group(1), 16)])
        return piece.replace(SENTENCEPIECE_SPACE, " ").encode()

    return decode
