"""The per-request matcher: which tokens may come next, and where the request stands."""

from __future__ import annotations

import codecs

from radixgen.constrained.char_automaton import CharAutomaton
from radixgen.constrained.grammar import CompiledGrammar, bitmask_num_words
from radixgen.constrained.grammar_interface import ConstraintMatcher, check_bitmask_row
from radixgen.constrained.jump_forward import JumpForward, plan_jump_forward


class Matcher(ConstraintMatcher):
    """Follows one request's output through a `CompiledGrammar` (the outlines backend).

    The engine calls, each step: `fill_bitmask(bitmask, row)` before sampling, `accept_token(id)`
    after it, and optionally `find_jump_forward()` / `apply_jump_forward(plan)`. EOS ids are
    allowed only where the constraint may end.
    """

    def __init__(self, grammar: CompiledGrammar) -> None:
        self.grammar = grammar
        automaton = grammar.automaton
        # _states[i]: token-automaton state before output token i; _states[-1] is the current one.
        self._states: list[int] = [automaton.initial_state]
        self._output_ids: list[int] = []
        # _char_checkpoints[i]: (char-automaton state, undecoded trailing bytes) after i tokens;
        # extended lazily, only when jump-forward is asked for.
        self._char_checkpoints: list[tuple[int | None, bytes]] = []
        self._eos_accepted = False
        # An outlines-core Guide kept in step with _states: it writes a new state's mask in Rust.
        self._guide = self._new_guide()
        self._token_budget: int | None = None  # tokens left, this step's included

    @property
    def output_ids(self) -> tuple[int, ...]:
        """The regular token ids accepted so far (EOS excluded)."""
        return tuple(self._output_ids)

    def fill_bitmask(self, bitmask, row: int) -> None:
        """Writes the allowed-token bits of the next step into `bitmask[row]`.

        Args:
            bitmask: int32 tensor [batch, ceil(vocab_size / 32)] (see `allocate_token_bitmask`).
            row: this request's row.
        """
        check_bitmask_row(bitmask, row, bitmask_num_words(self.grammar.vocab_size))
        state, table = self._states[-1], self.grammar.completion_table
        mask = None
        if self._token_budget is not None and table is not None:
            mask = table.budget_mask(state, self._token_budget)  # a subset of the plain mask
        if mask is None:
            mask = self.grammar.token_mask(state, self._guide)
        bitmask[row].copy_(mask, non_blocking=True)

    def set_token_budget(self, remaining: int | None) -> None:
        self._token_budget = remaining

    def min_completion_tokens(self) -> int | None:
        table = self.grammar.completion_table
        return None if table is None else table.min_tokens(self._states[-1])

    def min_completion_tokens_after(self, plan: JumpForward) -> int | None:
        table = self.grammar.completion_table
        keep = len(self._output_ids) - plan.retract_tokens
        if table is None or not 0 <= keep <= len(self._output_ids):
            return None
        state = self._states[keep]
        for token_id in plan.append_ids:
            state = self.grammar.automaton.next_state(state, token_id)
            if state is None:
                return None
        return table.min_tokens(state)

    def accept_token(self, token_id: int) -> bool:
        """Advances on the sampled token; False (and no change) if the token is not allowed."""
        if self._eos_accepted:
            return False
        if token_id in self.grammar.vocab.eos_token_ids:
            if not self.is_accepting():
                return False
            self._eos_accepted = True
            return True
        if not 0 <= token_id < self.grammar.vocab_size:
            return False
        next_state = self.grammar.automaton.next_state(self._states[-1], token_id)
        if next_state is None:
            return False
        self._states.append(next_state)
        self._output_ids.append(token_id)
        self._guide.advance(token_id, return_tokens=False)
        return True

    def is_accepting(self) -> bool:
        """Whether the output so far is a complete match (EOS allowed now)."""
        return self.grammar.automaton.is_accepting(self._states[-1])

    def is_terminated(self) -> bool:
        """Whether generation must stop: EOS was accepted, or the match is complete and no
        regular token can extend it."""
        return self._eos_accepted or self.grammar.is_terminal(self._states[-1])

    def find_jump_forward(self) -> JumpForward | None:
        """A jump-forward the engine may apply now, or None (then sample as usual).

        Does not change the matcher; call `apply_jump_forward(plan)` once the engine applies it.
        """
        chars = self.grammar.char_automaton
        if self._eos_accepted or chars is None:  # not built yet (background) or disabled
            return None
        return plan_jump_forward(
            self.grammar,
            chars,
            self._output_ids,
            self._char_state_at_end(chars),
            lambda position: self._states[position],
        )

    def apply_jump_forward(self, plan: JumpForward) -> None:
        """Retracts `plan.retract_tokens` tokens and accepts `plan.append_ids`.

        Raises:
            ValueError: the plan does not fit this matcher (it was made for another state).
        """
        keep = len(self._output_ids) - plan.retract_tokens
        if plan.retract_tokens < 0 or keep < 0:
            raise ValueError(f"plan.retract_tokens={plan.retract_tokens} is out of range")
        automaton, state = self.grammar.automaton, self._states[keep]
        for token_id in plan.append_ids:  # validate before changing anything
            state = automaton.next_state(state, token_id)
            if state is None:
                raise ValueError(f"plan.append_ids {plan.append_ids} are not allowed here")
        del self._states[keep + 1 :], self._output_ids[keep:]
        del self._char_checkpoints[keep + 1 :]
        if plan.retract_tokens <= self._guide.get_allowed_rollback():
            self._guide.rollback_state(plan.retract_tokens)
        else:  # beyond the guide's history: replay the kept tokens into a fresh one
            self._guide = self._new_guide()
            for token_id in self._output_ids:
                self._guide.advance(token_id, return_tokens=False)
        for token_id in plan.append_ids:
            self.accept_token(token_id)

    def _new_guide(self):
        import outlines_core

        return outlines_core.Guide(self.grammar.automaton.index, max_rollback=64)

    def _char_state_at_end(self, chars: CharAutomaton) -> int | None:
        """The character-automaton state after the output; None if it ends inside a character."""
        token_bytes = self.grammar.vocab.token_bytes
        decoder = codecs.getincrementaldecoder("utf-8")()
        if not self._char_checkpoints:
            self._char_checkpoints.append((chars.initial_state, b""))
        while len(self._char_checkpoints) <= len(self._output_ids):
            char_state, pending = self._char_checkpoints[-1]
            token_id = self._output_ids[len(self._char_checkpoints) - 1]
            decoder.setstate((pending, 0))
            try:
                text = decoder.decode(token_bytes[token_id])
                pending = decoder.getstate()[0]
            except UnicodeDecodeError:
                char_state, text, pending = None, "", b""
            self._char_checkpoints.append((chars.step_text(char_state, text), pending))
        char_state, pending = self._char_checkpoints[-1]
        return None if pending else char_state
