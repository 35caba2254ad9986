"""The one interface both grammar backends implement: compiled constraints and their matchers.

Two backends compile a `ConstraintSpec` for one vocabulary (see `backend.GrammarBackend`):

- "outlines": outlines-core's `Index`, a product of the regex DFA and the whole vocabulary,
  built eagerly at compile time (`grammar.CompiledGrammar`, `matcher.Matcher`);
- "llguidance": llguidance's `LLMatcher`, which computes each mask lazily by walking a token
  trie through the grammar's lexer and parser (`llguidance_grammar`).

Both consume radixgen's own JSON-schema translation, so the set of accepted texts, and with it
exactness, does not depend on the backend. The engine sees only the methods below.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

GrammarBackendName = Literal["llguidance", "outlines"]
GRAMMAR_BACKEND_NAMES: tuple[str, ...] = GrammarBackendName.__args__
# Chosen from docs/benchmarks.md ("Grammar backends"): llguidance compiles a realistic schema
# at a 128k vocabulary in ~1 ms where outlines-core takes a median of ~0.5 s.
DEFAULT_GRAMMAR_BACKEND: GrammarBackendName = "llguidance"


def check_grammar_backend_name(name: object, argument: str = "grammar_backend") -> str:
    """Returns `name` if it names a backend, else raises ValueError naming `argument`."""
    if name not in GRAMMAR_BACKEND_NAMES:
        raise ValueError(f"{argument} must be one of {GRAMMAR_BACKEND_NAMES}, got {name!r}")
    return name


class ConstraintMatcher(ABC):
    """One request's position in a compiled constraint.

    Each step the engine calls `fill_bitmask(bitmask, row)` before sampling and
    `accept_token(id)` after it. EOS ids are allowed exactly where the constraint may end.
    """

    # Whether a jump-forward plan may retract the token just sampled (re-tokenising across
    # it). Plans that only append let the engine's overlapped schedule keep the step it
    # launched ahead: that step computed the sampled token's KV, which stays valid.
    jump_forward_may_retract: bool = True

    @property
    @abstractmethod
    def output_ids(self) -> tuple[int, ...]:
        """The regular token ids accepted so far (EOS excluded)."""

    @abstractmethod
    def fill_bitmask(self, bitmask, row: int) -> None:
        """Writes the next step's allowed-token bits into `bitmask[row]`.

        Args:
            bitmask: int32 CPU tensor [batch, ceil(vocab_size / 32)] (`allocate_token_bitmask`).
            row: this request's row.
        """

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advances on a sampled token; False (and no change) if it is not allowed."""

    @abstractmethod
    def is_accepting(self) -> bool:
        """Whether the output so far is complete (EOS allowed now)."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether generation must stop: EOS accepted, or complete with no possible extension."""

    @abstractmethod
    def min_completion_tokens(self) -> int | None:
        """Tokens of the shortest completion from here (0: complete now); None when this
        grammar has no budget table (see `completion_budget`). llguidance gives a bound."""

    @abstractmethod
    def min_completion_tokens_after(self, plan) -> int | None:
        """`min_completion_tokens()` once the `JumpForward` `plan` were applied (no change)."""

    @abstractmethod
    def set_token_budget(self, remaining: int | None) -> None:
        """Tells the matcher how many tokens it may still generate (this step's included);
        the masks it fills then keep a complete output within reach. None: no budget."""

    @abstractmethod
    def find_jump_forward(self):
        """A `JumpForward` the engine may apply now, or None (then sample as usual)."""

    @abstractmethod
    def apply_jump_forward(self, plan) -> None:
        """Applies a plan from `find_jump_forward()`; ValueError if it does not fit."""


class ConstraintGrammar(ABC):
    """A constraint compiled for one vocabulary; shared by every request using it."""

    source: str  # a short description of the constraint, for errors and logs

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """The logits width its masks cover."""

    @abstractmethod
    def new_matcher(self) -> ConstraintMatcher:
        """A fresh per-request matcher at the start of the output."""

    def budget_table_ready(self) -> bool:
        """Whether the token-budget table (if any) is built; a backend may build it in the
        background after the compile, so that requests without a budget start at once."""
        return True


def check_bitmask_row(bitmask, row: int, num_words: int) -> None:
    """Raises ValueError naming the argument if `bitmask[row]` is not a mask row of `num_words`."""
    if bitmask.dim() != 2 or bitmask.shape[1] != num_words:
        raise ValueError(
            f"bitmask must have shape [batch, {num_words}], got {tuple(bitmask.shape)}"
        )
    if not 0 <= row < bitmask.shape[0]:
        raise ValueError(f"row {row} is outside the bitmask's {bitmask.shape[0]} rows")
