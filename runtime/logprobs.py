"""Logprobs of output tokens and of prompt tokens, computed batched from logits.

Prompt logprob of the token at position t comes from the logits at position t - 1; position
0 has none (reported as None). A chunked prefill adds each chunk's share.
"""

from __future__ import annotations

import torch

from radixgen.runtime.io_struct import TokenLogprob
from radixgen.runtime.req import Req


def top_logprob_lists(
    logprobs: torch.Tensor,  # [rows, vocab]
    nums: list[int],  # how many alternatives each row wants
) -> list[list[TokenLogprob]]:
    max_num = max(nums, default=0)
    if max_num == 0:
        return [[] for _ in nums]
    values, ids = logprobs.topk(max_num, dim=-1)
    values, ids = values.tolist(), ids.tolist()  # host sync, once per batch
    return [list(zip(values[i][:n], ids[i][:n], strict=True)) for i, n in enumerate(nums)]


def record_output_logprobs(
    reqs: list[Req],
    logprobs: torch.Tensor,  # [batch, vocab] raw log-probabilities of the sampled step
    next_token_ids: torch.Tensor,  # [batch] int64
) -> None:
    """Appends the sampled tokens' logprobs (and top alternatives) to requests that asked."""
    rows = [i for i, req in enumerate(reqs) if req.return_logprob]
    if not rows:
        return
    index = torch.tensor(rows, dtype=torch.int64, device=logprobs.device)
    chosen_ids = next_token_ids[index]
    chosen = logprobs[index].gather(1, chosen_ids.unsqueeze(1)).squeeze(1).tolist()
    tops = top_logprob_lists(logprobs[index], [reqs[i].top_logprobs_num for i in rows])
    for row, value, token_id, top in zip(rows, chosen, chosen_ids.tolist(), tops, strict=True):
        req = reqs[row]
        req.output_token_logprobs.append((value, token_id))
        if req.top_logprobs_num:
            req.output_top_logprobs.append(top)


def record_input_logprobs(
    reqs: list[Req],
    logits: torch.Tensor,  # [num_tokens, vocab], every token of the extend batch
    extend_starts: list[int],  # each request's first row in `logits`
    prefix_lens: list[int],  # each request's KV length before this forward
) -> None:
    """Adds this forward's prompt logprobs to the requests that want them."""
    for req, start_row, prefix_len in zip(reqs, extend_starts, prefix_lens, strict=True):
        if not req.wants_input_logprobs:
            continue
        prompt_len = len(req.origin_input_ids)
        first = req.logprob_start_len
        if first == 0 and prefix_len == 0:
            req.input_token_logprobs.append((None, req.origin_input_ids[0]))
            req.input_top_logprobs.append(None)
        # Rows predict positions prefix_len + 1 .. prefix_len + extend_len; keep those in
        # [max(first, 1), prompt_len).
        lo = max(first, 1, prefix_len + 1)
        hi = min(prompt_len, prefix_len + req.extend_input_len + 1)
        if lo < hi:
            rows = torch.arange(lo - 1 - prefix_len, hi - 1 - prefix_len, device=logits.device)
            rows += start_row
            targets = torch.tensor(req.origin_input_ids[lo:hi], device=logits.device)
            logprobs = torch.log_softmax(logits[rows].float(), dim=-1)  # [hi - lo, vocab]
            values = logprobs.gather(1, targets.unsqueeze(1)).squeeze(1).tolist()
            req.input_token_logprobs.extend(zip(values, req.origin_input_ids[lo:hi], strict=True))
            if req.top_logprobs_num:
                tops = top_logprob_lists(logprobs, [req.top_logprobs_num] * (hi - lo))
                req.input_top_logprobs.extend(tops)
            else:
                req.input_top_logprobs.extend([None] * (hi - lo))
        if prefix_len + req.extend_input_len >= prompt_len:
            req.input_logprobs_done = True
