"""A compiled constraint: the token automaton plus per-state allowed-token bitmasks.

One `CompiledGrammar` is shared (through the compile cache) by every request with the same
constraint; each request gets its own cheap `Matcher` from `new_matcher()`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from radixgen.constrained.char_automaton import CharAutomaton
from radixgen.constrained.completion_budget import TokenDistanceTable
from radixgen.constrained.grammar_interface import ConstraintGrammar
from radixgen.constrained.regex_index import TokenAutomaton
from radixgen.constrained.retokenize import BoundaryTokenizer
from radixgen.constrained.vocabulary import TokenVocabulary


def bitmask_num_words(vocab_size: int) -> int:
    """int32 words per bitmask row: one bit per token."""
    return (vocab_size + 31) // 32


def pack_token_bitmask(token_ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """Packs allowed token ids into one int32 bitmask row (bit j of word w allows 32*w+j)."""
    allowed = np.zeros(bitmask_num_words(vocab_size) * 32, dtype=np.bool_)
    allowed[token_ids] = True
    return np.packbits(allowed, bitorder="little").view(np.int32)  # [num_words]


@dataclass
class CompiledGrammar(ConstraintGrammar):
    """A constraint compiled for one vocabulary by the outlines backend.

    Attributes:
        automaton: the token-level DFA (outlines-core index without its end-of-match defect).
        vocab: the tokenizer's byte vocabulary (EOS ids, sizes).
        boundary_tokenizer: re-tokenises jump-forward boundaries; None disables jump-forward.
        source: a short description of the constraint, for errors and logs.
        completion_table: shortest completions in tokens for budget-aware masks, or None
            (built by the backend unless the constraint budget is disabled).
        char_automaton: the character-level FSM for jump-forward; None until
            `build_char_automaton()` has run (the backend runs it in the background, so a
            grammar is usable for masking before jump-forward is).
    """

    automaton: TokenAutomaton
    vocab: TokenVocabulary
    boundary_tokenizer: BoundaryTokenizer | None = None
    source: str = ""
    completion_table: TokenDistanceTable | None = None
    char_automaton: CharAutomaton | None = field(default=None, init=False)
    _mask_by_state: dict = field(default_factory=dict, repr=False)
    _terminal_by_state: dict = field(default_factory=dict, repr=False)
    _char_automaton_failed: bool = field(default=False, repr=False)
    _mask_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Separate: the char automaton build may take seconds and must never delay a mask.
    _char_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self._eos_ids = np.asarray(self.vocab.eos_token_ids, dtype=np.int64)

    def build_char_automaton(self, *, subprocess_timeout_s: float | None = None):
        """Builds (once) the character automaton jump-forward needs.

        Args:
            subprocess_timeout_s: if set, interegular runs in a separate process killed after
                this many seconds (then jump-forward stays off for this grammar); otherwise it
                runs in this thread.

        Returns the automaton, or None when jump-forward is disabled or the build failed.
        """
        from radixgen.constrained import char_fsm_worker

        if self.boundary_tokenizer is None:
            return None
        with self._char_lock:
            if self.char_automaton is None and not self._char_automaton_failed:
                try:
                    if subprocess_timeout_s is None:
                        table = char_fsm_worker.build_char_fsm_table(self.automaton.pattern)
                    else:
                        table = char_fsm_worker.build_char_fsm_table_in_subprocess(
                            self.automaton.pattern, timeout_s=subprocess_timeout_s
                        )
                    self.char_automaton = CharAutomaton(table)
                except Exception:  # jump-forward is an optimisation: sample instead
                    self._char_automaton_failed = True
        return self.char_automaton

    @property
    def vocab_size(self) -> int:
        return self.vocab.vocab_size

    def token_mask(self, state: int, guide=None):
        """The packed allowed-token row of `state` as a CPU int32 torch tensor [num_words].

        Computed once per state and cached: decoding revisits the same few states. With an
        outlines-core `Guide` standing in `state`, the bits are written by Rust
        (`Guide.write_mask_into`, ~10x faster on a broad state); otherwise the allowed ids are
        packed with numpy. Neither loops over the vocabulary in Python.
        """
        mask = self._mask_by_state.get(state)
        if mask is None:
            if guide is not None and guide.get_state() == state:
                mask = self._mask_from_guide(state, guide)
            else:
                mask = self._mask_from_index(state)
            with self._mask_lock:
                mask = self._mask_by_state.setdefault(state, mask)
        return mask

    def _mask_from_index(self, state: int):
        import torch

        allowed = self.automaton.allowed_token_ids(state)
        if self.automaton.is_accepting(state):
            allowed = np.concatenate([allowed, self._eos_ids])
        return torch.from_numpy(pack_token_bitmask(allowed, self.vocab_size))

    def _mask_from_guide(self, state: int, guide):
        import torch

        num_words = bitmask_num_words(self.vocab_size)
        # the index also knows the END pseudo-token (id vocab_size) and its own EOS (+1)
        scratch = torch.zeros(bitmask_num_words(self.vocab_size + 2), dtype=torch.int32)
        guide.write_mask_into(scratch.data_ptr(), scratch.numel(), scratch.element_size())
        bits = scratch[:num_words].numpy().copy()  # [num_words]
        if self.vocab_size % 32:  # clear the pseudo-token bits in the last, partial word
            bits[-1] &= np.int32((1 << (self.vocab_size % 32)) - 1)
        if self.automaton.is_accepting(state):
            bits |= pack_token_bitmask(self._eos_ids, self.vocab_size)
        return torch.from_numpy(bits)

    def is_terminal(self, state: int) -> bool:
        """Whether `state` is a complete match that no regular token can extend (cached)."""
        terminal = self._terminal_by_state.get(state)
        if terminal is None:
            automaton = self.automaton
            terminal = (
                automaton.is_accepting(state) and automaton.allowed_token_ids(state).size == 0
            )
            self._terminal_by_state[state] = terminal
        return terminal

    def new_matcher(self):
        """A fresh per-request matcher at the start of the output."""
        from radixgen.constrained.matcher import Matcher

        return Matcher(self)
