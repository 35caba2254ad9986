"""Regex -> token automaton, built with outlines-core's `Index`, without its end-of-match defect.

The defect (outlines-core 0.2.14). `Index` walks every token's bytes through a regex-automata
dense DFA. That DFA reports matches one byte late ("delayed match states") and is built with
leftmost-first semantics. `Index` keeps a token only if the state after its last byte is either
not a match state or a full match at end of input, so it drops every token whose bytes *minus the
last one* complete a match that the whole token does not: from the state after "a", the token "b"
is dropped for `a(bc)?` ("a" is a match, "ab" is not), and "." after "1" for
`[0-9]+(\\.[0-9]+)?`. Leftmost-first semantics additionally cut the lower-priority branch of an
alternation once a higher one has matched: `a|ab` rejects "ab".

The workaround. We index `(?:R)` followed by a sentinel character END that no token contains, and
give the vocabulary one extra pseudo-token made of exactly END's bytes. Matches can then only end
right after END, so no real token ever ends in a delayed match state and no branch is cut while
real text is being matched; and, END being one character, text matches R exactly when text+END
matches R+END: "R may end in state s" is "the END pseudo-token leads from s to a final state". END is U+10FFFF (bytes F4 8F BF BF); tokens containing the byte F4 are left
out of the index, so characters U+100000..U+10FFFF (Private Use Area B) cannot be generated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from radixgen.constrained.vocabulary import TokenVocabulary

END_SENTINEL = "\U0010ffff"
_SENTINEL_LEAD_BYTE = 0xF4
# Rust-regex class syntax that Python's `re` (and interegular) read as literal characters.
_RUST_ONLY_CLASS_SYNTAX = ("&&", "--", "~~", "[:")


class RegexError(ValueError):
    """The regex is invalid or uses syntax whose meaning differs between dialects."""


def validate_regex(pattern: str):
    """Validates `pattern` up front and returns interegular's parse of it (cheap).

    Patterns use the common subset of Python `re` and Rust `regex` syntax and are always matched
    against the whole output (no `^`/`$`, no lookaround, no backreferences).

    Raises:
        RegexError: naming what is wrong with `pattern`.
    """
    import interegular

    if not isinstance(pattern, str) or not pattern:
        raise RegexError(f"regex must be a non-empty str, got {pattern!r}")
    _reject_rust_only_class_syntax(pattern)
    try:
        return interegular.parse_pattern(pattern)
    except Exception as error:  # interegular raises several unrelated exception types
        detail = str(error) or type(error).__name__
        raise RegexError(f"regex {pattern!r} is invalid or unsupported: {detail}") from error


def regex_char_fsm(pattern: str):
    """interegular's character-level FSM of a validated pattern (pure Python; can take seconds
    for large schemas, so it is built in the background, only for jump-forward)."""
    return validate_regex(pattern).to_fsm()


def _reject_rust_only_class_syntax(pattern: str) -> None:
    class_depth, index = 0, 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            index += 2
            continue
        if class_depth and pattern.startswith(_RUST_ONLY_CLASS_SYNTAX, index):
            raise RegexError(
                f"regex {pattern!r}: {pattern[index : index + 2]!r} inside a character class means "
                "different things in Python and Rust regexes; escape it"
            )
        if char == "[":
            class_depth += 1
        elif char == "]" and class_depth:
            class_depth -= 1
        index += 1


def build_index_vocabulary(vocab: TokenVocabulary):
    """The outlines-core `Vocabulary` of `vocab` plus the END pseudo-token (id `vocab_size`)."""
    import outlines_core

    bytes_to_ids: dict[bytes, list[int]] = {}
    for token_id, raw in vocab.token_bytes.items():
        if _SENTINEL_LEAD_BYTE not in raw:
            bytes_to_ids.setdefault(raw, []).append(token_id)
    bytes_to_ids[END_SENTINEL.encode()] = [end_token_id(vocab)]
    # outlines-core needs one EOS id outside the token map; ours are handled by the matcher.
    return outlines_core.Vocabulary(vocab.vocab_size + 1, bytes_to_ids)


def end_token_id(vocab: TokenVocabulary) -> int:
    """The id of the END pseudo-token: one past the logits row, so it never reaches a mask."""
    return vocab.vocab_size


@dataclass
class TokenAutomaton:
    """A regex as a DFA over token ids: states are outlines-core index states.

    Attributes:
        pattern: the regex (matched against the whole output).
    """

    pattern: str
    index: object  # outlines_core.Index over "(?:pattern)END"
    end_token: int
    vocab_size: int
    initial_state: int = field(init=False)

    def __post_init__(self) -> None:
        self.initial_state = self.index.get_initial_state()

    def next_state(self, state: int, token_id: int) -> int | None:
        """The state after `token_id`, or None when the token is not allowed in `state`."""
        if token_id == self.end_token:
            return None
        return self.index.get_next_state(state, token_id)

    def is_accepting(self, state: int) -> bool:
        """Whether the output may end in `state` (the regex fully matches the text so far)."""
        # END may also be consumed by the pattern itself (`.`, negated classes), so the END
        # transition alone proves nothing: text is a match iff text+END fully matches
        # "(?:pattern)END", i.e. the state after END is final.
        after_end = self.index.get_next_state(state, self.end_token)
        return after_end is not None and self.index.is_final_state(after_end)

    def allowed_token_ids(self, state: int) -> np.ndarray:
        """Regular token ids allowed in `state` (EOS excluded), as an int64 array."""
        allowed = np.asarray(self.index.get_allowed_tokens(state) or [], dtype=np.int64)
        return allowed[allowed < self.vocab_size]


def compile_regex(pattern: str, vocab: TokenVocabulary, index_vocabulary=None) -> TokenAutomaton:
    """Builds the token automaton of `pattern` over `vocab`.

    Args:
        pattern: the regex (see `validate_regex` for the dialect).
        vocab: the tokenizer's byte vocabulary.
        index_vocabulary: `build_index_vocabulary(vocab)`, passed to reuse it across compiles.

    Raises:
        RegexError: invalid pattern, or no token sequence of the vocabulary can match it.
    """
    import outlines_core

    validate_regex(pattern)
    if index_vocabulary is None:
        index_vocabulary = build_index_vocabulary(vocab)
    try:
        index = outlines_core.Index(f"(?:{pattern}){END_SENTINEL}", index_vocabulary)
    except ValueError as error:
        raise RegexError(
            f"regex {pattern!r} cannot be compiled for this vocabulary: {error}"
        ) from error
    return TokenAutomaton(
        pattern=pattern,
        index=index,
        end_token=end_token_id(vocab),
        vocab_size=vocab.vocab_size,
    )
