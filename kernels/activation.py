"""SiLU-and-mul in one kernel: `silu(x[..., :n]) * x[..., n:]` for the SwiGLU MLP.

Algorithm: grid `(num_rows, cdiv(n, BLOCK))`; each program reads BLOCK gate and up values of one
row and writes BLOCK outputs, so the fused gate_up projection's output is read once and the
intermediate silu(gate) never reaches memory. Rounding follows torch: silu(gate) is rounded to
the input dtype before the multiply.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [num_rows, 2 * n]
    out_ptr,  # [num_rows, n]
    stride_x_row,
    stride_out_row,
    n,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    gate = tl.load(x_ptr + row * stride_x_row + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x_row + n + offs, mask=mask, other=0.0).to(tl.float32)
    silu = (gate * tl.sigmoid(gate)).to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(
        out_ptr + row * stride_out_row + offs, (silu * up).to(out_ptr.dtype.element_ty), mask=mask
    )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # [..., 2n] -> [..., n]
    """silu(gate) * up, with gate and up the two halves of the last dimension of x.

    Raises:
        ValueError naming x when its last dimension is odd.
    """
    if x.shape[-1] % 2 != 0:
        raise ValueError(f"x's last dimension must be even (gate | up), got {x.shape[-1]}")
    n = x.shape[-1] // 2
    rows = x.reshape(-1, 2 * n)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], n), dtype=x.dtype, device=x.device)
    if rows.shape[0] > 0 and n > 0:
        block = min(1024, triton.next_power_of_2(n))
        _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(n, block))](
            rows, out, rows.stride(0), out.stride(0), n, BLOCK=block, num_warps=4
        )
    return out.view(*x.shape[:-1], n)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Plain-torch reference of `silu_and_mul`."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
