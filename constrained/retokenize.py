"""Tokenises text at a jump-forward boundary the way the model's tokenizer does.

Only two questions are asked of the tokenizer: the ids of a text (no special tokens), and where
its last pre-token starts. Pre-tokens (the tokenizer's regex split into words, numbers,
punctuation runs, whitespace) are the units BPE merges within; text appended later can only
change the last pre-token of a text, so token boundaries before it are final.
"""

from __future__ import annotations

from typing import Any


class BoundaryTokenizer:
    """`encode` and `pre_token_starts` over a transformers or `tokenizers` tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers import Tokenizer

        if isinstance(tokenizer, Tokenizer):
            backend = tokenizer
        else:
            backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend = backend
        self._slow_tokenizer = tokenizer if backend is None else None
        self._normalizer = backend.normalizer if backend is not None else None
        self._pre_tokenizer = backend.pre_tokenizer if backend is not None else None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens."""
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self._slow_tokenizer.encode(text, add_special_tokens=False))

    def pre_token_starts(self, text: str) -> list[int] | None:
        """Character offsets where the pre-tokens of `text` start; None if unknown.

        Unknown without a pre-tokenizer (merges may then span any boundary: SentencePiece
        BPE) or when normalisation changes the text (offsets would not be ours: Llama-2's
        prepended "▁"); jump-forward is then not attempted.
        """
        if self._pre_tokenizer is None:
            return None
        if self._normalizer is not None and self._normalizer.normalize_str(text) != text:
            return None
        return [start for _, (start, _) in self._pre_tokenizer.pre_tokenize_str(text)]
