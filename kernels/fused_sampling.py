"""Fused sampling: vocab mask, temperature, softmax, min-p / top-k / top-p and the draw.

A row's vocabulary is split over `num_splits` programs (grid `(batch, num_splits)`), so a batch
of 64 fills an H200's 132 SMs; small launches combine the splits' partials. Logits are read,
never written; the int32 mask word of each token is loaded with it (1/32 of the logits' traffic,
no separate mask launch). The kernels are in `fused_sampling_kernels.py`.

1. Partials (every batch): per split, the max masked logit `x`, its first argmax and, for
   sampled batches, the mass `sum exp(y - max y)` of `y = x / T` (an online softmax rescaled in
   float64 when the max moves).
2. Filters (batches with min-p, top-k or top-p; one launch per radix pass, then one more). Every
   filter is a threshold on the key of `e = exp(y - max y)` (its float bits, ordered like `e`
   since `e >= 0`, and `e <= 1` leaves 30 bits): min-p keeps `key(e) >= key(min_p)` (torch:
   `p >= min_p * max p`); top-k and top-p keep the keys at or above one cut found without a sort
   by a radix select. Pass `i` histograms each split's survivors in the candidate key range into
   2**RADIX_BITS buckets (count, float64 mass); pass `i + 1` sums the splits' histograms, keeps
   the highest bucket whose lower bound still has `count above >= k` or `mass above >= top_p *
   total`, and narrows to it (every program of the row derives the same choice; split 0 records
   it). A row whose bucket holds one token or one key is done and skips later passes. The last
   launch applies the final cut and records each split's kept mass.
3. Draw (sampled rows; grid `(batch,)`): the greedy id is the argmax of the first split holding
   the max (a temperature <= 0 row ends here). `u = counter_uniform(seed, step)` (the torch
   sampler's hash, in int64 here); the split whose running kept mass first exceeds `u * total`
   holds the pick, and only it is scanned: the first token, in vocabulary order, whose float64
   running sum of kept `e` exceeds the target.

Launches: greedy and plain sampled batches 2 (each reads the row once, plus one split for the
draw); min-p 3; top-k/top-p 3 + 30 / RADIX_BITS. The torch reference (`fused_sample_ref`)
normalises, sorts and cumsums in float64: the two pick the same token except when the draw or a
top-p cut lands within rounding of a boundary, or equal probabilities straddle a top-k/top-p cut
(torch's sort breaks such ties arbitrarily; the kernel keeps all tied tokens).
"""

from __future__ import annotations

import torch
import triton

from radixgen.kernels.fused_sampling_kernels import (
    MAX_SPLITS,
    _draw_kernel,
    _kept_mass_kernel,
    _radix_pass_kernel,
    _split_partials_kernel,
)
from radixgen.kernels.sampling_torch import counter_uniform, sample_inverse_cdf, top_k_top_p
from radixgen.kernels.vocab_mask import apply_token_bitmask_ref_


def _check_row_tensor(name, tensor, batch, dtypes, device):
    if tensor.dim() != 1 or tensor.shape[0] != batch:
        raise ValueError(f"{name} must have shape [{batch}], got {tuple(tensor.shape)}")
    if tensor.dtype not in dtypes:
        raise TypeError(f"{name} must be {' or '.join(map(str, dtypes))}, got {tensor.dtype}")
    if tensor.device != device:
        raise ValueError(f"{name} must be on {device}, got {tensor.device}")
    return tensor.contiguous()


def fused_sample(
    logits: torch.Tensor,  # [batch, vocab] float32, bfloat16 or float16
    *,
    temperatures: torch.Tensor,  # [batch] float32; <= 0: greedy
    seeds: torch.Tensor | None = None,  # [batch] int64
    steps: torch.Tensor | None = None,  # [batch] int64
    top_ks: torch.Tensor | None = None,  # [batch] int64; >= vocab: off
    top_ps: torch.Tensor | None = None,  # [batch] float32; 1.0: off
    min_ps: torch.Tensor | None = None,  # [batch] float32; 0.0: off
    bitmask: torch.Tensor | None = None,  # [batch, num_words] int32
    num_splits: int | None = None,
    block_size: int | None = None,
    search_block_size: int | None = None,
    radix_bits: int = 5,
    num_warps: int = 8,
) -> torch.Tensor:
    """Samples one token per row (see the module docstring). No host sync.

    Args:
        logits: the batch's next-token logits (not modified).
        temperatures: per row; a row with temperature <= 0 takes the argmax (greedy).
        seeds, steps: the counter-based draw's inputs (as `counter_uniform`); both None when
            every row is greedy (then every row takes the argmax).
        top_ks, top_ps: both or neither; None leaves the radix passes out.
        min_ps: None compiles the min-p threshold out.
        bitmask: packed allowed tokens, bit j of `bitmask[r, w]` allows token 32w + j (as
            `apply_token_bitmask_`); tokens past `32 * num_words` are disallowed. Applied to
            every row: unconstrained rows should be all ones.
        num_splits: programs per row (at most 64); None: enough for ~4 programs per SM.
        block_size, search_block_size, radix_bits, num_warps: tuning (tokens per block of
            the streaming passes and of the radix histogram, whose `[block, 2**radix_bits]`
            tile must fit in registers; bits resolved per radix pass, a divisor of 30).

    Returns:
        [batch] int64 token ids.

    Raises:
        ValueError/TypeError naming the argument on bad shapes, dtypes or devices.
    """
    if logits.dim() != 2 or logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(
            f"logits must be a float32/bfloat16/float16 [batch, vocab] tensor, got "
            f"{logits.dtype} {tuple(logits.shape)}"
        )
    if logits.stride(1) != 1:
        raise ValueError("logits must be contiguous along the vocabulary")
    batch, vocab_size = logits.shape
    device = logits.device
    temperatures = _check_row_tensor("temperatures", temperatures, batch, (torch.float32,), device)
    if (seeds is None) != (steps is None):
        raise ValueError("seeds and steps must be given together (or both None: all greedy)")
    if (top_ks is None) != (top_ps is None):
        raise ValueError("top_ks and top_ps must be given together")
    if seeds is not None:
        seeds = _check_row_tensor("seeds", seeds, batch, (torch.int64,), device)
        steps = _check_row_tensor("steps", steps, batch, (torch.int64,), device)
    if top_ks is not None:
        top_ks = _check_row_tensor("top_ks", top_ks, batch, (torch.int64,), device)
        top_ps = _check_row_tensor("top_ps", top_ps, batch, (torch.float32,), device)
    if min_ps is not None:
        min_ps = _check_row_tensor("min_ps", min_ps, batch, (torch.float32,), device)
    if bitmask is not None:
        if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.shape[0] != batch:
            raise TypeError(
                f"bitmask must be an int32 [{batch}, num_words] tensor, got {bitmask.dtype} "
                f"{tuple(bitmask.shape)}"
            )
        if bitmask.device != device:
            raise ValueError(f"bitmask must be on {device}, got {bitmask.device}")
        if bitmask.stride(1) != 1:
            bitmask = bitmask.contiguous()
    if radix_bits not in (1, 2, 3, 5, 6):
        raise ValueError(f"radix_bits must divide 30 and be at most 6, got {radix_bits}")
    if num_splits is not None and not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    out = torch.empty(batch, dtype=torch.int64, device=device)
    if batch == 0:
        return out
    if vocab_size == 0:
        raise ValueError("logits must have at least one vocabulary entry")
    on_gpu = device.type == "cuda"
    # The interpreter runs a block as one numpy op: big blocks are faster there. On the GPU a
    # [256, 32] histogram tile fits 8 warps' registers (ptxas: no spills at sm_90).
    whole_vocab = triton.next_power_of_2(vocab_size)
    block_size = min(block_size or (1024 if on_gpu else 16384), whole_vocab)
    search_block_size = min(search_block_size or (256 if on_gpu else 8192), whole_vocab)
    if num_splits is None:
        num_splits = _default_splits(batch, vocab_size, block_size, device)
    # Splits own whole blocks; rounding up may leave fewer splits than asked.
    chunk = triton.cdiv(triton.cdiv(vocab_size, num_splits), block_size) * block_size
    num_splits = triton.cdiv(vocab_size, chunk)
    sample = seeds is not None
    top_k_or_p = sample and top_ks is not None
    filtered = sample and (top_k_or_p or min_ps is not None)
    unused = temperatures  # any tensor: a pointer argument that a compiled-out branch never reads
    mask = bitmask if bitmask is not None else unused
    num_words = bitmask.shape[1] if bitmask is not None else 0
    rows = (logits.stride(0), bitmask.stride(0) if bitmask is not None else 0)
    flags = dict(HAS_MASK=bitmask is not None, num_warps=num_warps)
    part_max = torch.empty(batch, MAX_SPLITS, dtype=torch.float32, device=device)
    part_arg = torch.empty(batch, MAX_SPLITS, dtype=torch.int32, device=device)
    part_mass = (
        torch.empty(batch, MAX_SPLITS, dtype=torch.float64, device=device) if sample else unused
    )
    grid = (batch, num_splits)
    _split_partials_kernel[grid](
        logits, mask, temperatures, part_max, part_arg, part_mass, vocab_size, num_words, chunk,
        *rows, SAMPLE=sample, BLOCK=block_size, **flags,
    )  # fmt: skip
    kept_mass, threshold = unused, unused
    if filtered:
        passes = 30 // radix_bits
        filters = (
            logits, mask, temperatures, top_ks if top_k_or_p else unused,
            top_ps if top_k_or_p else unused, min_ps if min_ps is not None else unused, part_max,
        )  # fmt: skip
        shape = (passes, batch) if top_k_or_p else (1, 1)
        state_i = torch.empty(*shape, 4, dtype=torch.int32, device=device)
        state_f = torch.empty(*shape, 2, dtype=torch.float64, device=device)
        buckets = (MAX_SPLITS, 1 << radix_bits) if top_k_or_p else (1, 1)
        hist_counts = torch.empty(*shape, *buckets, dtype=torch.int32, device=device)
        hist_masses = torch.empty(*shape, *buckets, dtype=torch.float64, device=device)
        radix = (state_i, state_f, hist_counts, hist_masses)
        sizes = (vocab_size, num_words, chunk, num_splits, batch, *rows)
        has_min_p = min_ps is not None
        for pass_index in range(passes if top_k_or_p else 0):
            _radix_pass_kernel[grid](
                *filters, *radix, *sizes, PASS=pass_index, HAS_MIN_P=has_min_p,
                SEARCH_BLOCK=search_block_size, RADIX_BITS=radix_bits, **flags,
            )  # fmt: skip
        kept_mass = torch.empty(batch, MAX_SPLITS, dtype=torch.float64, device=device)
        threshold = torch.empty(batch, dtype=torch.int32, device=device)
        _kept_mass_kernel[grid](
            *filters, *radix, kept_mass, threshold, *sizes, PASSES=passes,
            HAS_MIN_P=has_min_p, HAS_TOP_K_OR_P=top_k_or_p, BLOCK=block_size,
            RADIX_BITS=radix_bits, **flags,
        )  # fmt: skip
    _draw_kernel[(batch,)](
        logits, mask, temperatures, seeds if sample else unused, steps if sample else unused,
        part_max, part_arg, part_mass, kept_mass, threshold, out, vocab_size, num_words, chunk,
        num_splits, *rows, SAMPLE=sample, FILTERED=filtered, BLOCK=block_size, **flags,
    )  # fmt: skip
    return out


def _default_splits(batch: int, vocab_size: int, block_size: int, device: torch.device) -> int:
    """Programs per row: ~4 per SM over the batch (1 off CUDA: the interpreter runs programs
    one after another), a power of two so the few grid shapes repeat, each split >= 4 blocks."""
    if device.type != "cuda":
        return 1
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    wanted = triton.next_power_of_2(triton.cdiv(4 * sm_count, batch))
    most = max(vocab_size // (4 * block_size), 1)
    return max(min(wanted, most, MAX_SPLITS), 1)


# ---- the plain-torch reference -----------------------------------------------------------------


def sampling_probs_ref(
    logits: torch.Tensor,
    *,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor | None = None,
    top_ps: torch.Tensor | None = None,
    min_ps: torch.Tensor | None = None,
    bitmask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch sampler's steps before the draw: (greedy ids [batch] int64, probabilities
    [batch, vocab] float32 after the mask, temperature, min-p, top-k and top-p; zeros dropped)."""
    processed = logits.float().clone()
    if bitmask is not None:
        apply_token_bitmask_ref_(processed, bitmask)
    greedy_ids = processed.argmax(dim=-1)
    greedy = temperatures <= 0
    scaled = processed / torch.where(greedy, 1.0, temperatures).unsqueeze(1)
    probs = torch.softmax(scaled, dim=-1)
    if min_ps is not None:
        max_probs = probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < min_ps.unsqueeze(1) * max_probs, 0.0)
    if top_ks is not None:
        needs = ~greedy & ((top_ps < 1.0) | (top_ks < probs.shape[1]))
        probs = torch.where(needs.unsqueeze(1), top_k_top_p(probs, top_ks, top_ps), probs)
    return greedy_ids, probs


def fused_sample_ref(
    logits: torch.Tensor,
    *,
    temperatures: torch.Tensor,
    seeds: torch.Tensor | None = None,
    steps: torch.Tensor | None = None,
    top_ks: torch.Tensor | None = None,
    top_ps: torch.Tensor | None = None,
    min_ps: torch.Tensor | None = None,
    bitmask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain-torch reference of `fused_sample` (same arguments, the torch sampler's math)."""
    greedy_ids, probs = sampling_probs_ref(
        logits,
        temperatures=temperatures,
        top_ks=top_ks,
        top_ps=top_ps,
        min_ps=min_ps,
        bitmask=bitmask,
    )
    if seeds is None:
        return greedy_ids
    sampled_ids = sample_inverse_cdf(probs, counter_uniform(seeds, steps))
    return torch.where(temperatures <= 0, greedy_ids, sampled_ids)
