"""Extend attention: new tokens attend to their cached prefix and, causally, to themselves.

Algorithm (flash-attention 2, one program per block of BLOCK_M query tokens of one request and
one query head):

1. Load the query block `[BLOCK_M, head_dim]` of the request's new tokens.
2. Prefix stage: walk the request's cached prefix in BLOCK_N chunks. The slots of positions
   `[n, n + BLOCK_N)` come from `req_to_token[row, n:n + BLOCK_N]`; K and V rows are gathered from
   the paged pool `k_buffer[slot, kv_head, :]`. Every prefix token is visible to every new token,
   so only the last, partial chunk needs a score mask.
3. Extend stage: walk the new tokens' own K/V (contiguous in `k_new`/`v_new`). Chunks that lie
   wholly before the query block need no mask (and may be loaded through TMA tensor descriptors,
   `use_tma`); only the chunks on the diagonal apply the causal mask `key_pos <= query_pos`.
4. Online softmax in base 2: `log2(e) * scaling` is applied in one FMA with the running max
   (`qk * scale - max`), fp32 accumulators that `tl.dot` updates in place; the output is divided
   by the running row sum once at the end.

Grid `(num_heads, batch, m_blocks)`, heads fastest and the heaviest (last, diagonal-longest) query
blocks of every request and head first: the hardware starts blocks in that order, so the long
blocks start in the first wave and the short ones fill the tail (longest-processing-time-first),
and the query heads sharing a KV head run side by side and read its K/V tiles from L2.
Requests of any lengths share one launch: blocks past a request's end exit at once.

Tile sizes, warps, pipelining depth and TMA come from a per-(head_dim, max_extend_len) table
(`extend_attention_configs.json`, filled by `scripts/tune_extend_attention.py`).

FP8 KV pools (e4m3/e5m2): the cached prefix's K/V are converted to q's dtype as they are loaded,
`k_scale` folded into the prefix stage's softmax scale and `v_scale` applied to V; the new tokens'
K/V come unquantized from the projections.

head_dim that is not a power of two (96) is padded to the next power of two with masked loads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixgen.kernels.extend_attention_configs import select_extend_config
from radixgen.kernels.extend_attention_hopper import MIN_EXTEND_LEN as HOPPER_MIN_EXTEND_LEN
from radixgen.kernels.extend_attention_hopper import (
    hopper_extend_attention,
    hopper_extend_supported,
)
from radixgen.kernels.extend_attention_inputs import (
    FP8_KV_DTYPES,
    check_extend_inputs,
    new_token_tma_descriptors,
)

LOG2_E = 1.4426950408889634


@triton.jit
def _softmax_step(
    acc, m_i, l_i, q, k, v, qk_scale, valid, USE_MASK: tl.constexpr
):  # acc: [BLOCK_M, BLOCK_D] fp32; k: [BLOCK_D, BLOCK_N]; v: [BLOCK_N, BLOCK_D]
    """Folds one K/V chunk into the running (acc, max, sum) of the online softmax (log2 units)."""
    qk = tl.dot(q, k)  # [BLOCK_M, BLOCK_N], unscaled
    if USE_MASK:
        qk = tl.where(valid, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
    else:  # scale and max subtraction in one FMA per score
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _load_prefix_kv(
    k_buffer_ptr,
    v_buffer_ptr,
    token_row_ptr,  # req_to_token's row of this request
    pos,  # [BLOCK_N] prefix positions
    mask_n,  # [BLOCK_N] pos < prefix_len
    mask_d,  # [BLOCK_D]
    offs_d,
    kv_head,
    stride_kb_slot,
    stride_kb_head,
    stride_vb_slot,
    stride_vb_head,
    v_scale,
    dtype: tl.constexpr,
    IS_FP8_POOL: tl.constexpr,
):
    """Gathers one prefix chunk from the paged pool: K as [BLOCK_D, BLOCK_N], V as
    [BLOCK_N, BLOCK_D]."""
    slots = tl.load(token_row_ptr + pos, mask=mask_n, other=0).to(tl.int64)
    k = tl.load(
        k_buffer_ptr + slots[None, :] * stride_kb_slot + kv_head * stride_kb_head + offs_d[:, None],
        mask=mask_n[None, :] & mask_d[:, None],
        other=0.0,
    ).to(dtype)  # FP8 pools: converted exactly, k_scale is in the softmax scale
    v = tl.load(
        v_buffer_ptr + slots[:, None] * stride_vb_slot + kv_head * stride_vb_head + offs_d[None, :],
        mask=mask_n[:, None] & mask_d[None, :],
        other=0.0,
    )
    if IS_FP8_POOL:
        v = (v.to(tl.float32) * v_scale).to(dtype)
    return k, v


@triton.jit(do_not_specialize=["NUM_M_BLOCKS"])  # one compile for every prompt length
def _extend_attention_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_new_ptr,  # [num_tokens, num_kv_heads, head_dim]
    v_new_ptr,
    k_new_desc,  # TMA descriptor of k_new as [num_tokens, num_kv_heads * head_dim] (USE_TMA)
    v_new_desc,
    o_ptr,  # [num_tokens, num_heads, head_dim]
    k_buffer_ptr,  # [num_slots, num_kv_heads, head_dim]
    v_buffer_ptr,
    req_to_token_ptr,  # [rows, max_context_len] int32
    req_pool_indices_ptr,  # [batch]
    prefix_lens_ptr,  # [batch]
    extend_lens_ptr,  # [batch]
    extend_start_loc_ptr,  # [batch]
    qk_scale,
    k_scale,
    v_scale,
    stride_q_token,
    stride_q_head,
    stride_kn_token,
    stride_kn_head,
    stride_vn_token,
    stride_vn_head,
    stride_o_token,
    stride_o_head,
    stride_kb_slot,
    stride_kb_head,
    stride_vb_slot,
    stride_vb_head,
    stride_req_row,
    NUM_M_BLOCKS,
    IS_FP8_POOL: tl.constexpr,
    USE_TMA: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    head = tl.program_id(0)
    req = tl.program_id(1)
    m_block = NUM_M_BLOCKS - 1 - tl.program_id(2)  # heaviest blocks first
    kv_head = head // GROUP_SIZE

    extend_len = tl.load(extend_lens_ptr + req).to(tl.int32)
    m_start = m_block * BLOCK_M
    if m_start >= extend_len:
        return
    prefix_len = tl.load(prefix_lens_ptr + req).to(tl.int32)
    token_start = tl.load(extend_start_loc_ptr + req).to(tl.int64)
    row = tl.load(req_pool_indices_ptr + req).to(tl.int64)

    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < extend_len
    mask_d = offs_d < HEAD_DIM

    q_ptrs = (
        q_ptr
        + (token_start + offs_m)[:, None] * stride_q_token
        + head * stride_q_head
        + offs_d[None, :]
    )
    q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # Stage 1: the cached prefix, gathered from the paged pool; full chunks need no score mask.
    token_row_ptr = req_to_token_ptr + row * stride_req_row
    prefix_scale = qk_scale * k_scale
    prefix_full_end = (prefix_len // BLOCK_N) * BLOCK_N
    for n in range(0, prefix_full_end, BLOCK_N):
        pos = n + offs_n
        k, v = _load_prefix_kv(
            k_buffer_ptr, v_buffer_ptr, token_row_ptr, pos, pos < prefix_len, mask_d, offs_d,
            kv_head, stride_kb_slot, stride_kb_head, stride_vb_slot, stride_vb_head, v_scale,
            q.dtype, IS_FP8_POOL,
        )  # fmt: skip
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, q, k, v, prefix_scale, None, USE_MASK=False)
    if prefix_full_end < prefix_len:
        pos = prefix_full_end + offs_n
        mask_n = pos < prefix_len
        k, v = _load_prefix_kv(
            k_buffer_ptr, v_buffer_ptr, token_row_ptr, pos, mask_n, mask_d, offs_d,
            kv_head, stride_kb_slot, stride_kb_head, stride_vb_slot, stride_vb_head, v_scale,
            q.dtype, IS_FP8_POOL,
        )  # fmt: skip
        acc, m_i, l_i = _softmax_step(
            acc, m_i, l_i, q, k, v, prefix_scale, mask_n[None, :], USE_MASK=True
        )

    # Stage 2a: chunks of new tokens wholly before this query block: all visible, no mask
    # (they end at or before m_start < extend_len).
    k_new_base = k_new_ptr + token_start * stride_kn_token + kv_head * stride_kn_head
    v_new_base = v_new_ptr + token_start * stride_vn_token + kv_head * stride_vn_head
    unmasked_end = (m_start // BLOCK_N) * BLOCK_N
    for n in range(0, unmasked_end, BLOCK_N):
        pos = n + offs_n
        if USE_TMA:  # HEAD_DIM == BLOCK_D (checked by the launcher)
            tma_row = (token_start + n).to(tl.int32)
            k = tl.trans(k_new_desc.load([tma_row, kv_head * HEAD_DIM]))
            v = v_new_desc.load([tma_row, kv_head * HEAD_DIM])
        else:
            k_ptrs = k_new_base + pos[None, :] * stride_kn_token + offs_d[:, None]
            v_ptrs = v_new_base + pos[:, None] * stride_vn_token + offs_d[None, :]
            if HEAD_DIM == BLOCK_D:  # the hot loop of long prefills: unmasked loads
                k = tl.load(k_ptrs)
                v = tl.load(v_ptrs)
            else:
                k = tl.load(k_ptrs, mask=mask_d[:, None], other=0.0)
                v = tl.load(v_ptrs, mask=mask_d[None, :], other=0.0)
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, q, k, v, qk_scale, None, USE_MASK=False)

    # Stage 2b: the diagonal chunks, causal masked. The first one holds key unmasked_end <=
    # m_start, visible to every row, so no row's running max stays -inf. Padding rows past
    # extend_len see zero K/V past it (masked loads) and are not stored.
    diag_end = tl.minimum(m_start + BLOCK_M, extend_len)
    for n in range(unmasked_end, diag_end, BLOCK_N):
        pos = n + offs_n
        mask_n = pos < extend_len
        k = tl.load(
            k_new_base + pos[None, :] * stride_kn_token + offs_d[:, None],
            mask=mask_n[None, :] & mask_d[:, None],
            other=0.0,
        )
        v = tl.load(
            v_new_base + pos[:, None] * stride_vn_token + offs_d[None, :],
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        )
        valid = offs_m[:, None] >= pos[None, :]
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, q, k, v, qk_scale, valid, USE_MASK=True)

    out = acc / l_i[:, None]
    o_ptrs = (
        o_ptr
        + (token_start + offs_m)[:, None] * stride_o_token
        + head * stride_o_head
        + offs_d[None, :]
    )
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def extend_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_new: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v_new: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    req_to_token: torch.Tensor,  # [rows, max_context_len] int32
    req_pool_indices: torch.Tensor,  # [batch]
    prefix_lens: torch.Tensor,  # [batch]
    extend_lens: torch.Tensor,  # [batch]
    extend_start_loc: torch.Tensor,  # [batch], first token of each request in q
    max_extend_len: int,
    scaling: float,
    *,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    use_tma: bool | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    max_prefix_len: int | None = None,
    kernel: str | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Attention of each request's new tokens over its cached prefix and (causally) itself.

    Args:
        q, k_new, v_new: the new tokens of all requests, packed; request i owns
            `extend_lens[i]` tokens from `extend_start_loc[i]`.
        k_buffer, v_buffer: the layer's KV pool; prefix position p of request i is in slot
            `req_to_token[req_pool_indices[i], p]` for p < prefix_lens[i].
        max_extend_len: an upper bound of extend_lens (host int, sizes the grid; no sync).
        scaling: softmax scale, usually head_dim ** -0.5.
        out: optional output tensor (may alias nothing read here).
        block_m, block_n, num_warps, num_stages, use_tma: overrides of the launch config
            that `select_extend_config` takes from the tuned table (benchmarks, sweeps).
            use_tma falls back to pointer loads where TMA cannot address k_new/v_new.
        k_scale, v_scale: per-tensor scales of an FP8 pool (K = stored K * k_scale); the
            new tokens' k_new/v_new are in q's dtype, unscaled.
        max_prefix_len: an upper bound of prefix_lens known on the host (no sync), or None.
            0 lets a prefix-free batch of at least `MIN_EXTEND_LEN` (1024) tokens take the
            warp-specialized Hopper kernel (`extend_attention_hopper.py`) on sm_90 at
            head_dim 128.
        kernel: "triton" or "hopper" to force one (benchmarks, tests; "hopper" at any
            length); None picks the Hopper kernel where it applies and no launch override
            is given.

    Returns:
        The attention output, shaped and typed like q.

    Raises:
        ValueError/TypeError naming the argument on bad shapes, dtypes or strides.
    """
    per_request = {
        "req_pool_indices": req_pool_indices,
        "prefix_lens": prefix_lens,
        "extend_lens": extend_lens,
        "extend_start_loc": extend_start_loc,
    }
    check_extend_inputs(q, k_new, v_new, k_buffer, v_buffer, req_to_token, per_request)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_new.shape[1]
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(f"out must be like q {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)}")
    batch = req_pool_indices.shape[0]
    if batch == 0 or num_tokens == 0 or max_extend_len <= 0:
        return out

    overrides = (block_m, block_n, num_warps, num_stages, use_tma)
    if kernel not in (None, "triton", "hopper"):
        raise ValueError(f"kernel must be None, 'triton' or 'hopper', got {kernel!r}")
    hopper_fits = (
        max_prefix_len == 0
        and out.stride(1) == head_dim
        and hopper_extend_supported(q, k_new, v_new)
    )
    if kernel == "hopper" and not hopper_fits:
        raise ValueError(
            "kernel='hopper' needs max_prefix_len=0, an sm_90 GPU, bf16/fp16 and head_dim 128 "
            f"with TMA-addressable q/k_new/v_new; got max_prefix_len={max_prefix_len}, "
            f"{q.dtype}, head_dim {head_dim}, device {q.device}"
        )
    # The default leaves short batches to the Triton kernel (host-bound: HOPPER_MIN_EXTEND_LEN).
    by_default = hopper_fits and max_extend_len >= HOPPER_MIN_EXTEND_LEN
    if kernel == "hopper" or (kernel is None and by_default and all(v is None for v in overrides)):
        return hopper_extend_attention(
            q, k_new, v_new, extend_lens, extend_start_loc, max_extend_len, scaling, out
        )

    config = select_extend_config(head_dim, max_extend_len, on_cuda=q.is_cuda)
    if any(v is not None for v in overrides):
        config = config.with_overrides(
            block_m=block_m,
            block_n=block_n,
            num_warps=num_warps,
            num_stages=num_stages,
            use_tma=use_tma,
        )
    descriptors = (
        new_token_tma_descriptors(k_new, v_new, config.block_n) if config.use_tma else None
    )
    num_m_blocks = triton.cdiv(max_extend_len, config.block_m)
    grid = (num_heads, batch, num_m_blocks)  # heads fastest: see the module docstring
    _extend_attention_kernel[grid](
        q,
        k_new,
        v_new,
        *(descriptors or (k_new, v_new)),  # unused without TMA
        out,
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices,
        prefix_lens,
        extend_lens,
        extend_start_loc,
        scaling * LOG2_E,
        k_scale,
        v_scale,
        q.stride(0),
        q.stride(1),
        k_new.stride(0),
        k_new.stride(1),
        v_new.stride(0),
        v_new.stride(1),
        out.stride(0),
        out.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        req_to_token.stride(0),
        num_m_blocks,
        IS_FP8_POOL=k_buffer.dtype in FP8_KV_DTYPES,
        USE_TMA=descriptors is not None,
        GROUP_SIZE=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out


def extend_attention_ref(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_new: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v_new: torch.Tensor,
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,  # [rows, max_context_len] int32
    req_pool_indices: torch.Tensor,  # [batch]
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    scaling: float,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Plain-torch reference of `extend_attention` (fp32 math, one request at a time)."""
    del max_extend_len  # only sizes the Triton grid
    out = torch.empty_like(q)
    group = q.shape[1] // k_new.shape[1]
    for i in range(req_pool_indices.shape[0]):
        row, prefix_len = int(req_pool_indices[i]), int(prefix_lens[i])
        start, extend_len = int(extend_start_loc[i]), int(extend_lens[i])
        slots = req_to_token[row, :prefix_len].long()
        new = slice(start, start + extend_len)
        keys = torch.cat((k_buffer[slots].float() * k_scale, k_new[new].float()))
        values = torch.cat((v_buffer[slots].float() * v_scale, v_new[new].float()))
        keys = keys.repeat_interleave(group, dim=1)  # [prefix + extend, num_heads, head_dim]
        values = values.repeat_interleave(group, dim=1)
        queries = q[start : start + extend_len].float()
        scores = torch.einsum("qhd,khd->hqk", queries, keys) * scaling
        query_pos = prefix_len + torch.arange(extend_len, device=q.device)
        key_pos = torch.arange(prefix_len + extend_len, device=q.device)
        scores.masked_fill_(key_pos[None, None, :] > query_pos[None, :, None], float("-inf"))
        probs = scores.softmax(dim=-1)
        out[start : start + extend_len] = torch.einsum("hqk,khd->qhd", probs, values).to(q.dtype)
    return out
