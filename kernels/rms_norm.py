"""RMSNorm in one kernel: `weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`, alone
(`rms_norm`) or after the residual add that precedes it in every decoder layer
(`fused_add_rms_norm`: `h = x + residual; return rms_norm(h), h`).

Algorithm: one program per row (the hidden size fits one block: next power of two, masked).
The row is read once, the mean of squares is taken in fp32, and the normalised row is rounded
to the input dtype before the weight multiply, as the torch module does (the two agree within
bf16 rounding; the fp32 sum runs in another order). Unfused, the same math is eight elementwise
and reduction launches; at decode batch sizes those launches, not bytes, are the cost.
The fused variant rounds the sum to the storage dtype before normalising it, exactly as
`x + residual` in torch would, so it changes no value; it saves the add's launch and one
write and read of the row.

`quantize_fp8=True` (both functions; for the FP8 linear that follows, `fp8_gemm.py`): the row
is rounded to the input dtype as the unfused output would be, then stored as e4m3 with its
per-token scale (`Fp8Activations`), the very values `quantize_fp8_per_token` would make of the
unfused output, without its launch or the bf16 row's round trip through memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixgen.kernels.fp8_gemm import FP8_DTYPE, FP8_MAX, FP8_MIN_AMAX, Fp8Activations
from radixgen.kernels.norm_rows import store_normed
from radixgen.kernels.pdl import pdl_launch_options, wait_for_prior_grids


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [num_rows, hidden]
    weight_ptr,  # [hidden]
    out_ptr,  # [num_rows, hidden]: promote(x, weight), or e4m3 when QUANT
    scale_ptr,  # [num_rows] fp32 when QUANT (else unused)
    stride_x_row,
    stride_out_row,
    hidden,
    eps,
    BLOCK: tl.constexpr,
    QUANT: tl.constexpr,
    FP8_MAX_VALUE: tl.constexpr,
    MIN_AMAX: tl.constexpr,
    USE_PDL: tl.constexpr = False,  # pdl.py
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    wait_for_prior_grids(USE_PDL)
    x = tl.load(x_ptr + row * stride_x_row + offs, mask=mask, other=0.0).to(tl.float32)
    out_row = out_ptr + row * stride_out_row
    store_normed(
        x, weight_ptr, out_row, scale_ptr + row, x_ptr, offs, mask, hidden, eps,
        QUANT, FP8_MAX_VALUE, MIN_AMAX,
    )  # fmt: skip


@triton.jit
def _fused_add_rms_norm_kernel(
    x_ptr,  # [num_rows, hidden]
    residual_ptr,  # [num_rows, hidden]
    weight_ptr,  # [hidden]
    out_ptr,  # [num_rows, hidden]: promote(x, weight), or e4m3 when QUANT
    sum_ptr,  # [num_rows, hidden]: x + residual, the next residual
    scale_ptr,  # [num_rows] fp32 when QUANT (else unused)
    stride_x_row,
    stride_residual_row,
    stride_out_row,
    stride_sum_row,
    hidden,
    eps,
    BLOCK: tl.constexpr,
    QUANT: tl.constexpr,
    FP8_MAX_VALUE: tl.constexpr,
    MIN_AMAX: tl.constexpr,
    USE_PDL: tl.constexpr = False,  # pdl.py
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    wait_for_prior_grids(USE_PDL)
    x = tl.load(x_ptr + row * stride_x_row + offs, mask=mask, other=0.0).to(tl.float32)
    residual = tl.load(residual_ptr + row * stride_residual_row + offs, mask=mask, other=0.0)
    # Rounded to the storage dtype, as torch's `x + residual` is, before the norm reads it.
    summed = (x + residual.to(tl.float32)).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + row * stride_sum_row + offs, summed, mask=mask)
    h = summed.to(tl.float32)
    out_row = out_ptr + row * stride_out_row
    store_normed(
        h, weight_ptr, out_row, scale_ptr + row, sum_ptr, offs, mask, hidden, eps,
        QUANT, FP8_MAX_VALUE, MIN_AMAX,
    )  # fmt: skip


def _check_norm_inputs(x: torch.Tensor, weight: torch.Tensor) -> int:
    """Returns the hidden size after checking `weight` against `x`."""
    if weight.dim() != 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"weight must be [hidden={x.shape[-1]}], got {tuple(weight.shape)} for x {tuple(x.shape)}"
        )
    if not x.is_floating_point() or not weight.is_floating_point():
        raise TypeError(f"x and weight must be floating point, got {x.dtype} and {weight.dtype}")
    hidden = x.shape[-1]
    if hidden > 65536:
        raise ValueError(f"hidden size must be <= 65536, got {hidden}")
    return hidden


def _rows(x: torch.Tensor, hidden: int) -> torch.Tensor:  # [num_rows, hidden], unit stride
    rows = x.reshape(-1, hidden)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _launch_options(hidden: int, quantize_fp8: bool) -> dict:
    block = triton.next_power_of_2(hidden)
    return {
        "BLOCK": block,
        "num_warps": min(16, max(1, block // 256)),
        "QUANT": quantize_fp8,
        "FP8_MAX_VALUE": FP8_MAX,
        "MIN_AMAX": FP8_MIN_AMAX,
    }


def _outputs(rows: torch.Tensor, weight: torch.Tensor, quantize_fp8: bool):
    """The normed rows' buffer ([num_rows, hidden]: promote(x, weight), or e4m3) and the
    per-row scales ([num_rows] fp32 when quantizing; else a 1-element placeholder)."""
    if not quantize_fp8:
        dtype = torch.promote_types(rows.dtype, weight.dtype)
        return torch.empty(rows.shape, dtype=dtype, device=rows.device), rows.new_empty(1)
    if weight.dtype != rows.dtype:
        raise ValueError(
            f"quantize_fp8 needs weight in x's dtype {rows.dtype} (the unfused output's), "
            f"got {weight.dtype}"
        )
    scales = torch.empty(rows.shape[0], dtype=torch.float32, device=rows.device)
    return torch.empty(rows.shape, dtype=FP8_DTYPE, device=rows.device), scales


def _normed(out: torch.Tensor, scales: torch.Tensor, x: torch.Tensor, quantize_fp8: bool):
    """The caller's view of the normed rows: shaped like x, or its `Fp8Activations`."""
    if quantize_fp8:
        return Fp8Activations(out, scales, x.dtype)
    return out.view(x.shape)


def rms_norm(
    x: torch.Tensor,  # [..., hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    quantize_fp8: bool = False,
) -> torch.Tensor | Fp8Activations:  # [..., hidden], dtype promote(x, weight)
    """RMS-normalises the last dimension of x and scales it by weight; with `quantize_fp8`,
    returns the result quantized per row (`Fp8Activations` of [num_rows, hidden]).

    Raises:
        ValueError/TypeError naming the argument on bad shapes or dtypes.
    """
    hidden = _check_norm_inputs(x, weight)
    rows = _rows(x, hidden)
    out, scales = _outputs(rows, weight, quantize_fp8)
    if rows.shape[0] > 0:
        _rms_norm_kernel[(rows.shape[0],)](
            rows, weight, out, scales, rows.stride(0), out.stride(0), hidden, eps,
            **_launch_options(hidden, quantize_fp8), **pdl_launch_options(x.device),
        )  # fmt: skip
    return _normed(out, scales, x, quantize_fp8)


def fused_add_rms_norm(
    x: torch.Tensor,  # [..., hidden]
    residual: torch.Tensor,  # [..., hidden], same shape and dtype as x
    weight: torch.Tensor,  # [hidden]
    eps: float,
    quantize_fp8: bool = False,
) -> tuple[torch.Tensor | Fp8Activations, torch.Tensor]:
    """`h = x + residual` and `rms_norm(h, weight, eps, quantize_fp8)` in one pass over the
    rows.

    Returns:
        (normed [..., hidden] in promote(x, weight), or its `Fp8Activations` with
        `quantize_fp8`; h [..., hidden] in x's dtype: the next layer's residual).

    Raises:
        ValueError/TypeError naming the argument on bad shapes or dtypes.
    """
    hidden = _check_norm_inputs(x, weight)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"residual must match x {tuple(x.shape)} {x.dtype}, got "
            f"{tuple(residual.shape)} {residual.dtype}"
        )
    rows, residual_rows = _rows(x, hidden), _rows(residual, hidden)
    out, scales = _outputs(rows, weight, quantize_fp8)
    summed = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0] > 0:
        _fused_add_rms_norm_kernel[(rows.shape[0],)](
            rows, residual_rows, weight, out, summed, scales,
            rows.stride(0), residual_rows.stride(0), out.stride(0), summed.stride(0),
            hidden, eps, **_launch_options(hidden, quantize_fp8), **pdl_launch_options(x.device),
        )  # fmt: skip
    return _normed(out, scales, x, quantize_fp8), summed.view(x.shape)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain-torch reference of `rms_norm` (the transformers formulation)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch reference of `fused_add_rms_norm`: the add, then `rms_norm_ref`."""
    summed = x + residual
    return rms_norm_ref(summed, weight, eps), summed
