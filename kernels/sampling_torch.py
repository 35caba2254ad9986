"""The torch sampling math shared by the torch sampler (`radixgen.runtime.sampler`) and the fused
kernel's reference (`fused_sampling.fused_sample_ref`): the counter-based uniform, top-k/top-p and
the inverse-CDF draw.

Torch only, no Triton: the torch sampler imports it on every platform (Triton is a Linux-only
dependency). `fused_sampling._counter_uniform` is the Triton twin of `counter_uniform`; the two
must stay bit-identical (tests/test_kernels_fused_sampling.py checks it).
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF


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
    # The seed is salted first: hash32(0) == 0, so seed 0 at step 0 would draw ~0.0 and
    # always pick the first allowed token.
    mixed = hash32(hash32(seeds ^ 0x2545F491) ^ hash32(steps * 0x9E3779B1 + (seeds >> 32)))
    low = hash32(mixed ^ 0x5BD1E995)
    # 53 random bits (32 + 21) -> a float64 uniform in [0, 1).
    bits = (mixed << 21) | (low >> 11)
    return bits.to(torch.float64) * (1.0 / (1 << 53))


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
    # Float64 sums: float32 rounding moved ~1% of inverse-CDF draws at 128k tokens
    # (docs/kernels.md), and the fused kernel must agree with this reference.
    cdf = sorted_probs.double().cumsum(dim=-1)  # [rows, vocab]
    mass_before = cdf - sorted_probs.double()
    drop |= mass_before >= top_ps.double().unsqueeze(1) * cdf[:, -1:]
    drop[:, 0] = False
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(1, sorted_ids, sorted_probs)


def sample_inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Draws one token per row: the first whose cumulative mass exceeds u * total mass.

    probs: [batch, vocab], unnormalised, zeros for excluded tokens; uniform: [batch] float64 in
    [0, 1). One random number per row (not per token), so a draw is cheap and reproducible.
    The cumulative sum is float64: rounding decides a draw only within ~1e-13 of a boundary.
    """
    cdf = probs.double().cumsum(dim=-1)  # [batch, vocab]
    target = (uniform.double() * cdf[:, -1]).unsqueeze(1)  # [batch, 1]
    ids = torch.searchsorted(cdf, target, right=True).squeeze(1)
    ids = ids.clamp_max(probs.shape[1] - 1)
    # u * total rounding up to the total could land past the last kept token: take the most
    # likely one instead (probability ~1e-16).
    chosen = probs.gather(1, ids.unsqueeze(1)).squeeze(1)
    return torch.where(chosen > 0, ids, probs.argmax(dim=-1))
