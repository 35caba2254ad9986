"""Batched multi-LoRA: a different adapter on each request's tokens of one batch (Punica/S-LoRA).

For a linear layer `y = base(x)` that stacks `len(output_sizes)` checkpoint modules (q/k/v,
gate/up), adapter `a` adds to the rows of its tokens

    y[t, shard s] += scaling[a] * (x[t] @ A[a, s].T) @ B[a, s].T

with `A[a, s]: [rank, K]` (shrink) and `B[a, s]: [size_s, rank]` (expand). The adapters live
stacked in pool buffers, zero-padded to the pool's `max_rank` (zero rows and columns add
exactly nothing):

    lora_a: [num_slots, num_shards * max_rank, K]   shard s's A in rows [s*R, (s+1)*R)
    lora_b: [num_slots, N, max_rank]                shard s's B in its output rows of N

Tokens arrive packed, request by request; `LoRASegments` cuts them into segments of
consecutive tokens that share one adapter slot (-1: the base model, nothing added).

Triton, two paths chosen by `lora_apply`:
- SGMV (`lora_apply_sgmv`, every segment length; prefill): two kernels, each with grid
  `(num_segments, cdiv(max_segment_len, BLOCK_M), cdiv(cols, BLOCK_cols))`. A program reads its
  segment's slot (returning at once for -1) and multiplies a `[BLOCK_M, K]` tile of the
  segment's tokens by that slot's A (shrink, into an fp32 `[T, shards * R]` scratch), then the
  scratch by B, adding `scaling * (h @ B.T)` to `y` in place (expand, one launch per shard).
- decode (`lora_decode.lora_apply_decode`, taken when every segment is one token): split-K
  shrink and wide-tile expand grouped by pool slot, q/k/v in one launch (see that module).
Every index is read from device tensors and neither grid depends on which slot a token uses
(decode: only on the batch size and the pool), so decode steps capture in CUDA graphs.

`lora_apply_ref` is the torch reference (also the CPU path): one gathered matmul pair per adapter
slot present in the batch (a loop over at most `max_loras_per_batch` slots, never over tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixgen.kernels.host_copy import host_parts_to_device
from radixgen.kernels.lora_decode import MAX_SHARDS, lora_apply_decode


@dataclass(frozen=True)
class LoRASegments:
    """Which adapter slot each packed token uses, as segments of consecutive tokens.

    Attributes:
        token_slots: [num_tokens] int32, each token's slot (-1: base model).
        segment_starts: [num_segments] int32, first token of each segment.
        segment_lens: [num_segments] int32, tokens of each segment (>= 1).
        segment_slots: [num_segments] int32, the segment's slot (-1: base model).
        max_segment_len: host copy of `segment_lens.max()` (sizes the grid; 1 in decode).
        slots_present: host list of the distinct slots >= 0 in the batch (the reference's loop).
        request_slots: host list of each request's slot, as `make_lora_segments` got it (what
            a tensor-parallel follower rebuilds the segments from; empty for static segments).
    """

    token_slots: torch.Tensor
    segment_starts: torch.Tensor
    segment_lens: torch.Tensor
    segment_slots: torch.Tensor
    max_segment_len: int
    slots_present: tuple[int, ...]
    request_slots: tuple[int, ...] = ()

    @property
    def num_segments(self) -> int:
        return int(self.segment_starts.shape[0])


def lora_apply_ref(
    x: torch.Tensor,  # [T, K]
    y: torch.Tensor,  # [T, N], updated in place
    lora_a: torch.Tensor,  # [num_slots, num_shards * R, K]
    lora_b: torch.Tensor,  # [num_slots, N, R]
    scalings: torch.Tensor,  # [num_slots] fp32
    segments: LoRASegments,
    output_sizes: tuple[int, ...],
) -> torch.Tensor:
    """Adds every token's adapter delta to `y` (in place) and returns `y`."""
    max_rank = lora_b.shape[2]
    for slot in segments.slots_present:
        rows = torch.nonzero(segments.token_slots == slot).squeeze(1)  # [n] int64
        x_rows = x.index_select(0, rows).float()  # [n, K]
        shrunk = x_rows @ lora_a[slot].float().T  # [n, num_shards * R]
        delta = torch.empty(rows.shape[0], y.shape[1], dtype=torch.float32, device=y.device)
        offset = 0
        for shard, size in enumerate(output_sizes):
            rank_cols = shrunk[:, shard * max_rank : (shard + 1) * max_rank]  # [n, R]
            delta[:, offset : offset + size] = (
                rank_cols @ lora_b[slot, offset : offset + size].float().T
            )
            offset += size
        delta *= scalings[slot].float()
        y.index_add_(0, rows, delta.to(y.dtype))
    return y


@triton.jit
def _lora_shrink_kernel(
    x_ptr,  # [T, K]
    a_ptr,  # [num_slots, RR, K]
    h_ptr,  # [T, RR] fp32
    seg_start_ptr,
    seg_len_ptr,
    seg_slot_ptr,
    K,
    RR,
    stride_xt,
    stride_a_slot,
    stride_ar,
    stride_ht,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    segment = tl.program_id(0)
    slot = tl.load(seg_slot_ptr + segment)
    if slot >= 0:
        start = tl.load(seg_start_ptr + segment)
        length = tl.load(seg_len_ptr + segment)
        offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_r = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
        offs_k = tl.arange(0, BLOCK_K)
        rows = (start + offs_m).to(tl.int64)
        row_mask = offs_m < length
        a_base = a_ptr + slot.to(tl.int64) * stride_a_slot
        acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_mask = (k0 + offs_k) < K
            x = tl.load(
                x_ptr + rows[:, None] * stride_xt + (k0 + offs_k)[None, :],
                mask=row_mask[:, None] & k_mask[None, :],
                other=0.0,
            )  # [BLOCK_M, BLOCK_K]
            a = tl.load(
                a_base + offs_r[:, None] * stride_ar + (k0 + offs_k)[None, :],
                mask=(offs_r < RR)[:, None] & k_mask[None, :],
                other=0.0,
            )  # [BLOCK_R, BLOCK_K]
            acc += tl.dot(x, tl.trans(a))
        tl.store(
            h_ptr + rows[:, None] * stride_ht + offs_r[None, :],
            acc,
            mask=row_mask[:, None] & (offs_r < RR)[None, :],
        )


@triton.jit
def _lora_expand_kernel(
    h_ptr,  # [T, >= R] fp32, this shard's rank columns
    b_ptr,  # [num_slots, N_shard, R], this shard's output rows
    y_ptr,  # [T, N_shard], this shard's output columns, updated in place
    scaling_ptr,  # [num_slots] fp32
    seg_start_ptr,
    seg_len_ptr,
    seg_slot_ptr,
    N,
    R,
    stride_ht,
    stride_b_slot,
    stride_bn,
    stride_yt,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    segment = tl.program_id(0)
    slot = tl.load(seg_slot_ptr + segment)
    if slot >= 0:
        start = tl.load(seg_start_ptr + segment)
        length = tl.load(seg_len_ptr + segment)
        offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_r = tl.arange(0, BLOCK_R)
        rows = (start + offs_m).to(tl.int64)
        row_mask = offs_m < length
        n_mask = offs_n < N
        b_base = b_ptr + slot.to(tl.int64) * stride_b_slot
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for r0 in range(0, R, BLOCK_R):
            r_mask = (r0 + offs_r) < R
            h = tl.load(
                h_ptr + rows[:, None] * stride_ht + (r0 + offs_r)[None, :],
                mask=row_mask[:, None] & r_mask[None, :],
                other=0.0,
            )  # [BLOCK_M, BLOCK_R] fp32
            b = tl.load(
                b_base + offs_n[:, None] * stride_bn + (r0 + offs_r)[None, :],
                mask=n_mask[:, None] & r_mask[None, :],
                other=0.0,
            )  # [BLOCK_N, BLOCK_R]
            # 16-bit weights: the rank activations are rounded to them for the tensor cores.
            acc += tl.dot(h.to(b.dtype), tl.trans(b))
        scaling = tl.load(scaling_ptr + slot)
        y_ptrs = y_ptr + rows[:, None] * stride_yt + offs_n[None, :]
        out_mask = row_mask[:, None] & n_mask[None, :]
        y = tl.load(y_ptrs, mask=out_mask, other=0.0).to(tl.float32)
        tl.store(y_ptrs, (y + scaling * acc).to(y_ptr.dtype.element_ty), mask=out_mask)


def _block_m(max_segment_len: int) -> int:
    # tl.dot needs >= 16 rows; longer prefill segments take bigger tiles (fewer A/B re-reads).
    return 16 if max_segment_len <= 16 else 32 if max_segment_len <= 32 else 64


def check_lora_operands(
    x: torch.Tensor,  # [T, K]
    lora_a: torch.Tensor,  # [num_slots, num_shards * R, K]
    lora_b: torch.Tensor,  # [num_slots, N, R]
    scalings: torch.Tensor,  # [num_slots] fp32
    segments: LoRASegments,
    output_sizes: tuple[int, ...],
) -> None:
    """Raises ValueError unless the operands of one projection's delta match (the output `y`
    is the caller's: `[T, sum(output_sizes)]`)."""
    num_tokens, in_features = x.shape
    num_slots, stacked_rank, a_in = lora_a.shape
    max_rank = lora_b.shape[2]
    if a_in != in_features or stacked_rank != len(output_sizes) * max_rank:
        raise ValueError(
            f"lora_a {tuple(lora_a.shape)} does not match x {tuple(x.shape)} and "
            f"{len(output_sizes)} shard(s) of rank {max_rank}"
        )
    if tuple(lora_b.shape[:2]) != (num_slots, sum(output_sizes)):
        raise ValueError(
            f"lora_b {tuple(lora_b.shape)} does not match output sizes {output_sizes} and "
            f"{num_slots} slots"
        )
    if x.stride(1) != 1 or lora_a.stride(2) != 1 or lora_b.stride(2) != 1:
        raise ValueError("x, lora_a and lora_b must be contiguous in their last dimension")
    if scalings.shape != (num_slots,) or segments.token_slots.shape != (num_tokens,):
        raise ValueError("scalings must be [num_slots] and segments must cover x's tokens")


def takes_decode_kernels(segments: LoRASegments, output_sizes: tuple[int, ...]) -> bool:
    """One token per segment (decode: token_slots is each row's slot) and at most
    MAX_SHARDS shards: the decode kernels, else SGMV."""
    return segments.max_segment_len == 1 and len(output_sizes) <= MAX_SHARDS


def lora_apply(
    x: torch.Tensor,  # [T, K]
    y: torch.Tensor,  # [T, N], updated in place
    lora_a: torch.Tensor,  # [num_slots, num_shards * R, K]
    lora_b: torch.Tensor,  # [num_slots, N, R]
    scalings: torch.Tensor,  # [num_slots] fp32
    segments: LoRASegments,
    output_sizes: tuple[int, ...],
) -> torch.Tensor:
    """Triton: adds every token's adapter delta to `y` (in place) and returns `y`; one-token
    segments (decode) take the decode kernels, longer ones SGMV.

    Raises:
        ValueError: shapes, dtypes or devices that do not match.
    """
    check_lora_operands(x, lora_a, lora_b, scalings, segments, output_sizes)
    num_tokens = x.shape[0]
    if y.shape != (num_tokens, sum(output_sizes)) or y.stride(1) != 1:
        raise ValueError(
            f"y {tuple(y.shape)} must be [{num_tokens}, {sum(output_sizes)}], contiguous in "
            "its last dimension"
        )
    if segments.num_segments == 0 or num_tokens == 0:
        return y
    if takes_decode_kernels(segments, output_sizes):
        return lora_apply_decode(x, y, lora_a, lora_b, scalings, segments.token_slots, output_sizes)
    return lora_apply_sgmv(x, y, lora_a, lora_b, scalings, segments, output_sizes)


def lora_apply_sgmv(
    x: torch.Tensor,  # [T, K]
    y: torch.Tensor,  # [T, N], updated in place
    lora_a: torch.Tensor,  # [num_slots, num_shards * R, K]
    lora_b: torch.Tensor,  # [num_slots, N, R]
    scalings: torch.Tensor,  # [num_slots] fp32
    segments: LoRASegments,
    output_sizes: tuple[int, ...],
) -> torch.Tensor:
    """The SGMV kernels (shapes checked by `lora_apply`): every segment length."""
    num_tokens, in_features = x.shape
    stacked_rank, max_rank = lora_a.shape[1], lora_b.shape[2]
    block_m = _block_m(segments.max_segment_len)
    m_tiles = triton.cdiv(segments.max_segment_len, block_m)
    shrunk = torch.empty(num_tokens, stacked_rank, dtype=torch.float32, device=x.device)
    block_r = max(16, triton.next_power_of_2(min(stacked_rank, 64)))
    block_k = 64 if in_features >= 64 else max(16, triton.next_power_of_2(in_features))
    _lora_shrink_kernel[(segments.num_segments, m_tiles, triton.cdiv(stacked_rank, block_r))](
        x,
        lora_a,
        shrunk,
        segments.segment_starts,
        segments.segment_lens,
        segments.segment_slots,
        in_features,
        stacked_rank,
        x.stride(0),
        lora_a.stride(0),
        lora_a.stride(1),
        shrunk.stride(0),
        BLOCK_M=block_m,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
    )
    block_rank = max(16, triton.next_power_of_2(min(max_rank, 64)))
    offset = 0
    for shard, size in enumerate(output_sizes):  # <= 3 launches (q/k/v)
        block_n = 64 if size >= 64 else max(16, triton.next_power_of_2(size))
        _lora_expand_kernel[(segments.num_segments, m_tiles, triton.cdiv(size, block_n))](
            shrunk[:, shard * max_rank :],
            lora_b[:, offset:],
            y[:, offset:],
            scalings,
            segments.segment_starts,
            segments.segment_lens,
            segments.segment_slots,
            size,
            max_rank,
            shrunk.stride(0),
            lora_b.stride(0),
            lora_b.stride(1),
            y.stride(0),
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_R=block_rank,
        )
        offset += size
    return y


def make_lora_segments(
    request_slots: list[int],
    extend_lens: list[int],
    device: torch.device,
    *,
    merge_requests: bool,
) -> LoRASegments:
    """Segments of a packed batch: request i brings `extend_lens[i]` tokens under slot
    `request_slots[i]` (-1: base).

    Args:
        merge_requests: consecutive requests of one slot form one segment (extend batches:
            longer tiles). Decode passes False: one segment per row, so the grid depends on
            the batch size only (CUDA graphs).
    """
    if len(request_slots) != len(extend_lens):
        raise ValueError("request_slots and extend_lens need one entry per request")
    starts, lens, slots = [], [], []
    position = 0
    for slot, length in zip(request_slots, extend_lens, strict=True):  # per request, not token
        if merge_requests and slots and slots[-1] == slot:
            lens[-1] += length
        else:
            starts.append(position)
            lens.append(length)
            slots.append(slot)
        position += length
    # One copy that does not wait for the step in flight (a pageable one would, and the host's
    # work would stop overlapping it: 1.3x batch 1's LoRA step on the H200); each list
    # 16-byte aligned for the kernels (Triton compiles a variant per pointer alignment).
    segment_starts, segment_lens, segment_slots = host_parts_to_device(
        [starts, lens, slots], device, torch.int32
    )
    token_slots = torch.repeat_interleave(
        segment_slots, segment_lens.long(), output_size=position
    )  # [num_tokens]
    return LoRASegments(
        token_slots=token_slots,
        segment_starts=segment_starts,
        segment_lens=segment_lens,
        segment_slots=segment_slots,
        max_segment_len=max(lens, default=0),
        slots_present=tuple(sorted({slot for slot in slots if slot >= 0})),
        request_slots=tuple(request_slots),
    )
