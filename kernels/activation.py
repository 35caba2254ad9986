"""SiLU-and-mul in one kernel: `silu(x[..., :n]) * x[..., n:]` for the SwiGLU MLP.

Algorithm: grid `(num_rows, cdiv(n, BLOCK))`; each program reads BLOCK gate and up values of one
row and writes BLOCK outputs, so the fused gate_up projection's output is read once and the
intermediate silu(gate) never reaches memory. Rounding follows torch: silu(gate) is rounded to
the input dtype before the multiply.

`quantize_fp8=True` (for an FP8 `down_proj`, `fp8_gemm.py`): one program per row (the row's
amax is its scale), the product rounded to the input dtype as the unfused output would be, then
stored as e4m3 with the row's scale: `Fp8Activations`, the values `quantize_fp8_per_token`
would make of the unfused output, without its launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixgen.kernels.fp8_gemm import FP8_DTYPE, FP8_MAX, FP8_MIN_AMAX, Fp8Activations
from radixgen.kernels.gated_silu import silu_times_up
from radixgen.kernels.norm_rows import store_fp8_row
from radixgen.kernels.pdl import pdl_launch_options, wait_for_prior_grids


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [num_rows, 2 * n]
    delta_ptr,  # [num_rows, 2 * n] fp32, added to x first (read only if HAS_DELTA)
    out_ptr,  # [num_rows, n]
    stride_x_row,
    stride_delta_row,
    stride_out_row,
    n,
    HAS_DELTA: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr = False,  # pdl.py
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    wait_for_prior_grids(USE_PDL)
    gate = tl.load(x_ptr + row * stride_x_row + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x_row + n + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:  # rounded to x's dtype, as adding the delta into x first would be
        delta_row = delta_ptr + row * stride_delta_row
        gate += tl.load(delta_row + offs, mask=mask, other=0.0)
        up += tl.load(delta_row + n + offs, mask=mask, other=0.0)
        gate = gate.to(x_ptr.dtype.element_ty).to(tl.float32)
        up = up.to(x_ptr.dtype.element_ty).to(tl.float32)
    activated = silu_times_up(gate, up, x_ptr.dtype.element_ty)
    tl.store(
        out_ptr + row * stride_out_row + offs, activated.to(out_ptr.dtype.element_ty), mask=mask
    )


@triton.jit
def _silu_and_mul_fp8_kernel(
    x_ptr,  # [num_rows, 2 * n]
    out_ptr,  # [num_rows, n] e4m3
    scale_ptr,  # [num_rows] fp32
    stride_x_row,
    stride_out_row,
    n,
    BLOCK: tl.constexpr,  # >= n: the whole row, for its amax
    FP8_MAX_VALUE: tl.constexpr,
    MIN_AMAX: tl.constexpr,
    USE_PDL: tl.constexpr = False,  # pdl.py
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    wait_for_prior_grids(USE_PDL)
    gate = tl.load(x_ptr + row * stride_x_row + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x_row + n + offs, mask=mask, other=0.0).to(tl.float32)
    silu = (gate * tl.sigmoid(gate)).to(x_ptr.dtype.element_ty).to(tl.float32)
    y = (silu * up).to(x_ptr.dtype.element_ty).to(tl.float32)  # the unfused output
    store_fp8_row(
        y, mask, out_ptr + row * stride_out_row, scale_ptr + row, offs, FP8_MAX_VALUE, MIN_AMAX
    )


def silu_and_mul(
    x: torch.Tensor, quantize_fp8: bool = False, delta: torch.Tensor | None = None
) -> torch.Tensor | Fp8Activations:  # [..., 2n] -> [..., n]
    """silu(gate) * up, with gate and up the two halves of the last dimension of x; with
    `quantize_fp8`, quantized per row (`Fp8Activations` of [num_rows, n]).

    Args:
        delta: fp32 of x's shape, added to x first (rounded to x's dtype, as `x + delta`
            would be): a LoRA delta computed beside the gate_up GEMM (runtime/lora/layer.py).

    Raises:
        ValueError naming x when its last dimension is odd (or, quantizing, above 65536), or
        naming delta when its shape or dtype does not fit (or it comes with quantize_fp8).
    """
    if x.shape[-1] % 2 != 0:
        raise ValueError(f"x's last dimension must be even (gate | up), got {x.shape[-1]}")
    n = x.shape[-1] // 2
    rows = x.reshape(-1, 2 * n)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    if delta is not None:
        if quantize_fp8 or delta.shape != x.shape or delta.dtype != torch.float32:
            raise ValueError(
                f"delta must be float32 of x's shape {tuple(x.shape)} and without quantize_fp8,"
                f" got {delta.dtype} {tuple(delta.shape)}"
            )
        delta = delta.reshape(-1, 2 * n).contiguous()
    if quantize_fp8:
        return _silu_and_mul_fp8(rows, n)
    out = torch.empty((rows.shape[0], n), dtype=x.dtype, device=x.device)
    if rows.shape[0] > 0 and n > 0:
        block = min(1024, triton.next_power_of_2(n))
        _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(n, block))](
            rows,
            rows if delta is None else delta,  # not read without a delta
            out,
            rows.stride(0),
            0 if delta is None else delta.stride(0),
            out.stride(0),
            n,
            HAS_DELTA=delta is not None,
            BLOCK=block,
            num_warps=4,
            **pdl_launch_options(x.device),
        )
    return out.view(*x.shape[:-1], n)


def _silu_and_mul_fp8(rows: torch.Tensor, n: int) -> Fp8Activations:  # rows: [num_rows, 2n]
    if n > 65536:
        raise ValueError(
            f"quantize_fp8 takes rows of at most 65536 outputs, got x of width {2 * n}"
        )
    values = torch.empty((rows.shape[0], n), dtype=FP8_DTYPE, device=rows.device)
    scales = torch.empty(rows.shape[0], dtype=torch.float32, device=rows.device)
    if rows.shape[0] > 0 and n > 0:
        block = triton.next_power_of_2(n)
        _silu_and_mul_fp8_kernel[(rows.shape[0],)](
            rows, values, scales, rows.stride(0), values.stride(0), n,
            BLOCK=block, FP8_MAX_VALUE=FP8_MAX, MIN_AMAX=FP8_MIN_AMAX,
            num_warps=min(16, max(1, block // 512)), **pdl_launch_options(rows.device),
        )  # fmt: skip
    return Fp8Activations(values, scales, rows.dtype)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Plain-torch reference of `silu_and_mul`."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
