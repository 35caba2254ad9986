"""The Triton kernels of `fused_sampling.fused_sample` (the host side and the algorithm's
description live there). Every kernel but the draw runs on grid `(batch, num_splits)`: split `s`
of a row owns the tokens `[s * chunk, min((s + 1) * chunk, vocab))`; per-split partials go to
`[batch, MAX_SPLITS]` buffers (MAX_SPLITS is fixed, so the number of splits is a runtime value
and never recompiles a kernel) and the next launch combines them.

Every filter is one threshold on the int32 key (the float bits) of `e = exp(x / T - max_y)`:
a token is kept when `key >= threshold`, so min-p, top-k and top-p share one code path.
"""

from __future__ import annotations

import triton
import triton.language as tl

MAX_SPLITS = 64  # partial buffers are [batch, MAX_SPLITS]; num_splits <= MAX_SPLITS
_SPLITS = tl.constexpr(MAX_SPLITS)  # the same, readable inside @triton.jit functions
# Integer arguments that change with the batch size are not specialised (`do_not_specialize`):
# Triton would compile a variant per value class (== 1, multiple of 16, other), i.e. mid-serving
# when a new batch size appears.
_BATCH_DEPENDENT = ["chunk", "num_splits", "batch"]

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


# ---- per-token helpers -------------------------------------------------------------------------


@triton.jit
def _masked_logits(logits_row, bitmask_row, offs, limit, num_words, HAS_MASK: tl.constexpr):
    """[BLOCK] float32 logits of tokens `offs`; -inf from `limit` on and where masked."""
    inside = offs < limit
    x = tl.load(logits_row + offs, mask=inside, other=float("-inf")).to(tl.float32)
    if HAS_MASK:
        word_ids = offs // 32
        # Each word is loaded by its 32 tokens' lanes (one cached line); missing words: disallowed.
        words = tl.load(bitmask_row + word_ids, mask=inside & (word_ids < num_words), other=0)
        allowed = ((words >> (offs % 32)) & 1) != 0
        x = tl.where(allowed, x, float("-inf"))
    return x


@triton.jit
def _probs(logits_row, bitmask_row, offs, limit, num_words, temperature, max_y,
           HAS_MASK: tl.constexpr):  # fmt: skip
    """Unnormalised probabilities e = exp(x / T - max_y) of tokens `offs` ([BLOCK] float32) and
    their int32 keys (the float bits, ordered like e since e >= 0). Every pass computes e with
    this one function, so all passes agree on every token's key bit for bit."""
    x = _masked_logits(logits_row, bitmask_row, offs, limit, num_words, HAS_MASK)
    e = tl.where(x > float("-inf"), tl.exp(x / temperature - max_y), 0.0)
    return e, e.to(tl.int32, bitcast=True)


@triton.jit
def _row_max_x(part_max_ptr, row, num_splits):
    """The row's max masked logit, combined from its splits' partials."""
    splits = tl.arange(0, _SPLITS)
    maxima = tl.load(part_max_ptr + row * _SPLITS + splits, mask=splits < num_splits,
                     other=float("-inf"))  # fmt: skip
    return tl.max(maxima, axis=0)


@triton.jit
def _row_params(temperatures_ptr, min_ps_ptr, row, HAS_MIN_P: tl.constexpr):
    """(sampling temperature, whether the row samples, the min-p key threshold)."""
    temperature = tl.load(temperatures_ptr + row)
    sampled = temperature > 0.0
    threshold = tl.full([], 1, tl.int32)  # e > 0
    if HAS_MIN_P:
        # e >= min_p <=> key(e) >= key(min_p) for non-negative floats.
        min_p = tl.load(min_ps_ptr + row)
        threshold = tl.maximum(threshold, min_p.to(tl.int32, bitcast=True))
    return tl.where(sampled, temperature, 1.0), sampled, threshold


# ---- launch 1: per-split max, first argmax and softmax mass -------------------------------------


@triton.jit(do_not_specialize=["chunk"])
def _split_partials_kernel(
    logits_ptr,  # [batch, vocab] float32/bfloat16/float16
    bitmask_ptr,  # [batch, num_words] int32 (HAS_MASK)
    temperatures_ptr,  # [batch] float32; <= 0: greedy
    part_max_ptr,  # out [batch, _SPLITS] float32: max masked logit of the split
    part_arg_ptr,  # out [batch, _SPLITS] int32: its first argmax (the split start if none)
    part_mass_ptr,  # out [batch, _SPLITS] float64: sum exp(y - max_y_split) (SAMPLE)
    vocab_size,
    num_words,
    chunk,
    stride_logits_row,
    stride_bitmask_row,
    HAS_MASK: tl.constexpr,
    SAMPLE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    logits_row = logits_ptr + row * stride_logits_row
    bitmask_row = bitmask_ptr + row * stride_bitmask_row
    start = split * chunk
    end = tl.minimum(start + chunk, vocab_size)
    temperature = tl.load(temperatures_ptr + row)
    temperature = tl.where(temperature > 0.0, temperature, 1.0)
    offs = tl.arange(0, BLOCK)
    max_x = tl.full([], float("-inf"), tl.float32)
    argmax_x = start
    max_y = tl.full([], float("-inf"), tl.float32)
    mass = tl.full([], 0.0, tl.float64)
    for block_start in range(start, end, BLOCK):
        x = _masked_logits(logits_row, bitmask_row, block_start + offs, end, num_words, HAS_MASK)
        block_max, block_arg = tl.max(x, axis=0, return_indices=True)
        better = block_max > max_x  # strictly: the first maximum wins, as in torch.argmax
        argmax_x = tl.where(better, block_start + block_arg, argmax_x)
        max_x = tl.maximum(max_x, block_max)
        if SAMPLE:
            y = x / temperature
            new_max_y = tl.maximum(max_y, tl.max(y, axis=0))
            # -inf until the first allowed token: subtract 0 then (no -inf - -inf = NaN).
            finite_max_y = tl.where(new_max_y > float("-inf"), new_max_y, 0.0)
            e = tl.where(x > float("-inf"), tl.exp(y - finite_max_y), 0.0)
            # Float64 rescale when the max moves; exp(-inf) = 0 drops the empty start.
            rescale = tl.exp((max_y - finite_max_y).to(tl.float64))
            mass = mass * rescale + tl.sum(e.to(tl.float64), axis=0)
            max_y = new_max_y
    tl.store(part_max_ptr + row * _SPLITS + split, max_x)
    tl.store(part_arg_ptr + row * _SPLITS + split, argmax_x)
    if SAMPLE:
        tl.store(part_mass_ptr + row * _SPLITS + split, mass)


# ---- launches 2 ..: the top-k / top-p radix select, one launch per pass -------------------------


@triton.jit
def _radix_state(state_i_ptr, state_f_ptr, hist_counts_ptr, hist_masses_ptr, row, num_splits,
                 batch, top_k, top_p, PASS: tl.constexpr, RADIX_BITS: tl.constexpr):  # fmt: skip
    """The radix select's state before pass PASS: (low_key, count_above, min_count, done,
    mass_above, mass_needed). Pass 0 starts from the whole key range; later passes read the
    state the previous pass started from (pass >= 2) and its histograms (summed over splits),
    and narrow to the highest bucket whose lower bound still keeps `count >= min_count` or
    `mass >= mass_needed` (top_k and top_p * total, set from pass 0's histograms)."""
    low_key = tl.full([], 0, tl.int32)
    count_above = tl.full([], 0, tl.int32)
    min_count = tl.full([], 1, tl.int32)
    done = tl.full([], 0, tl.int32)
    mass_above = tl.full([], 0.0, tl.float64)
    mass_needed = tl.full([], 0.0, tl.float64)
    if PASS > 0:
        if PASS > 1:
            state_i = state_i_ptr + ((PASS - 1) * batch + row) * 4
            state_f = state_f_ptr + ((PASS - 1) * batch + row) * 2
            low_key = tl.load(state_i)
            count_above = tl.load(state_i + 1)
            min_count = tl.load(state_i + 2)
            done = tl.load(state_i + 3)
            mass_above = tl.load(state_f)
            mass_needed = tl.load(state_f + 1)
        if done == 0:
            NUM_BUCKETS: tl.constexpr = 1 << RADIX_BITS
            SHIFT: tl.constexpr = 30 - RADIX_BITS * PASS  # the previous pass's bucket width
            splits = tl.arange(0, _SPLITS)
            buckets = tl.arange(0, NUM_BUCKETS)
            tile = (((PASS - 1) * batch + row) * _SPLITS + splits[:, None]) * NUM_BUCKETS
            tile += buckets[None, :]  # [_SPLITS, BUCKETS]
            valid = (splits < num_splits)[:, None]
            counts = tl.sum(tl.load(hist_counts_ptr + tile, mask=valid, other=0), axis=0)
            masses = tl.sum(tl.load(hist_masses_ptr + tile, mask=valid, other=0.0), axis=0)
            if PASS == 1:
                # The first range holds every survivor: their count and mass set the cut.
                min_count = tl.maximum(tl.minimum(top_k, tl.sum(counts, axis=0)), 1).to(tl.int32)
                mass_needed = top_p.to(tl.float64) * tl.sum(masses, axis=0)
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
            low_key += chosen << SHIFT
            # One token or one key left in the bucket: its lower bound is the cut.
            if SHIFT == 0:
                done = tl.full([], 1, tl.int32)
            else:
                done = (count_in <= 1).to(tl.int32)
    return low_key, count_above, min_count, done, mass_above, mass_needed


@triton.jit(do_not_specialize=_BATCH_DEPENDENT)
def _radix_pass_kernel(
    logits_ptr,
    bitmask_ptr,
    temperatures_ptr,
    top_ks_ptr,  # [batch] int64
    top_ps_ptr,  # [batch] float32
    min_ps_ptr,  # [batch] float32 (HAS_MIN_P)
    part_max_ptr,  # [batch, _SPLITS] float32 from launch 1
    state_i_ptr,  # [passes, batch, 4] int32: low_key, count_above, min_count, done
    state_f_ptr,  # [passes, batch, 2] float64: mass_above, mass_needed
    hist_counts_ptr,  # [passes, batch, _SPLITS, 2**RADIX_BITS] int32
    hist_masses_ptr,  # [passes, batch, _SPLITS, 2**RADIX_BITS] float64
    vocab_size,
    num_words,
    chunk,
    num_splits,
    batch,
    stride_logits_row,
    stride_bitmask_row,
    PASS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    """Pass PASS: derive the candidate key range (`_radix_state`) and histogram this split's
    survivors in it into 2**RADIX_BITS buckets (count, float64 mass)."""
    NUM_BUCKETS: tl.constexpr = 1 << RADIX_BITS
    SHIFT: tl.constexpr = 30 - RADIX_BITS * (PASS + 1)
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    temperature, sampled, min_p_key = _row_params(temperatures_ptr, min_ps_ptr, row, HAS_MIN_P)
    top_k = tl.load(top_ks_ptr + row)
    top_p = tl.load(top_ps_ptr + row)
    max_x = _row_max_x(part_max_ptr, row, num_splits)
    if sampled & (max_x > float("-inf")) & ((top_k < vocab_size) | (top_p < 1.0)):
        low_key, count_above, min_count, done, mass_above, mass_needed = _radix_state(
            state_i_ptr, state_f_ptr, hist_counts_ptr, hist_masses_ptr, row, num_splits, batch,
            top_k, top_p, PASS, RADIX_BITS,
        )  # fmt: skip
        if PASS > 0:
            if split == 0:
                state_i = state_i_ptr + (PASS * batch + row) * 4
                tl.store(state_i, low_key)
                tl.store(state_i + 1, count_above)
                tl.store(state_i + 2, min_count)
                tl.store(state_i + 3, done)
                tl.store(state_f_ptr + (PASS * batch + row) * 2, mass_above)
                tl.store(state_f_ptr + (PASS * batch + row) * 2 + 1, mass_needed)
        if done == 0:
            logits_row = logits_ptr + row * stride_logits_row
            bitmask_row = bitmask_ptr + row * stride_bitmask_row
            max_y = max_x / temperature
            start = split * chunk
            end = tl.minimum(start + chunk, vocab_size)
            buckets = tl.arange(0, NUM_BUCKETS)
            offs = tl.arange(0, SEARCH_BLOCK)
            counts = tl.zeros([NUM_BUCKETS], tl.int32)
            masses = tl.zeros([NUM_BUCKETS], tl.float64)
            for block_start in range(start, end, SEARCH_BLOCK):
                e, keys = _probs(logits_row, bitmask_row, block_start + offs, end, num_words,
                                 temperature, max_y, HAS_MASK)  # fmt: skip
                digits = (keys - low_key) >> SHIFT  # [SEARCH_BLOCK]; negative below the range
                in_range = (keys >= min_p_key) & (keys >= low_key) & (digits < NUM_BUCKETS)
                # After pass 0 few tokens remain candidates: most blocks skip the
                # [SEARCH_BLOCK, BUCKETS] tile and cost only their read.
                if tl.max(in_range.to(tl.int32), axis=0) > 0:
                    hits = in_range[:, None] & (digits[:, None] == buckets[None, :])
                    counts += tl.sum(hits.to(tl.int32), axis=0)
                    masses += tl.sum(tl.where(hits, e.to(tl.float64)[:, None], 0.0), axis=0)
            hist = ((PASS * batch + row) * _SPLITS + split) * NUM_BUCKETS + buckets
            tl.store(hist_counts_ptr + hist, counts)
            tl.store(hist_masses_ptr + hist, masses)


# ---- the kept-mass launch (filtered batches) ----------------------------------------------------


@triton.jit(do_not_specialize=_BATCH_DEPENDENT)
def _kept_mass_kernel(
    logits_ptr,
    bitmask_ptr,
    temperatures_ptr,
    top_ks_ptr,
    top_ps_ptr,
    min_ps_ptr,
    part_max_ptr,
    state_i_ptr,
    state_f_ptr,
    hist_counts_ptr,
    hist_masses_ptr,
    kept_mass_ptr,  # out [batch, _SPLITS] float64: mass of the split's kept tokens
    threshold_ptr,  # out [batch] int32: the row's key threshold (written by split 0)
    vocab_size,
    num_words,
    chunk,
    num_splits,
    batch,
    stride_logits_row,
    stride_bitmask_row,
    PASSES: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    HAS_TOP_K_OR_P: tl.constexpr,
    BLOCK: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    """The row's final key threshold (min-p, and the radix select's cut after its last pass)
    and each split's float64 mass of kept tokens (the draw picks a split by these)."""
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    temperature, sampled, threshold = _row_params(temperatures_ptr, min_ps_ptr, row, HAS_MIN_P)
    max_x = _row_max_x(part_max_ptr, row, num_splits)
    if sampled & (max_x > float("-inf")):
        if HAS_TOP_K_OR_P:
            top_k = tl.load(top_ks_ptr + row)
            top_p = tl.load(top_ps_ptr + row)
            if (top_k < vocab_size) | (top_p < 1.0):
                low_key, _, _, _, _, _ = _radix_state(
                    state_i_ptr, state_f_ptr, hist_counts_ptr, hist_masses_ptr, row, num_splits,
                    batch, top_k, top_p, PASSES, RADIX_BITS,
                )  # fmt: skip
                threshold = tl.maximum(threshold, low_key)
        logits_row = logits_ptr + row * stride_logits_row
        bitmask_row = bitmask_ptr + row * stride_bitmask_row
        max_y = max_x / temperature
        start = split * chunk
        end = tl.minimum(start + chunk, vocab_size)
        offs = tl.arange(0, BLOCK)
        kept = tl.full([], 0.0, tl.float64)
        for block_start in range(start, end, BLOCK):
            e, keys = _probs(logits_row, bitmask_row, block_start + offs, end, num_words,
                             temperature, max_y, HAS_MASK)  # fmt: skip
            kept += tl.sum(tl.where(keys >= threshold, e, 0.0).to(tl.float64), axis=0)
        tl.store(kept_mass_ptr + row * _SPLITS + split, kept)
        if split == 0:
            tl.store(threshold_ptr + row, threshold)


# ---- the last launch: combine, then draw inside one split ---------------------------------------


@triton.jit(do_not_specialize=["chunk", "num_splits"])
def _draw_kernel(
    logits_ptr,
    bitmask_ptr,
    temperatures_ptr,
    seeds_ptr,  # [batch] int64 (SAMPLE)
    steps_ptr,  # [batch] int64 (SAMPLE)
    part_max_ptr,
    part_arg_ptr,
    part_mass_ptr,  # (SAMPLE and not FILTERED)
    kept_mass_ptr,  # (FILTERED)
    threshold_ptr,  # (FILTERED)
    out_ptr,  # out [batch] int64
    vocab_size,
    num_words,
    chunk,
    num_splits,
    stride_logits_row,
    stride_bitmask_row,
    HAS_MASK: tl.constexpr,
    SAMPLE: tl.constexpr,
    FILTERED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Grid (batch,). The greedy id is the first split's argmax among the splits holding the
    max. A sampled row draws `u * kept total`, finds the split whose running kept mass passes
    it, and scans only from that split's start (float64 running sums, vocabulary order)."""
    row = tl.program_id(0).to(tl.int64)
    splits = tl.arange(0, _SPLITS)
    valid = splits < num_splits
    maxima = tl.load(part_max_ptr + row * _SPLITS + splits, mask=valid, other=float("-inf"))
    max_x = tl.max(maxima, axis=0)
    first = tl.min(tl.where(valid & (maxima == max_x), splits, _SPLITS), axis=0)
    argmax_x = tl.load(part_arg_ptr + row * _SPLITS + first)
    token = argmax_x.to(tl.int64)
    if SAMPLE:
        temperature = tl.load(temperatures_ptr + row)
        if (temperature > 0.0) & (max_x > float("-inf")):
            max_y = max_x / temperature
            if FILTERED:
                masses = tl.load(kept_mass_ptr + row * _SPLITS + splits, mask=valid, other=0.0)
                threshold = tl.load(threshold_ptr + row)
            else:
                # Each split's mass was taken against its own max (= its max logit / T).
                masses = tl.load(part_mass_ptr + row * _SPLITS + splits, mask=valid, other=0.0)
                rescale = tl.exp((maxima / temperature - max_y).to(tl.float64))
                masses = tl.where(masses > 0.0, masses * rescale, 0.0)
                threshold = tl.full([], 1, tl.int32)
            uniform = _counter_uniform(tl.load(seeds_ptr + row), tl.load(steps_ptr + row))
            target = uniform * tl.sum(masses, axis=0)
            cumulative = tl.cumsum(masses, axis=0)  # [_SPLITS]
            split = tl.min(tl.where(valid & (cumulative > target), splits, _SPLITS), axis=0)
            # Rounding put the target at the very top: scan the last split that keeps a token.
            last = tl.max(tl.where(valid & (masses > 0.0), splits, 0), axis=0)
            split = tl.minimum(split, last)
            running = tl.sum(tl.where(splits < split, masses, 0.0), axis=0)
            logits_row = logits_ptr + row * stride_logits_row
            bitmask_row = bitmask_ptr + row * stride_bitmask_row
            offs = tl.arange(0, BLOCK)
            picked = tl.full([], -1, tl.int32)
            start = split * chunk
            # Past the split only if its own sum fell short of its recorded mass (rounding).
            while (picked < 0) & (start < vocab_size):
                e, keys = _probs(logits_row, bitmask_row, start + offs, vocab_size, num_words,
                                 temperature, max_y, HAS_MASK)  # fmt: skip
                weights = tl.where(keys >= threshold, e, 0.0).to(tl.float64)
                block_mass = tl.sum(weights, axis=0)
                # The prefix scan only in the block that crosses the target.
                if running + block_mass > target:
                    cdf = running + tl.cumsum(weights, axis=0)  # [BLOCK]
                    first_hit = tl.min(tl.where(cdf > target, offs, BLOCK), axis=0)
                    picked = tl.where(first_hit < BLOCK, start + first_hit, -1)
                running += block_mass
                start += BLOCK
            # Not found only if rounding put the target at the very top: the argmax, as torch.
            token = tl.where(picked >= 0, picked, argmax_x).to(tl.int64)
    tl.store(out_ptr + row, token)
