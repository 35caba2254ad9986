"""`GrammarBackend`: the engine's entry point to constrained decoding.

backend = GrammarBackend(tokenizer, vocab_size=model_vocab_size)
future = backend.compile_async(ConstraintSpec.json_schema(schema), timeout_s=30)
... later, when future.done():
matcher = future.result().new_matcher()   # raises the request's compile error, if any
each step: matcher.fill_bitmask(bitmask, row); sample; matcher.accept_token(token_id)
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

from radixgen.constrained.compile_cache import CompileCache, DiskCache
from radixgen.constrained.constraint_spec import ConstraintSpec
from radixgen.constrained.grammar import CompiledGrammar
from radixgen.constrained.regex_index import build_index_vocabulary, compile_regex
from radixgen.constrained.retokenize import BoundaryTokenizer
from radixgen.constrained.vocabulary import TokenVocabulary, load_tokenizer_file, load_vocabulary


class GrammarBackend:
    """Compiles constraints for one tokenizer and hands out compiled grammars.

    Args:
        tokenizer: a transformers tokenizer, a `tokenizers.Tokenizer`, a tokenizer.json path, or
            a ready `TokenVocabulary` (then without jump-forward, which needs the tokenizer).
        vocab_size: the model's logits width (may exceed the tokenizer's size).
        eos_token_ids: ids that end generation (default: the tokenizer's EOS).
        cache_size: compiled constraints kept in memory.
        cache_dir: if set, compiled indexes are also stored there and reused across restarts.
        max_workers: concurrent compilations.
        jump_forward: whether matchers may propose jump-forwards.
        char_fsm_timeout_s: budget of the background character-automaton build (a separate
            process, so its pure-Python work never holds this process's GIL); past it, that
            grammar simply has no jump-forward.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        vocab_size: int | None = None,
        eos_token_ids: list[int] | None = None,
        cache_size: int = 128,
        cache_dir: str | Path | None = None,
        max_workers: int = 2,
        jump_forward: bool = True,
        char_fsm_timeout_s: float = 120.0,
    ) -> None:
        if isinstance(tokenizer, TokenVocabulary):  # bytes only: no re-tokenising, no jump-forward
            self.vocab, jump_forward = tokenizer, False
        else:
            if isinstance(tokenizer, (str, Path)):
                tokenizer = load_tokenizer_file(tokenizer)
            self.vocab = load_vocabulary(
                tokenizer, vocab_size=vocab_size, eos_token_ids=eos_token_ids
            )
        self._boundary_tokenizer = BoundaryTokenizer(tokenizer) if jump_forward else None
        self._index_vocabulary = build_index_vocabulary(self.vocab)
        self._char_fsm_timeout_s = char_fsm_timeout_s
        self._disk_cache = DiskCache(cache_dir) if cache_dir is not None else None
        self._cache = CompileCache(
            self._compile_key, max_entries=cache_size, max_workers=max_workers
        )

    def compile_async(
        self, spec: ConstraintSpec, *, timeout_s: float | None = None
    ) -> Future[CompiledGrammar]:
        """Compiles `spec` on a worker thread; the future holds the grammar or the error.

        Errors (in the future): `RegexError`/`ValueError` for an invalid or unsupported
        constraint, `UnsupportedSchemaError` for a rejected JSON schema, `CompileTimeoutError`
        after `timeout_s`.
        """
        if not isinstance(spec, ConstraintSpec):
            raise TypeError(f"spec must be a ConstraintSpec, got {type(spec).__name__}")
        return self._cache.submit((spec, self.vocab.fingerprint), timeout_s=timeout_s)

    def compile(self, spec: ConstraintSpec, *, timeout_s: float | None = None) -> CompiledGrammar:
        """Blocking `compile_async(spec).result()`."""
        return self.compile_async(spec, timeout_s=timeout_s).result()

    def shutdown(self) -> None:
        self._cache.shutdown()

    def _compile_key(self, key: tuple[ConstraintSpec, str]) -> CompiledGrammar:
        spec, _ = key
        pattern = spec.to_regex()
        automaton = self._disk_cache.load(key) if self._disk_cache is not None else None
        if automaton is None:
            automaton = compile_regex(pattern, self.vocab, self._index_vocabulary)
            if self._disk_cache is not None:
                self._disk_cache.store(key, automaton)
        grammar = CompiledGrammar(
            automaton=automaton,
            vocab=self.vocab,
            boundary_tokenizer=self._boundary_tokenizer,
            source=spec.describe(),
        )
        if self._boundary_tokenizer is not None:
            # Masks work without it; jump-forward starts once this background build finishes.
            self._cache.run_in_background(
                lambda: grammar.build_char_automaton(subprocess_timeout_s=self._char_fsm_timeout_s)
            )
        return grammar
