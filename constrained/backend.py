"""`GrammarBackend`: the engine's entry point to constrained decoding.

backend = GrammarBackend(tokenizer, vocab_size=model_vocab_size, grammar_backend="llguidance")
future = backend.compile_async(ConstraintSpec.json_schema(schema), timeout_s=30)
... later, when future.done():
matcher = future.result().new_matcher()   # raises the request's compile error, if any
each step: matcher.fill_bitmask(bitmask, row); sample; matcher.accept_token(token_id)

`grammar_backend` picks who compiles and masks ("llguidance" or "outlines", see
`grammar_interface`); both enforce radixgen's own translation, so outputs are equally exact.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

from radixgen.constrained.compile_cache import CompileCache, DiskCache
from radixgen.constrained.constraint_spec import ConstraintSpec
from radixgen.constrained.grammar_interface import (
    DEFAULT_GRAMMAR_BACKEND,
    ConstraintGrammar,
    ConstraintMatcher,
    GrammarBackendName,
    check_grammar_backend_name,
)
from radixgen.constrained.retokenize import BoundaryTokenizer
from radixgen.constrained.vocabulary import TokenVocabulary, load_tokenizer_file, load_vocabulary


class GrammarBackend:
    """Compiles constraints for one tokenizer and hands out compiled grammars.

    Args:
        tokenizer: a transformers tokenizer, a `tokenizers.Tokenizer`, a tokenizer.json path, or
            a ready `TokenVocabulary` (then without jump-forward, which needs the tokenizer).
        grammar_backend: "llguidance" (lazy masks from a token trie; also EBNF and Lark
            grammars) or "outlines" (outlines-core token automata built at compile time).
        vocab_size: the model's logits width (may exceed the tokenizer's size).
        eos_token_ids: ids that end generation (default: the tokenizer's EOS).
        cache_size: compiled constraints kept in memory.
        cache_dir: outlines only: compiled indexes are also stored there across restarts.
        max_workers: concurrent compilations.
        jump_forward: whether matchers may propose jump-forwards.
        char_fsm_timeout_s: outlines only: budget of the background character-automaton build
            (a separate process, so its pure-Python work never holds this process's GIL); past
            it, that grammar simply has no jump-forward.
        constraint_budget: builds each grammar's shortest-completion table, so matchers told
            their token budget (`set_token_budget`) keep a complete output within reach
            (`completion_budget`); off for tools that never generate (checker, benchmarks).

    Raises:
        ValueError: `grammar_backend` names no backend.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        grammar_backend: GrammarBackendName = DEFAULT_GRAMMAR_BACKEND,
        vocab_size: int | None = None,
        eos_token_ids: list[int] | None = None,
        cache_size: int = 128,
        cache_dir: str | Path | None = None,
        max_workers: int = 2,
        jump_forward: bool = True,
        char_fsm_timeout_s: float = 120.0,
        constraint_budget: bool = False,
    ) -> None:
        self.grammar_backend = check_grammar_backend_name(grammar_backend)
        if isinstance(tokenizer, TokenVocabulary):  # bytes only: no re-tokenising, no jump-forward
            self.vocab, tokenizer, jump_forward = tokenizer, None, False
        else:
            if isinstance(tokenizer, (str, Path)):
                tokenizer = load_tokenizer_file(tokenizer)
            self.vocab = load_vocabulary(
                tokenizer, vocab_size=vocab_size, eos_token_ids=eos_token_ids
            )
        self._cache = CompileCache(
            self._compile_key, max_entries=cache_size, max_workers=max_workers
        )
        if self.grammar_backend == "llguidance":
            from radixgen.constrained.llguidance_backend import LLGuidanceCompiler

            self._compiler = LLGuidanceCompiler(
                self.vocab, tokenizer, constraint_budget=constraint_budget
            )
        else:
            from radixgen.constrained.outlines_backend import OutlinesCompiler

            self._compiler = OutlinesCompiler(
                self.vocab,
                boundary_tokenizer=BoundaryTokenizer(tokenizer) if jump_forward else None,
                disk_cache=DiskCache(cache_dir) if cache_dir is not None else None,
                char_fsm_timeout_s=char_fsm_timeout_s,
                run_in_background=self._cache.run_in_background,
                constraint_budget=constraint_budget,
            )
        self.jump_forward = jump_forward

    def compile_async(
        self, spec: ConstraintSpec, *, timeout_s: float | None = None
    ) -> Future[ConstraintGrammar]:
        """Compiles `spec` on a worker thread; the future holds the grammar or the error.

        Errors (in the future): `RegexError`/`ValueError` for an invalid or unsupported
        constraint, `UnsupportedSchemaError` for a rejected JSON schema, `CompileTimeoutError`
        after `timeout_s`.
        """
        if not isinstance(spec, ConstraintSpec):
            raise TypeError(f"spec must be a ConstraintSpec, got {type(spec).__name__}")
        return self._cache.submit((spec, self.vocab.fingerprint), timeout_s=timeout_s)

    def compile(self, spec: ConstraintSpec, *, timeout_s: float | None = None) -> ConstraintGrammar:
        """Blocking `compile_async(spec).result()`."""
        return self.compile_async(spec, timeout_s=timeout_s).result()

    def fill_bitmasks(self, matchers: list[tuple[ConstraintMatcher, int]], bitmask) -> None:
        """Writes each matcher's next-step allowed-token bits into its row of `bitmask`.

        With llguidance the rows are filled in parallel (Rust threads, GIL released); with
        outlines one after another (each row is a cached per-state copy).

        Args:
            matchers: (matcher from this backend's grammars, row) pairs, rows distinct.
            bitmask: int32 CPU tensor [batch, ceil(vocab_size / 32)].
        """
        if self.grammar_backend == "llguidance":
            self._compiler.fill_bitmasks(matchers, bitmask)
            return
        for matcher, row in matchers:
            matcher.fill_bitmask(bitmask, row)

    def shutdown(self) -> None:
        self._cache.shutdown()
        if self.grammar_backend == "llguidance":  # its budget tables build on a thread
            self._compiler.shutdown()

    def _compile_key(self, key: tuple[ConstraintSpec, str]) -> ConstraintGrammar:
        spec, _ = key
        return self._compiler.compile(spec)
