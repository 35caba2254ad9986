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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_normed(h, weight_ptr, out_row_ptr, rounding_ptr, offs, mask, hidden, eps):
    """Stores `h * rsqrt(mean(h^2) + eps) * weight` (h: [BLOCK] fp32 row), the normalised row
    rounded to `rounding_ptr`'s dtype before the weight multiplies it, as torch's RMSNorm."""
    rstd = tl.math.rsqrt(tl.sum(h * h, 0) / hidden + eps)
    normed = (h * rstd).to(rounding_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_row_ptr + offs, (normed * weight).to(out_row_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [num_rows, hidden]
    weight_ptr,  # [hidden]
    out_ptr,  # [num_rows, hidden]
    stride_x_row,
    stride_out_row,
    hidden,
    eps,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x_row + offs, mask=mask, other=0.0).to(tl.float32)
    _store_normed(x, weight_ptr, out_ptr + row * stride_out_row, x_ptr, offs, mask, hidden, eps)


@triton.jit
def _fused_add_rms_norm_kernel(
    x_ptr,  # [num_rows, hidden]
    residual_ptr,  # [num_rows, hidden]
    weight_ptr,  # [hidden]
    out_ptr,  # [num_rows, hidden]
    sum_ptr,  # [num_rows, hidden]: x + residual, the next residual
    stride_x_row,
    stride_residual_row,
    stride_out_row,
    stride_sum_row,
    hidden,
    eps,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x_row + offs, mask=mask, other=0.0).to(tl.float32)
    residual = tl.load(residual_ptr + row * stride_residual_row + offs, mask=mask, other=0.0)
    # Rounded to the storage dtype, as torch's `x + residual` is, before the norm reads it.
    summed = (x + residual.to(tl.float32)).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + row * stride_sum_row + offs, summed, mask=mask)
    h = summed.to(tl.float32)
    _store_normed(h, weight_ptr, out_ptr + row * stride_out_row, sum_ptr, offs, mask, hidden, eps)


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


def _launch_options(hidden: int) -> dict:
    block = triton.next_power_of_2(hidden)
    return {"BLOCK": block, "num_warps": min(16, max(1, block // 256))}


def rms_norm(
    x: torch.Tensor,  # [..., hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # [..., hidden], dtype promote(x, weight)
    """RMS-normalises the last dimension of x and scales it by weight.

    Raises:
        ValueError/TypeError naming the argument on bad shapes or dtypes.
    """
    hidden = _check_norm_inputs(x, weight)
    rows = _rows(x, hidden)
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if rows.shape[0] > 0:
        _rms_norm_kernel[(rows.shape[0],)](
            rows, weight, out, rows.stride(0), out.stride(0), hidden, eps, **_launch_options(hidden)
        )
    return out.view(x.shape)


def fused_add_rms_norm(
    x: torch.Tensor,  # [..., hidden]
    residual: torch.Tensor,  # [..., hidden], same shape and dtype as x
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`h = x + residual` and `rms_norm(h, weight, eps)` in one pass over the rows.

    Returns:
        (normed [..., hidden] in promote(x, weight), h [..., hidden] in x's dtype: the next
        layer's residual).

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
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    summed = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0] > 0:
        _fused_add_rms_norm_kernel[(rows.shape[0],)](
            rows, residual_rows, weight, out, summed,
            rows.stride(0), residual_rows.stride(0), out.stride(0), summed.stride(0),
            hidden, eps, **_launch_options(hidden),
        )  # fmt: skip
    return out.view(x.shape), summed.view(x.shape)


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
