"""Decode attention: one query token per request over its whole paged history (flash-decoding).

Algorithm, two launches (one with `merge_counters`):

1. Stage 1, grid `(batch, num_kv_heads, num_kv_splits)`. The request's history `[0, seq_len)` is
   cut into `num_kv_splits` contiguous ranges (each a multiple of BLOCK_N long). One program takes
   ALL query heads of one KV head's GQA group (padded to BLOCK_H >= 16 rows so `tl.dot` applies)
   and one range: it gathers the range's slots from `req_to_token[row]`, reads each K/V row of
   its KV head once, and runs an online softmax in base 2 with fp32 accumulators. It writes the
   normalised partial output `[head_dim]` and its log-sum-exp (base 2) per query head and split.
   Empty ranges (short requests) write lse = -inf.
2. Stage 2, grid `(batch, num_heads)`: merges the splits, weighting each partial output by
   `exp2(lse_s - max_s lse)`. With `merge_counters` (int32 zeros, one per request and KV head,
   kept by the attention backend's metadata) stage 1 merges instead: each program of a
   non-empty split counts itself on its (request, KV head)'s counter after storing its
   partials (acquire-release), and the one that completes the count (of the used splits)
   merges the group's heads over those splits, writes the output and resets the counter to 0
   for the next layer. At decode batch 1 that saves one launch per layer (32 a step of the 8B
   model, ~2 us each in a CUDA graph).

FP8 KV (e4m3/e5m2 buffers): K/V rows are converted to q's dtype as they are loaded (on CUDA
with a bf16 q, q and the tiles go to fp16 instead: `default_fp8_dot_fp16`; V is then read as
32-bit words and converted before the dot, `load_fp8_rows_as_fp16`; `fp8_pool_paths` picks
both); the per-tensor `k_scale` is folded into the softmax scale and `v_scale` into each
split's normalised output, so the math stays fp32-accumulated exactly as for a bf16 pool.

The stage-1 kernel (`decode_split_kernel`, with `HAS_KV_STARTS`: positions `[kv_start, seq_len)`)
and its inner loop (`attend_paged_range`) also serve tree decode attention
(`tree_decode_attention.py`), for each request's own suffix and for shared segments.

`num_kv_splits` depends only on the batch size and the device, never on the lengths, so the
grid is fixed for a batch size and the launch can be captured in a CUDA graph; lengths are read
on the device. Splitting fills the GPU when batch * num_kv_heads is small and contexts are long.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from radixgen.kernels.extend_attention_inputs import FP8_KV_DTYPES
from radixgen.kernels.pdl import pdl_launch_options, prefetch_to_l2, wait_for_prior_grids

LOG2_E = 1.4426950408889634
MAX_KV_SPLITS = 32


@triton.jit
def attend_paged_range_kv_lhs(
    q,  # [BLOCK_M, BLOCK_D] in the compute dtype
    k_base,
    v_base,
    slot_row_ptr,
    start,
    end,
    qk_scale,
    stride_k_slot,
    stride_v_slot,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """`attend_paged_range` with K and V as the dots' left operands (transposed scores
    `K q^T` and output `V^T P^T`). Same arguments and results. Why: an operand converted after
    its load (an FP8 pool's tiles) can feed Hopper's tensor cores from registers only on the
    left; on the right it goes back through shared memory first. A tuning variant (`kv_lhs`)
    until the H200 sweep decides."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_d = offs_d < HEAD_DIM
    q_t = tl.trans(q)  # [BLOCK_D, BLOCK_M]
    acc_t = tl.zeros([BLOCK_D, BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for n in range(start, end, BLOCK_N):
        pos = n + offs_n
        mask_n = pos < end
        slots = tl.load(slot_row_ptr + pos, mask=mask_n, other=0).to(tl.int64)
        k = tl.load(
            k_base + slots[:, None] * stride_k_slot + offs_d[None, :],
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        ).to(q.dtype)  # [BLOCK_N, BLOCK_D]
        v_t = tl.load(
            v_base + slots[None, :] * stride_v_slot + offs_d[:, None],
            mask=mask_n[None, :] & mask_d[:, None],
            other=0.0,
        ).to(q.dtype)  # [BLOCK_D, BLOCK_N]
        qk_t = tl.dot(k, q_t) * qk_scale  # [BLOCK_N, BLOCK_M], log2 units
        qk_t = tl.where(mask_n[:, None], qk_t, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk_t, 0))
        p_t = tl.math.exp2(qk_t - m_new[None, :])  # [BLOCK_N, BLOCK_M]
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p_t, 0)
        acc_t = acc_t * alpha[None, :] + tl.dot(v_t, p_t.to(v_t.dtype))
        m_i = m_new
    return tl.trans(acc_t), m_i, l_i


@triton.jit
def _fp8_byte_to_fp16(words, shift: tl.constexpr, FP8_WORDS: tl.constexpr):
    """The FP8 byte at bit `shift` of each int32 word as fp16, exactly. e5m2 is fp16's top
    byte. e4m3's sign, exponent and mantissa bits placed at fp16's (bias 15 against 7) give the
    value / 2^8, normal or subnormal alike."""
    byte = (words >> shift) & 0xFF
    if FP8_WORDS == 2:
        return (byte << 8).to(tl.uint16).to(tl.float16, bitcast=True)
    bits = (((byte & 0x80) << 8) | ((byte & 0x7F) << 7)).to(tl.uint16)
    return (bits.to(tl.float16, bitcast=True).to(tl.float32) * 256.0).to(tl.float16)


@triton.jit
def load_fp8_rows_as_fp16(
    base,  # FP8 rows: row r's element d at base + slots[r] * stride_slot + d
    slots,  # [BLOCK_N] int64
    mask_n,  # [BLOCK_N]
    stride_slot,  # elements (bytes); a multiple of 4
    HEAD_DIM: tl.constexpr,  # a multiple of 4
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP8_WORDS: tl.constexpr,  # 1: e4m3, 2: e5m2
    USE_PTX: tl.constexpr,  # CUDA: one conversion instruction per 2 elements
):
    """An FP8 tile `[BLOCK_N, BLOCK_D]` as fp16, read as 32-bit words (4 elements each) and
    converted in the layout it was loaded in. Why: loaded as FP8 and converted after, the tile
    feeds a dot's right operand with positions along its K dimension, and Hopper has no 8-bit
    transposing shared-memory load (`ldmatrix.trans` is 16-bit): Triton then reads the tile one
    byte at a time (64 `ld.shared.b8` a thread per 64 x 128 tile). Converted first, the fp16
    tile takes `ldmatrix.trans`. Without `USE_PTX` (the interpreter, which cannot run inline PTX)
    the bytes are converted with integer operations, exactly."""
    offs_w = tl.arange(0, BLOCK_D // 4)
    words = tl.load(
        base.to(tl.pointer_type(tl.int32)) + slots[:, None] * (stride_slot // 4) + offs_w[None, :],
        mask=mask_n[:, None] & (offs_w[None, :] < HEAD_DIM // 4),
        other=0,
    )  # [BLOCK_N, BLOCK_D // 4]: elements 4w .. 4w + 3 of each row, the first in the low byte
    if USE_PTX:
        cvt: tl.constexpr = "cvt.rn.f16x2.e4m3x2" if FP8_WORDS == 1 else "cvt.rn.f16x2.e5m2x2"
        e0, e1, e2, e3 = tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; .reg .b32 a, b; mov.b32 {lo, hi}, $4; "
            + cvt
            + " a, lo; "
            + cvt
            + " b, hi; mov.b32 {$0, $1}, a; mov.b32 {$2, $3}, b; }",
            "=h,=h,=h,=h,r",
            [words],
            dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
            is_pure=True,
            pack=1,
        )
    else:
        e0 = _fp8_byte_to_fp16(words, 0, FP8_WORDS)
        e1 = _fp8_byte_to_fp16(words, 8, FP8_WORDS)
        e2 = _fp8_byte_to_fp16(words, 16, FP8_WORDS)
        e3 = _fp8_byte_to_fp16(words, 24, FP8_WORDS)
    # join(join(e0, e2), join(e1, e3))[..., x, y] is element 2x + y of the word.
    return tl.reshape(tl.join(tl.join(e0, e2), tl.join(e1, e3)), [BLOCK_N, BLOCK_D])


@triton.jit
def attend_paged_range(
    q,  # [BLOCK_M, BLOCK_D] in the compute dtype
    k_base,  # K of one KV head: slot s at k_base + s * stride_k_slot
    v_base,
    slot_row_ptr,  # a req_to_token row: the KV slot of each position
    start,
    end,
    qk_scale,  # scaling * log2(e) (times a K dequantisation scale)
    stride_k_slot,
    stride_v_slot,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_LHS: tl.constexpr = False,  # K/V on the dots' left: `attend_paged_range_kv_lhs`
    V_FP8_WORDS: tl.constexpr = 0,  # an FP8 V tile through `load_fp8_rows_as_fp16` (1 e4m3, 2 e5m2)
    V_FP8_PTX: tl.constexpr = True,  # its conversion in inline PTX (CUDA)
):
    """Online softmax of q's rows over positions [start, end) of one paged history, base 2.

    K/V tiles are converted to q's dtype (a no-op unless the pool stores another dtype) for the
    tensor-core dots; accumulators are fp32. Returns (acc [M, D], row max [M], row sum [M]).
    """
    if KV_LHS:
        acc, m_i, l_i = attend_paged_range_kv_lhs(
            q,
            k_base,
            v_base,
            slot_row_ptr,
            start,
            end,
            qk_scale,
            stride_k_slot,
            stride_v_slot,
            BLOCK_M,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
        )
        return acc, m_i, l_i
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_d = offs_d < HEAD_DIM
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for n in range(start, end, BLOCK_N):
        pos = n + offs_n
        mask_n = pos < end
        slots = tl.load(slot_row_ptr + pos, mask=mask_n, other=0).to(tl.int64)
        k = tl.load(
            k_base + slots[None, :] * stride_k_slot + offs_d[:, None],
            mask=mask_n[None, :] & mask_d[:, None],
            other=0.0,
        ).to(q.dtype)  # [BLOCK_D, BLOCK_N]
        if V_FP8_WORDS:
            v = load_fp8_rows_as_fp16(
                v_base,
                slots,
                mask_n,
                stride_v_slot,
                HEAD_DIM,
                BLOCK_D,
                BLOCK_N,
                V_FP8_WORDS,
                V_FP8_PTX,
            )  # [BLOCK_N, BLOCK_D] fp16 (q's dtype on this path)
        else:
            v = tl.load(
                v_base + slots[:, None] * stride_v_slot + offs_d[None, :],
                mask=mask_n[:, None] & mask_d[None, :],
                other=0.0,
            ).to(q.dtype)  # [BLOCK_N, BLOCK_D]
        qk = tl.dot(q, k) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        # Position n < end is valid, so every row's max is finite.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def decode_split_kernel(
    q_ptr,  # [batch, num_heads, head_dim]
    k_buffer_ptr,  # [num_slots, num_kv_heads, head_dim]
    v_buffer_ptr,
    req_to_token_ptr,  # [rows, max_context_len] int32
    req_pool_indices_ptr,  # [batch]
    seq_lens_ptr,  # [batch]
    kv_starts_ptr,  # [batch] int32, first position attended (read only if HAS_KV_STARTS)
    partial_out_ptr,  # [batch, num_heads, num_kv_splits, head_dim] fp32
    partial_lse_ptr,  # [batch, num_heads, num_kv_splits] fp32
    o_ptr,  # [batch, num_heads, head_dim] (MERGE only)
    merge_counters_ptr,  # [batch * num_kv_heads] int32 zeros (MERGE only)
    shared_out_ptr,  # [num_entries, num_heads, head_dim] fp32 (HAS_SHARED only)
    shared_lse_ptr,  # [num_entries, num_heads] fp32 (HAS_SHARED only)
    entry_offsets_ptr,  # [batch + 1] int32: request i's entries (HAS_SHARED only)
    qk_scale,  # softmax scale * log2(e) * k_scale
    v_scale,
    stride_q_batch,
    stride_q_head,
    stride_kb_slot,
    stride_kb_head,
    stride_vb_slot,
    stride_vb_head,
    stride_req_row,
    stride_o_batch,
    stride_o_head,
    num_kv_splits,  # runtime: tuning it does not recompile
    min_split_len,  # runtime: a split covers at least this many positions (a multiple of BLOCK_N)
    HAS_KV_STARTS: tl.constexpr,  # False: positions [0, seq_len) (plain decode)
    MERGE: tl.constexpr,  # the last split program of each (request, KV head) merges
    HAS_SHARED: tl.constexpr,  # tree attention: the merge takes the shared pass's entries too
    DOT_FP16: tl.constexpr,  # FP8 pools: q and the K/V tiles as fp16 (exact for e4m3 and e5m2)
    KV_LHS: tl.constexpr,  # K/V on the dots' left (`attend_paged_range_kv_lhs`)
    V_FP8_WORDS: tl.constexpr,  # FP8 V read as words, converted before the dot (fp16 dots only)
    V_FP8_PTX: tl.constexpr,  # ... with inline PTX (CUDA); integer operations otherwise
    GROUP_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr = False,  # pdl.py
    PREFETCH_KV: tl.constexpr = False,  # the first tile's K/V rows asked into L2 before the wait
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # Before the PDL wait: only the previous kernel's outputs (q and the current token's K/V,
    # from the rotary + KV-store kernel) can still be in flight; the lengths, rows and slots
    # were written before the forward, the older positions' K/V by earlier steps.
    seq_len = tl.load(seq_lens_ptr + req).to(tl.int32)
    kv_start = tl.load(kv_starts_ptr + req) if HAS_KV_STARTS else 0
    row = tl.load(req_pool_indices_ptr + req).to(tl.int64)
    split_len = tl.cdiv(tl.cdiv(seq_len - kv_start, num_kv_splits), BLOCK_N) * BLOCK_N
    # A short history in fewer, longer splits (tuning): one split merges from registers.
    split_len = tl.maximum(split_len, min_split_len)
    split_start = kv_start + split * split_len
    split_end = tl.minimum(split_start + split_len, seq_len)
    # Splits holding positions (>= 1: split 0 stands for an empty range). The split count is
    # fixed per batch size (CUDA graphs), so a short context leaves most splits empty: they
    # neither store partials nor get merged (at batch 1 on the H200, 32 splits, a few hundred
    # tokens: the merge walked all 32 twice, 15 us a layer).
    used_splits = tl.maximum(tl.cdiv(seq_len - kv_start, tl.maximum(split_len, 1)), 1)
    if PREFETCH_KV:
        _prefetch_first_tile(
            k_buffer_ptr + kv_head * stride_kb_head, v_buffer_ptr + kv_head * stride_vb_head,
            req_to_token_ptr + row * stride_req_row, split_start, split_end, stride_kb_slot,
            stride_vb_slot, HEAD_DIM, BLOCK_D, BLOCK_N, USE_PDL,
        )  # fmt: skip
    wait_for_prior_grids(USE_PDL)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask_h = offs_h < GROUP_SIZE
    mask_d = offs_d < HEAD_DIM
    heads = kv_head * GROUP_SIZE + offs_h

    q = tl.load(
        q_ptr + req * stride_q_batch + heads[:, None] * stride_q_head + offs_d[None, :],
        mask=mask_h[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_H, BLOCK_D]
    if DOT_FP16:
        # Hopper converts e4m3/e5m2 to fp16 in one instruction; to bf16 only through fp32.
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    acc, m_i, l_i = attend_paged_range(
        q,
        k_buffer_ptr + kv_head * stride_kb_head,
        v_buffer_ptr + kv_head * stride_vb_head,
        req_to_token_ptr + row * stride_req_row,
        split_start,
        split_end,
        qk_scale,
        stride_kb_slot,
        stride_vb_slot,
        BLOCK_H,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_N,
        KV_LHS,
        V_FP8_WORDS,
        V_FP8_PTX,
    )

    # Row of (request, query head) in the partial buffers; num_heads = num_kv_heads * GROUP_SIZE.
    partial_row = (req * tl.num_programs(1) * GROUP_SIZE + heads).to(tl.int64)
    if split_end > split_start:
        lse = m_i + tl.math.log2(l_i)
        out = acc * (v_scale / l_i[:, None])
    else:  # an empty split 0 (an empty range): weight 0 in the merge
        lse = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        out = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    if MERGE:
        out_ptrs = o_ptr + req * stride_o_batch + heads[:, None] * stride_o_head + offs_d[None, :]
        if HAS_SHARED:
            entry_start = tl.load(entry_offsets_ptr + req)
            entry_end = tl.load(entry_offsets_ptr + req + 1)
        else:
            entry_start = 0
            entry_end = 0
        num_heads = tl.num_programs(1) * GROUP_SIZE
        if used_splits == 1:
            # Alone (one split: large batches, and most tree suffixes): merged from registers,
            # with no partial stored, no counter and no reload from L2.
            if split == 0:
                _add_entries_and_store(
                    out, tl.full([BLOCK_H], 1.0, dtype=tl.float32), lse, out_ptrs, mask_h,
                    offs_d, mask_d, shared_out_ptr, shared_lse_ptr, entry_start, entry_end,
                    heads, num_heads, HAS_SHARED, HEAD_DIM, BLOCK_H,
                )  # fmt: skip
        elif split < used_splits:
            # Only the used splits store and arrive at the group's counter: an empty split has
            # nothing to merge (at batch 1, 32 splits over a few hundred positions, 4 or 5
            # arrive instead of 32 atomics on one address). Every program computes the same
            # `used_splits`.
            _store_partial(
                partial_out_ptr, partial_lse_ptr, partial_row, num_kv_splits, split, out, lse,
                mask_h, offs_d, mask_d, HEAD_DIM,
            )  # fmt: skip
            # Every thread's partials are stored before the release of the (one-thread) atomic.
            tl.debug_barrier()
            counter = merge_counters_ptr + req * tl.num_programs(1) + kv_head
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == used_splits - 1:
                tl.debug_barrier()  # the acquire above orders every thread's loads below
                _merge_group(
                    partial_out_ptr, partial_lse_ptr, partial_row, num_kv_splits, used_splits,
                    out_ptrs, mask_h, offs_d, mask_d, shared_out_ptr, shared_lse_ptr,
                    entry_start, entry_end, heads, num_heads, HAS_SHARED, HEAD_DIM, BLOCK_H,
                    BLOCK_D,
                )  # fmt: skip
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
    else:
        # The separate merge (callers that merge themselves) reads every split: all store.
        _store_partial(
            partial_out_ptr, partial_lse_ptr, partial_row, num_kv_splits, split, out, lse, mask_h,
            offs_d, mask_d, HEAD_DIM,
        )  # fmt: skip


@triton.jit
def _prefetch_first_tile(
    k_base, v_base, slot_row_ptr, start, end, stride_k_slot, stride_v_slot,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    """Asks L2 for the K and V rows of positions `start .. start + BLOCK_N` (within `end`) of
    one KV head, before the PDL wait: the split's first tile then loads from L2 after it (at
    batch 1 a split is one tile). The current token's rows may still be being written: a
    prefetch only moves lines into L2, which every SM's writes go through."""
    pos = start + tl.arange(0, BLOCK_N)
    slots = tl.load(slot_row_ptr + pos, mask=pos < end, other=0).to(tl.int64)  # [BLOCK_N]
    elem_bytes: tl.constexpr = k_base.dtype.element_ty.primitive_bitwidth // 8
    line: tl.constexpr = 128 // elem_bytes  # elements of a 128-byte line
    # [row lines]: one address each, within the row (a head_dim not a power of two repeats
    # its last line)
    lines = tl.minimum(tl.arange(0, max(1, BLOCK_D // line)) * line, HEAD_DIM - 1)
    prefetch_to_l2(k_base + slots[:, None] * stride_k_slot + lines[None, :], USE_PDL)
    prefetch_to_l2(v_base + slots[:, None] * stride_v_slot + lines[None, :], USE_PDL)


@triton.jit
def _store_partial(
    partial_out_ptr, partial_lse_ptr, partial_row, num_kv_splits, split, out, lse, mask_h, offs_d,
    mask_d, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """Stores one split's normalised output and lse for the GQA group's heads."""
    tl.store(
        partial_out_ptr
        + (partial_row[:, None] * num_kv_splits + split) * HEAD_DIM
        + offs_d[None, :],
        out,
        mask=mask_h[:, None] & mask_d[None, :],
    )
    tl.store(partial_lse_ptr + partial_row * num_kv_splits + split, lse, mask=mask_h)


@triton.jit
def _merge_group(
    partial_out_ptr, partial_lse_ptr, partial_row, num_kv_splits, used_splits, out_ptrs, mask_h,
    offs_d, mask_d, shared_out_ptr, shared_lse_ptr, entry_start, entry_end, heads, num_heads,
    HAS_SHARED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Merges the first `used_splits` splits (the others are empty and unwritten) of the GQA
    group's heads (`partial_row`: [BLOCK_H] rows; `num_kv_splits`: the buffers' split stride)
    into `out_ptrs` ([BLOCK_H, BLOCK_D]); the partials are read from L2 (other SMs wrote them).
    With HAS_SHARED, the tree's shared entries too (`_add_entries_and_store`)."""
    lse_rows = partial_lse_ptr + partial_row * num_kv_splits
    lse_max = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    for s in range(0, used_splits):
        lse = tl.load(lse_rows + s, mask=mask_h, other=float("-inf"), cache_modifier=".cg")
        lse_max = tl.maximum(lse_max, lse)
    # Split 0 is never empty for seq_len >= 1 (a tree suffix may be: its request then has
    # entries, which the online merge below takes): finite, or -inf for an empty tree suffix.
    lse_max = tl.where(mask_h, lse_max, 0.0)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    weight_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
    out_rows = partial_out_ptr + (partial_row * num_kv_splits)[:, None] * HEAD_DIM
    for s in range(0, used_splits):
        lse = tl.load(lse_rows + s, mask=mask_h, other=float("-inf"), cache_modifier=".cg")
        weight = tl.math.exp2(lse - lse_max)  # [BLOCK_H]
        partial = tl.load(
            out_rows + s * HEAD_DIM + offs_d[None, :],
            mask=mask_h[:, None] & mask_d[None, :],
            other=0.0,
            cache_modifier=".cg",
        )  # [BLOCK_H, BLOCK_D]
        acc += partial * weight[:, None]
        weight_sum += weight
    _add_entries_and_store(
        acc, weight_sum, lse_max, out_ptrs, mask_h, offs_d, mask_d, shared_out_ptr,
        shared_lse_ptr, entry_start, entry_end, heads, num_heads, HAS_SHARED, HEAD_DIM, BLOCK_H,
    )  # fmt: skip


@triton.jit
def _add_entries_and_store(
    acc, weight_sum, lse_max, out_ptrs, mask_h, offs_d, mask_d, shared_out_ptr, shared_lse_ptr,
    entry_start, entry_end, heads, num_heads, HAS_SHARED: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
):  # fmt: skip
    """Stores `acc / weight_sum` ([BLOCK_H, BLOCK_D]: partials weighted by exp2(lse - lse_max))
    after adding, with HAS_SHARED, the tree's shared entries `entry_start .. entry_end` (rows
    `entry * num_heads + heads` of the shared pass's partials, written by an earlier launch),
    rescaling online as each one raises the maximum."""
    if HAS_SHARED:
        for e in range(entry_start, entry_end):
            entry_rows = heads.to(tl.int64) + e * num_heads  # e * num_heads < 2**31
            lse = tl.load(shared_lse_ptr + entry_rows, mask=mask_h, other=0.0)
            partial = tl.load(
                shared_out_ptr + entry_rows[:, None] * HEAD_DIM + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :],
                other=0.0,
            )  # [BLOCK_H, BLOCK_D]
            new_max = tl.maximum(lse_max, lse)  # finite: a shared entry is never empty
            scale = tl.math.exp2(lse_max - new_max)  # 0 while the suffix was empty (-inf)
            weight = tl.math.exp2(lse - new_max)
            acc = acc * scale[:, None] + partial * weight[:, None]
            weight_sum = weight_sum * scale + weight
            lse_max = new_max
    out = acc / tl.where(mask_h, weight_sum, 1.0)[:, None]
    tl.store(out_ptrs, out.to(out_ptrs.dtype.element_ty), mask=mask_h[:, None] & mask_d[None, :])


@triton.jit
def _decode_merge_kernel(
    partial_out_ptr,  # [batch, num_heads, num_kv_splits, head_dim] fp32
    partial_lse_ptr,  # [batch, num_heads, num_kv_splits] fp32
    o_ptr,  # [batch, num_heads, head_dim]
    stride_o_batch,
    stride_o_head,
    NUM_KV_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    partial_row = (req * tl.num_programs(1) + head).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < NUM_KV_SPLITS
    mask_d = offs_d < HEAD_DIM
    lse = tl.load(
        partial_lse_ptr + partial_row * NUM_KV_SPLITS + offs_s, mask=mask_s, other=float("-inf")
    )  # [BLOCK_S]
    partial = tl.load(
        partial_out_ptr
        + (partial_row * NUM_KV_SPLITS + offs_s[:, None]) * HEAD_DIM
        + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    # Split 0 is never empty for seq_len >= 1, so the max is finite.
    weights = tl.math.exp2(lse - tl.max(lse, 0))
    out = tl.sum(partial * weights[:, None], 0) / tl.sum(weights, 0)
    tl.store(
        o_ptr + req * stride_o_batch + head * stride_o_head + offs_d,
        out.to(o_ptr.dtype.element_ty),
        mask=mask_d,
    )


@functools.cache
def _multiprocessor_count(device_index: int | None) -> int:
    # Cached: querying the properties costs microseconds on every decode step otherwise.
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_num_kv_splits(batch: int, num_kv_heads: int, device: torch.device) -> int:
    """Splits so that stage 1 has about four programs per SM; a power of two, 1..MAX_KV_SPLITS.

    Depends only on the batch size (not the lengths), so a CUDA graph captured for a batch size
    stays valid for any lengths.
    """
    if device.type != "cuda":
        return 4
    num_sms = _multiprocessor_count(device.index)
    wanted = triton.cdiv(4 * num_sms, max(1, batch * num_kv_heads))
    return max(1, min(MAX_KV_SPLITS, triton.next_power_of_2(wanted)))


# An FP8 pool's launch runs one-warp programs from this many programs an SM (batch x KV heads x
# splits; depends on the batch alone, so a captured graph's launch stays valid). H200, the
# twenty-second session's sweep: at 256 x 1024 (2,048 programs, 15.5 an SM) one warp 164.9 us
# against two warps' 184.0; at 64 x 4096 (1,024 programs, 7.8 an SM) 199.1 against 184.6.
FP8_ONE_WARP_MIN_PROGRAMS_PER_SM = 12


def default_decode_blocks(
    head_dim: int, device: torch.device, *, fp8_pool: bool = False, programs: int = 0
) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages); measured on the H200. (An FP8 pool in 128-position
    tiles measured 3-6% faster than in 64-position ones, with fp16 dots, but spills registers
    under Triton 3.9's sm_90 compile; docs/benchmarks.md, the seventh session.) An FP8 pool's
    launch runs 5 stages under `default_decode_max_registers`' cap: 234.8 -> 199.7 us at
    256 x 1024 (the ninth session); in 32-position tiles of 2 warps, 199.2 -> 183.9 us (2.70 ->
    2.92 TB/s; 64 x 4096: 197.5 -> 184.7 us; the twenty-first session's sweep): twice the
    programs an SM, each with fewer bytes in flight. Over an FP8 pool, grids of
    `FP8_ONE_WARP_MIN_PROGRAMS_PER_SM` programs an SM or more (`programs`: the split kernel's
    grid size) run one warp a program: Nsight Compute had the 2-warp launch issue-bound (58%
    of issue slots, DRAM at 59%), and one warp holding a whole tile issues ~10% fewer
    instructions for it, with no exchange of the scores between warps through shared memory
    (sm_90 PTX from Triton 3.9: 1,024 a tile against 2 x 565, 2 barriers against 7). Small
    grids keep two warps a program: more warps to hide latency when few programs run."""
    if device.type != "cuda":
        return 32, 4, 1
    if head_dim > 128:
        return 32, 4, 2
    if not fp8_pool:
        return 64, 4, 3
    if programs >= FP8_ONE_WARP_MIN_PROGRAMS_PER_SM * _multiprocessor_count(device.index):
        return 32, 1, 5
    return 32, 2, 5


def default_decode_max_registers(
    head_dim: int, device: torch.device, *, fp8_pool: bool
) -> int | None:
    """The split kernel's register cap (ptxas `.maxnreg`), or None for the compiler's choice.
    Over an FP8 pool the kernel takes 168 registers a thread (sm_90: 3 programs an SM, against
    5 over a bf16 pool at 96) and so keeps a third of the bytes in flight; capped at 128 it
    fits 4 programs without spilling (tests/test_kernels_decode_attention.py compiles it)."""
    return 128 if device.type == "cuda" and fp8_pool and head_dim <= 128 else None


def default_fp8_dot_fp16(device: torch.device) -> bool:
    """Whether a bf16 model's FP8 pool is read through fp16 dots: on CUDA, yes. Hopper converts
    e4m3/e5m2 to fp16 in one instruction but to bf16 only through fp32, and the conversions, not
    the bytes, bounded the kernel (305 -> 234 us at 256 x 1024 on the H200). Both conversions
    are exact; q is clamped to fp16's range (+-65504) first."""
    return device.type == "cuda"


def fp8_pool_paths(
    q: torch.Tensor,
    v_buffer: torch.Tensor,
    *,
    fp8_dot_fp16: bool | None,
    fp8_v_words: bool | None,
    kv_lhs: bool = False,
) -> tuple[bool, int]:
    """(DOT_FP16, V_FP8_WORDS) of a launch over this pool: whether a bf16 q and the FP8 tiles
    go to fp16 for the dots (`default_fp8_dot_fp16`), and whether V is read as 32-bit words and
    converted before the dot (`load_fp8_rows_as_fp16`: 1 e4m3, 2 e5m2, 0 no; off by default,
    as the H200 measured it slower). None picks the default; both are off over a 16/32-bit pool."""
    if v_buffer.dtype not in FP8_KV_DTYPES:
        return False, 0
    if fp8_dot_fp16 is None:
        fp8_dot_fp16 = default_fp8_dot_fp16(q.device)
    dot_fp16 = fp8_dot_fp16 and q.dtype == torch.bfloat16
    if fp8_v_words is None:
        # Off: measured slower on the H200 (eleventh session, 256 x 1024: 227.8 us with V
        # read as words against 200.1 us with byte loads, both at the default launch).
        fp8_v_words = False
    words_fit = q.shape[-1] % 4 == 0 and v_buffer.stride(0) % 4 == 0 and v_buffer.stride(1) % 4 == 0
    use_words = fp8_v_words and not kv_lhs and (dot_fp16 or q.dtype == torch.float16)
    if not (use_words and words_fit):
        return dot_fp16, 0
    return dot_fp16, 1 if v_buffer.dtype == torch.float8_e4m3fn else 2


def check_decode_inputs(
    q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, *, kv_dtypes=None
) -> None:
    """Shapes, strides and dtypes of a paged decode call; K/V must have q's dtype unless
    `kv_dtypes` lists the allowed ones. Raises ValueError/TypeError naming the argument."""
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, num_heads, head_dim], got {tuple(q.shape)}")
    batch, num_heads, head_dim = q.shape
    for name, t in (("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if t.dim() != 3 or t.shape[2] != head_dim or t.stride(2) != 1:
            raise ValueError(
                f"{name} must be [num_slots, num_kv_heads, head_dim={head_dim}] contiguous in "
                f"head_dim, got {tuple(t.shape)}"
            )
    num_kv_heads = k_buffer.shape[1]
    if v_buffer.shape[1] != num_kv_heads or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}); "
            f"v_buffer has {v_buffer.shape[1]} heads"
        )
    if q.stride(2) != 1:
        raise ValueError("q must be contiguous in head_dim")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"q must be float16/bfloat16/float32, got {q.dtype}")
    if kv_dtypes is None and (
        k_buffer.dtype != v_buffer.dtype or k_buffer.dtype not in (q.dtype, *FP8_KV_DTYPES)
    ):
        raise TypeError(
            f"k_buffer/v_buffer dtype must be q's ({q.dtype}) or FP8 (e4m3/e5m2), got "
            f"{k_buffer.dtype}/{v_buffer.dtype}"
        )
    if kv_dtypes is not None and not {k_buffer.dtype, v_buffer.dtype} <= set(kv_dtypes):
        raise TypeError(
            f"k_buffer/v_buffer dtype must be one of {kv_dtypes}, got "
            f"{k_buffer.dtype}/{v_buffer.dtype}"
        )
    if req_to_token.dtype != torch.int32 or req_to_token.dim() != 2 or req_to_token.stride(1) != 1:
        raise TypeError("req_to_token must be a contiguous int32 [rows, max_context_len] tensor")
    for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens)):
        if t.shape != (batch,) or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be an int32/int64 [batch={batch}] tensor")
    if head_dim > 256:
        raise ValueError(f"head_dim must be <= 256, got {head_dim}")


def decode_attention(
    q: torch.Tensor,  # [batch, num_heads, head_dim]
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    req_to_token: torch.Tensor,  # [rows, max_context_len] int32
    req_pool_indices: torch.Tensor,  # [batch]
    seq_lens: torch.Tensor,  # [batch], >= 1, history length including the current token
    scaling: float,
    *,
    out: torch.Tensor | None = None,
    num_kv_splits: int | None = None,
    partial_out: torch.Tensor | None = None,
    partial_lse: torch.Tensor | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    merge_counters: torch.Tensor | None = None,
    fp8_dot_fp16: bool | None = None,
    kv_lhs: bool = False,
    max_registers: int | None = None,
    fp8_v_words: bool | None = None,
    min_split_len: int = 0,
    prefetch_kv: bool = False,
) -> torch.Tensor:  # [batch, num_heads, head_dim]
    """Attention of one query per request over positions `[0, seq_lens[i])` of its history.

    Args:
        q: the query of each request's current token.
        k_buffer, v_buffer: the layer's KV pool; position p of request i is in slot
            `req_to_token[req_pool_indices[i], p]`. The current token's K/V must be written.
        seq_lens: history lengths (>= 1), read on the device (no host sync).
        out: optional output tensor like q.
        num_kv_splits: KV splits per request; default from `default_num_kv_splits`.
        partial_out, partial_lse: optional fp32 workspaces `[batch, num_heads, num_kv_splits,
            head_dim]` and `[batch, num_heads, num_kv_splits]` (CUDA graphs keep them static).
        block_n, num_warps, num_stages: tuning overrides (benchmarks).
        k_scale, v_scale: per-tensor scales of an FP8 pool (K = stored K * k_scale).
        merge_counters: int32 zeros, at least `batch * num_kv_heads`, left zeros: the splits
            are then merged in the same launch (one per call; callers keep one per batch).
        fp8_dot_fp16: an FP8 pool's tiles and q converted to fp16 (not q's dtype) for the dots;
            a tuning override (benchmarks), default `default_fp8_dot_fp16`.
        kv_lhs: K/V tiles as the dots' left operands (`attend_paged_range_kv_lhs`); a tuning
            variant for the benchmarks, the same results.
        max_registers: a cap on the split kernel's registers per thread (ptxas `.maxnreg`), a
            tuning override (benchmarks): None for `default_decode_max_registers`, 0 for no
            cap.
        fp8_v_words: an FP8 pool's V tiles read as 32-bit words and converted to fp16 before
            the dot (`load_fp8_rows_as_fp16`); a tuning override, off by default (slower on
            the H200).
        min_split_len: each KV split covers at least this many positions (rounded up to the
            launch's tile), so a short history uses fewer splits (one split merges from
            registers, with no partials or counter); a tuning override, 0 by default (splits
            as short as one tile).
        prefetch_kv: with programmatic dependent launch (CUDA, sm_90+), each split asks L2
            for its first tile's K and V rows before waiting for the previous kernel; a
            tuning override, off by default (H200: 0-0.2 us a launch saved at batch 1, up
            to 1 us lost at batch 4).

    Returns:
        The attention output, shaped and typed like q.

    Raises:
        ValueError/TypeError naming the argument on bad shapes, dtypes or strides.
    """
    check_decode_inputs(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens)
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(f"out must be like q {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)}")
    if batch == 0:
        return out
    num_kv_splits = num_kv_splits or default_num_kv_splits(batch, num_kv_heads, q.device)
    if not 1 <= num_kv_splits <= MAX_KV_SPLITS:
        raise ValueError(f"num_kv_splits must be in [1, {MAX_KV_SPLITS}], got {num_kv_splits}")
    partial_shape = (batch, num_heads, num_kv_splits, head_dim)
    if partial_out is None:
        partial_out = torch.empty(partial_shape, dtype=torch.float32, device=q.device)
    if partial_lse is None:
        partial_lse = torch.empty(partial_shape[:3], dtype=torch.float32, device=q.device)
    if partial_out.shape != partial_shape or not partial_out.is_contiguous():
        raise ValueError(f"partial_out must be contiguous {partial_shape}")
    if partial_lse.shape != partial_shape[:3] or not partial_lse.is_contiguous():
        raise ValueError(f"partial_lse must be contiguous {partial_shape[:3]}")

    merge = merge_counters is not None
    if merge and (
        merge_counters.dtype != torch.int32
        or merge_counters.device != q.device
        or merge_counters.numel() < batch * num_kv_heads
    ):
        raise ValueError(
            f"merge_counters must be int32 on {q.device} with >= {batch * num_kv_heads} entries"
        )
    group_size = num_heads // num_kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    fp8_pool = k_buffer.dtype in FP8_KV_DTYPES
    default_n, default_warps, default_stages = default_decode_blocks(
        head_dim, q.device, fp8_pool=fp8_pool, programs=batch * num_kv_heads * num_kv_splits
    )
    block_n = block_n or default_n
    if min_split_len < 0:
        raise ValueError(f"min_split_len must be >= 0, got {min_split_len}")
    if max_registers is None:
        max_registers = default_decode_max_registers(head_dim, q.device, fp8_pool=fp8_pool)
    dot_fp16, v_fp8_words = fp8_pool_paths(
        q, v_buffer, fp8_dot_fp16=fp8_dot_fp16, fp8_v_words=fp8_v_words, kv_lhs=kv_lhs
    )
    decode_split_kernel[(batch, num_kv_heads, num_kv_splits)](
        q,
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices,
        seq_lens,
        seq_lens,  # kv_starts: unused (HAS_KV_STARTS=False)
        partial_out,
        partial_lse,
        out,
        merge_counters if merge else seq_lens,  # unused without MERGE
        partial_out,  # shared_out_ptr, shared_lse_ptr, entry_offsets_ptr: unused (HAS_SHARED
        partial_lse,  # False; tree attention's)
        seq_lens,
        scaling * LOG2_E * k_scale,
        v_scale,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        req_to_token.stride(0),
        out.stride(0),
        out.stride(1),
        num_kv_splits,
        triton.cdiv(min_split_len, block_n) * block_n,
        HAS_KV_STARTS=False,
        MERGE=merge,
        HAS_SHARED=False,
        DOT_FP16=dot_fp16,
        KV_LHS=kv_lhs,
        V_FP8_WORDS=v_fp8_words,
        V_FP8_PTX=q.device.type == "cuda",
        GROUP_SIZE=group_size,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_H=max(16, triton.next_power_of_2(group_size)),
        BLOCK_N=block_n,
        PREFETCH_KV=prefetch_kv,
        num_warps=num_warps or default_warps,
        num_stages=num_stages or default_stages,
        **({"maxnreg": max_registers} if max_registers else {}),
        **pdl_launch_options(q.device),
    )
    if merge:
        return out
    _decode_merge_kernel[(batch, num_heads)](
        partial_out,
        partial_lse,
        out,
        out.stride(0),
        out.stride(1),
        NUM_KV_SPLITS=num_kv_splits,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_S=triton.next_power_of_2(num_kv_splits),
        num_warps=4 if head_dim >= 128 else 2,
    )
    return out


def decode_attention_ref(
    q: torch.Tensor,  # [batch, num_heads, head_dim]
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,  # [rows, max_context_len] int32
    req_pool_indices: torch.Tensor,  # [batch]
    seq_lens: torch.Tensor,  # [batch]
    scaling: float,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Plain-torch reference of `decode_attention` (fp32 math, one request at a time)."""
    out = torch.empty_like(q)
    group = q.shape[1] // k_buffer.shape[1]
    for i in range(q.shape[0]):
        slots = req_to_token[int(req_pool_indices[i]), : int(seq_lens[i])].long()
        # [seq, num_heads, dim]
        keys = (k_buffer[slots].float() * k_scale).repeat_interleave(group, dim=1)
        values = (v_buffer[slots].float() * v_scale).repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,khd->hk", q[i].float(), keys) * scaling
        out[i] = torch.einsum("hk,khd->hd", scores.softmax(dim=-1), values).to(q.dtype)
    return out
