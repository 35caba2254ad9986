"""Rotary position embedding (rotate-half layout) of q and k in one kernel.

`out = x * cos[pos] + rotate_half(x) * sin[pos]` with `rotate_half(x) = cat(-x2, x1)` over the
two halves of head_dim, from precomputed fp32 `cos_cache`/`sin_cache` `[max_positions,
head_dim]` tables (the HF Llama layout).

Algorithm: one program per token rotates all its query heads and all its key heads: the token's
cos/sin rows are read once, each head is read as its two halves `[heads, head_dim / 2]` and
written rotated. Rounding follows the torch module (cos/sin rounded to the input dtype; each
product and the sum rounded); on the GPU the compiler may still fuse a multiply-add, so bf16
results can differ from torch by one ulp (1.8% of elements, measured on the H200). Unfused
this is about 14 launches.

`rotary_embedding_and_store_kv` also writes each token's rotated key and its value into the
layer's paged KV cache at the token's slot (`k_cache[slot] = k_rot`, `v_cache[slot] = v`), the
store the attention backend would otherwise do with two more launches per layer. Into an FP8
cache (e4m3 / e5m2) it stores as the pool's own quantizing store does: the value rounded to the
model dtype, divided by the layer's `k_scale` / `v_scale` (IEEE division, as torch's), clamped
to the format's range and cast (round to nearest even), in place of that store's ~8 launches
per layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixgen.kernels.extend_attention_inputs import FP8_KV_DTYPES
from radixgen.kernels.pdl import pdl_launch_options, wait_for_prior_grids


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """Rounds fp32 values to the storage dtype and back, as each torch op would."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def cache_value(x, dtype: tl.constexpr, cache_dtype: tl.constexpr, scale, FP8_MAX: tl.constexpr):
    """fp32 `x` as the cache stores it: in `cache_dtype`; into an FP8 cache (FP8_MAX > 0, the
    format's largest value) first rounded to the model dtype, divided by the scale and
    clamped (`radix_cache.memory_pool.TokenToKVPool`'s quantizing store)."""
    if FP8_MAX > 0:
        scaled = tl.math.div_rn(round_to(x, dtype), scale)
        return tl.clamp(scaled, -FP8_MAX, FP8_MAX).to(cache_dtype)
    return x.to(cache_dtype)


@triton.jit
def rotate_halves(x1, x2, cos1, cos2, sin1, sin2, dtype: tl.constexpr):
    """`(x1 cos1 - x2 sin1, x2 cos2 + x1 sin2)`: rotate-half of a head's two halves (fp32, with
    cos / sin already rounded to dtype), each product and the sum rounded as torch's module
    rounds them (the sums' last rounding is the caller's store)."""
    out1 = round_to(x1 * cos1, dtype) + round_to(-x2 * sin1, dtype)
    out2 = round_to(x2 * cos2, dtype) + round_to(x1 * sin2, dtype)
    return out1, out2


@triton.jit
def _load_heads(
    src_ptr, delta_ptr, stride_src_head, num_heads,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr, HAS_DELTA: tl.constexpr,
):  # fmt: skip
    """One token's heads as their two halves, fp32 `[BLOCK_H, BLOCK_HALF]` each (with
    HAS_DELTA plus the fp32 delta, `[num_heads, 2 * HALF]` contiguous, rounded to the input
    dtype as adding it into the input first would be), and their mask."""
    dtype = src_ptr.dtype.element_ty
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < HALF)
    src = src_ptr + offs_h[:, None] * stride_src_head + offs_d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        delta = delta_ptr + offs_h[:, None] * (2 * HALF) + offs_d[None, :]
        x1 = round_to(x1 + tl.load(delta, mask=mask, other=0.0), dtype)
        x2 = round_to(x2 + tl.load(delta + HALF, mask=mask, other=0.0), dtype)
    return x1, x2, mask


@triton.jit
def _rotate_heads(
    src_ptr, dst_ptr, stride_src_head, stride_dst_head, num_heads, cos1, cos2, sin1, sin2,
    delta_ptr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr,
    HAS_DELTA: tl.constexpr, scale=1.0, FP8_MAX: tl.constexpr = 0.0,
):  # fmt: skip
    """Rotates `[num_heads, 2 * HALF]` (one token's heads) into `dst` (an FP8 cache with
    FP8_MAX > 0: quantized by `scale`, `cache_value`)."""
    dtype = src_ptr.dtype.element_ty
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    x1, x2, mask = _load_heads(  # [BLOCK_H, BLOCK_HALF] each
        src_ptr, delta_ptr, stride_src_head, num_heads, HALF, BLOCK_HALF, BLOCK_H, HAS_DELTA
    )
    out1, out2 = rotate_halves(
        x1, x2, cos1[None, :], cos2[None, :], sin1[None, :], sin2[None, :], dtype
    )
    dst = dst_ptr + offs_h[:, None] * stride_dst_head + offs_d[None, :]
    if FP8_MAX > 0:
        cache_dtype = dst_ptr.dtype.element_ty
        tl.store(dst, cache_value(out1, dtype, cache_dtype, scale, FP8_MAX), mask=mask)
        tl.store(dst + HALF, cache_value(out2, dtype, cache_dtype, scale, FP8_MAX), mask=mask)
    else:
        tl.store(dst, out1.to(dtype), mask=mask)
        tl.store(dst + HALF, out2.to(dtype), mask=mask)


@triton.jit
def _copy_heads(
    src_ptr, dst_ptr, stride_src_head, stride_dst_head, num_heads, delta_ptr,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr, HAS_DELTA: tl.constexpr,
    scale, FP8_MAX: tl.constexpr,
):  # fmt: skip
    """Copies `[num_heads, 2 * HALF]` (one token's values, plus the delta) into the cache's
    dtype (`cache_value`)."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    x1, x2, mask = _load_heads(
        src_ptr, delta_ptr, stride_src_head, num_heads, HALF, BLOCK_HALF, BLOCK_H, HAS_DELTA
    )
    dst = dst_ptr + offs_h[:, None] * stride_dst_head + offs_d[None, :]
    dtype = src_ptr.dtype.element_ty
    cache_dtype = dst_ptr.dtype.element_ty
    tl.store(dst, cache_value(x1, dtype, cache_dtype, scale, FP8_MAX), mask=mask)
    tl.store(dst + HALF, cache_value(x2, dtype, cache_dtype, scale, FP8_MAX), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr,  # [num_tokens] int
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_ptr,  # [num_tokens, num_kv_heads, head_dim]
    q_out_ptr,
    k_out_ptr,
    cos_ptr,  # [max_positions, head_dim] fp32
    sin_ptr,
    v_ptr,  # [num_tokens, num_kv_heads, head_dim]           (STORE_KV only)
    k_cache_ptr,  # [num_slots, num_kv_heads, head_dim]       (STORE_KV only)
    v_cache_ptr,  # [num_slots, num_kv_heads, head_dim]       (STORE_KV only)
    slots_ptr,  # [num_tokens] int, each token's cache slot   (STORE_KV only)
    delta_ptr,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim] fp32 (HAS_DELTA only)
    stride_delta_token,
    stride_q_token, stride_q_head, stride_k_token, stride_k_head,
    stride_qo_token, stride_qo_head, stride_ko_token, stride_ko_head,
    stride_cos_row,
    stride_v_token, stride_v_head, stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head,
    num_heads,
    num_kv_heads,
    k_scale,  # an FP8 cache's dequantization scales (STORE_KV with FP8_MAX > 0)
    v_scale,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    STORE_KV: tl.constexpr,
    HAS_DELTA: tl.constexpr,  # q, k and v get a delta (laid out as q | k | v) added first
    FP8_MAX: tl.constexpr,  # > 0: the caches are FP8 with this largest value
    USE_PDL: tl.constexpr = False,  # pdl.py
    HEADS_PER_PROGRAM: tl.constexpr = 0,  # > 0: grid axis 1 splits the token's heads
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    # Before the PDL wait: the position, the slot and the cos / sin rows (written before the
    # forward, or static); q, k, v and the delta are the previous kernel's (read after it).
    dtype = q_ptr.dtype.element_ty
    position = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask_d = offs_d < HALF
    cos_row = cos_ptr + position * stride_cos_row + offs_d
    sin_row = sin_ptr + position * stride_cos_row + offs_d
    cos1 = round_to(tl.load(cos_row, mask=mask_d, other=0.0), dtype)
    cos2 = round_to(tl.load(cos_row + HALF, mask=mask_d, other=0.0), dtype)
    sin1 = round_to(tl.load(sin_row, mask=mask_d, other=0.0), dtype)
    sin2 = round_to(tl.load(sin_row + HALF, mask=mask_d, other=0.0), dtype)
    if STORE_KV:
        slot = tl.load(slots_ptr + token).to(tl.int64)
    wait_for_prior_grids(USE_PDL)
    delta_q = delta_ptr + token * stride_delta_token
    delta_k = delta_q + num_heads * (2 * HALF)
    delta_v = delta_k + num_kv_heads * (2 * HALF)
    # A few tokens leave most SMs idle with one program a token, which then runs its heads'
    # loads and stores one after another: there each program takes HEADS_PER_PROGRAM query
    # heads, or as many key (and value) heads, of its token (q blocks first, then k blocks).
    q_head0 = 0
    k_head0 = 0
    do_q = True
    do_k = True
    if HEADS_PER_PROGRAM > 0:
        block = tl.program_id(1)
        q_blocks = tl.cdiv(num_heads, HEADS_PER_PROGRAM)
        do_q = block < q_blocks
        do_k = block >= q_blocks
        q_head0 = tl.minimum(block, q_blocks - 1) * HEADS_PER_PROGRAM
        k_head0 = tl.maximum(block - q_blocks, 0) * HEADS_PER_PROGRAM
        num_heads = tl.minimum(num_heads - q_head0, HEADS_PER_PROGRAM)
        num_kv_heads = tl.minimum(num_kv_heads - k_head0, HEADS_PER_PROGRAM)
    q_ptr += q_head0 * stride_q_head
    q_out_ptr += q_head0 * stride_qo_head
    delta_q += q_head0 * (2 * HALF)
    k_ptr += k_head0 * stride_k_head
    k_out_ptr += k_head0 * stride_ko_head
    v_ptr += k_head0 * stride_v_head
    k_cache_ptr += k_head0 * stride_kc_head
    v_cache_ptr += k_head0 * stride_vc_head
    delta_k += k_head0 * (2 * HALF)
    delta_v += k_head0 * (2 * HALF)
    if do_q:
        _rotate_heads(
            q_ptr + token * stride_q_token, q_out_ptr + token * stride_qo_token, stride_q_head,
            stride_qo_head, num_heads, cos1, cos2, sin1, sin2, delta_q, HALF, BLOCK_HALF,
            BLOCK_HQ, HAS_DELTA,
        )  # fmt: skip
    if do_k:
        _rotate_heads(
            k_ptr + token * stride_k_token, k_out_ptr + token * stride_ko_token, stride_k_head,
            stride_ko_head, num_kv_heads, cos1, cos2, sin1, sin2, delta_k, HALF, BLOCK_HALF,
            BLOCK_HK, HAS_DELTA,
        )  # fmt: skip
    if STORE_KV and do_k:
        # The key is rotated again rather than re-read from k_out: a few FLOPs against a
        # global-memory round trip (and no barrier between the two stores).
        _rotate_heads(
            k_ptr + token * stride_k_token, k_cache_ptr + slot * stride_kc_slot, stride_k_head,
            stride_kc_head, num_kv_heads, cos1, cos2, sin1, sin2, delta_k, HALF, BLOCK_HALF,
            BLOCK_HK, HAS_DELTA, k_scale, FP8_MAX,
        )  # fmt: skip
        _copy_heads(
            v_ptr + token * stride_v_token, v_cache_ptr + slot * stride_vc_slot, stride_v_head,
            stride_vc_head, num_kv_heads, delta_v, HALF, BLOCK_HALF, BLOCK_HK, HAS_DELTA,
            v_scale, FP8_MAX,
        )  # fmt: skip


# Batches of at most this many tokens (decode at small batch) split each token's heads over
# programs, HEADS_PER_PROGRAM query heads (or key and value heads) each: one program a token
# rotates and stores 48 heads of Llama-3.1-8B one after another (~3.3 us a layer at batch 1
# on the H200, the fifteenth session's profile).
HEAD_SPLIT_MAX_TOKENS = 8
HEADS_PER_PROGRAM = 2


def _check_rotary_inputs(positions, q, k, cos_cache, sin_cache) -> None:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim] "
            f"must agree, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    head_dim = q.shape[2]
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    if q.dtype != k.dtype or q.stride(2) != 1 or k.stride(2) != 1:
        raise TypeError("q and k must share a dtype and be contiguous in head_dim")
    if positions.shape != (q.shape[0],) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"positions must be an int32/int64 [num_tokens={q.shape[0]}] tensor")
    for name, table in (("cos_cache", cos_cache), ("sin_cache", sin_cache)):
        if table.dim() != 2 or table.shape[1] != head_dim or table.stride(1) != 1:
            raise ValueError(f"{name} must be [max_positions, head_dim={head_dim}] contiguous")
    if cos_cache.stride(0) != sin_cache.stride(0):
        raise ValueError("cos_cache and sin_cache must share a layout")


def _launch(
    positions, q, k, cos_cache, sin_cache, store, delta=None, kv_scales=(1.0, 1.0)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs the kernel; `store`: None or (v, k_cache, v_cache, slots), and `delta`: None or
    the fp32 q | k | v delta, already checked; `kv_scales`: an FP8 cache's (k_scale, v_scale)."""
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if q.shape[0] == 0:
        return q_out, k_out
    # Without a store the cache arguments are never read: q stands in for each pointer.
    v, k_cache, v_cache, slots = store if store is not None else (q, q, q, positions)
    fp8_max = torch.finfo(k_cache.dtype).max if k_cache.dtype in FP8_KV_DTYPES else 0.0
    half = q.shape[2] // 2
    # Up to HEAD_SPLIT_MAX_TOKENS tokens: HEADS_PER_PROGRAM heads a program (`_rotary_kernel`).
    per_program = HEADS_PER_PROGRAM if q.shape[0] <= HEAD_SPLIT_MAX_TOKENS else 0
    blocks = (
        triton.cdiv(q.shape[1], per_program) + triton.cdiv(k.shape[1], per_program)
        if per_program
        else 1
    )
    heads_q = min(q.shape[1], per_program) if per_program else q.shape[1]
    heads_k = min(k.shape[1], per_program) if per_program else k.shape[1]
    _rotary_kernel[(q.shape[0], blocks)](
        positions, q, k, q_out, k_out, cos_cache, sin_cache, v, k_cache, v_cache, slots,
        cos_cache if delta is None else delta, 0 if delta is None else delta.stride(0),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        cos_cache.stride(0),
        v.stride(0), v.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        q.shape[1], k.shape[1], float(kv_scales[0]), float(kv_scales[1]),
        HALF=half,
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(heads_q),
        BLOCK_HK=triton.next_power_of_2(heads_k),
        STORE_KV=store is not None,
        HAS_DELTA=delta is not None,
        FP8_MAX=fp8_max,
        HEADS_PER_PROGRAM=per_program,
        num_warps=4,
        **pdl_launch_options(q.device),
    )  # fmt: skip
    return q_out, k_out


def rotary_embedding(
    positions: torch.Tensor,  # [num_tokens] int
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos_cache: torch.Tensor,  # [max_positions, head_dim] float32
    sin_cache: torch.Tensor,  # [max_positions, head_dim] float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns rotated copies of q and k (contiguous), positions read on the device.

    Raises:
        ValueError/TypeError naming the argument on bad shapes, dtypes or strides.
    """
    _check_rotary_inputs(positions, q, k, cos_cache, sin_cache)
    return _launch(positions, q, k, cos_cache, sin_cache, None)


def rotary_embedding_and_store_kv(
    positions: torch.Tensor,  # [num_tokens] int
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos_cache: torch.Tensor,  # [max_positions, head_dim] float32
    sin_cache: torch.Tensor,  # [max_positions, head_dim] float32
    k_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim], written at `slots`
    v_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim], written at `slots`
    slots: torch.Tensor,  # [num_tokens] int, distinct
    delta: torch.Tensor | None = None,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rotary_embedding`, and each token's rotated key and value written to its cache slot
    (cast to the cache's dtype), in the same launch.

    Into FP8 caches (both e4m3 or both e5m2) the key and value are stored quantized with
    `kv_scales` = (k_scale, v_scale) (stored = value / scale, clamped to the format's range),
    as `TokenToKVPool.set_kv` stores them; other caches ignore the scales.

    `delta` (float32, laid out as q | k | v, a LoRA delta computed beside the qkv GEMM) is
    added to q, k and v first, rounded to their dtype as adding it into them would be; `v`
    itself is left as given (the cache gets v + delta).

    Returns:
        Rotated copies of q and k, as `rotary_embedding`.

    Raises:
        ValueError/TypeError naming the argument on bad shapes, dtypes or strides.
    """
    _check_rotary_inputs(positions, q, k, cos_cache, sin_cache)
    if v.shape != k.shape or v.stride(2) != 1:
        raise ValueError(f"v must be like k {tuple(k.shape)}, contiguous in head_dim")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.dim() != 3 or cache.shape[1:] != k.shape[1:] or cache.stride(2) != 1:
            raise ValueError(
                f"{name} must be [num_slots, {k.shape[1]}, {k.shape[2]}] contiguous in "
                f"head_dim, got {tuple(cache.shape)}"
            )
    if slots.shape != (q.shape[0],) or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slots must be an int32/int64 [num_tokens={q.shape[0]}] tensor")
    if (k_cache.dtype in FP8_KV_DTYPES or v_cache.dtype in FP8_KV_DTYPES) and (
        k_cache.dtype != v_cache.dtype
    ):
        raise TypeError(f"k_cache and v_cache must share an FP8 dtype, got {k_cache.dtype} and "
                        f"{v_cache.dtype}")  # fmt: skip
    if len(kv_scales) != 2 or not all(scale > 0 for scale in kv_scales):
        raise ValueError(f"kv_scales must be two positive floats, got {kv_scales!r}")
    width = (q.shape[1] + 2 * k.shape[1]) * q.shape[2]
    if delta is not None and (
        delta.shape != (q.shape[0], width) or delta.dtype != torch.float32 or delta.stride(1) != 1
    ):
        raise ValueError(
            f"delta must be float32 [num_tokens={q.shape[0]}, {width}] (q | k | v), contiguous "
            f"in its last dimension, got {delta.dtype} {tuple(delta.shape)}"
        )
    store = (v, k_cache, v_cache, slots)
    return _launch(positions, q, k, cos_cache, sin_cache, store, delta, kv_scales)


def rotary_embedding_ref(positions, q, k, cos_cache, sin_cache):
    """Plain-torch reference of `rotary_embedding` (the HF rotate-half formulation)."""
    cos = cos_cache[positions].unsqueeze(1).to(q.dtype)  # [num_tokens, 1, head_dim]
    sin = sin_cache[positions].unsqueeze(1).to(q.dtype)

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def store_in_cache(
    cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    slots: torch.Tensor,  # [num_tokens]
    x: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    scale: float = 1.0,
) -> None:
    """`cache[slots] = x` in torch, cast to the cache's dtype; an FP8 cache stores
    `x / scale` clamped to its format's range (as the Triton kernel and the pool do)."""
    if cache.dtype not in FP8_KV_DTYPES:
        cache[slots] = x.to(cache.dtype)
        return
    limit = torch.finfo(cache.dtype).max
    quantized = (x.float() / scale).clamp(-limit, limit).to(cache.dtype)
    cache.view(torch.uint8)[slots] = quantized.view(torch.uint8)  # no fp8 index_put on the CPU


def rotary_embedding_and_store_kv_ref(
    positions, q, k, v, cos_cache, sin_cache, k_cache, v_cache, slots, kv_scales=(1.0, 1.0)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch reference of `rotary_embedding_and_store_kv`."""
    q_out, k_out = rotary_embedding_ref(positions, q, k, cos_cache, sin_cache)
    store_in_cache(k_cache, slots, k_out, kv_scales[0])
    store_in_cache(v_cache, slots, v, kv_scales[1])
    return q_out, k_out
