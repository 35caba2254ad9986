"""The MLP activation `silu(gate) * up` as one jit function, rounded once per step as the
model's dtype would round it, shared by the activation kernel (`activation.py`) and the GEMVs
that compute it as they load their input (`gemv.py`, `int4_gemm.py`: `gated`), so the fused and
unfused paths give the same bits; and the GEMVs' x loads (`load_x`) and |x| maximum (`abs_max`)
built on it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def silu_times_up_ref(gate_up: torch.Tensor) -> torch.Tensor:  # [..., 2n] -> [..., n]
    """`silu_times_up` in torch over the two halves of the last dimension (gate first),
    rounded as the kernels round: silu to gate_up's dtype, then the product."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    silu = (gate * torch.sigmoid(gate)).to(gate_up.dtype).float()
    return (silu * up).to(gate_up.dtype)


@triton.jit
def silu_times_up(gate, up, DTYPE: tl.constexpr):
    """float32 `silu(gate) * up` of float32 `gate` and `up`: silu rounded to DTYPE first (as
    storing it would), then the product rounded to DTYPE (returned as float32)."""
    silu = (gate * tl.sigmoid(gate)).to(DTYPE).to(tl.float32)
    return (silu * up).to(DTYPE).to(tl.float32)


@triton.jit
def load_gated_x(x_row, cols, mask, K):
    """`silu_times_up` float32 at `cols` of one `[2K]` gate | up row (gate first) in x's dtype:
    what the activation kernel would have stored there (0 where `mask`, or None: none)."""
    if mask is None:  # every column in range
        gate = tl.load(x_row + cols).to(tl.float32)
        up = tl.load(x_row + K + cols).to(tl.float32)
    else:
        gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_row + K + cols, mask=mask, other=0.0).to(tl.float32)
    return silu_times_up(gate, up, x_row.dtype.element_ty)


@triton.jit
def load_x(x_row, offs, K, GATED: tl.constexpr, mask=None):
    """x's float32 values at `offs` (0 where masked): with GATED, `silu(gate) * up` of the
    `[2K]` gate | up row, as the activation kernel would have stored it."""
    # One return (Triton compiles the code after a return inside a constexpr branch).
    if GATED:
        x = load_gated_x(x_row, offs, mask, K)
    elif mask is None:
        x = tl.load(x_row + offs).to(tl.float32)
    else:
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
    return x


@triton.jit
def abs_max(x_row, start, end, K, GATED: tl.constexpr, BLOCK: tl.constexpr = 256):
    """The largest |x| of x[start:end] as float32 (at least 1e-30; `load_x`'s x)."""
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for k in range(start, end, BLOCK):
        offs = k + tl.arange(0, BLOCK)
        amax = tl.maximum(amax, tl.abs(load_x(x_row, offs, K, GATED, offs < end)))
    return tl.maximum(tl.max(amax), 1e-30)
