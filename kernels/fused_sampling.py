"""Fused sampling: vocab mask, temperature, softmax, min-p / top-k / top-p and the draw, per row.

One launch, grid `(batch,)`: one program samples one row, walking the vocabulary in blocks of
BLOCK tokens (logits are read, never written; the int32 mask word of each token is loaded with
it, so a mask costs 1/32 of the logits' traffic and no separate launch).

Pass 1 (every row): `x` = the masked logits; the greedy id is the first argmax of `x` (the
temperature-0 case ends here) and, for sampled rows, the online softmax of `y = x / T` keeps the
running max and the mass `sum exp(y - max)`, rescaled in float64 whenever the max moves.

Filters (rows that use them; the branches are compiled out when no row of the batch does):
`e = exp(y - max(y))` is the unnormalised probability, 1 for the most likely token. min-p keeps
`e >= min_p` (torch: `p >= min_p * max p`). top-k and top-p keep the tokens at or above one
threshold, the smallest kept `e`, found without a sort by a radix select on the float bits of
`e` (positive floats order like their int32 bits, and `e <= 1` has bit 30 clear): each pass
histograms the tokens still in the candidate key range into 2**RADIX_BITS buckets (count and
float64 mass), keeps the highest bucket whose lower bound still satisfies `count above >= k` or
`mass above >= top_p * total`, and narrows to it; it stops when that bucket holds one token or
one key (at most 30 / RADIX_BITS passes). The first pass also sums the min-p survivors' mass, so
a min-p-only row costs one extra pass.

Draw (sampled rows): inverse CDF with one counter-based uniform per row, `u = counter_uniform(
seed, step)` (the same hash as the torch sampler, computed here in int64): the first token, in
vocabulary order, whose float64 running sum of kept `e` exceeds `u * kept total`. The scan stops
at that token (on average half the row).

So a greedy row reads its logits once; a plain sampled row 1.5 times; min-p adds one pass; top-k
or top-p adds the radix passes. The torch reference (`fused_sample_ref`) normalises, sorts and
cumsums in float64: the two pick the same token except when the draw or a top-p cut lands within
rounding of a boundary, or equal probabilities straddle a top-k/top-p cut (torch's sort breaks
such ties arbitrarily; the kernel keeps all tied tokens).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixgen.kernels.sampling_torch import counter_uniform, sample_inverse_cdf, top_k_top_p
from radixgen.kernels.vocab_mask import apply_token_bitmask_ref_

# ---- the counter-based uniform in Triton: bit-identical to `counter_uniform` -------------------


@triton.jit
def _hash32(x):
    # The same int64 arithmetic as `hash32` (wrapping products, low 32 bits kept).
    x = x & 0xFFFFFFFF
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _counter_uniform(seed, step):
    mixed = _hash32(_hash32(seed ^ 0x2545F491) ^ _hash32(step * 0x9E3779B1 + (seed >> 32)))
    low = _hash32(mixed ^ 0x5BD1E995)
    bits = (mixed << 21) | (low >> 11)
    return bits.to(tl.float64) * (1.0 / (1 << 53))


# ---- the kernel --------------------------------------------------------------------------------


@triton.jit
def _masked_logits(logits_row, bitmask_row, offs, vocab_size, num_words, HAS_MASK: tl.constexpr):
    """[BLOCK] float32 logits of tokens `offs`; -inf past the vocabulary and where masked."""
    in_vocab = offs < vocab_size
    x = tl.load(logits_row + offs, mask=in_vocab, other=float("-inf")).to(tl.float32)
    if HAS_MASK:
        word_ids = offs // 32
        # Each word is loaded by its 32 tokens' lanes (one cached line); missing words: disallowed.
        words = tl.load(bitmask_row + word_ids, mask=in_vocab & (word_ids < num_words), other=0)
        allowed = ((words >> (offs % 32)) & 1) != 0
        x = tl.where(allowed, x, float("-inf"))
    return x


@triton.jit
def _probs(logits_row, bitmask_row, offs, vocab_size, num_words, temperature, max_y, min_p,
           HAS_MASK: tl.constexpr):  # fmt: skip
    """Unnormalised probabilities e = exp(x / T - max_y) of tokens `offs` ([BLOCK] float32),
    their int32 keys (the float bits: ordered like e) and whether min-p keeps them."""
    x = _masked_logits(logits_row, bitmask_row, offs, vocab_size, num_words, HAS_MASK)
    e = tl.where(x > float("-inf"), tl.exp(x / temperature - max_y), 0.0)
    keys = e.to(tl.int32, bitcast=True)
    return e, keys, (e > 0.0) & (e >= min_p)


@triton.jit
def _histogram(logits_row, bitmask_row, vocab_size, num_words, temperature, max_y, min_p,
               low_key, shift, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr,
               NUM_BUCKETS: tl.constexpr):  # fmt: skip
    """Count and float64 mass of the surviving tokens in each bucket of the key range
    `[low_key, low_key + NUM_BUCKETS << shift)`: ([NUM_BUCKETS] int32, [NUM_BUCKETS] float64)."""
    buckets = tl.arange(0, NUM_BUCKETS)
    offs = tl.arange(0, BLOCK)
    counts = tl.zeros([NUM_BUCKETS], tl.int32)
    masses = tl.zeros([NUM_BUCKETS], tl.float64)
    for start in range(0, vocab_size, BLOCK):
        e, keys, keep = _probs(logits_row, bitmask_row, start + offs, vocab_size, num_words,
                               temperature, max_y, min_p, HAS_MASK)  # fmt: skip
        digits = (keys - low_key) >> shift  # [BLOCK]; negative below the range
        in_range = keep & (keys >= low_key) & (digits < NUM_BUCKETS)
        hits = in_range[:, None] & (digits[:, None] == buckets[None, :])  # [BLOCK, BUCKETS]
        counts += tl.sum(hits.to(tl.int32), axis=0)
        masses += tl.sum(tl.where(hits, e.to(tl.float64)[:, None], 0.0), axis=0)
    return counts, masses


@triton.jit
def _threshold(logits_row, bitmask_row, vocab_size, num_words, temperature, max_y, min_p,
               top_k, top_p, search, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr,
               SEARCH_BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr):  # fmt: skip
    """(smallest kept key, float64 kept mass) of one row: min-p survivors, then top-k/top-p
    (only when `search`) by a radix select over the keys (see the module docstring)."""
    NUM_BUCKETS: tl.constexpr = 1 << RADIX_BITS
    buckets = tl.arange(0, NUM_BUCKETS)
    low_key = tl.full([], 0, tl.int32)  # candidates: keys in [low_key, low_key + 2**(shift+RB))
    shift = tl.full([], 30 - RADIX_BITS, tl.int32)
    counts = tl.zeros([NUM_BUCKETS], tl.int32)
    masses = tl.zeros([NUM_BUCKETS], tl.float64)
    if search:
        # The first range holds every survivor: their count and mass set the cut.
        counts, masses = _histogram(logits_row, bitmask_row, vocab_size, num_words, temperature,
                                    max_y, min_p, low_key, shift, HAS_MASK, SEARCH_BLOCK,
                                    NUM_BUCKETS)  # fmt: skip
        kept_mass = tl.sum(masses, axis=0)
    else:
        # min-p only: the survivors' mass, without the histogram's registers.
        offs = tl.arange(0, BLOCK)
        kept_mass = tl.full([], 0.0, tl.float64)
        for start in range(0, vocab_size, BLOCK):
            e, keys, keep = _probs(logits_row, bitmask_row, start + offs, vocab_size, num_words,
                                   temperature, max_y, min_p, HAS_MASK)  # fmt: skip
            kept_mass += tl.sum(tl.where(keep, e, 0.0).to(tl.float64), axis=0)
    min_count = tl.maximum(tl.minimum(top_k, tl.sum(counts, axis=0)), 1).to(tl.int32)
    mass_needed = top_p.to(tl.float64) * kept_mass
    count_above = tl.full([], 0, tl.int32)  # kept for sure: keys above the candidate range
    mass_above = tl.full([], 0.0, tl.float64)
    done = search == 0
    while done == 0:
        count_at_least = count_above + tl.cumsum(counts, axis=0, reverse=True)  # [BUCKETS]
        mass_at_least = mass_above + tl.cumsum(masses, axis=0, reverse=True)
        satisfied = (count_at_least >= 1) & (
            (count_at_least >= min_count) | (mass_at_least >= mass_needed)
        )
        # The previous pass chose this range because its lower bound satisfied the cut, so
        # bucket 0 does (up to float64 summation order): default to it.
        chosen = tl.maximum(tl.max(tl.where(satisfied, buckets, -1), axis=0), 0)
        count_in = tl.sum(tl.where(buckets == chosen, counts, 0), axis=0)
        count_above += tl.sum(tl.where(buckets > chosen, counts, 0), axis=0)
        mass_above += tl.sum(tl.where(buckets > chosen, masses, 0.0), axis=0)
        kept_mass = mass_above + tl.sum(tl.where(buckets == chosen, masses, 0.0), axis=0)
        low_key += chosen << shift
        # One token or one key left in the bucket: its lower bound is the cut.
        done = (count_in <= 1) | (shift == 0)
        if done == 0:
            shift -= RADIX_BITS
            counts, masses = _histogram(logits_row, bitmask_row, vocab_size, num_words,
                                        temperature, max_y, min_p, low_key, shift, HAS_MASK,
                                        SEARCH_BLOCK, NUM_BUCKETS)  # fmt: skip
    # Without top-k/top-p every survivor (e > 0) is kept.
    return tl.where(search, low_key, 1), kept_mass


@triton.jit
def _fused_sample_kernel(
    logits_ptr,  # [batch, vocab] float32/bfloat16/float16
    bitmask_ptr,  # [batch, num_words] int32 (unused without HAS_MASK)
    temperatures_ptr,  # [batch] float32; <= 0: greedy
    seeds_ptr,  # [batch] int64 (SAMPLE)
    steps_ptr,  # [batch] int64 (SAMPLE)
    top_ks_ptr,  # [batch] int64 (FILTER_TOP_K_OR_P)
    top_ps_ptr,  # [batch] float32 (FILTER_TOP_K_OR_P)
    min_ps_ptr,  # [batch] float32 (FILTER_MIN_P)
    out_ptr,  # [batch] int64
    vocab_size,
    num_words,
    stride_logits_row,
    stride_bitmask_row,
    HAS_MASK: tl.constexpr,
    SAMPLE: tl.constexpr,
    FILTER_MIN_P: tl.constexpr,
    FILTER_TOP_K_OR_P: tl.constexpr,
    BLOCK: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    logits_row = logits_ptr + row * stride_logits_row
    bitmask_row = bitmask_ptr + row * stride_bitmask_row
    offs = tl.arange(0, BLOCK)
    temperature = tl.load(temperatures_ptr + row)
    greedy = temperature <= 0.0
    sampling_temperature = tl.where(greedy, 1.0, temperature)

    # Pass 1: greedy argmax of x; running max and float64 mass of y = x / T.
    max_x = tl.full([], float("-inf"), tl.float32)
    argmax_x = tl.full([], 0, tl.int32)
    max_y = tl.full([], float("-inf"), tl.float32)
    mass = tl.full([], 0.0, tl.float64)
    for start in range(0, vocab_size, BLOCK):
        x = _masked_logits(logits_row, bitmask_row, start + offs, vocab_size, num_words, HAS_MASK)
        block_max, block_arg = tl.max(x, axis=0, return_indices=True)
        better = block_max > max_x  # strictly: the first maximum wins, as in torch.argmax
        argmax_x = tl.where(better, start + block_arg, argmax_x)
        max_x = tl.maximum(max_x, block_max)
        if SAMPLE:
            y = x / sampling_temperature
            new_max_y = tl.maximum(max_y, tl.max(y, axis=0))
            # -inf until the first allowed token: subtract 0 then (no -inf - -inf = NaN).
            finite_max_y = tl.where(new_max_y > float("-inf"), new_max_y, 0.0)
            e = tl.where(x > float("-inf"), tl.exp(y - finite_max_y), 0.0)
            # Float64 rescale of the running mass when the max moves (float32 would add ~1e-7
            # per move); exp(-inf) = 0 drops the empty start.
            rescale = tl.exp((max_y - finite_max_y).to(tl.float64))
            mass = mass * rescale + tl.sum(e.to(tl.float64), axis=0)
            max_y = new_max_y
    token = argmax_x.to(tl.int64)

    if SAMPLE:
        if (temperature > 0.0) & (max_y > float("-inf")):
            min_p = 0.0
            if FILTER_MIN_P:
                min_p = tl.load(min_ps_ptr + row)
            low_key = tl.full([], 1, tl.int32)  # keep every e > 0
            kept_mass = mass
            if FILTER_MIN_P or FILTER_TOP_K_OR_P:
                search = tl.full([], False, tl.int1)
                top_k = tl.full([], 1 << 30, tl.int64)
                top_p = tl.full([], 1.0, tl.float32)
                if FILTER_TOP_K_OR_P:
                    top_k = tl.load(top_ks_ptr + row)
                    top_p = tl.load(top_ps_ptr + row)
                    search = (top_k < vocab_size) | (top_p < 1.0)
                if search | (min_p > 0.0):
                    low_key, kept_mass = _threshold(
                        logits_row, bitmask_row, vocab_size, num_words, sampling_temperature,
                        max_y, min_p, top_k, top_p, search, HAS_MASK, BLOCK, SEARCH_BLOCK,
                        RADIX_BITS,
                    )  # fmt: skip

            # Inverse CDF in vocabulary order: the first kept token whose running mass > target.
            uniform = _counter_uniform(tl.load(seeds_ptr + row), tl.load(steps_ptr + row))
            target = uniform * kept_mass
            running = tl.full([], 0.0, tl.float64)
            picked = tl.full([], -1, tl.int32)
            start = 0
            while (picked < 0) & (start < vocab_size):
                e, keys, keep = _probs(logits_row, bitmask_row, start + offs, vocab_size,
                                       num_words, sampling_temperature, max_y, min_p,
                                       HAS_MASK)  # fmt: skip
                weights = tl.where(keep & (keys >= low_key), e, 0.0).to(tl.float64)
                cdf = running + tl.cumsum(weights, axis=0)  # [BLOCK]
                first_hit = tl.min(tl.where(cdf > target, offs, BLOCK), axis=0)
                picked = tl.where(first_hit < BLOCK, start + first_hit, -1)
                running += tl.sum(weights, axis=0)
                start += BLOCK
            # Not found only if rounding put the target at the very top: the argmax, as torch.
            token = tl.where(picked >= 0, picked, argmax_x).to(tl.int64)
    tl.store(out_ptr + row, token)


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
    block_size: int | None = None,
    search_block_size: int | None = None,
    radix_bits: int = 5,
    num_warps: int = 8,
) -> torch.Tensor:
    """Samples one token per row in one launch (see the module docstring). No host sync.

    Args:
        logits: the batch's next-token logits (not modified).
        temperatures: per row; a row with temperature <= 0 takes the argmax (greedy).
        seeds, steps: the counter-based draw's inputs (as `counter_uniform`); both None when
            every row is greedy (then every row takes the argmax).
        top_ks, top_ps: both or neither; None compiles the top-k/top-p pass out.
        min_ps: None compiles the min-p filter out.
        bitmask: packed allowed tokens, bit j of `bitmask[r, w]` allows token 32w + j (as
            `apply_token_bitmask_`); tokens past `32 * num_words` are disallowed. Applied to
            every row: unconstrained rows should be all ones.
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
    unused = temperatures  # any tensor: a pointer argument that a compiled-out branch never reads
    _fused_sample_kernel[(batch,)](
        logits,
        bitmask if bitmask is not None else unused,
        temperatures,
        seeds if seeds is not None else unused,
        steps if steps is not None else unused,
        top_ks if top_ks is not None else unused,
        top_ps if top_ps is not None else unused,
        min_ps if min_ps is not None else unused,
        out,
        vocab_size,
        bitmask.shape[1] if bitmask is not None else 0,
        logits.stride(0),
        bitmask.stride(0) if bitmask is not None else 0,
        HAS_MASK=bitmask is not None,
        SAMPLE=seeds is not None,
        FILTER_MIN_P=min_ps is not None,
        FILTER_TOP_K_OR_P=top_ks is not None,
        BLOCK=block_size,
        SEARCH_BLOCK=search_block_size,
        RADIX_BITS=radix_bits,
        num_warps=num_warps,
    )
    return out


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
