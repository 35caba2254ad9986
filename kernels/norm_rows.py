"""Row epilogues shared by the norm, activation and GEMV kernels: a row stored as e4m3 with its
per-token scale (`store_fp8_row`), and a row's RMSNorm (`store_normed`, `rms_norm.py`'s math),
in a module of their own so that the GEMVs' epilogues (`split_k.py`) can use them without
importing the kernels that import the GEMVs."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def store_fp8_row(y, mask, out_row_ptr, scale_ptr, offs, FP8_MAX_VALUE, MIN_AMAX):
    """Stores the fp32 row `y` ([BLOCK], zero where masked) as e4m3 with its per-row scale
    `amax / FP8_MAX_VALUE` (the one per-token quantization of every kernel here)."""
    amax = tl.maximum(tl.max(tl.abs(y), 0), MIN_AMAX)
    scale = amax / FP8_MAX_VALUE
    yq = tl.clamp(y / scale, -FP8_MAX_VALUE, FP8_MAX_VALUE)
    tl.store(out_row_ptr + offs, yq.to(out_row_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr, scale)


@triton.jit
def store_normed(
    h,
    weight_ptr,
    out_row_ptr,
    scale_ptr,
    rounding_ptr,
    offs,
    mask,
    hidden,
    eps,
    QUANT: tl.constexpr,
    FP8_MAX_VALUE: tl.constexpr,
    MIN_AMAX: tl.constexpr,
):
    """Stores `h * rsqrt(mean(h^2) + eps) * weight` (h: [BLOCK] fp32 row), the normalised row
    rounded to `rounding_ptr`'s dtype before the weight multiplies it, as torch's RMSNorm.
    QUANT: the product rounded to that dtype too (the unfused output), then e4m3 values into
    `out_row_ptr` and the row's scale into `scale_ptr`."""
    rstd = tl.math.rsqrt(tl.sum(h * h, 0) / hidden + eps)
    normed = (h * rstd).to(rounding_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if QUANT:
        y = (normed * weight).to(rounding_ptr.dtype.element_ty).to(tl.float32)
        store_fp8_row(y, mask, out_row_ptr, scale_ptr, offs, FP8_MAX_VALUE, MIN_AMAX)
    else:
        tl.store(out_row_ptr + offs, (normed * weight).to(out_row_ptr.dtype.element_ty), mask=mask)
