"""The "outlines" grammar backend: regexes compiled to outlines-core token automata.

The whole automaton (regex DFA x vocabulary) is built at compile time, on the compile pool,
and stored in the optional disk cache; masks are then per-state lookups. It takes regexes
only: EBNF and Lark grammars need the llguidance backend.
"""

from __future__ import annotations

from collections.abc import Callable

from radixgen.constrained.compile_cache import DiskCache
from radixgen.constrained.completion_budget import TokenDistanceTable
from radixgen.constrained.constraint_spec import ConstraintSpec
from radixgen.constrained.grammar import CompiledGrammar
from radixgen.constrained.regex_index import build_index_vocabulary, compile_regex
from radixgen.constrained.retokenize import BoundaryTokenizer
from radixgen.constrained.vocabulary import TokenVocabulary

# Kinds this backend cannot express as one regex.
GRAMMAR_KINDS = ("ebnf", "lark", "structural_tag")


class OutlinesCompiler:
    """Compiles constraints to `CompiledGrammar`s (token automata) for one vocabulary.

    Args:
        vocab: the tokenizer's byte vocabulary.
        boundary_tokenizer: re-tokenises jump-forward boundaries; None disables jump-forward.
        disk_cache: where compiled indexes are stored across restarts, or None.
        char_fsm_timeout_s: budget of the background character-automaton build.
        run_in_background: runs a callable on the compile pool (the jump-forward FSM build).
        constraint_budget: builds each grammar's shortest-completion table (budget-aware masks).
    """

    def __init__(
        self,
        vocab: TokenVocabulary,
        *,
        boundary_tokenizer: BoundaryTokenizer | None,
        disk_cache: DiskCache | None,
        char_fsm_timeout_s: float,
        run_in_background: Callable[[Callable[[], object]], object],
        constraint_budget: bool = False,
    ) -> None:
        self.vocab = vocab
        self._boundary_tokenizer = boundary_tokenizer
        self._disk_cache = disk_cache
        self._char_fsm_timeout_s = char_fsm_timeout_s
        self._run_in_background = run_in_background
        self._constraint_budget = constraint_budget
        self._index_vocabulary = build_index_vocabulary(vocab)

    def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        if spec.kind in GRAMMAR_KINDS:
            raise ValueError(
                f"{spec.kind} constraints need grammar_backend='llguidance'; the outlines backend "
                "takes regex, json_schema, json_object and choices only"
            )
        pattern = spec.to_regex()
        key = (spec, self.vocab.fingerprint)
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
            completion_table=(
                TokenDistanceTable(automaton, self.vocab.eos_token_ids)
                if self._constraint_budget
                else None
            ),
        )
        if self._boundary_tokenizer is not None:
            # Masks work without it; jump-forward starts once this background build finishes.
            self._run_in_background(
                lambda: grammar.build_char_automaton(subprocess_timeout_s=self._char_fsm_timeout_s)
            )
        return grammar
