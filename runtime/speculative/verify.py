"""Acceptance of drafted tokens from one verify forward's logits, on the device.

A request with drafts d_1..d_K runs its last sampled token t followed by the drafts: K + 1
rows of logits, row j predicting the token after input j. Walking j = 0, 1, ...:
- greedy rows accept d_{j+1} when it is the target's argmax at row j;
- sampled rows accept d_{j+1} with probability p_j(d_{j+1}), the target's (temperature,
  top-k/top-p/min-p filtered) probability. On rejection the token is drawn from p_j with
  d_{j+1} removed and renormalised. For a deterministic draft (NGRAM) that is rejection
  sampling: the token emitted at each position is distributed exactly as p_j.
The first rejection (or the row after the last draft, which has none) ends the walk with the
target's own token there: every verify step emits accepted + 1 tokens per request.

Random numbers are counter-based like the sampler's: the draw at output position s uses
`counter_uniform(seed, s)`, the very number plain decoding uses there (so a request without
drafts samples what it would have sampled), and the acceptance test a salted seed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from radixgen.kernels.host_copy import host_parts_to_device
from radixgen.kernels.sampling_torch import counter_uniform, sample_inverse_cdf
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode
from radixgen.runtime.req import Req
from radixgen.runtime.sampler import filter_probs
from radixgen.runtime.sampling_batch_info import SamplingBatchInfo

# Salts the seed of the acceptance draws, independent of the token draws at the same position.
ACCEPT_SEED_SALT = 0x5EC0DE5
NO_DRAFT = -1


def build_verify_batch(
    runner,
    reqs: list[Req],
    drafts: list[list[int]],
    out_cache_loc: torch.Tensor,  # [num_drafts + batch] int64
    *,
    as_decode_rows: bool,
) -> ForwardBatch:
    """The verify forward: each request's last sampled token then its drafts, after its
    cached prefix, every row's logits.

    As an EXTEND batch (each request's tokens attend causally to each other and to its prefix),
    or with `as_decode_rows` as a DECODE batch of one row per token: the row of token j of a
    request shares the request's `req_to_token` row with history length prefix + j + 1. Every
    layer stores all rows' K/V before attending, so row j sees exactly tokens 0..j: the same
    causal attention, and the same math as plain decode steps. Such a batch replays the decode
    CUDA graph of its row count; each row reads the whole prefix, so it suits short contexts.
    Rows run under their request's LoRA adapter (its pool slot), as its decode steps do.
    """
    prefix_lens = [req.kv_committed_len for req in reqs]
    input_ids = [[req.output_ids[-1], *draft] for req, draft in zip(reqs, drafts, strict=True)]
    if not as_decode_rows:
        return runner.build_forward_batch(
            mode=ForwardMode.EXTEND,
            input_ids=input_ids,
            req_pool_indices=[req.req_pool_idx for req in reqs],
            prefix_lens=prefix_lens,
            out_cache_loc=out_cache_loc,
            return_all_logits=True,
            lora_slots=[req.lora_slot for req in reqs],
        )
    rows = [
        (req.req_pool_idx, prefix + j, token_id, req.lora_slot)
        for req, prefix, ids in zip(reqs, prefix_lens, input_ids, strict=True)
        for j, token_id in enumerate(ids)
    ]
    return runner.build_forward_batch(
        mode=ForwardMode.DECODE,
        input_ids=[[token_id] for _, _, token_id, _ in rows],
        req_pool_indices=[row for row, _, _, _ in rows],
        prefix_lens=[position for _, position, _, _ in rows],
        out_cache_loc=out_cache_loc,
        lora_slots=[slot for _, _, _, slot in rows],
    )


@dataclass
class VerifyInput:
    """The host-side layout of a verify forward, request by request."""

    row_request: torch.Tensor  # [num_rows] int64, the request (batch row) of each logits row
    row_offset: torch.Tensor  # [num_rows] int64, j: the row's index within its request
    next_draft: torch.Tensor  # [num_rows] int64, d_{j+1}; NO_DRAFT on each request's last row
    row_steps: torch.Tensor  # [num_rows] int64, output position the row's token would take


def build_verify_input(
    drafts: list[list[int]], output_lens: list[int], device: torch.device
) -> VerifyInput:
    """Lays out the rows of requests with `drafts[i]` drafted and `output_lens[i]` output
    tokens so far (one host-to-device copy)."""
    row_request, row_offset, next_draft, row_steps = [], [], [], []
    for request, (draft, output_len) in enumerate(zip(drafts, output_lens, strict=True)):
        num_rows = len(draft) + 1
        row_request += [request] * num_rows
        row_offset += range(num_rows)
        next_draft += [*draft, NO_DRAFT]
        row_steps += range(output_len, output_len + num_rows)
    # Without waiting for the kernels in flight, each row list 16-byte aligned.
    parts = host_parts_to_device([row_request, row_offset, next_draft, row_steps], device)
    return VerifyInput(*parts)


def verify_drafts(
    logits: torch.Tensor,  # [num_rows, vocab] float32, the verify forward's every row
    layout: VerifyInput,
    info: SamplingBatchInfo,  # the batch's (no penalties, bias, bans or masks)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (num_accepted [batch] int64, final_token [batch] int64): how many drafts each
    request accepted, and the target's token after them."""
    batch_size = info.batch_size
    has_draft = layout.next_draft != NO_DRAFT  # [num_rows]
    drafts = layout.next_draft.clamp(min=0).unsqueeze(1)  # [num_rows, 1]
    greedy_ids = logits.argmax(dim=-1)  # [num_rows]
    accept = has_draft & (greedy_ids == drafts.squeeze(1))
    final_ids = greedy_ids
    if not info.all_greedy:
        rows_info = _rows_of(info, layout.row_request)
        probs = torch.softmax(logits / rows_info.temperatures, dim=-1)
        probs = filter_probs(probs, rows_info)  # [num_rows, vocab], unnormalised
        draft_probs = probs.gather(1, drafts).squeeze(1) / probs.sum(dim=-1)
        seeds = rows_info.seeds
        accept_uniform = counter_uniform(seeds ^ ACCEPT_SEED_SALT, layout.row_steps)
        accept_sampled = has_draft & (accept_uniform < draft_probs)
        # The rejected draft is removed from its row (rows without a draft keep all tokens).
        kept = probs.gather(1, drafts) * (~has_draft).unsqueeze(1)
        residual = probs.scatter(1, drafts, kept)
        sampled_ids = sample_inverse_cdf(residual, counter_uniform(seeds, layout.row_steps))
        accept = torch.where(rows_info.greedy, accept, accept_sampled)
        final_ids = torch.where(rows_info.greedy, greedy_ids, sampled_ids)
    # The first row that does not accept ends each request's walk (its last row always does).
    stop_offsets = torch.where(accept, torch.iinfo(torch.int64).max, layout.row_offset)
    num_accepted = torch.full((batch_size,), torch.iinfo(torch.int64).max, device=logits.device)
    num_accepted = num_accepted.scatter_reduce(0, layout.row_request, stop_offsets, "amin")
    request_starts = torch.searchsorted(
        layout.row_request, torch.arange(batch_size, device=logits.device)
    )  # [batch], row_request is sorted
    return num_accepted, final_ids[request_starts + num_accepted]


def _rows_of(info: SamplingBatchInfo, row_request: torch.Tensor) -> SamplingBatchInfo:
    """`info`'s sampling parameters repeated for each logits row (the filters' inputs)."""
    return dataclasses.replace(
        info,
        temperatures=info.temperatures[row_request],
        top_ps=info.top_ps[row_request],
        top_ks=info.top_ks[row_request],
        min_ps=info.min_ps[row_request],
        greedy=info.greedy[row_request],
        seeds=info.seeds[row_request],
        frequency_penalties=None,
        presence_penalties=None,
        repetition_penalties=None,
        output_counts=None,
        seen_tokens=None,
        logit_biases=None,
        vocab_bitmask=None,
        vocab_bitmask_rows=None,
        banned_rows=None,
        banned_token_ids=None,
    )
