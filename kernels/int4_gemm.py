"""int4 weight-only linear layers (AWQ / GPTQ checkpoints after the load-time repack):

    y[m, n] = sum_k x[m, k] * (q[k, n] - zero[g(k), n]) * scale[g(k), n]   (+ bias[n])

with 4-bit codes `q` in 0..15, one `scale` and `zero` per group of `group_size` consecutive
input rows, `g(k) = k // group_size`.

Runtime layout (every checkpoint format is repacked into it at load time,
runtime/models/int4_linear.py):
- `qweight: [K / 8, N] int32`: word `[i, n]` holds rows `k = 8 i + j` of column n in its nibble
  j (bits 4j..4j+3) -- GPTQ's order, packed along K, so a `[BLOCK_K, BLOCK_N]` tile is
  `BLOCK_K / 8` contiguous rows of N words (coalesced along N);
- `scales: [K / group_size, N]` and `zeros: [K / group_size, N]` in the activation dtype
  (zeros are small integers, exact in fp16/bf16).

Two Triton kernels, chosen by the number of tokens M (`int4_linear` dispatches):
- M <= GEMV_M_MAX (decode): `_int4_gemv_kernel`, a split-K GEMV. Grid `(M, cdiv(N, BLOCK_N),
  split_k)`: each program reduces a `[K / split_k, BLOCK_N]` slice of the weight against one
  token's activations on the CUDA cores; the other tokens' programs re-read the same slice from
  L2. Split-K fills the GPU when N / BLOCK_N alone would not. Per tile it computes
  `scale * (sum_k x q - zero * sum_k x)`: no per-weight subtraction or scale.
- larger M: `_int4_gemm_kernel`, a tiled dequantize-GEMM on the tensor cores (`tl.dot`), with
  split-K for the mid-size M whose tile grid is small;
- M >= DEQUANTIZE_M_MIN (prefill): `dequantize_int4` writes the bf16 weight in one pass, then
  cuBLAS multiplies (compute-bound: cuBLAS's tiles beat a Triton tile that also dequantizes). It multiplies by `q - zero` (an exact
  small integer in x's dtype) and applies the group's scale to each tile's partial sums.
In both, each packed word is loaded once and split into its 8 nibbles in registers, and a
`BLOCK_K <= group_size` tile lies in one group (one scale per output per tile). Both compile for
sm_90 without spills at the default configs (checked with Triton's ptxas on the CPU: GEMV 80
registers a thread, GEMM 114 at BLOCK_M = 64 with 8 warps).
Splits write fp32 partials summed in a fixed order (deterministic).
On the CPU `int4_linear` runs `int4_linear_ref` (dequantize to float32, then matmul).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# The FP8 GEMM's split-K epilogue, shared: [SPLIT_K, M * N] fp32 partials -> [M * N] output.
from radixgen.kernels.fp8_gemm import _split_k_reduce_kernel

INT4_PER_INT32 = 8
# Tokens up to which the CUDA-core GEMV beats the tensor-core GEMM (at M = 1 the GEMV reads
# the weight once; from a few tokens the GEMM reads it once for up to BLOCK_M of them).
GEMV_M_MAX = 4
# Tokens from which dequantizing the weight (one pass, bf16 [K, N]) and multiplying with cuBLAS
# beats the fused dequantize-GEMM: the product is compute-bound there, and cuBLAS's bf16 GEMM is
# faster than a Triton tile that also dequantizes (prefill).
DEQUANTIZE_M_MIN = 256


@triton.jit
def _packed_tile(
    qweight_ptr, scales_ptr, zeros_ptr, k, k_end, offs_n, mask_n, N,
    GROUP_SIZE: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The codes `[BLOCK_K / 8, 8, BLOCK_N]` int32 of the tile at rows `k..k+BLOCK_K` (row
    `k + 8 r + j` at `[r, j]`), and its group's scales and zeros `[BLOCK_N]` float32. Each packed
    word is loaded once and split into its 8 nibbles in registers; the tile lies in one group
    (BLOCK_K divides GROUP_SIZE and k is a multiple of BLOCK_K)."""
    rows = k // 8 + tl.arange(0, BLOCK_K // 8)
    words = tl.load(
        qweight_ptr + rows.to(tl.int64)[:, None] * N + offs_n[None, :],
        mask=(rows * 8 < k_end)[:, None] & mask_n[None, :],
        other=0,
    )  # [BLOCK_K / 8, BLOCK_N]
    codes = (words[:, None, :] >> (tl.arange(0, 8) * 4)[None, :, None]) & 0xF
    group_row = (k // GROUP_SIZE) * N  # < 2^31: K / group_size * N is small
    scale = tl.load(scales_ptr + group_row + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    zero = tl.load(zeros_ptr + group_row + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    return codes, scale, zero


@triton.jit
def _int4_gemv_kernel(
    x_ptr,  # [M, K]
    qweight_ptr,  # [K / 8, N] int32
    scales_ptr,  # [K / GROUP_SIZE, N]
    zeros_ptr,  # [K / GROUP_SIZE, N]
    out_ptr,  # SPLIT_K == 1: [M, N] x's dtype; else [SPLIT_K, M, N] fp32 partials
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K
    stride_xm,
    stride_split,
    GROUP_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    pid_k = tl.program_id(2)
    mask_n = offs_n < N
    offs_r = tl.arange(0, BLOCK_K // 8)  # packed rows of a tile
    nibbles = tl.arange(0, 8)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k in range(k_start, k_end, BLOCK_K):
        codes, scale, zero = _packed_tile(
            qweight_ptr, scales_ptr, zeros_ptr, k, k_end, offs_n, mask_n, N, GROUP_SIZE, BLOCK_K
        )
        rows = k // 8 + offs_r
        x = tl.load(
            x_ptr + row * stride_xm + rows[:, None] * 8 + nibbles[None, :],
            mask=(rows * 8 < k_end)[:, None],
            other=0.0,
        ).to(tl.float32)  # [BLOCK_K / 8, 8]: x[k + 8 r + j] at [r, j], as the codes
        x_dot_q = tl.sum(tl.sum(x[:, :, None] * codes.to(tl.float32), axis=1), axis=0)
        # sum_k x (q - z) s = s (sum_k x q - z sum_k x): no per-weight subtraction or scale.
        acc += (x_dot_q - zero * tl.sum(tl.sum(x, axis=1), axis=0)) * scale
    out = out_ptr + pid_k.to(tl.int64) * stride_split + row * N + offs_n
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _int4_gemm_kernel(
    x_ptr,  # [M, K]
    qweight_ptr,  # [K / 8, N] int32
    scales_ptr,  # [K / GROUP_SIZE, N]
    zeros_ptr,  # [K / GROUP_SIZE, N]
    out_ptr,  # SPLIT_K == 1: [M, N] x's dtype; else [SPLIT_K, M, N] fp32 partials
    M,
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K
    stride_xm,
    stride_split,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    pid_k = tl.program_id(2)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k in range(k_start, k_end, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + ks[None, :], mask=mask_m[:, None] & (ks < k_end)[None, :], other=0.0)
        codes, scale, zero = _packed_tile(
            qweight_ptr, scales_ptr, zeros_ptr, k, k_end, offs_n, mask_n, N, GROUP_SIZE, BLOCK_K
        )
        codes = tl.reshape(codes, [BLOCK_K, BLOCK_N])  # row 8 r + j = [r, j]: order kept
        # q - zero is an integer in [-16, 15]: exact in x's dtype, so the dot is exact up to
        # the fp32 accumulation; the scale is applied to the tile's partial sums.
        w = (codes.to(tl.float32) - zero[None, :]).to(x.dtype)
        acc += tl.dot(x, w) * scale[None, :]
    out = (
        out_ptr
        + pid_k.to(tl.int64) * stride_split
        + offs_m.to(tl.int64)[:, None] * N
        + offs_n[None, :]
    )
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _dequantize_int4_kernel(
    qweight_ptr,  # [K / 8, N] int32
    scales_ptr,  # [K / GROUP_SIZE, N]
    zeros_ptr,  # [K / GROUP_SIZE, N]
    out_ptr,  # [K, N]
    N,
    K,
    GROUP_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    k = tl.program_id(0) * BLOCK_K
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    codes, scale, zero = _packed_tile(
        qweight_ptr, scales_ptr, zeros_ptr, k, K, offs_n, mask_n, N, GROUP_SIZE, BLOCK_K
    )
    weight = (codes.to(tl.float32) - zero[None, None, :]) * scale[None, None, :]
    rows = k + tl.arange(0, BLOCK_K // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]  # [R, 8]
    out = out_ptr + rows.to(tl.int64)[:, :, None] * N + offs_n[None, None, :]
    mask = (rows < K)[:, :, None] & mask_n[None, None, :]
    tl.store(out, weight.to(out_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _multiprocessor_count(device_index: int | None) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _largest_block_k(group_size: int, limit: int) -> int:
    """The largest power of two <= limit, >= 8, dividing group_size (a tile in one group)."""
    block_k = limit
    while group_size % block_k:
        block_k //= 2
    return block_k


def default_int4_config(m: int, n: int, k: int, group_size: int, device: torch.device) -> dict:
    """Kernel, block sizes and split-K of `int4_gemm` for an `[m, k] x [k, n]` product.

    Split-K is chosen so that the grid has about four programs per SM, each with at least two
    BLOCK_K steps; BLOCK_K divides the group size (one scale per tile).
    """
    gemv = m <= GEMV_M_MAX
    block_m = 1 if gemv else min(64, max(16, triton.next_power_of_2(m)))
    # GEMV: a [BLOCK_K / 8, 8, BLOCK_N] fp32 tile is 8K values, 64 registers a thread at 4 warps.
    block_n = 64
    block_k = _largest_block_k(group_size, 128 if gemv else 64)
    num_sms = _multiprocessor_count(device.index) if device.type == "cuda" else 8
    tiles = (m if gemv else triton.cdiv(m, block_m)) * triton.cdiv(n, block_n)
    max_split = max(1, k // (2 * block_k))
    split_k = max(1, min(max_split, 16, triton.next_power_of_2(triton.cdiv(4 * num_sms, tiles))))
    return {
        "gemv": gemv,
        "block_m": block_m,
        "block_n": block_n,
        "block_k": block_k,
        "split_k": split_k,
        # 8 warps halve the GEMM's registers a thread at BLOCK_M = 64 (ptxas, sm_90: 114).
        "num_warps": 8 if block_m >= 64 else 4,
        "num_stages": 3,
    }


def int4_gemm(
    x: torch.Tensor,  # [M, K] bf16/fp16/fp32
    qweight: torch.Tensor,  # [K / 8, N] int32
    scales: torch.Tensor,  # [K / group_size, N]
    zeros: torch.Tensor,  # [K / group_size, N]
    group_size: int,
    **overrides,
) -> torch.Tensor:  # [M, N] x's dtype
    """The Triton int4 product `x @ dequantize_int4_ref(...)` (no bias).

    Args:
        overrides: tuning keys of `default_int4_config` (benchmarks and tests).

    Raises:
        ValueError naming the argument on bad shapes, dtypes, strides or group size.
    """
    check_int4_inputs(x, qweight, scales, zeros, group_size)
    m, k = x.shape
    n = qweight.shape[1]
    config = default_int4_config(m, n, k, group_size, x.device)
    unknown = set(overrides) - set(config)
    if unknown:
        raise ValueError(f"unknown int4_gemm overrides {sorted(unknown)}")
    config.update({name: value for name, value in overrides.items() if value is not None})
    if not config["gemv"]:
        config["block_m"] = max(16, config["block_m"])  # tl.dot needs 16 rows
    block_k = config["block_k"]
    if group_size % block_k or block_k % 8:
        raise ValueError(
            f"block_k={block_k} must divide group_size={group_size} and be a multiple of 8"
        )
    k_per_split = triton.cdiv(triton.cdiv(k, config["split_k"]), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)  # no empty splits
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    partial = (
        out if splits == 1 else torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    )
    common = dict(GROUP_SIZE=group_size, BLOCK_N=config["block_n"], BLOCK_K=block_k)
    launch = dict(num_warps=config["num_warps"], num_stages=config["num_stages"])
    if config["gemv"]:
        grid = (m, triton.cdiv(n, config["block_n"]), splits)
        _int4_gemv_kernel[grid](
            x, qweight, scales, zeros, partial, n, k, k_per_split, x.stride(0), m * n,
            **common, **launch,
        )  # fmt: skip
    else:
        grid = (triton.cdiv(m, config["block_m"]), triton.cdiv(n, config["block_n"]), splits)
        _int4_gemm_kernel[grid](
            x, qweight, scales, zeros, partial, m, n, k, k_per_split, x.stride(0), m * n,
            BLOCK_M=config["block_m"], **common, **launch,
        )  # fmt: skip
    if splits > 1:  # one launch sums the partials in a fixed order and casts (deterministic)
        block = 1024
        _split_k_reduce_kernel[(triton.cdiv(m * n, block),)](
            partial, out, m * n, SPLIT_K=splits, BLOCK=block
        )
    return out


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
            f"qweight must be [K / 8, N] int32 with K={k}, got {tuple(qweight.shape)} {qweight.dtype}"
        )
    expected = (k // group_size, qweight.shape[1])
    for name, tensor in (("scales", scales), ("zeros", zeros)):
        if tuple(tensor.shape) != expected or not tensor.is_floating_point():
            raise ValueError(
                f"{name} must be a float {expected} tensor, got {tuple(tensor.shape)} {tensor.dtype}"
            )
    for name, tensor in (("qweight", qweight), ("scales", scales), ("zeros", zeros)):
        if not tensor.is_contiguous() or tensor.device != x.device:
            raise ValueError(f"{name} must be contiguous and on x's device {x.device}")


def dequantize_int4(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:  # [K, N] scales' dtype
    """The Triton twin of `dequantize_int4_ref`: `(q - zero) * scale` in one pass over the
    packed weight, rounded once to the scales' dtype."""
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    check_int4_inputs(torch.empty(0, k, device=qweight.device), qweight, scales, zeros, group_size)
    out = torch.empty((k, n), dtype=scales.dtype, device=qweight.device)
    block_n, block_k = 64, _largest_block_k(group_size, 64)
    grid = (triton.cdiv(k, block_k), triton.cdiv(n, block_n))
    _dequantize_int4_kernel[grid](
        qweight, scales, zeros, out, n, k, GROUP_SIZE=group_size, BLOCK_N=block_n, BLOCK_K=block_k
    )
    return out


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


def int4_linear(
    x: torch.Tensor,  # [..., K]
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:  # [..., N] x's dtype
    """`x @ W + bias` with an int4 W: on CUDA the Triton GEMV or GEMM by M, or from
    DEQUANTIZE_M_MIN tokens the dequantized weight through cuBLAS; the reference on CPU."""
    if x.device.type != "cuda":
        return int4_linear_ref(x, qweight, scales, zeros, group_size, bias)
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] >= DEQUANTIZE_M_MIN:
        weight = dequantize_int4(qweight, scales, zeros, group_size).to(x.dtype)  # [K, N]
        out = flat @ weight if bias is None else torch.addmm(bias, flat, weight)
        return out.reshape(*x.shape[:-1], out.shape[-1])
    out = int4_gemm(
        flat if flat.stride(-1) == 1 else flat.contiguous(), qweight, scales, zeros, group_size
    )
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


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
