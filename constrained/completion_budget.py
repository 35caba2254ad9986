"""Valid at the token budget: shortest completions in tokens, and masks that keep one in reach.

A constrained output cut by `max_new_tokens` (or the context) is an invalid prefix unless the
mask, near the end, steers it to a complete match. With `remaining` tokens left (this step's
included), a token is safe iff the shortest completion after it needs at most `remaining - 1`
tokens. Keeping every step safe keeps the invariant "shortest completion <= remaining", so
the last token that fits makes the output complete. The rule is "dist(next) <= remaining - 1",
not "only when remaining == dist(state)": one token may lengthen the shortest completion by
more than one (opening a branch whose minimum is long), so that must be refused in time too.

Two tables, one per backend:

- `TokenDistanceTable` (outlines): exact. Distances are computed once per compiled grammar
  on its token automaton (a reverse BFS over the distinct state-to-state edges), and each state
  keeps the tokens that lead somewhere shorter than its farthest successor, sorted by that
  distance: a budget mask is a prefix of that array, packed with numpy and cached.
- `ByteDistanceTable` (llguidance, regular constraints only): a bound. llguidance never builds
  a token automaton (that is what makes it compile in a millisecond), so distances are taken on
  a byte automaton of the same regex, counted in a small set of "spelling tokens" (single
  bytes plus the tokenizer's encodings of the shortest completions): an upper bound of the
  token distance. While every state reachable within one token's bytes (the longest token of
  the vocabulary) stays completable in `remaining - 1`, the mask is llguidance's own; past that,
  only spelling tokens that keep the bound are allowed (the end of the output is spelled with
  those, and may need a few tokens more than the exact minimum).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from radixgen.constrained.regex_index import END_SENTINEL, TokenAutomaton
from radixgen.constrained.vocabulary import TokenVocabulary

UNREACHABLE = np.iinfo(np.int32).max  # distance of a state from which no match is reachable


def shortest_distances(
    num_states: int, edge_sources: np.ndarray, edge_targets: np.ndarray, accepting: np.ndarray
) -> np.ndarray:
    """Edges to an accepting state from each state, by a BFS backwards from the accepting ones.

    Args:
        num_states: states are 0..num_states-1.
        edge_sources, edge_targets: [num_edges] int64, the distinct edges (deduplicated, so
            the loop is over state pairs, never over vocabulary entries).
        accepting: [num_states] bool.

    Returns:
        [num_states] int32, `UNREACHABLE` where no accepting state can be reached.
    """
    order = np.argsort(edge_targets, kind="stable")
    sources_by_target = edge_sources[order]
    starts = np.searchsorted(edge_targets[order], np.arange(num_states + 1))
    distance = np.full(num_states, UNREACHABLE, dtype=np.int32)
    queue = deque(np.flatnonzero(accepting).tolist())
    distance[accepting] = 0
    while queue:
        state = queue.popleft()
        for source in sources_by_target[starts[state] : starts[state + 1]].tolist():
            if distance[source] == UNREACHABLE:
                distance[source] = distance[state] + 1
                queue.append(source)
    return distance


def _pack(token_ids: np.ndarray, num_words: int):
    import torch

    allowed = np.zeros(num_words * 32, dtype=np.bool_)
    allowed[token_ids] = True
    return torch.from_numpy(np.packbits(allowed, bitorder="little").view(np.int32))


class TokenDistanceTable:
    """Exact shortest completions, in tokens, on an outlines token automaton.

    Built once per compiled grammar (on the compile pool): `index.get_transitions()` plus
    numpy work per state; at a 128k vocabulary a realistic schema's 16M edges take ~2 s
    and ~1.5 GB transiently (docs/constrained.md).
    """

    def __init__(self, automaton: TokenAutomaton, eos_token_ids: tuple[int, ...]) -> None:
        transitions = automaton.index.get_transitions()  # {state: {token: next_state}}
        raw_rows = {}  # state -> (regular token ids, next state ids), per state, never per token
        for state, row in transitions.items():
            tokens = np.fromiter(row.keys(), dtype=np.int64, count=len(row))
            nexts = np.fromiter(row.values(), dtype=np.int64, count=len(row))
            regular = tokens < automaton.vocab_size  # drop the END pseudo-token
            raw_rows[state] = (tokens[regular], nexts[regular])
        del transitions
        reached = [nexts for _, nexts in raw_rows.values()]
        sources_seen = np.array([automaton.initial_state, *raw_rows], dtype=np.int64)
        state_ids = np.unique(np.concatenate([sources_seen, *reached]))
        state_ids = state_ids.astype(np.int64).tolist()
        self._dense = {state: i for i, state in enumerate(state_ids)}
        dense_of = np.zeros(max(state_ids) + 1, dtype=np.int64)
        dense_of[state_ids] = np.arange(len(state_ids))
        self._eos_ids = np.asarray(eos_token_ids, dtype=np.int64)
        self._num_words = (automaton.vocab_size + 31) // 32
        self._accepting = np.array([automaton.is_accepting(s) for s in state_ids], dtype=np.bool_)
        tokens_by_state, targets_by_state, sources, targets = [], [], [], []
        empty = np.zeros(0, dtype=np.int64)
        for i, state in enumerate(state_ids):
            tokens, nexts = raw_rows.pop(state, (empty, empty))
            nexts = dense_of[nexts]
            tokens_by_state.append(tokens)
            targets_by_state.append(nexts)
            distinct = np.unique(nexts)
            sources.append(np.full(distinct.size, i, dtype=np.int64))
            targets.append(distinct)
        self.distance = shortest_distances(
            len(state_ids), np.concatenate(sources), np.concatenate(targets), self._accepting
        )  # [num_states] int32
        # Per state: its farthest successor's distance, and the tokens leading anywhere closer,
        # sorted by the distance after them (int32 ids: the only per-token memory kept).
        self._farthest_next = np.zeros(len(state_ids), dtype=np.int64)
        self._closer_tokens: list[np.ndarray] = []
        self._closer_distances: list[np.ndarray] = []
        for i, (tokens, nexts) in enumerate(zip(tokens_by_state, targets_by_state, strict=True)):
            after = self.distance[nexts].astype(np.int64)
            farthest = int(after.max()) if after.size else 0
            closer = after < farthest
            order = np.argsort(after[closer], kind="stable")
            self._farthest_next[i] = farthest
            self._closer_tokens.append(tokens[closer][order].astype(np.int32))
            self._closer_distances.append(after[closer][order])
        self._mask_cache: dict[tuple[int, int], object] = {}

    def min_tokens(self, state: int) -> int:
        """Tokens of the shortest completion from `state` (0: complete already)."""
        return int(self.distance[self._dense[state]])

    def budget_mask(self, state: int, remaining: int):
        """The allowed-token row of `state` with `remaining` tokens left (this step's
        included): the tokens after which a completion fits in `remaining - 1`, plus EOS
        where the output may end. None when the budget restricts nothing here.

        Returns: None or a CPU int32 torch tensor [num_words] (cached per distinct mask).
        """
        i = self._dense[state]
        allowed_distance = remaining - 1
        if allowed_distance >= self._farthest_next[i]:
            return None
        # Below the shortest path the invariant is already broken (a budget never promised):
        # the shortest-path tokens are still the best move.
        allowed_distance = max(allowed_distance, int(self.distance[i]) - 1)
        count = int(np.searchsorted(self._closer_distances[i], allowed_distance, side="right"))
        key = (i, count)
        mask = self._mask_cache.get(key)
        if mask is None:
            allowed = self._closer_tokens[i][:count].astype(np.int64)
            if self._accepting[i]:
                allowed = np.concatenate([allowed, self._eos_ids])
            mask = self._mask_cache.setdefault(key, _pack(allowed, self._num_words))
        return mask


def build_byte_automaton(pattern: str) -> TokenAutomaton:
    """`pattern`'s automaton over single bytes (token id b is byte b), built by outlines-core
    in Rust: a byte DFA in a few milliseconds for a typical schema."""
    import outlines_core

    byte_to_ids = {bytes([b]): [b] for b in range(256) if b != END_SENTINEL.encode()[0]}
    byte_to_ids[END_SENTINEL.encode()] = [256]
    vocabulary = outlines_core.Vocabulary(257, byte_to_ids)
    index = outlines_core.Index(f"(?:{pattern}){END_SENTINEL}", vocabulary)
    return TokenAutomaton(pattern=pattern, index=index, end_token=256, vocab_size=256)


@dataclass(frozen=True)
class ByteSpelling:
    """What the byte tables need of a vocabulary, computed once per vocabulary (~0.25 s at
    128k): the token spelling each byte alone, and the longest token in bytes."""

    byte_token: np.ndarray  # [256] int64 token id, -1 where no token is that byte alone
    max_token_bytes: int

    @classmethod
    def of(cls, vocab: TokenVocabulary) -> ByteSpelling:
        byte_token = np.full(256, -1, dtype=np.int64)
        for token_id, raw in sorted(vocab.token_bytes.items(), reverse=True):
            if len(raw) == 1:
                byte_token[raw[0]] = token_id  # the lowest id wins for duplicate spellings
        longest = max((len(raw) for raw in vocab.token_bytes.values()), default=1)
        return cls(byte_token=byte_token, max_token_bytes=longest)


class ByteDistanceTable:
    """A sound bound on shortest completions, in tokens, from a byte automaton (llguidance).

    Distances are counted in "spelling tokens": the single-byte tokens plus the tokens of the
    tokenizer's own encodings of each state's shortest byte completion (JSON punctuation, key
    names), at most `MAX_SPELLING_TOKENS`. Each is walked through the byte automaton from all
    states at once (numpy, per token and byte, never per vocabulary entry), so a distance is a
    real path the tight mask can follow. `_reach[q]` is the largest distance of any state
    within `max_token_bytes` bytes of q: it bounds the distance after any one token.

    Args:
        pattern: the regex llguidance enforces.
        vocab: the tokenizer's byte vocabulary.
        encode: bytes -> token ids (the tokenizer's own encoding, no special tokens).
        spelling: `ByteSpelling.of(vocab)`, shared by every table of that vocabulary.
    """

    MAX_SPELLING_TOKENS = 1024
    MAX_ENCODED_STATES = 4096  # bounds compile time on huge automata (spelling stays sound)

    def __init__(
        self,
        pattern: str,
        vocab: TokenVocabulary,
        encode: Callable[[bytes], list[int]],
        spelling: ByteSpelling,
    ) -> None:
        automaton = build_byte_automaton(pattern)
        transitions = automaton.index.get_transitions()  # at most 257 edges per state
        reached = {target for row in transitions.values() for target in row.values()}
        state_ids = sorted(set(transitions) | reached | {automaton.initial_state})
        self._dense = {state: i for i, state in enumerate(state_ids)}
        self.initial_state = self._dense[automaton.initial_state]
        num_states = len(state_ids)
        # [num_states, 256] next dense state, -1: the byte is not allowed there
        self._next = np.full((num_states, 256), -1, dtype=np.int64)
        for i, state in enumerate(state_ids):  # at most 256 bytes per state
            for byte, target in transitions.get(state, {}).items():
                if byte < 256:
                    self._next[i, byte] = self._dense[target]
        self._accepting = np.array([automaton.is_accepting(s) for s in state_ids], dtype=np.bool_)
        self._spelling = self._spelling_tokens(
            vocab, encode, spelling.byte_token
        )  # [num_spelling] int64 ids
        # [num_states, num_spelling] the state after each spelling token, -1: not allowed
        self._spelled_next = np.stack(
            [self._walk_all(vocab.token_bytes[t]) for t in self._spelling.tolist()], axis=1
        ).astype(np.int32)
        sources, columns = np.nonzero(self._spelled_next >= 0)
        self.distance = shortest_distances(
            num_states,
            sources.astype(np.int64),
            self._spelled_next[sources, columns].astype(np.int64),
            self._accepting,
        )  # [num_states] int32
        any_edge = np.nonzero(self._next >= 0)
        edge_sources, edge_targets = any_edge[0], self._next[any_edge]
        reach = np.zeros(num_states, dtype=np.int64)
        for _ in range(
            spelling.max_token_bytes
        ):  # bounded by the longest token, not the vocabulary
            after = np.maximum(self.distance[edge_targets].astype(np.int64), reach[edge_targets])
            updated = reach.copy()
            np.maximum.at(updated, edge_sources, after)
            if np.array_equal(updated, reach):
                break
            reach = updated
        self._reach = reach  # [num_states] int64
        # No budget above this restricts any state's mask (`budget_mask` is None for all).
        self.max_reach = int(reach.max()) if num_states else 0
        self._eos_ids = np.asarray(vocab.eos_token_ids, dtype=np.int64)
        self._num_words = (vocab.vocab_size + 31) // 32
        self._mask_cache: dict[tuple[int, int], object] = {}

    def _walk_all(self, raw: bytes) -> np.ndarray:
        """[num_states] the state after `raw` from every state at once, -1 where it dies."""
        current = np.arange(self._next.shape[0], dtype=np.int64)
        for byte in raw:
            current = np.where(current >= 0, self._next[np.maximum(current, 0), byte], -1)
        return current

    def _spelling_tokens(self, vocab: TokenVocabulary, encode, byte_token) -> np.ndarray:
        """Single-byte tokens plus the encodings of each state's shortest byte completion."""
        spellable = (self._next >= 0) & (byte_token >= 0)[None, :]  # [num_states, 256]
        sources, bytes_ = np.nonzero(spellable)
        byte_distance = shortest_distances(
            self._next.shape[0], sources, self._next[sources, bytes_], self._accepting
        )
        # each state's first byte on a shortest byte completion (-1: accepting or none)
        target_distance = np.where(spellable, byte_distance[np.maximum(self._next, 0)], -2)
        on_path = spellable & (target_distance == (byte_distance[:, None] - 1))
        first_byte = np.where(on_path.any(axis=1), on_path.argmax(axis=1), -1)
        completion: dict[int, bytes] = {}
        order = np.argsort(byte_distance, kind="stable")
        for state in order[: self.MAX_ENCODED_STATES].tolist():
            byte = int(first_byte[state])
            if byte_distance[state] == UNREACHABLE or byte < 0:
                completion[state] = b""
                continue
            rest = completion.get(int(self._next[state, byte]))
            if rest is not None:  # shorter ones come first, so it is there unless cut
                completion[state] = bytes([byte]) + rest
        ids = set(byte_token[byte_token >= 0].tolist())
        for text in set(completion.values()):
            try:
                ids.update(encode(text))
            except (UnicodeDecodeError, ValueError):  # a completion ending mid-character
                continue
            if len(ids) >= self.MAX_SPELLING_TOKENS:
                break
        return np.array(sorted(i for i in ids if i in vocab.token_bytes), dtype=np.int64)

    def step(self, state: int | None, raw: bytes) -> int | None:
        """The byte state after `raw` (None: off the automaton, no bound known)."""
        for byte in raw:
            if state is None:
                return None
            target = int(self._next[state, byte])
            state = target if target >= 0 else None
        return state

    def min_tokens(self, state: int | None) -> int | None:
        """A bound on the tokens of the shortest completion from `state` (None: unknown)."""
        if state is None:
            return None
        distance = int(self.distance[state])
        return None if distance == UNREACHABLE else distance

    def budget_mask(self, state: int | None, remaining: int):
        """A row to AND with llguidance's mask: None when every token keeps a completion within
        `remaining - 1`; else the spelling tokens that do, plus EOS where it may end."""
        if state is None or self._reach[state] <= remaining - 1:
            return None
        allowed_distance = max(remaining - 1, int(self.distance[state]) - 1)
        key = (state, allowed_distance)
        mask = self._mask_cache.get(key)
        if mask is None:
            targets = self._spelled_next[state]  # [num_spelling]
            usable = targets >= 0
            usable[usable] = self.distance[targets[usable]] <= allowed_distance
            allowed = self._spelling[usable]
            if self._accepting[state]:
                allowed = np.concatenate([allowed, self._eos_ids])
            mask = self._mask_cache.setdefault(key, _pack(allowed, self._num_words))
        return mask
