"""The character-level automaton of a regex (from interegular's FSM), for jump-forward.

Jump-forward asks, at the end of the output so far: is the next character forced? A character
is forced in state q when the regex may not end in q (q is not accepting) and exactly one
character leads to a live state (a state from which an accepting state is reachable). A run of
forced characters stops at the first state that offers a choice, so it never crosses a point where
the free part could still continue (the digits of a number, an optional space, the end).

interegular is pure Python and can take seconds on a large schema, so the FSM is copied into a
plain `CharFsmTable` that a worker process can build and send back as JSON
(`python -m radixgen.constrained.char_fsm_worker`).
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass

# Characters tried when a transition class is "anything else" or when picking probe continuations.
_PROBE_POOL = (" ", "a", "Z", "0", "7", "_", "-", ".", ",", '"', "'", ":", "\n", "é", "中", "😀")
_MAX_FORCED_CHARS = 4096


@dataclass(frozen=True)
class CharFsmTable:
    """A deterministic character FSM as plain data.

    Attributes:
        initial: the start state.
        finals: accepting states.
        transitions: state -> {character class -> next state}.
        class_chars: character class -> the characters named in the pattern that belong to it.
        other_class: the class of every character not named in the pattern, or None.
    """

    initial: int
    finals: frozenset[int]
    transitions: dict[int, dict[int, int]]
    class_chars: dict[int, tuple[str, ...]]
    other_class: int | None

    @classmethod
    def from_interegular(cls, fsm) -> CharFsmTable:
        from interegular.fsm import anything_else

        class_chars: dict[int, list[str]] = {}
        other_class = None
        for symbol, char_class in fsm.alphabet._symbol_mapping.items():
            if symbol is anything_else:
                other_class = char_class
            else:
                class_chars.setdefault(char_class, []).append(symbol)
        return cls(
            initial=fsm.initial,
            finals=frozenset(fsm.finals),
            transitions={state: dict(targets) for state, targets in fsm.map.items()},
            class_chars={c: tuple(sorted(chars)) for c, chars in class_chars.items()},
            other_class=other_class,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "initial": self.initial,
                "finals": sorted(self.finals),
                "transitions": {s: t for s, t in self.transitions.items()},
                "class_chars": self.class_chars,
                "other_class": self.other_class,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> CharFsmTable:
        data = json.loads(text)
        return cls(
            initial=data["initial"],
            finals=frozenset(data["finals"]),
            transitions={
                int(s): {int(c): t for c, t in targets.items()}
                for s, targets in data["transitions"].items()
            },
            class_chars={int(c): tuple(chars) for c, chars in data["class_chars"].items()},
            other_class=data["other_class"],
        )


class CharAutomaton:
    """Steps a `CharFsmTable` one character at a time and finds forced runs.

    None is the dead state.
    """

    def __init__(self, table: CharFsmTable) -> None:
        self.table = table
        self.initial_state = table.initial
        self._class_of_char = {c: k for k, chars in table.class_chars.items() for c in chars}
        self._live_states = self._find_live_states()
        self._forced_cache: dict[int, str] = {}

    def _find_live_states(self) -> frozenset:
        predecessors: dict[int, set[int]] = {}
        for source, targets in self.table.transitions.items():
            for target in targets.values():
                predecessors.setdefault(target, set()).add(source)
        live, frontier = set(self.table.finals), list(self.table.finals)
        while frontier:
            for source in predecessors.get(frontier.pop(), ()):
                if source not in live:
                    live.add(source)
                    frontier.append(source)
        return frozenset(live)

    def _class_of(self, char: str) -> int | None:
        return self._class_of_char.get(char, self.table.other_class)

    def step(self, state: int | None, char: str) -> int | None:
        """The state after `char`, or None if the text can no longer match."""
        if state is None:
            return None
        char_class = self._class_of(char)
        if char_class is None:
            return None
        target = self.table.transitions.get(state, {}).get(char_class)
        return target if target in self._live_states else None

    def step_text(self, state: int | None, text: str) -> int | None:
        for char in text:
            state = self.step(state, char)
        return state

    def is_accepting(self, state: int | None) -> bool:
        return state is not None and state in self.table.finals

    def _live_transitions(self, state: int) -> dict[int, int]:
        return {
            char_class: target
            for char_class, target in self.table.transitions.get(state, {}).items()
            if target in self._live_states
        }

    def forced_text(self, state: int | None) -> str:
        """The characters every match must continue with from `state` ("" if there is a choice)."""
        if state is None:
            return ""
        if state not in self._forced_cache:
            forced: list[str] = []
            current = state
            while len(forced) < _MAX_FORCED_CHARS and current not in self.table.finals:
                transitions = self._live_transitions(current)
                if len(transitions) != 1:
                    break
                ((char_class, target),) = transitions.items()
                chars = self.table.class_chars.get(char_class, ())
                if char_class == self.table.other_class or len(chars) != 1:
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
        for char_class in self._live_transitions(state):
            named = self.table.class_chars.get(char_class, ())
            probes.extend(named[:2])
            probes.extend(c for c in _PROBE_POOL if c in named)
            if char_class == self.table.other_class:
                probes.extend(c for c in _PROBE_POOL if self._class_of(c) == char_class)
        # Pre-tokenizers split on character categories (letters, digits, spaces, punctuation),
        # with a few single-character rules (contractions, newlines): one probe per kind.
        by_kind = {_probe_kind(c): c for c in reversed(probes)}
        return list(dict.fromkeys(by_kind.values()))


def _probe_kind(char: str) -> tuple[str, str]:
    return (unicodedata.category(char)[0], char if char in " \t\r\n'" else "")
