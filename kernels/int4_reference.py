"""The int4 runtime layout in plain torch: the row packing, input checks, and the references the
Triton kernels of kernels/int4_gemm.py are tested against (and that `int4_linear` runs on the
CPU).

    qweight [K / 8, N] int32   eight input rows of column n per word, one per nibble
    scales, zeros [K / G, N]   one per group of G input rows (zeros: integers 0..16)

Which rows share a word is the packing's span S (rows per interleaved chunk, W = S / 8 words):
word `[i, n]` holds row `(i // W) S + j W + i % W` in nibble j. S = 8 is GPTQ's own order
(rows 8 i + j; checkpoints use it). The runtime layout takes S = 128 when every 128-row chunk
lies in one group (`runtime_span`): nibble j of a chunk's 16 words is then 16 consecutive input
rows, the K side of one tensor-core dot, with no reshuffle of the unpacked tile.
"""

from __future__ import annotations

import torch

INT4_PER_INT32 = 8
INTERLEAVED_SPAN = 128  # rows per chunk of the runtime layout (16 words x 8 nibbles)


def runtime_span(group_size: int) -> int:
    """The runtime layout's span for a group size: 128 when a chunk lies in one group (group
    sizes that are multiples of 128, the common AWQ / GPTQ 128 among them), else GPTQ's 8."""
    return INTERLEAVED_SPAN if group_size % INTERLEAVED_SPAN == 0 else INT4_PER_INT32


def check_int4_inputs(x, qweight, scales, zeros, group_size) -> None:
    """Raises ValueError naming the argument whose shape, dtype or layout is wrong."""
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be [M, K] with unit stride along K, got {tuple(x.shape)}")
    m, k = x.shape
    if group_size <= 0 or group_size % 8 or k % group_size:
        raise ValueError(
            f"group_size must be a positive multiple of 8 dividing K={k}, got {group_size}"
        )
    if qweight.dtype != torch.int32 or qweight.dim() != 2 or qweight.shape[0] * 8 != k:
        raise ValueError(
            f"qweight must be [K / 8, N] int32 with K={k}, "
            f"got {tuple(qweight.shape)} {qweight.dtype}"
        )
    expected = (k // group_size, qweight.shape[1])
    for name, tensor in (("scales", scales), ("zeros", zeros)):
        if tuple(tensor.shape) != expected or not tensor.is_floating_point():
            raise ValueError(
                f"{name} must be a float {expected} tensor, "
                f"got {tuple(tensor.shape)} {tensor.dtype}"
            )
    for name, tensor in (("qweight", qweight), ("scales", scales), ("zeros", zeros)):
        if not tensor.is_contiguous() or tensor.device != x.device:
            raise ValueError(f"{name} must be contiguous and on x's device {x.device}")


def dequantize_int4_ref(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:  # [K, N] float32
    """`(q - zero) * scale` of the runtime layout, in float32."""
    codes = unpack_int4_rows(qweight, runtime_span(group_size)).float()  # [K, N]
    zeros_per_row = zeros.float().repeat_interleave(group_size, 0)
    return (codes - zeros_per_row) * scales.float().repeat_interleave(group_size, 0)


def int4_linear_ref(
    x: torch.Tensor,  # [..., K]
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:  # [..., N] x's dtype
    """Dequantize to float32, then multiply in float32."""
    out = x.float() @ dequantize_int4_ref(qweight, scales, zeros, group_size)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def unpack_int4_rows(packed: torch.Tensor, span: int = INT4_PER_INT32) -> torch.Tensor:
    """`[R, C] int32` -> `[8 R, C]` uint8 codes: with span S (W = S / 8 words a chunk), row
    `(i // W) S + j W + i % W` is nibble j of packed row i (S = 8: row 8 i + j, GPTQ's order)."""
    words = span // INT4_PER_INT32
    rows, cols = packed.shape
    if rows % words:
        raise ValueError(f"packed must have a multiple of {words} rows for span {span}")
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)  # [8]
    chunks = packed.reshape(rows // words, 1, words, cols)  # [chunk, 1, i % W, C]
    codes = (chunks >> shifts[None, :, None, None]) & 0xF  # [chunk, j, i % W, C]
    return codes.reshape(-1, cols).to(torch.uint8)


def pack_int4_rows(codes: torch.Tensor, span: int = INT4_PER_INT32) -> torch.Tensor:
    """Inverse of `unpack_int4_rows`: `[R, C]` codes in 0..15 (R a multiple of the span) ->
    `[R / 8, C]` int32."""
    rows, cols = codes.shape
    if span % INT4_PER_INT32 or rows % span:
        raise ValueError(f"codes must have a multiple of span={span} rows, got {rows}")
    words = span // INT4_PER_INT32
    grouped = codes.to(torch.int32).reshape(rows // span, 8, words, cols)  # [chunk, j, i % W, C]
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=codes.device)
    # Nibbles occupy disjoint bits: their sum is their bitwise or (bit 31 wraps to the sign).
    packed = (grouped << shifts[None, :, None, None]).sum(1, dtype=torch.int32)
    return packed.reshape(rows // 8, cols)
