"""FP8 (e4m3) linear layers: W8A8 with per-output-channel weight scales and dynamic per-token
activation scales, bf16/fp16/fp32 output.

    y[m, n] = (sum_k xq[m, k] * wq[n, k]) * x_scale[m] * w_scale[n]  (+ bias[n])

where `xq = x / x_scale` and `wq = w / w_scale` are e4m3 with `scale = amax / 448` per row.

Two GEMMs, chosen by the number of tokens M (`fp8_linear` dispatches):

- small M (decode, <= SMALL_M_MAX): `fp8_gemm`, a Triton skinny GEMM. Grid `(cdiv(M, BLOCK_M),
  cdiv(N, BLOCK_N), split_k)`: each program multiplies a `[BLOCK_M, K / split_k]` slice of the
  activations by a `[K / split_k, BLOCK_N]` slice of the weight on the fp8 tensor cores (M is
  padded to 16 rows with masked loads), so every weight byte is read exactly once and the grid
  still fills the GPU when N / BLOCK_N alone would not. Splits write scaled fp32 partials that
  are summed in a fixed order (deterministic, unlike atomics): in the same launch by each
  tile's last program when the caller passes `split_k_counters` (the FP8 layers keep theirs),
  else by a second small kernel (`split_k.py`); with one split the GEMM stores the output
  itself. Launch sizes: `fp8_gemm_configs.json` per shape and token count where the H200
  sweep (`scripts/bench_fp8_gemm.py --sweep`) filled it, else a heuristic.
  cuBLASLt (`torch._scaled_mm`) is slower than bf16 at these shapes (measured on the H200).
- large M (prefill): `torch._scaled_mm` (cuBLASLt FP8) with row-wise scales.

Activations are quantized by one Triton kernel per call (`quantize_fp8_per_token`), unless
they arrive quantized already (`Fp8Activations`: the RMSNorm or SiLU-and-mul kernel before the
linear wrote e4m3 values and per-token scales in its own pass, `rms_norm.py`, `activation.py`):
at decode, that saves the quantize launch of three of a layer's four linears. On the CPU
`fp8_linear` runs `fp8_linear_ref`: the same quantization in torch (float8_e4m3fn exists on the
CPU), then the product of the dequantized operands in float32 (emulated FP8).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from radixgen.kernels.gated_silu import silu_times_up_ref
from radixgen.kernels.gemv import GemvConfig, gemv
from radixgen.kernels.launch_tables import (
    BucketRows,
    load_json_table,
    parse_shape_rows,
    select_bounded_bucket,
)
from radixgen.kernels.norm_rows import store_fp8_row
from radixgen.kernels.pdl import pdl_launch_options, prefetch_to_l2, wait_for_prior_grids
from radixgen.kernels.rope_store import RopeStore, rope_store_ref
from radixgen.kernels.split_k import finish_splits, split_buffers, store_split

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448
# amax floor: an all-zero row gets a tiny positive scale instead of a division by zero.
FP8_MIN_AMAX = 1e-12
# Tokens up to which the Triton skinny GEMM beats cuBLASLt FP8 (issue 19's H200 figures:
# `_scaled_mm` loses to bf16 at M <= 64 and wins from M = 256).
SMALL_M_MAX = 64


@dataclass(frozen=True)
class Fp8Activations:
    """Activations quantized per token by the kernel that produced them: `values * scales[:,
    None]` approximates them, exactly as `quantize_fp8_per_token` of the unquantized tensor
    would (the producers round to `dtype` first, then quantize the same way)."""

    values: torch.Tensor  # [M, K] e4m3
    scales: torch.Tensor  # [M] fp32
    dtype: torch.dtype  # the unquantized activations' dtype: the linear's output dtype

    @property
    def shape(self) -> torch.Size:
        return self.values.shape


@triton.jit
def _quantize_per_token_kernel(
    x_ptr,  # [M, K] bf16/fp16/fp32
    xq_ptr,  # [M, K] fp8 e4m3
    scale_ptr,  # [M] fp32
    K,
    stride_x,
    stride_xq,
    FP8_MAX_VALUE: tl.constexpr,
    MIN_AMAX: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,  # pdl.py
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    mask = offs < K
    wait_for_prior_grids(USE_PDL)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    store_fp8_row(x, mask, xq_ptr + row * stride_xq, scale_ptr + row, offs, FP8_MAX_VALUE, MIN_AMAX)


@triton.jit
def _fp8_gemm_kernel(
    x_ptr,  # [M, K] fp8 e4m3
    w_ptr,  # [N, K] fp8 e4m3
    x_scale_ptr,  # [M] fp32
    w_scale_ptr,  # [N] fp32
    out_ptr,  # [M, N] output dtype
    partial_ptr,  # [splits, M, N] fp32 partials (SPLIT_MODE > 0)
    counters_ptr,  # [>= tiles] int32 zeros (SPLIT_MODE == 2)
    M,
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K
    stride_xm,
    stride_wn,
    stride_om,
    stride_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_MODE: tl.constexpr,  # 0: one split; 1: partials, a reduce launch; 2: summed in-kernel
    SWAP_AB: tl.constexpr = False,  # out^T = W x^T: the weight rows on the dot's M side
    USE_PDL: tl.constexpr = False,  # pdl.py
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn

    # Hopper's FP8 tensor-core instruction (wgmma) takes 64 rows on its M side: with few
    # tokens (BLOCK_M 16) the product in token-major form compiles to mma.sync with both
    # operands converted to fp16. Swapped, the weight rows fill the M side and the tokens sit
    # on N (wgmma takes N = 8 .. 256): FP8 straight from shared memory, both K-major.
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    # The first two K steps' weight rows (constant; in bounds) head for L2 while the previous
    # kernel ends.
    first_rows = w_ptr + tl.minimum(offs_n, N - 1).to(tl.int64) * stride_wn + k_start
    prefetch_to_l2(first_rows, USE_PDL)
    prefetch_to_l2(tl.where(k_start + BLOCK_K < k_end, first_rows + BLOCK_K, first_rows), USE_PDL)
    wait_for_prior_grids(USE_PDL)
    for k in range(k_start, k_end, BLOCK_K):
        ks = k + offs_k
        mask_k = ks < k_end
        x = tl.load(x_rows + ks[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        # [BLOCK_N, BLOCK_K] rows of the [N, K] row-major weight, contiguous in K (the K-major
        # operand FP8 tensor-core instructions read).
        w = tl.load(w_rows + ks[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        if SWAP_AB:
            acc = tl.dot(w, tl.trans(x), acc)  # [BLOCK_N, BLOCK_M]
        else:
            acc = tl.dot(x, tl.trans(w), acc)  # [BLOCK_M, BLOCK_N]

    x_scale = tl.load(x_scale_ptr + offs_m, mask=mask_m, other=0.0)
    w_scale = tl.load(w_scale_ptr + offs_n, mask=mask_n, other=0.0)
    tile = pid_m * tl.num_programs(1) + pid_n
    if SWAP_AB:
        acc = acc * w_scale[:, None] * x_scale[None, :]
        offsets = offs_m.to(tl.int64)[None, :] * stride_om + offs_n[:, None]
        mask = mask_n[:, None] & mask_m[None, :]
    else:
        acc = acc * x_scale[:, None] * w_scale[None, :]
        offsets = offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        mask = mask_m[:, None] & mask_n[None, :]
    store_split(
        acc, out_ptr, partial_ptr, counters_ptr + tile, offsets, mask, pid_k,
        tl.num_programs(2), stride_split, SPLIT_MODE, WIDE_REDUCE=False,
    )  # fmt: skip


@functools.cache
def _multiprocessor_count(device_index: int | None) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@dataclass(frozen=True)
class Fp8GemmLaunch:
    """A table row's launch sizes for `fp8_gemm` (BLOCK_M and BLOCK_K stay the heuristic's)."""

    block_n: int  # output columns (weight rows) per program
    split_k: int  # programs sharing one output tile's K range
    num_warps: int
    swap_ab: bool = False  # the weight rows on the dot's M side (Hopper's FP8 wgmma at M < 64)

    def __post_init__(self) -> None:
        if self.swap_ab and self.block_n < 64:
            raise ValueError(f"swap_ab takes block_n >= 64 (wgmma's M side), got {self.block_n}")
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"block_n must be a power of two >= 16, got {self.block_n}")
        if not 1 <= self.split_k <= 64:
            raise ValueError(f"split_k must be in 1..64, got {self.split_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")


# {(K, N): ((max_tokens, launch), ...)}, max_tokens ascending, all <= SMALL_M_MAX.
Fp8GemmTable = dict[tuple[int, int], BucketRows]
DEFAULT_TABLE_PATH = Path(__file__).with_name("fp8_gemm_configs.json")


def parse_fp8_gemm_table(data: dict) -> Fp8GemmTable:
    """Validates the JSON form (written by `scripts/bench_fp8_gemm.py --sweep`):

        {"note": ..., "source": ..., "shapes": {"4096x6144": [
            {"max_tokens": 1, "block_n": 64, "split_k": 4, "num_warps": 4}]}}

    keyed by "in_features x out_features" (K x N); a GEMM with more tokens than every row's
    bound takes the heuristic. Raises ValueError naming the row."""
    table = parse_shape_rows(data, Fp8GemmLaunch, "FP8 GEMM table", bounded=True)
    for (k, n), rows in table.items():
        if rows[-1][0] > SMALL_M_MAX:
            raise ValueError(f"shape {k}x{n}: max_tokens above SMALL_M_MAX ({SMALL_M_MAX})")
    return table


@functools.cache
def load_fp8_gemm_table(path: Path = DEFAULT_TABLE_PATH) -> Fp8GemmTable:
    """The parsed table (read once per path); empty when the file does not exist."""
    return load_json_table(path, parse_fp8_gemm_table)


def gemm_config(
    m: int, n: int, k: int, device: torch.device, table: Fp8GemmTable | None = None
) -> dict[str, int]:
    """`fp8_gemm`'s launch for an `[m, k] x [k, n]` product: the GPU's table row for this
    shape and token count where it has one (`fp8_gemm_configs.json`, swept on the H200), over
    `default_gemm_config`."""
    config = default_gemm_config(m, n, k, device)
    rows = (load_fp8_gemm_table() if table is None else table).get((k, n))
    launch = select_bounded_bucket(rows, m)
    if launch is not None:
        config.update(dataclasses.asdict(launch))
    return config


def default_gemm_config(m: int, n: int, k: int, device: torch.device) -> dict[str, int]:
    """The heuristic block sizes and split-K of `fp8_gemm` for an `[m, k] x [k, n]` product.

    BLOCK_M covers M (16..64: the fp8 tensor-core minimum is 16 rows); split-K is chosen so that
    the grid has about four programs per SM, each with at least two BLOCK_K steps, and the fp32
    partials cost at most a quarter of the weight's bytes. (The H200 sweep found this splits
    too finely at the 8B shapes: 69 against 83 us a layer at M = 1; the table overrides it.)
    """
    block_m = min(64, max(16, triton.next_power_of_2(m)))
    block_n, block_k = 64, 128
    num_sms = _multiprocessor_count(device.index) if device.type == "cuda" else 8
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    # Each split writes and the reduction reads an fp32 [M, N] partial (8 * M * N bytes): keep
    # that traffic within a quarter of the weight's N * K bytes, i.e. splits <= K / (32 * M).
    max_split = max(1, min(k // (2 * block_k), k // (32 * m)))
    split_k = max(1, min(max_split, 16, triton.next_power_of_2(triton.cdiv(4 * num_sms, tiles))))
    return {
        "block_m": block_m,
        "block_n": block_n,
        "block_k": block_k,
        "split_k": split_k,
        "num_warps": 4,
        "num_stages": 4,
        "swap_ab": False,
    }


def quantize_fp8_per_token(
    x: torch.Tensor,  # [M, K] float
) -> tuple[torch.Tensor, torch.Tensor]:  # ([M, K] e4m3, [M] fp32)
    """Dynamic per-row (per-token) e4m3 quantization: `x ~= xq * scale[:, None]`.

    One Triton kernel on CUDA; `quantize_fp8_per_token_ref` elsewhere.
    """
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be a [M, K] tensor contiguous in K, got {tuple(x.shape)}")
    if not x.is_cuda:
        return quantize_fp8_per_token_ref(x)
    return quantize_fp8_per_token_triton(x)


def quantize_fp8_per_token_triton(
    x: torch.Tensor,  # [M, K] float, contiguous in K
) -> tuple[torch.Tensor, torch.Tensor]:  # ([M, K] e4m3, [M] fp32)
    """The Triton kernel of `quantize_fp8_per_token` on x's device (on the CPU only under the
    interpreter: the tests compare the fused producers with it there, whose e4m3 rounding of
    values just below a power of two differs from torch's)."""
    m, k = x.shape
    xq = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0:
        return xq, scale
    block_k = triton.next_power_of_2(k)
    _quantize_per_token_kernel[(m,)](
        x,
        xq,
        scale,
        k,
        x.stride(0),
        xq.stride(0),
        FP8_MAX_VALUE=FP8_MAX,
        MIN_AMAX=FP8_MIN_AMAX,
        BLOCK_K=block_k,
        **pdl_launch_options(x.device),
        num_warps=min(16, max(1, block_k // 512)),
    )
    return xq, scale


def quantize_fp8_activations(x: torch.Tensor) -> Fp8Activations:  # x: [M, K]
    """`quantize_fp8_per_token(x)` as `Fp8Activations` (the producers' fallback path)."""
    values, scales = quantize_fp8_per_token(x)
    return Fp8Activations(values, scales, x.dtype)


def quantize_fp8_per_token_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch reference of `quantize_fp8_per_token` (also the per-channel weight
    quantizer: a weight's output channels are its rows)."""
    x = x.float()
    scale = x.abs().amax(dim=-1).clamp(min=FP8_MIN_AMAX) / FP8_MAX  # [M]
    xq = (x / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return xq, scale


def fp8_gemm(
    xq: torch.Tensor,  # [M, K] e4m3
    x_scale: torch.Tensor,  # [M] fp32
    weight: torch.Tensor,  # [N, K] e4m3
    weight_scale: torch.Tensor,  # [N] fp32
    out_dtype: torch.dtype,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    split_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    swap_ab: bool | None = None,
    split_k_counters: torch.Tensor | None = None,
) -> torch.Tensor:  # [M, N] out_dtype
    """The Triton W8A8 GEMM: `(xq @ weight.T) * x_scale[:, None] * weight_scale[None, :]`.

    Tuning overrides (benchmarks) default to `gemm_config` (the table, else the heuristic). `split_k_counters`: int32
    zeros on xq's device, at least one per output tile (`fp8_split_k_counter_slots(N)` covers
    every M <= SMALL_M_MAX), left zeros: split-K partials are then summed in the same launch.

    Raises:
        ValueError/TypeError naming the argument on bad shapes, dtypes or strides.
    """
    _check_gemm_inputs(xq, x_scale, weight, weight_scale)
    m, k = xq.shape
    n = weight.shape[0]
    config = gemm_config(m, n, k, xq.device)
    overrides = {
        "block_m": block_m,
        "block_n": block_n,
        "block_k": block_k,
        "split_k": split_k,
        "num_warps": num_warps,
        "num_stages": num_stages,
        "swap_ab": swap_ab,
    }
    config.update({name: value for name, value in overrides.items() if value is not None})
    block_k, splits = config["block_k"], config["split_k"]
    k_per_split = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)  # no empty splits
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0:
        return out
    grid = (triton.cdiv(m, config["block_m"]), triton.cdiv(n, config["block_n"]), splits)
    # Splits write fp32 partials, summed in a fixed order (deterministic): in-kernel by each
    # tile's last program when counters cover the tiles, else by one more launch.
    split_mode, partial, counters = split_buffers(out, splits, grid[0] * grid[1], split_k_counters)
    _fp8_gemm_kernel[grid](
        xq,
        weight,
        x_scale,
        weight_scale,
        out,
        partial,
        counters,
        m,
        n,
        k,
        k_per_split,
        xq.stride(0),
        weight.stride(0),
        n,
        m * n,
        BLOCK_M=config["block_m"],
        BLOCK_N=config["block_n"],
        BLOCK_K=block_k,
        SPLIT_MODE=split_mode,
        SWAP_AB=config["swap_ab"],
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
        **pdl_launch_options(xq.device),
    )
    return finish_splits(split_mode, partial, out)


def fp8_split_k_counter_slots(n: int) -> int:
    """Counters that let every `fp8_gemm` of an N-column weight up to SMALL_M_MAX tokens sum
    its splits in-kernel: one per output tile of the smallest tiles a launch uses (16 x 16:
    the heuristic's and the table's `block_n` are >= 16)."""
    return triton.cdiv(SMALL_M_MAX, 16) * triton.cdiv(n, 16)


def _check_gemm_inputs(xq, x_scale, weight, weight_scale) -> None:
    if xq.dim() != 2 or weight.dim() != 2 or xq.shape[1] != weight.shape[1]:
        raise ValueError(
            f"xq must be [M, K] and weight [N, K] with the same K, got {tuple(xq.shape)} and "
            f"{tuple(weight.shape)}"
        )
    for name, t in (("xq", xq), ("weight", weight)):
        if t.dtype != FP8_DTYPE:
            raise TypeError(f"{name} must be {FP8_DTYPE}, got {t.dtype}")
        if t.stride(1) != 1:
            raise ValueError(f"{name} must be contiguous in K")
    for name, t, size in (
        ("x_scale", x_scale, xq.shape[0]),
        ("weight_scale", weight_scale, weight.shape[0]),
    ):
        if t.shape != (size,) or t.dtype != torch.float32:
            raise ValueError(
                f"{name} must be a float32 [{size}] tensor, got {t.dtype} {tuple(t.shape)}"
            )


def fp8_scaled_mm(
    xq: torch.Tensor,  # [M, K] e4m3
    x_scale: torch.Tensor,  # [M] fp32
    weight: torch.Tensor,  # [N, K] e4m3
    weight_scale: torch.Tensor,  # [N] fp32
    out_dtype: torch.dtype,
    *,
    use_fast_accum: bool = False,
) -> torch.Tensor:  # [M, N]
    """cuBLASLt FP8 GEMM with row-wise scales (`torch._scaled_mm`); K and N multiples of 16.

    `weight.t()` of a row-major `[N, K]` weight is the column-major `[K, N]` operand cuBLASLt
    wants, so the weight is never copied.
    """
    return torch._scaled_mm(
        xq,
        weight.t(),
        scale_a=x_scale[:, None],
        scale_b=weight_scale[None, :],
        out_dtype=out_dtype,
        use_fast_accum=use_fast_accum,
    )


def fp8_linear(
    x: torch.Tensor | Fp8Activations,  # [..., K] bf16/fp16/fp32, or [M, K] quantized
    weight: torch.Tensor,  # [N, K] e4m3
    weight_scale: torch.Tensor,  # [N] fp32
    bias: torch.Tensor | None = None,  # [N]
    split_k_counters: torch.Tensor | None = None,  # int32 zeros (`fp8_gemm`, `gemv`)
    gemv_configs: dict[int, GemvConfig] | None = None,  # tokens -> the FP8 GEMV's launch
    silu_out: bool = False,  # gate | up weight: silu(gate) * up, [..., N / 2] (GEMV only)
    rope_store: RopeStore | None = None,  # q | k | v weight: rotated q, k / v stored (GEMV)
    fast_accum: bool = False,  # cuBLASLt's FP8 fast accumulation (`torch._scaled_mm`'s)
) -> torch.Tensor:  # [..., N], x.dtype
    """`x @ dequant(weight).T + bias` through FP8: activations quantized per token.

    CUDA: the FP8 split-K GEMV (`gemv.py`) for the token counts `gemv_configs` lists (the
    layer resolves them from `gemv_fp8_configs.json` once), else the Triton skinny GEMM for
    M <= SMALL_M_MAX tokens, `torch._scaled_mm` above (the Triton GEMM too where cuBLASLt's
    rules fail: fp16/fp32 output, K or N not a multiple of 16). Elsewhere: `fp8_linear_ref`.
    `Fp8Activations` skip the quantization; so do 16-bit activations whose GEMV launch is
    `a16` (W8A16: e4m3 weights times x as it is, `gemv.py`). `silu_out` (no bias; only at the
    token counts `gemv_configs` lists): the GEMV writes `silu_and_mul` of the product.
    `rope_store` (no bias; GEMV token counts only): the rotated q of the q | k | v product, k
    and v written into its caches (`kernels/rope_store.py`). `fast_accum`: the `_scaled_mm`
    path (M > SMALL_M_MAX) lets the tensor cores accumulate each K block in their own reduced
    precision before adding it to fp32 (`use_fast_accum`, as vLLM's and SGLang's Hopper FP8
    GEMMs do): 5-12% faster at 256-8192 tokens on the H200 (docs/benchmarks.md); the other
    paths accumulate in fp32 either way.
    """
    if not weight.is_cuda:
        out = fp8_linear_ref(x, weight, weight_scale, bias)
        if rope_store is not None:
            return rope_store_ref(out.reshape(-1, out.shape[-1]), rope_store)
        return silu_times_up_ref(out) if silu_out else out
    quantized = isinstance(x, Fp8Activations)
    tokens = x.shape[0] if quantized else x.numel() // max(1, x.shape[-1])
    gemv_config = gemv_configs.get(tokens) if gemv_configs else None
    if (silu_out or rope_store is not None) and (gemv_config is None or bias is not None):
        raise ValueError(
            "silu_out and rope_store take a GEMV launch (gemv_configs at these tokens), no bias"
        )
    n_out = weight.shape[0] // 2 if silu_out else weight.shape[0]
    if rope_store is not None:
        n_out = rope_store.q_width
    if gemv_config is not None and gemv_config.a16 and not quantized:
        # W8A16 GEMV: the activations as they are, no quantization pass.
        x2d = x.reshape(-1, x.shape[-1])
        x2d = x2d if x2d.stride(1) == 1 else x2d.contiguous()
        out = gemv(
            x2d, weight, gemv_config, split_k_counters, weight_scale=weight_scale,
            silu_out=silu_out, rope_store=rope_store,
        )  # fmt: skip
        out = out if bias is None else out + bias
        return out.reshape(*x.shape[:-1], n_out)
    if quantized:
        xq, x_scale, dtype = x.values, x.scales, x.dtype
        leading = xq.shape[:-1]
    else:
        leading, dtype = x.shape[:-1], x.dtype
        x2d = x.reshape(-1, x.shape[-1])
        if x2d.stride(1) != 1:
            x2d = x2d.contiguous()
        xq, x_scale = quantize_fp8_per_token(x2d)
    m, k = xq.shape
    n = weight.shape[0]
    # cuBLASLt row-wise scaling: bf16 output, K and N multiples of 16.
    use_cublas = m > SMALL_M_MAX and k % 16 == 0 and n % 16 == 0 and dtype == torch.bfloat16
    if gemv_config is not None:  # W8A8 (an `a16` launch takes e4m3 x too, with its scales)
        out = gemv(
            xq, weight, gemv_config, split_k_counters, x_scale=x_scale,
            weight_scale=weight_scale, out_dtype=dtype, silu_out=silu_out, rope_store=rope_store,
        )  # fmt: skip
    elif use_cublas:
        out = fp8_scaled_mm(xq, x_scale, weight, weight_scale, dtype, use_fast_accum=fast_accum)
    else:
        out = fp8_gemm(xq, x_scale, weight, weight_scale, dtype, split_k_counters=split_k_counters)
    if bias is not None:
        out = out + bias
    return out.reshape(*leading, n_out)


def fp8_linear_ref(
    x: torch.Tensor | Fp8Activations,  # [..., K], or [M, K] quantized
    weight: torch.Tensor,  # [N, K] e4m3
    weight_scale: torch.Tensor,  # [N] fp32
    bias: torch.Tensor | None = None,
) -> torch.Tensor:  # [..., N], x.dtype
    """Emulated FP8 linear (plain torch, any device): the activations are quantized exactly as
    on the GPU, then both operands are dequantized and multiplied in float32."""
    if isinstance(x, Fp8Activations):
        xq, x_scale, dtype = x.values, x.scales, x.dtype
        leading = xq.shape[:-1]
    else:
        leading, dtype = x.shape[:-1], x.dtype
        xq, x_scale = quantize_fp8_per_token_ref(x.reshape(-1, x.shape[-1]))
    out = (xq.float() @ weight.float().t()) * x_scale[:, None] * weight_scale.float()[None, :]
    if bias is not None:
        out = out + bias.float()
    return out.to(dtype).reshape(*leading, weight.shape[0])
