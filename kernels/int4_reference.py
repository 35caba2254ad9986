"""The int4 runtime layout in plain torch: the row packing, input checks, and the references the
Triton kernels of kernels/int4_gemm.py are tested against (and that `int4_linear` runs on the
CPU).

    qweight [K / 8, N] int32   word [i, n] holds input rows 8 i + j of column n in nibble j
    scales, zeros [K / G, N]   one per group of G input rows (zeros: integers 0..16)
"""

from __future__ import annotations

import torch

INT4_PER_INT32 = 8


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
    codes = unpack_int4_rows(qweight).float()  # [K, N]
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


def unpack_int4_rows(packed: torch.Tensor) -> torch.Tensor:  # [8 R, C] uint8
    """`[R, C] int32` -> `[8 R, C]` codes: row `8 i + j` is nibble j of packed row i."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)  # [8]
    codes = (packed[:, None, :] >> shifts[None, :, None]) & 0xF  # [R, 8, C]
    return codes.reshape(-1, packed.shape[1]).to(torch.uint8)


def pack_int4_rows(codes: torch.Tensor) -> torch.Tensor:  # [R / 8, C] int32
    """Inverse of `unpack_int4_rows`: `[R, C]` codes in 0..15 (R a multiple of 8)."""
    rows, cols = codes.shape
    if rows % INT4_PER_INT32:
        raise ValueError(f"codes must have a multiple of 8 rows, got {rows}")
    grouped = codes.to(torch.int32).reshape(rows // 8, 8, cols)  # [R / 8, 8, C]
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=codes.device)
    # Nibbles occupy disjoint bits: their sum is their bitwise or (bit 31 wraps to the sign).
    return (grouped << shifts[None, :, None]).sum(1, dtype=torch.int32)
