"""NGRAM (prompt lookup) drafts: the continuation of an earlier match of the sequence's end.

For a sequence t[0..L) (prompt and output), the proposer looks for earlier positions i < L-1
with t[i] == t[L-1], measures how many tokens before each also match the suffix (up to
`max_window`), keeps the longest match of at least `min_window` tokens (the latest among
equals: recent text predicts best) and proposes the tokens that followed it. Vectorised with
numpy over the candidate positions: `max_window` array comparisons per request, no loop per
token. Code, logs and chat repeat themselves, which is where this pays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from radixgen.runtime.req import Req

if TYPE_CHECKING:
    import torch


def propose_ngram(
    tokens: np.ndarray,  # [seq_len] int64, prompt then output
    *,
    num_draft: int,
    min_window: int,
    max_window: int,
) -> list[int]:
    """`num_draft` tokens that followed the longest earlier match of the sequence's last tokens
    (none without a match of at least `min_window` tokens)."""
    seq_len = int(tokens.shape[0])
    if num_draft < 1 or seq_len < min_window + 1:
        return []
    # Candidates: earlier positions holding the last token (whose continuation exists).
    candidates = np.flatnonzero(tokens[: seq_len - 1] == tokens[seq_len - 1])  # [num_cand]
    if candidates.size == 0:
        return []
    match_lens = np.ones(candidates.shape, dtype=np.int64)  # [num_cand]
    still_matching = np.ones(candidates.shape, dtype=bool)
    for back in range(1, min(max_window, seq_len - 1)):
        earlier = candidates - back
        valid = still_matching & (earlier >= 0)
        same = np.zeros(candidates.shape, dtype=bool)
        same[valid] = tokens[earlier[valid]] == tokens[seq_len - 1 - back]
        still_matching = same
        if not still_matching.any():
            break
        match_lens += still_matching
    best_len = int(match_lens.max())
    if best_len < min_window:
        return []
    # The latest position with the longest match (argmax of the reversed array).
    best = candidates[len(candidates) - 1 - int(np.argmax(match_lens[::-1] == best_len))]
    start = int(best) + 1
    if start + num_draft <= seq_len:
        return tokens[start : start + num_draft].tolist()
    # The match ends within `num_draft` of the end: the text since it repeats with period
    # seq_len - start, and so (the proposal's bet) does its future: repeat it cyclically.
    return np.resize(tokens[start:], num_draft).tolist()


class NgramProposer:
    """The NGRAM `DraftProposer` (decoder.py): prompt lookup over a request's tokens.

    Args:
        min_window, max_window: the suffix lengths tried (`propose_ngram`).
    """

    uses_target_hidden_states = False

    def __init__(self, *, min_window: int, max_window: int):
        self.min_window = min_window
        self.max_window = max_window

    def propose(self, reqs: list[Req], limits: list[int]) -> list[list[int]]:
        return [
            propose_ngram(
                np.asarray(req.fill_ids, dtype=np.int64),
                num_draft=limit,
                min_window=self.min_window,
                max_window=self.max_window,
            )
            for req, limit in zip(reqs, limits, strict=True)
        ]

    def after_verify(
        self, reqs: list[Req], drafts: list[list[int]], hidden_states: torch.Tensor | None
    ) -> None:
        pass  # stateless

    def release(self, reqs: list[Req]) -> None:
        pass

    def check_integrity(self) -> None:
        pass  # holds no memory
