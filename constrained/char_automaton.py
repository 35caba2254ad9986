"""The character-level automaton of a regex (interegular's FSM), for jump-forward.

Jump-forward asks, at the end of the output so far: is the next character forced? A character
is forced in state q when the regex may not end in q (q is not accepting) and exactly one
character leads to a live state (a state from which an accepting state is reachable). A run of
forced characters stops at the first state that offers a choice, so it never crosses a point where
the free part could still continue (the digits of a number, an optional space, the end).
"""

from __future__ import annotations

import unicodedata

from interegular.fsm import anything_else

# Characters tried when a transition class is "anything else" or when picking probe continuations.
_PROBE_POOL = (" ", "a", "Z", "0", "7", "_", "-", ".", ",", '"', "'", ":", "\n", "é", "中", "😀")
_MAX_FORCED_CHARS = 4096


class CharAutomaton:
    """Steps interegular's FSM one character at a time and finds forced runs.

    States are interegular state ids; None is the dead state.
    """

    def __init__(self, fsm) -> None:
        self.fsm = fsm
        self.initial_state = fsm.initial
        self._live_states = self._find_live_states()
        self._forced_cache: dict[int, str] = {}

    def _find_live_states(self) -> frozenset:
        predecessors: dict[int, set[int]] = {}
        for source, transitions in self.fsm.map.items():
            for target in transitions.values():
                predecessors.setdefault(target, set()).add(source)
        live, frontier = set(self.fsm.finals), list(self.fsm.finals)
        while frontier:
            for source in predecessors.get(frontier.pop(), ()):
                if source not in live:
                    live.add(source)
                    frontier.append(source)
        return frozenset(live)

    def step(self, state: int | None, char: str) -> int | None:
        """The state after `char`, or None if the text can no longer match."""
        if state is None:
            return None
        transition = self.fsm.alphabet[char]
        if transition is None:
            return None
        target = self.fsm.map.get(state, {}).get(transition)
        return target if target in self._live_states else None

    def step_text(self, state: int | None, text: str) -> int | None:
        for char in text:
            state = self.step(state, char)
        return state

    def is_accepting(self, state: int | None) -> bool:
        return state is not None and state in self.fsm.finals

    def _live_transitions(self, state: int) -> dict[int, int]:
        return {
            transition: target
            for transition, target in self.fsm.map.get(state, {}).items()
            if target in self._live_states
        }

    def _class_chars(self, transition: int) -> list:
        return list(self.fsm.alphabet.by_transition[transition])

    def forced_text(self, state: int | None) -> str:
        """The characters every match must continue with from `state` ("" if there is a choice)."""
        if state is None:
            return ""
        if state not in self._forced_cache:
            forced: list[str] = []
            current = state
            while len(forced) < _MAX_FORCED_CHARS and current not in self.fsm.finals:
                transitions = self._live_transitions(current)
                if len(transitions) != 1:
                    break
                ((transition, target),) = transitions.items()
                chars = self._class_chars(transition)
                if len(chars) != 1 or chars[0] is anything_else:
                    break
                forced.append(chars[0])
                current = target
            self._forced_cache[state] = "".join(forced)
        return self._forced_cache[state]

    def is_terminal(self, state: int | None) -> bool:
        """Accepting with no live continuation: the output must end here."""
        return self.is_accepting(state) and not self._live_transitions(state)

    def probe_continuations(self, state: int | None) -> list[str]:
        """A few characters that may follow `state`: representatives of each allowed class."""
        if state is None:
            return []
        probes: list[str] = []
        for transition in self._live_transitions(state):
            chars = self._class_chars(transition)
            concrete = sorted(c for c in chars if c is not anything_else)
            probes.extend(concrete[:2])
            probes.extend(c for c in _PROBE_POOL if c in concrete)
            if anything_else in chars:
                probes.extend(c for c in _PROBE_POOL if self.fsm.alphabet[c] == transition)
        # Pre-tokenizers split on character categories (letters, digits, spaces, punctuation),
        # with a few single-character rules (contractions, newlines): one probe per kind.
        by_kind = {_probe_kind(c): c for c in reversed(probes)}
        return list(dict.fromkeys(by_kind.values()))


def _probe_kind(char: str) -> tuple[str, str]:
    return (unicodedata.category(char)[0], char if char in " \t\r\n'" else "")
