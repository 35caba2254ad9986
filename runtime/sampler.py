"""Batched sampling on the device: masks, penalties, temperature, top-k/top-p/min-p.

Randomness is counter-based: each row's random number is a hash of (request seed, output
step), so a request draws the same token whatever batch it is in and whenever it runs (after
a retraction, a resumed request re-draws exactly what it would have drawn). A draw is an
inverse-CDF lookup with that one number per row: no per-token noise, and masked
probabilities can stay unnormalised.

Logprobs are those of the model's raw distribution (log_softmax of the logits before
penalties, masks and temperature), as SGLang reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixgen.kernels.vocab_mask import apply_token_bitmask_
from radixgen.runtime.sampling_batch_info import SamplingBatchInfo

_MASK32 = 0xFFFFFFFF


@dataclass
class SampleOutput:
    next_token_ids: torch.Tensor  # [batch] int64
    logprobs: torch.Tensor | None = None  # [batch, vocab] float32 raw log-probabilities


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer ("lowbias32") on int64 tensors holding values in [0, 2**32).

    int64 products may wrap; masking to the low 32 bits afterwards keeps the result exact,
    because wrapping arithmetic preserves the low bits.
    """
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def counter_uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One uniform number in [0, 1) per row that depends only on (seed, step).

    seeds, steps: [batch] int64. Returns [batch] float64.
    """
    mixed = hash32(hash32(seeds) ^ hash32(steps * 0x9E3779B1 + (seeds >> 32)))
    low = hash32(mixed ^ 0x5BD1E995)
    # 53 random bits (32 + 21) -> a float64 uniform in [0, 1).
    bits = (mixed << 21) | (low >> 11)
    return bits.to(torch.float64) * (1.0 / (1 << 53))


def apply_penalties(logits: torch.Tensor, info: SamplingBatchInfo) -> None:
    """Repetition (prompt and output tokens), frequency and presence (output) penalties."""
    repetition = info.repetition_penalties  # [batch, 1]
    penalised = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits.copy_(torch.where(info.seen_tokens, penalised, logits))
    counts = info.output_counts.to(logits.dtype)
    logits -= info.frequency_penalties * counts
    logits -= info.presence_penalties * (counts > 0).to(logits.dtype)


def filter_probs(probs: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Zeroes tokens outside top-k, top-p and min-p. probs: [batch, vocab], normalised."""
    if info.need_min_p:
        max_probs = probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < info.min_ps.unsqueeze(1) * max_probs, 0.0)
    if info.need_top_k_or_p:
        vocab_size = probs.shape[1]
        needs = ~info.greedy & ((info.top_ps < 1.0) | (info.top_ks < vocab_size))
        rows = needs.nonzero().squeeze(1)  # host sync: sort only the rows that need it
        if rows.numel() == probs.shape[0]:
            return top_k_top_p(probs, info.top_ks, info.top_ps)
        filtered = top_k_top_p(probs[rows], info.top_ks[rows], info.top_ps[rows])
        probs = probs.index_copy(0, rows, filtered)
    return probs


def top_k_top_p(
    probs: torch.Tensor,  # [rows, vocab]
    top_ks: torch.Tensor,  # [rows] int64
    top_ps: torch.Tensor,  # [rows] float32
) -> torch.Tensor:
    """Keeps each row's top-k tokens, then the smallest prefix whose mass reaches top-p."""
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(probs.shape[1], device=probs.device).unsqueeze(0)
    drop = ranks >= top_ks.unsqueeze(1)
    # Drop a token when the mass before it already reaches top_p (the first is always kept).
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop |= mass_before >= top_ps.unsqueeze(1) * sorted_probs.sum(-1, keepdim=True)
    drop[:, 0] = False
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(1, sorted_ids, sorted_probs)


def sample_inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Draws one token per row: the first whose cumulative mass exceeds u * total mass.

    probs: [batch, vocab], unnormalised, zeros for excluded tokens; uniform: [batch] in
    [0, 1). One random number per row (not per token), so a draw is cheap and reproducible.
    """
    cdf = probs.cumsum(dim=-1)  # [batch, vocab]
    target = (uniform.to(cdf.dtype) * cdf[:, -1]).unsqueeze(1)  # [batch, 1]
    ids = torch.searchsorted(cdf, target, right=True).squeeze(1)
    ids = ids.clamp_max(probs.shape[1] - 1)
    # Rounding at the very top of the cdf could land on an excluded token: take the most
    # likely one instead (probability ~1e-7).
    chosen = probs.gather(1, ids.unsqueeze(1)).squeeze(1)
    return torch.where(chosen > 0, ids, probs.argmax(dim=-1))


class Sampler:
    """Samples one token per row from `[batch, vocab]` logits."""

    def __call__(
        self,
        logits: torch.Tensor,  # [batch, vocab] float32
        info: SamplingBatchInfo,
        steps: torch.Tensor | None,  # [batch] int64, each row's output length so far
        # (None allowed when every row is greedy: no random number is drawn)
        return_logprobs: bool = False,
    ) -> SampleOutput:
        logits = logits.float()
        logprobs = torch.log_softmax(logits, dim=-1) if return_logprobs else None
        modifies = (
            info.vocab_bitmask is not None or info.banned_rows is not None or info.has_penalties
        )
        # The model's logits are not ours to change in place: copy only when we must.
        processed = logits.clone() if modifies else logits
        if info.vocab_bitmask is not None:
            # The one mask function: a Triton kernel on CUDA, torch elsewhere.
            apply_token_bitmask_(processed, info.vocab_bitmask, info.vocab_bitmask_rows)
        if info.banned_rows is not None:
            processed[info.banned_rows, info.banned_token_ids] = float("-inf")
        if info.has_penalties:
            apply_penalties(processed, info)
        greedy_ids = processed.argmax(dim=-1)
        if info.all_greedy:
            return SampleOutput(next_token_ids=greedy_ids, logprobs=logprobs)
        if steps is None:
            raise ValueError("steps is required when some row samples (not greedy)")
        probs = torch.softmax(processed / info.temperatures, dim=-1)
        probs = filter_probs(probs, info)
        sampled_ids = sample_inverse_cdf(probs, counter_uniform(info.seeds, steps))
        next_ids = torch.where(info.greedy, greedy_ids, sampled_ids)
        return SampleOutput(next_token_ids=next_ids, logprobs=logprobs)
