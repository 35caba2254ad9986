"""RMSNorm in one kernel: `weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`.

Algorithm: one program per row (the hidden size fits one block: next power of two, masked).
The row is read once, the mean of squares is taken in fp32, and the normalised row is rounded
to the input dtype before the weight multiply, as the torch module does (the two agree within
bf16 rounding; the fp32 sum runs in another order). Unfused, the same math is eight elementwise
and reduction launches; at decode batch sizes those launches, not bytes, are the cost.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
    rstd = tl.math.rsqrt(tl.sum(x * x, 0) / hidden + eps)
    normed = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + row * stride_out_row + offs,
        (normed * weight).to(out_ptr.dtype.element_ty),
        mask=mask,
    )


def rms_norm(
    x: torch.Tensor,  # [..., hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # [..., hidden], dtype promote(x, weight)
    """RMS-normalises the last dimension of x and scales it by weight.

    Raises:
        ValueError/TypeError naming the argument on bad shapes or dtypes.
    """
    if weight.dim() != 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"weight must be [hidden={x.shape[-1]}], got {tuple(weight.shape)} for x {tuple(x.shape)}"
        )
    if not x.is_floating_point() or not weight.is_floating_point():
        raise TypeError(f"x and weight must be floating point, got {x.dtype} and {weight.dtype}")
    hidden = x.shape[-1]
    if hidden > 65536:
        raise ValueError(f"hidden size must be <= 65536, got {hidden}")
    rows = x.reshape(-1, hidden)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if rows.shape[0] > 0:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(rows.shape[0],)](
            rows,
            weight,
            out,
            rows.stride(0),
            out.stride(0),
            hidden,
            eps,
            BLOCK=block,
            num_warps=min(16, max(1, block // 256)),
        )
    return out.view(x.shape)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain-torch reference of `rms_norm` (the transformers formulation)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)
