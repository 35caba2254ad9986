"""`rg.select` from prompt logprobs, for any backend that can return them.

Steps (no token is sampled):
1. Prefill the shared prefix once; the runtime caches its KV, and we learn its length P.
2. In one batch, ask for the prompt logprobs of `prefix` and of every `prefix + choice`
   from position P-1 on. Every prompt reuses the cached prefix, so each computes only
   its last prefix token and the choice's tokens.
3. Cut each choice's tokens out: position P-1 belongs to the choice only when BPE merged
   the prefix's last token with the choice's first characters (its id then differs from
   the bare prefix's token at P-1).
4. Score per `ChoicesMethod`; the pick is the argmax of the scores (first on ties).
"""

from __future__ import annotations

from typing import Any, Protocol

from radixgen.backends.base import SelectOutcome
from radixgen.errors import BackendError
from radixgen.ir import ChoicesMethod

TokenLogprob = tuple[float | None, int]  # (logprob, token_id); None for position 0


class PromptLogprobSource(Protocol):
    """What a backend provides so `select_by_prompt_logprobs` can score choices."""

    def prefill(self, text: str) -> dict[str, Any]: ...

    def prompt_logprobs(
        self, texts: list[str], logprob_start_len: int
    ) -> list[list[TokenLogprob]]: ...


def select_by_prompt_logprobs(
    source: PromptLogprobSource, prefix: str, choices: list[str], method: ChoicesMethod
) -> SelectOutcome:
    if prefix == "":
        raise ValueError("rg.select needs text before it: the prompt is empty")
    prefill_meta = source.prefill(prefix)
    prefix_len = int(prefill_meta["prompt_tokens"])
    start = prefix_len - 1
    rows = source.prompt_logprobs([prefix, *[prefix + c for c in choices]], start)
    if len(rows) != len(choices) + 1 or not rows[0]:
        raise BackendError("the backend returned no prompt logprobs for rg.select")
    prefix_last_token = rows[0][0][1]
    choice_logprobs = [_choice_part(row, prefix_last_token) for row in rows[1:]]
    token_logprobs = [[lp for lp, _ in entries] for entries in choice_logprobs]
    meta: dict[str, Any] = {
        "choices": list(choices),
        "choices_method": method.value,
        "token_logprobs": token_logprobs,
        "choice_token_ids": [[tid for _, tid in entries] for entries in choice_logprobs],
        "prompt_tokens": prefix_len,
        "cached_tokens": int(prefill_meta.get("cached_tokens", 0)),
        "completion_tokens": 0,
        "finish_reason": None,
    }
    if method is ChoicesMethod.UNCONDITIONAL_LIKELIHOOD_NORMALIZED:
        unconditional_rows = source.prompt_logprobs(list(choices), 0)
        unconditional = [[lp for lp, _ in row if lp is not None] for row in unconditional_rows]
        meta["unconditional_token_logprobs"] = unconditional
        scores: list[Any] = [
            _mean(cond) - _mean(uncond)
            for cond, uncond in zip(token_logprobs, unconditional, strict=True)
        ]
    elif method is ChoicesMethod.GREEDY_TOKEN_SELECTION:
        # Lists compare lexicographically: the first token decides, ties go to the next one.
        scores = _shared_prefix_ties(choice_logprobs)
    else:
        scores = [_mean(lps) for lps in token_logprobs]
    meta["scores"] = scores
    index = max(range(len(choices)), key=scores.__getitem__)
    return SelectOutcome(index=index, scores=scores, meta_info=meta)


def _choice_part(row: list[TokenLogprob], prefix_last_token: int) -> list[tuple[float, int]]:
    """The entries of a `prefix + choice` row (from position P-1) that belong to the choice."""
    entries = row[1:] if row and row[0][1] == prefix_last_token else row
    if not entries or any(lp is None for lp, _ in entries):
        raise BackendError("prompt logprobs are missing for a select choice")
    return [(float(lp), int(tid)) for lp, tid in entries]


def _shared_prefix_ties(choice_logprobs: list[list[tuple[float, int]]]) -> list[list[float]]:
    """Each choice's token logprobs, where choices that start with the same tokens get the
    same values for them (the first choice's): the same token after the same text is a tie.
    Computed in different batch rows, its logprobs may differ in the last bits (the CPU's
    kernels round by batch shape), which must not pick the choice."""
    first_seen: dict[tuple[int, ...], float] = {}
    scores = []
    for entries in choice_logprobs:
        token_ids = tuple(token_id for _, token_id in entries)
        scores.append(
            [first_seen.setdefault(token_ids[: i + 1], lp) for i, (lp, _) in enumerate(entries)]
        )
    return scores


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
