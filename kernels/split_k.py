"""Split-K epilogues shared by the skinny GEMMs (`int4_gemm.py`, `fp8_gemm.py`).

A split-K program multiplies one K slice of an output tile and stores fp32 partial sums. They
are summed in split order (deterministic, unlike atomics) either by one more launch, or in the
same launch by the tile's last program to arrive: each program counts itself on the tile's
int32 counter (acquire-release), and the one that completes the count reads every split's
partials from L2, writes the output and resets the counter to 0 for the next call. At decode a
launch costs ~2 us in a CUDA graph, so the in-kernel sum saves one per linear per layer. The
caller owns the counters (zeros, one per output tile, kept by the layer so that a CUDA graph
reads the same buffer each replay).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixgen.kernels.gated_silu import silu_times_up
from radixgen.kernels.norm_rows import store_normed
from radixgen.kernels.rope_store import rope_tile_rows, store_rope


@triton.jit
def tile_rows(
    pid_n, N, BLOCK_N: tl.constexpr, SILU_OUT: tl.constexpr = False, ROPE_HALF: tl.constexpr = 0
):
    """`(rows, mask)` `[BLOCK_N]`: the weight rows (output columns) of output tile `pid_n`.
    With SILU_OUT (a merged gate | up weight, N = 2 I, whose launch writes silu(gate) * up):
    gate rows `pid_n B/2 ..` in the first half, then the same up rows, `I + pid_n B/2 ..`, so
    the tile's epilogue holds both halves of its `B/2` activations (`store_split`). With
    ROPE_HALF > 0 (a qkv weight whose launch rotates and stores, `rope_store.py`): the two
    halves of its heads' pairs (`rope_tile_rows`)."""
    r = tl.arange(0, BLOCK_N)
    if ROPE_HALF > 0:
        rows, mask = rope_tile_rows(pid_n, N, BLOCK_N, ROPE_HALF)
    elif SILU_OUT:
        column = pid_n * (BLOCK_N // 2) + r % (BLOCK_N // 2)
        rows = column + (r // (BLOCK_N // 2)) * (N // 2)
        mask = column < N // 2
    else:
        rows = pid_n * BLOCK_N + r
        mask = rows < N
    return rows, mask


@triton.jit
def silu_columns(row, pid_n, N, BLOCK_N: tl.constexpr, SILU_OUT: tl.constexpr = False):
    """`(offsets, mask)` `[BLOCK_N / 2]` in the `[M, N / 2]` activation output of row `row`'s
    tile `pid_n` (`tile_rows`); without SILU_OUT two unused scalars (compiled away)."""
    if SILU_OUT:
        columns = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        offsets = row * (N // 2) + columns
        mask = columns < N // 2
    else:
        offsets = row
        mask = row < 0
    return offsets, mask


@triton.jit
def _store_added_and_norm(total, out_ptr, offsets, mask, norm, NORM_BLOCK: tl.constexpr):
    """The ADD_NORM epilogue (`norm`: a tuple, `gemv`'s `add_norm`): stores the tile's `h =
    output + residual` (the output rounded to out's dtype, the sum rounded again, as
    `fused_add_rms_norm` rounds it) into out (the new residual), counts the tile on its row's
    counter (acquire-release), and the row's last tile normalizes the whole row from L2 into
    `normed` (`store_normed`: the norm kernel's math) and resets the counter to 0."""
    residual_ptr, weight_ptr, normed_row_ptr, counter_ptr, row_start, tiles, hidden, eps = norm
    dtype = out_ptr.dtype.element_ty
    residual = tl.load(residual_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    h = (total.to(dtype).to(tl.float32) + residual).to(dtype)
    tl.store(out_ptr + offsets, h, mask=mask)
    tl.debug_barrier()  # every thread's h before the release of the (one-thread) atomic
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == tiles - 1:
        tl.debug_barrier()  # the acquire above orders every thread's loads below
        offs = tl.arange(0, NORM_BLOCK)
        row_mask = offs < hidden
        row = tl.load(out_ptr + row_start + offs, mask=row_mask, other=0.0, cache_modifier=".cg")
        store_normed(
            row.to(tl.float32), weight_ptr, normed_row_ptr, counter_ptr, out_ptr, offs, row_mask,
            hidden, eps, False, 0.0, 0.0,
        )  # fmt: skip
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def _store_output(
    total, out_ptr, offsets, mask, silu_offsets, silu_mask, SILU_OUT: tl.constexpr,
    norm=None, NORM_BLOCK: tl.constexpr = 0, rope=None, ROPE_HALF: tl.constexpr = 0,
    KV_FP8_MAX: tl.constexpr = 0.0,
):  # fmt: skip
    """Stores a tile's summed fp32 outputs at `offsets`, or with SILU_OUT its `B/2`
    activations `silu(gate) * up` (a token's: `[B/2]`, or `[BLOCK_M, B/2]` of a GEMM tile) at
    `silu_offsets` (`silu_columns`): gate and up each rounded
    to out's dtype first, as the GEMV's output would be, then as `silu_and_mul` rounds; with
    NORM_BLOCK > 0, `_store_added_and_norm`; with ROPE_HALF > 0 the rotary + KV-store epilogue
    (`rope`: (the kernel's rope tuple, `rope_load`'s values, token row, tile), `store_rope`)."""
    dtype = out_ptr.dtype.element_ty
    if ROPE_HALF > 0:
        rope_args, loaded, row, pid_n = rope[0], rope[1], rope[2], rope[3]
        store_rope(
            total, out_ptr, rope_args, loaded, row, pid_n, total.shape[0], ROPE_HALF, KV_FP8_MAX
        )
    elif NORM_BLOCK > 0:
        _store_added_and_norm(total, out_ptr, offsets, mask, norm, NORM_BLOCK)
    elif SILU_OUT:
        if len(total.shape) == 1:  # a GEMV's [B]
            halves = tl.permute(tl.reshape(total, [2, total.shape[0] // 2]), [1, 0])
        else:  # a GEMM's [BLOCK_M, B]: every token's row holds its gate then up columns
            halves = tl.reshape(total, [total.shape[0], 2, total.shape[1] // 2])
            halves = tl.permute(halves, [0, 2, 1])
        gate, up = tl.split(halves)  # [B/2] or [BLOCK_M, B/2] each (`tile_rows`' order)
        act = silu_times_up(gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32), dtype)
        tl.store(out_ptr + silu_offsets, act.to(dtype), mask=silu_mask)
    else:
        tl.store(out_ptr + offsets, total.to(dtype), mask=mask)


@triton.jit
def _add_four_partials(total, partial_ptr, offsets, first, stride_split, mask, num_splits):
    """`total` plus splits `first..first+3`'s fp32 partial sums at `offsets`, added in split
    order after the four loads are issued (splits past the last add 0), read from L2: other SMs
    wrote them."""
    parts = partial_ptr + offsets
    last = num_splits - 1  # a split past it reads the last one again, then adds 0 for it
    p0 = tl.load(parts + tl.minimum(first, last) * stride_split, mask=mask, cache_modifier=".cg")
    p1 = tl.load(
        parts + tl.minimum(first + 1, last) * stride_split, mask=mask, cache_modifier=".cg"
    )
    p2 = tl.load(
        parts + tl.minimum(first + 2, last) * stride_split, mask=mask, cache_modifier=".cg"
    )
    p3 = tl.load(
        parts + tl.minimum(first + 3, last) * stride_split, mask=mask, cache_modifier=".cg"
    )
    total += tl.where(first <= last, p0, 0.0)
    total += tl.where(first + 1 <= last, p1, 0.0)
    total += tl.where(first + 2 <= last, p2, 0.0)
    return total + tl.where(first + 3 <= last, p3, 0.0)


@triton.jit
def store_split(
    acc, out_ptr, partial_ptr, counter_ptr, offsets, mask, pid_k, num_splits, stride_split,
    SPLIT_MODE: tl.constexpr, WIDE_REDUCE: tl.constexpr, silu_offsets=None, silu_mask=None,
    SILU_OUT: tl.constexpr = False, norm=None, NORM_BLOCK: tl.constexpr = 0, rope=None,
    ROPE_HALF: tl.constexpr = 0, KV_FP8_MAX: tl.constexpr = 0.0,
):  # fmt: skip
    """Stores a program's fp32 sums `acc` at `offsets` of the `[M, N]` output (with SILU_OUT,
    the tile's activations at `silu_offsets` of the `[M, N / 2]` one; with NORM_BLOCK > 0, the
    residual add and the row's RMSNorm: `_store_output`; the partials stay at `offsets`).

    SPLIT_MODE 0: no split-K, store into out. 1: store the partial into its split's slice of
    `partial_ptr` (a reduce launch follows; not with SILU_OUT). 2: store the partial, then count
    the tile's arrived splits on `counter_ptr`; the last one sums the partials in split order
    (deterministic), writes out and resets the counter to 0 for the next call (no second
    launch).
    """
    tl.static_assert(
        not ((SILU_OUT or NORM_BLOCK > 0 or ROPE_HALF > 0) and SPLIT_MODE == 1),
        "SILU_OUT, NORM_BLOCK and ROPE_HALF sum their splits in-kernel",
    )
    if SPLIT_MODE == 0:
        _store_output(
            acc, out_ptr, offsets, mask, silu_offsets, silu_mask, SILU_OUT, norm, NORM_BLOCK,
            rope, ROPE_HALF, KV_FP8_MAX,
        )  # fmt: skip
    else:
        tl.store(partial_ptr + pid_k.to(tl.int64) * stride_split + offsets, acc, mask=mask)
        if SPLIT_MODE == 2:
            # Every thread's partial is stored before the release of the (one-thread) atomic.
            tl.debug_barrier()
            arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
            if arrived == num_splits - 1:
                tl.debug_barrier()  # the acquire above orders every thread's loads below
                total = tl.zeros_like(acc)
                if WIDE_REDUCE:  # few values a thread (GEMV): eight splits' loads in flight
                    for base in range(0, num_splits, 8):
                        total = _add_four_partials(
                            total, partial_ptr, offsets, base, stride_split, mask, num_splits
                        )
                        total = _add_four_partials(
                            total, partial_ptr, offsets, base + 4, stride_split, mask, num_splits
                        )
                else:  # a GEMM tile: one split at a time (registers)
                    for split in range(0, num_splits):
                        total += tl.load(
                            partial_ptr + split * stride_split + offsets,
                            mask=mask,
                            other=0.0,
                            cache_modifier=".cg",  # from L2: other SMs wrote them
                        )
                _store_output(
                    total, out_ptr, offsets, mask, silu_offsets, silu_mask, SILU_OUT, norm,
                    NORM_BLOCK, rope, ROPE_HALF, KV_FP8_MAX,
                )  # fmt: skip
                tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def reduce_splits_kernel(
    partial_ptr,  # [SPLIT_K, M * N] fp32
    out_ptr,  # [M * N] output dtype
    numel,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for split in tl.static_range(SPLIT_K):
        acc += tl.load(partial_ptr + split * numel + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def paired_tiles(n: int, block_n: int) -> int:
    """Output tiles of an `n`-row weight whose tiles pair rows (`tile_rows` with SILU_OUT or
    ROPE_HALF): `block_n / 2` pairs a tile."""
    return triton.cdiv(n // 2, block_n // 2)


def split_buffers(
    out: torch.Tensor,  # [M, out width]: the output (narrower than the weight's rows with an
    #                     epilogue that pairs them: silu_out, rope_store)
    splits: int,
    tiles: int,  # output tiles of the launch grid (its first two axes)
    split_k_counters: torch.Tensor | None,
    weight_rows: int | None = None,  # the partials' width; default out's
    in_kernel: bool = False,  # the epilogue needs each tile's summed splits (no reduce launch)
) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(SPLIT_MODE, partials, counters) of a launch with `splits` K splits: 0 with one split
    (`out` stands in for both buffers), 2 when the caller's counters cover the tiles, else 1
    (`finish_splits` then sums the partials).

    Raises:
        ValueError: counters that are not int32 on out's device; an `in_kernel` launch with
            splits but too few counters.
    """
    if splits == 1:
        return 0, out, out
    m, n = out.shape[0], weight_rows or out.shape[1]
    partial = torch.empty((splits, m, n), dtype=torch.float32, device=out.device)
    counters = split_k_counters
    if counters is not None and (counters.dtype != torch.int32 or counters.device != out.device):
        raise ValueError(f"split_k_counters must be int32 on {out.device}")
    if counters is not None and counters.numel() >= tiles:
        return 2, partial, counters
    if in_kernel:
        raise ValueError(
            f"this epilogue with {splits} K splits needs split_k_counters for {tiles} tiles"
        )
    return 1, partial, out


def finish_splits(
    split_mode: int, partial: torch.Tensor, out: torch.Tensor, block: int = 1024
) -> torch.Tensor:
    """`out` once its partials are summed: one reduce launch in SPLIT_MODE 1, nothing else."""
    if split_mode == 1:
        splits, m, n = partial.shape
        reduce_splits_kernel[(triton.cdiv(m * n, block),)](
            partial, out, m * n, SPLIT_K=splits, BLOCK=block
        )
    return out
