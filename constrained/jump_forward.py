"""Jump-forward: append forced text without sampling it, keeping the tokenizer's own token ids.

When the constraint admits exactly one continuation (a JSON key, punctuation, a const tail), the
engine can append it in one extend step instead of one decode step per token. Two things can go
wrong, and both made SGLang remove its jump-forward; here they are ruled out by construction:

1. Text must never change. The forced text comes from the character automaton and stops at the
   first choice (`CharAutomaton.forced_text`), so a number's digits, an optional space or the end
   of the output are never decided here. Retracted tokens are only re-tokenised, never re-worded:
   the new tokens spell exactly the retracted text followed by forced text.
2. Token ids must be the tokenizer's own. Appending `encode(forced)` after the emitted tokens can
   give ids the tokenizer would never produce (`"` + `name` where it writes `"name`), and the
   model then continues from an unfamiliar boundary. So the boundary is re-tokenised: the tail of
   the output plus the forced text is encoded together, tokens that differ from the emitted ones
   are retracted, and only tokens that no later text can change are appended: those ending
   before the last pre-token, confirmed by encoding the text followed by each character that may
   come next. The rest of the forced text is left to the (masked) model, which may merge it with
   the free text that follows exactly as the tokenizer would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

from radixgen.constrained.char_automaton import CharAutomaton
from radixgen.constrained.retokenize import BoundaryTokenizer

# Re-tokenise at most this many trailing output tokens: bounds the cost of a jump-forward.
MAX_WINDOW_TOKENS = 64


@dataclass(frozen=True)
class JumpForward:
    """A jump-forward for the engine to apply in one extend step.

    Attributes:
        retract_tokens: how many trailing output tokens to remove (their KV entries too).
        append_ids: token ids to append after the retraction; they spell the retracted text
            followed by `appended_text`.
        appended_text: the text added to the output (already emitted text is unchanged).
    """

    retract_tokens: int
    append_ids: tuple[int, ...]
    appended_text: str


def _common_prefix_length(first: list[int], second: list[int]) -> int:
    length = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        length += 1
    return length


def plan_jump_forward(
    grammar,
    chars: CharAutomaton,
    output_ids: list[int],
    char_state: int | None,
    state_before: Callable[[int], int],
) -> JumpForward | None:
    """Finds a jump-forward at the end of `output_ids`, or None.

    Args:
        grammar: the request's `CompiledGrammar`.
        chars: its character automaton.
        output_ids: the regular token ids emitted so far.
        char_state: the character-automaton state after them (None: mid-character or unknown).
        state_before: i -> the token-automaton state before `output_ids[i]` (i == len: current).
    """
    tokenizer, vocab = grammar.boundary_tokenizer, grammar.vocab
    forced = chars.forced_text(char_state)
    if not forced or tokenizer is None:
        return None
    window_start = _window_start(output_ids, vocab, tokenizer)
    if window_start is None:
        return None
    window_ids = output_ids[window_start:]
    emitted = vocab.decode(window_ids).decode("utf-8")
    text = emitted + forced
    text_bytes = text.encode()
    ids = tokenizer.encode(text)
    if any(token_id not in vocab.token_bytes for token_id in ids):
        return None  # a special token appeared in the text
    token_ends = list(accumulate(len(vocab.token_bytes[t]) for t in ids))
    if not token_ends or token_ends[-1] != len(text_bytes) or vocab.decode(ids) != text_bytes:
        return None  # the tokenizer does not round-trip this text (normaliser, prefix space)

    stable_length = _stable_token_count(
        text, ids, token_ends, chars.step_text(char_state, forced), chars, tokenizer
    )
    kept = _common_prefix_length(ids[:stable_length], window_ids)
    emitted_length = len(emitted.encode())
    stable_end = token_ends[stable_length - 1] if stable_length else 0
    if stable_end <= emitted_length:
        return None  # nothing new would be appended
    append_ids = ids[kept:stable_length]

    state = state_before(window_start + kept)
    for token_id in append_ids:
        state = grammar.automaton.next_state(state, token_id)
        if state is None:
            return None  # the automata disagree (should not happen); sample instead
    return JumpForward(
        retract_tokens=len(window_ids) - kept,
        append_ids=tuple(append_ids),
        appended_text=text_bytes[emitted_length:stable_end].decode("utf-8"),
    )


def _window_start(output_ids: list[int], vocab, tokenizer: BoundaryTokenizer) -> int | None:
    """Where re-tokenisation starts: the whole output if short, else the first token within the
    last MAX_WINDOW_TOKENS that starts a pre-token (so the tokenizer sees a natural start)."""
    if len(output_ids) <= MAX_WINDOW_TOKENS:
        return 0
    first = len(output_ids) - MAX_WINDOW_TOKENS
    token_starts = list(
        accumulate((len(vocab.token_bytes[t]) for t in output_ids[first:]), initial=0)
    )
    try:
        emitted = vocab.decode(output_ids[first:]).decode("utf-8")
    except UnicodeDecodeError:  # the window starts inside a character
        return None
    starts = tokenizer.pre_token_starts(emitted)
    if starts is None:
        return None
    char_to_byte = list(accumulate((len(c.encode()) for c in emitted), initial=0))
    pre_token_byte_starts = {char_to_byte[s] for s in starts if s > 0}
    for index, byte_start in enumerate(token_starts[1:-1], start=1):
        if byte_start in pre_token_byte_starts:
            return first + index
    return None


def _stable_token_count(
    text: str,
    ids: list[int],
    token_ends: list[int],
    end_state: int | None,
    chars: CharAutomaton,
    tokenizer: BoundaryTokenizer,
) -> int:
    """How many leading tokens of `ids` no continuation of `text` (from the character-automaton
    state `end_state`) can re-tokenise."""
    if chars.is_terminal(end_state):
        return len(ids)  # nothing may follow: every token is final
    probes = chars.probe_continuations(end_state)

    starts = tokenizer.pre_token_starts(text)
    if starts is None:
        return 0  # no pre-token boundaries to trust: no token is known to be final
    cut_chars = max((s for s in starts if s < len(text)), default=0)
    for probe in probes:
        probe_starts = tokenizer.pre_token_starts(text + probe) or [0]
        cut_chars = min(cut_chars, max(s for s in probe_starts if s <= len(text)))
    cut_bytes = len(text[:cut_chars].encode())

    char_boundaries = set(accumulate((len(c.encode()) for c in text), initial=0))
    stable = 0
    while stable < len(ids) and token_ends[stable] <= cut_bytes:
        stable += 1
    for probe in probes:
        stable = _common_prefix_length(ids[:stable], tokenizer.encode(text + probe))
    while stable and token_ends[stable - 1] not in char_boundaries:
        stable -= 1  # never end a jump inside a character
    return stable
