"""A split-K GEMV for 16-bit or FP8 weights at decode batch 1: `out = x @ W.T`, W `[N, K]`
row-major.

At batch 1 every linear layer streams its weight once, and cuBLAS reaches ~3.1 TB/s on the
q/k/v and o shapes of Llama-3.1-8B and ~4 TB/s on gate/up and down (H200, 2026-12-01), with a
second `splitKreduce` launch for o and down. This kernel reads the weight with 16-byte loads
along K (its rows are contiguous), keeps `[BLOCK_N, BLOCK_K]` fp32 partial products per thread
(one cross-thread reduction per program, after the loop), loads the next K step while it
computes one (Triton pipelines only loads that feed `tl.dot`), and sums the split-K partials in
the same launch (`split_k.py`: the layer owns the counters).

Grid `(M, cdiv(N, BLOCK_N), split_k)`: one program per token, output block and K slice (M is 1
to a few tokens: each re-reads the weight from L2).

It is used only where the per-shape table (`gemv_configs.json`, written by
`scripts/bench_gemv.py --sweep` on the GPU, which keeps a shape only if the kernel beats
`F.linear` there) has a row; otherwise, and on the CPU, `F.linear`. The shipped table (the
H200's, with programmatic dependent launch: the first weight tile loads while the previous
kernel finishes, `pdl.py`) lists qkv, o and down of the 8B model at 1 token. Products are summed
in fp32 in another order than cuBLAS: outputs agree within bf16 rounding.

FP8 (W8A8, `fp8_gemm.py`'s quantization): e4m3 activations and weights, each converted to fp32
in registers, the per-token and per-channel scales applied once to each split's sums:
`fp8_gemm`'s math on the CUDA cores instead of the tensor cores, whose tiles pad one token to 16
rows. Or, with `packed_f16`, in packed fp16 (`_gemv_e4m3_packed_kernel`): x's values times 2^-9
keep every product exact and below 448 (two e4m3 values' products reach 2e5, past fp16's
range), half the instructions. Its own table, `gemv_fp8_configs.json` (`bench_gemv.py --sweep
--fp8`, against the model's FP8 path): since the eighteenth session's H200 sweep, packed rows
for all four 8B projections at 1 token.

Gated (`gemv(gate_up, ..., gated=True)`): x is an MLP's `[M, 2K]` gate | up and the GEMV
multiplies `silu(gate) * up`, computed (and rounded as `silu_and_mul` rounds it) as it loads x:
the down projection runs without the activation kernel before it at the table rows marked
`gated` (`LinearBase.takes_gated_input`). Opt-in: measured slower on the H200 (every thread
recomputes the x values it broadcasts), so no shipped row has it.

Epilogues (opt-in per table row; docs/kernels.md, "GEMV epilogues at batch 1"): `silu_out`, a
merged gate | up weight's tiles each holding their activations' gate and up rows, writes
`silu(gate) * up`; `add_norm` (16-bit) adds the residual and the row's last tile writes the next
RMSNorm (`split_k.store_split`).

W8A16 (a table row's `a16`): e4m3 weights with the layer's bf16/fp16 activations as they are.
At one token the W8A8 path pays for its activations' quantization in the kernels before the
GEMM: a SiLU kernel that must see the whole 14,336-wide row for its amax (one program at batch
1) and a separate pass before `o_proj`. This launch reads x in its own dtype (converted to fp32
once per step, shared by the program's BLOCK_N rows), so those passes go (`fp8_linear`, and the
model asks `LinearBase.takes_fp8_activations(num_tokens)`); the sums are only weight-scaled.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from radixgen.kernels.gated_silu import abs_max, load_gated_x
from radixgen.kernels.launch_tables import (
    load_json_table,
    parse_shape_rows,
    select_bounded_bucket,
)
from radixgen.kernels.pdl import pdl_launch_options, wait_for_prior_grids
from radixgen.kernels.rope_store import RopeStore, rope_prologue
from radixgen.kernels.split_k import (
    finish_splits,
    paired_tiles,
    silu_columns,
    split_buffers,
    store_split,
    tile_rows,
)

DEFAULT_TABLE_PATH = Path(__file__).with_name("gemv_configs.json")
FP8_TABLE_PATH = Path(__file__).with_name("gemv_fp8_configs.json")


@dataclass(frozen=True)
class GemvConfig:
    """Launch sizes of one `gemv`."""

    block_n: int  # output rows (weight rows) per program
    block_k: int  # K columns per loop step
    split_k: int  # programs sharing one output block's K range
    num_warps: int
    # FP8 weights on CUDA: products summed in packed fp16 (`_gemv_e4m3_packed_kernel`), e4m3
    # x or, with `a16`, 16-bit x
    packed_f16: bool = False
    # FP8 weights: the launch takes the layer's 16-bit activations as they are (W8A16), so
    # `fp8_linear` and the kernels before it skip the activations' quantization
    a16: bool = False
    # A down projection's row: the layer takes the MLP's gate | up and this launch computes
    # silu(gate) * up as it loads x (`gated`), the activation kernel skipped. Opt-in per row:
    # x's values are recomputed by every thread that reads them (the GEMV broadcasts x over
    # its rows), which costs more than the launch saved unless the sweep or an A/B says not.
    gated: bool = False
    # A merged gate | up projection's row: the launch writes silu(gate) * up, each tile holding
    # block_n / 2 gate rows and their up rows (`gemv(..., silu_out=True)`), so the activation
    # kernel after the layer goes. Opt-in per row (an A/B in the decode step decides).
    silu_out: bool = False
    # An o or down projection's row: the launch also adds the residual and writes the next
    # RMSNorm of the row (`gemv(..., add_norm=)`), so the norm kernel after the layer goes.
    # Opt-in per row (an A/B in the decode step decides).
    add_norm: bool = False
    # A merged q | k | v projection's row: the launch also rotates q and k and writes k and v
    # into the KV cache (`gemv(..., rope_store=)`), so the rotary kernel after the layer goes.
    # Opt-in per row (an A/B in the decode step decides).
    rope_store: bool = False

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if not 1 <= self.split_k <= 256:
            raise ValueError(f"split_k must be in 1..256, got {self.split_k}")
        if self.block_k < 16:
            raise ValueError(f"block_k must be >= 16, got {self.block_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if self.add_norm and (self.gated or self.silu_out or self.packed_f16 or self.a16):
            raise ValueError("add_norm is a 16-bit GEMV option, not with gated/silu_out/packed")
        if self.silu_out and (self.gated or self.block_n < 2):
            raise ValueError("silu_out needs block_n >= 2 and is not gated")
        if self.rope_store and (self.gated or self.silu_out or self.add_norm or self.block_n < 2):
            raise ValueError("rope_store needs block_n >= 2, not with gated/silu_out/add_norm")
        if self.gated and self.packed_f16:
            raise ValueError("gated launches run the float32 path: not with packed_f16")


class AddNorm(NamedTuple):
    """A GEMV epilogue's residual add and RMSNorm (`gemv(..., add_norm=)`): the decoder
    layer's `fused_add_rms_norm` after its o or down projection, done by the GEMV's tiles."""

    residual: torch.Tensor  # [M, N] in x's dtype: the residual stream before the add
    weight: torch.Tensor  # [N] the norm's weight
    eps: float
    counters: torch.Tensor  # [>= M] int32 zeros (the launch leaves them zero)


# {(in_features K, out_features N): ((max_tokens or None, config), ...)}, max_tokens ascending.
GemvTable = dict[tuple[int, int], tuple[tuple[int | None, GemvConfig], ...]]


def parse_gemv_table(data: dict) -> GemvTable:
    """Validates the JSON form:

        {"note": ..., "source": ..., "shapes": {"4096x6144": [
            {"max_tokens": 1, "block_n": 16, "block_k": 256, "split_k": 4, "num_warps": 4}]}}

    keyed by "in_features x out_features"; a launch with more tokens than every row's bound
    takes `F.linear`. Raises ValueError naming the row.
    """
    return parse_shape_rows(data, GemvConfig, "GEMV table", bounded=True)


@functools.cache
def load_gemv_table(path: Path = DEFAULT_TABLE_PATH) -> GemvTable:
    """The parsed table (read once per path); empty when the file does not exist."""
    return load_json_table(path, parse_gemv_table)


def select_gemv_config(
    in_features: int, out_features: int, num_tokens: int, table: GemvTable | None = None
) -> GemvConfig | None:
    """The table's config for this shape and token count, or None (use `F.linear`)."""
    rows = (load_gemv_table() if table is None else table).get((in_features, out_features))
    return select_bounded_bucket(rows, num_tokens)


@triton.jit
def _gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K], rows contiguous
    out_ptr,  # [M, N] x's dtype (FP8: the output dtype)
    partial_ptr,  # [num_splits, M, N] fp32 (SPLIT_MODE > 0)
    counters_ptr,  # [>= M * cdiv(N, BLOCK_N)] int32 zeros (SPLIT_MODE == 2)
    x_scale_ptr,  # [M] fp32 (SCALED and X_SCALED only)
    w_scale_ptr,  # [N] fp32 (SCALED only)
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K
    stride_xm,
    stride_wn,
    stride_split,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_MODE: tl.constexpr,  # see split_k.store_split
    SCALED: tl.constexpr,  # FP8 weights: sums times w_scale[n] (and x_scale[row])
    X_SCALED: tl.constexpr = True,  # e4m3 x with its per-token scale; False: W8A16
    USE_PDL: tl.constexpr = False,  # pdl.py: the first weight tile loads before the wait
    GATED: tl.constexpr = False,  # x_ptr: [M, 2K] gate | up; x = silu(gate) * up
    SILU_OUT: tl.constexpr = False,  # w: gate | up; out: [M, N / 2] silu(gate) * up
    norm_residual_ptr=None,  # [M, N] (NORM_BLOCK > 0: out = x @ w.T + residual, normalized)
    norm_weight_ptr=None,  # [N]
    normed_ptr=None,  # [M, N]: out's rows RMS-normalized, times the weight
    norm_counters_ptr=None,  # [>= M] int32 zeros: the row's tiles arrived
    norm_eps=1e-6,
    NORM_BLOCK: tl.constexpr = 0,  # > 0 (next_power_of_2(N)): `split_k.store_split`'s ADD_NORM
    rope=None,  # `RopeStore.launch_args` (ROPE_HALF > 0): w is q | k | v, out: [M, q] rotated
    ROPE_HALF: tl.constexpr = 0,  # > 0: head_dim / 2 of the rotary + KV-store epilogue
    KV_FP8_MAX: tl.constexpr = 0.0,  # > 0: the FP8 cache format's largest value
):
    row = tl.program_id(0).to(tl.int64)
    offs_n, mask_n = tile_rows(tl.program_id(1), N, BLOCK_N, SILU_OUT, ROPE_HALF)
    pid_k = tl.program_id(2)
    offs_k = tl.arange(0, BLOCK_K)
    x_row = x_ptr + row * stride_xm
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    # Per-thread partial products over the K range: one cross-thread reduction, after the loop.
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    ks = k_start + offs_k
    w = tl.load(w_rows + ks[None, :], mask=mask_n[:, None] & (ks < k_end)[None, :], other=0.0)
    wait_for_prior_grids(USE_PDL)  # x and the outputs are the earlier kernels'
    rope_epilogue = rope_prologue(rope, row, BLOCK_N, ROPE_HALF, out_ptr)
    for k in range(k_start, k_end, BLOCK_K):
        # The next step's tile is in flight while this one computes (past k_end: masked off).
        next_ks = k + BLOCK_K + offs_k
        next_w = tl.load(
            w_rows + next_ks[None, :], mask=mask_n[:, None] & (next_ks < k_end)[None, :], other=0.0
        )  # [BLOCK_N, BLOCK_K]
        cols = k + offs_k
        if GATED:
            x = load_gated_x(x_row, cols, cols < k_end, K)  # [BLOCK_K]
        else:
            x = tl.load(x_row + cols, mask=cols < k_end, other=0.0).to(tl.float32)  # [BLOCK_K]
        acc += w.to(tl.float32) * x[None, :]
        w = next_w
    sums = tl.sum(acc, axis=1)  # [BLOCK_N]
    if SCALED:  # a linear map of each split's sums: the split-K total is scaled alike
        w_scale = tl.load(w_scale_ptr + offs_n, mask=mask_n, other=0.0)
        if X_SCALED:
            w_scale = w_scale * tl.load(x_scale_ptr + row)
        sums = sums * w_scale
    tile = row * tl.num_programs(1) + tl.program_id(1)
    silu_offsets, silu_mask = silu_columns(row, tl.program_id(1), N, BLOCK_N, SILU_OUT)
    norm = None
    if NORM_BLOCK > 0:
        norm = (
            norm_residual_ptr, norm_weight_ptr, normed_ptr + row * N, norm_counters_ptr + row,
            row * N, tl.num_programs(1), N, norm_eps,
        )  # fmt: skip
    store_split(
        sums, out_ptr, partial_ptr, counters_ptr + tile, row * N + offs_n, mask_n,
        pid_k, tl.num_programs(2), stride_split, SPLIT_MODE, WIDE_REDUCE=True,
        silu_offsets=silu_offsets, silu_mask=silu_mask, SILU_OUT=SILU_OUT, norm=norm,
        NORM_BLOCK=NORM_BLOCK, rope=rope_epilogue, ROPE_HALF=ROPE_HALF, KV_FP8_MAX=KV_FP8_MAX,
    )  # fmt: skip


# x's e4m3 values enter the packed fp16 products times 2^-9 (0x1800 in fp16): below 1, so a
# product with an e4m3 weight stays below 448 and 8 of them below fp16's 65504, each exact.
_X_SCALE_INVERSE: tl.constexpr = tl.constexpr(512.0)


@triton.jit
def _e4m3_pairs(words):
    """`[..]` int32 words of 4 e4m3 values (first in the low byte) as two fp16 pairs times 2^-9
    (elements 0, 1 and 2, 3), exactly."""
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; .reg .b32 a, b, c; mov.b32 {lo, hi}, $2; mov.b32 c, 0x18001800; "
        "cvt.rn.f16x2.e4m3x2 a, lo; cvt.rn.f16x2.e4m3x2 b, hi; "
        "mul.rn.f16x2 $0, a, c; mul.rn.f16x2 $1, b, c; }",
        "=r,=r,r", [words], dtype=(tl.int32, tl.int32), is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _split_quads(quads):
    """`[..., G, 2, 2]` (groups of 4 words) -> the four `[..., G]` of words 4 g + 0, 1, 2, 3
    (free when a thread holds its 4 words, as a 16-byte load leaves them)."""
    even, odd = tl.split(quads)  # words 4 g + {0, 2} and 4 g + {1, 3}
    w0, w2 = tl.split(even)
    w1, w3 = tl.split(odd)
    return w0, w1, w2, w3


@triton.jit
def _e4m3_quad_dot(w0, w1, w2, w3, x0, x1, x2, x3):
    """`[BLOCK_N, G]` float32: the dot products of 4 consecutive e4m3 weight words (16 weights)
    with x's (`x0`..`x3`: `_e4m3_pairs` of x's words, broadcast over the rows), converted two
    weights an instruction and summed in packed fp16 (each product exact, 8 a lane, below
    3,600), then once in float32."""
    x0_lo, x0_hi = x0
    x1_lo, x1_hi = x1
    x2_lo, x2_hi = x2
    x3_lo, x3_hi = x3
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; .reg .b32 a, b, s; .reg .f16 l, h; .reg .f32 fl, fh; "
        "mov.b32 {lo, hi}, $1; cvt.rn.f16x2.e4m3x2 a, lo; cvt.rn.f16x2.e4m3x2 b, hi; "
        "mul.rn.f16x2 s, a, $5; fma.rn.f16x2 s, b, $6, s; "
        "mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 a, lo; cvt.rn.f16x2.e4m3x2 b, hi; "
        "fma.rn.f16x2 s, a, $7, s; fma.rn.f16x2 s, b, $8, s; "
        "mov.b32 {lo, hi}, $3; cvt.rn.f16x2.e4m3x2 a, lo; cvt.rn.f16x2.e4m3x2 b, hi; "
        "fma.rn.f16x2 s, a, $9, s; fma.rn.f16x2 s, b, $10, s; "
        "mov.b32 {lo, hi}, $4; cvt.rn.f16x2.e4m3x2 a, lo; cvt.rn.f16x2.e4m3x2 b, hi; "
        "fma.rn.f16x2 s, a, $11, s; fma.rn.f16x2 s, b, $12, s; "
        "mov.b32 {l, h}, s; cvt.f32.f16 fl, l; cvt.f32.f16 fh, h; add.f32 $0, fl, fh; }",
        "=f,r,r,r,r,r,r,r,r,r,r,r,r",
        [w0, w1, w2, w3, x0_lo[None, :], x0_hi[None, :], x1_lo[None, :], x1_hi[None, :],
         x2_lo[None, :], x2_hi[None, :], x3_lo[None, :], x3_hi[None, :]],
        dtype=tl.float32, is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _x16_pair(words, x_inv, X_BF16: tl.constexpr):
    """`[..]` int32 words of two bf16 (`X_BF16`) or fp16 values, first in the low half, as one
    fp16 pair of the values times `x_inv` (each product in float32, rounded to fp16 once)."""
    if X_BF16:  # bf16 -> float32: the bits at the top of the word
        pair = tl.inline_asm_elementwise(
            "{ .reg .b32 lo, hi; .reg .f32 a, b; shl.b32 lo, $1, 16; "
            "and.b32 hi, $1, 0xFFFF0000; mul.rn.f32 a, lo, $2; mul.rn.f32 b, hi, $2; "
            "cvt.rn.f16x2.f32 $0, b, a; }",
            "=r,r,f", [words, x_inv], dtype=tl.int32, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        pair = tl.inline_asm_elementwise(
            "{ .reg .f16 l, h; .reg .f32 a, b; mov.b32 {l, h}, $1; cvt.f32.f16 a, l; "
            "cvt.f32.f16 b, h; mul.rn.f32 a, a, $2; mul.rn.f32 b, b, $2; "
            "cvt.rn.f16x2.f32 $0, b, a; }",
            "=r,r,f", [words, x_inv], dtype=tl.int32, is_pure=True, pack=1,
        )  # fmt: skip
    return pair


@triton.jit
def _split_octets(octets):
    """`[G, 2, 2, 2]` (groups of 8 words, word 4 a + 2 b + c at [g, a, b, c]) -> the eight
    `[G]` of words 8 g + 0, ..., 7."""
    even, odd = tl.split(octets)  # c = 0, 1: [G, 2, 2]
    even_0, even_2 = tl.split(even)  # words 4 a + 0, 4 a + 2: [G, 2]
    odd_1, odd_3 = tl.split(odd)  # words 4 a + 1, 4 a + 3
    w0, w4 = tl.split(even_0)
    w2, w6 = tl.split(even_2)
    w1, w5 = tl.split(odd_1)
    w3, w7 = tl.split(odd_3)
    return w0, w1, w2, w3, w4, w5, w6, w7


@triton.jit
def _x_step_pairs(x_words, k, k_end, x_inv, BLOCK_K: tl.constexpr, X_KIND: tl.constexpr):
    """x's values of inputs `k..k+BLOCK_K` as the eight `[BLOCK_K / 16]` fp16 pairs the quad
    dots take: pairs 2 i, 2 i + 1 are inputs 4 i .. 4 i + 3 of each group of 16 (e4m3 x times
    2^-9, `_e4m3_pairs`; 16-bit x times `x_inv`, `_x16_pair`)."""
    if X_KIND == 0:  # 4 e4m3 values a word
        cols = k // 4 + tl.arange(0, BLOCK_K // 4)
        x = tl.load(x_words + cols, mask=cols < k_end // 4, other=0)  # [BLOCK_K / 4]
        x0, x1, x2, x3 = _split_quads(tl.reshape(x, [BLOCK_K // 16, 2, 2]))
        p0, p1 = _e4m3_pairs(x0)
        p2, p3 = _e4m3_pairs(x1)
        p4, p5 = _e4m3_pairs(x2)
        p6, p7 = _e4m3_pairs(x3)
    else:  # 2 bf16 / fp16 values a word
        cols = k // 2 + tl.arange(0, BLOCK_K // 2)
        x = tl.load(x_words + cols, mask=cols < k_end // 2, other=0)  # [BLOCK_K / 2]
        w0, w1, w2, w3, w4, w5, w6, w7 = _split_octets(tl.reshape(x, [BLOCK_K // 16, 2, 2, 2]))
        p0 = _x16_pair(w0, x_inv, X_KIND == 1)
        p1 = _x16_pair(w1, x_inv, X_KIND == 1)
        p2 = _x16_pair(w2, x_inv, X_KIND == 1)
        p3 = _x16_pair(w3, x_inv, X_KIND == 1)
        p4 = _x16_pair(w4, x_inv, X_KIND == 1)
        p5 = _x16_pair(w5, x_inv, X_KIND == 1)
        p6 = _x16_pair(w6, x_inv, X_KIND == 1)
        p7 = _x16_pair(w7, x_inv, X_KIND == 1)
    return p0, p1, p2, p3, p4, p5, p6, p7


@triton.jit
def _gemv_e4m3_packed_kernel(
    x_ptr,  # [M, K] e4m3 (X_KIND 0) or bf16 / fp16 (1 / 2), read as int32 words
    w_ptr,  # [N, K] e4m3, rows contiguous, read as int32 words
    out_ptr,  # [M, N] the output dtype
    partial_ptr,  # [num_splits, M, N] fp32 (SPLIT_MODE > 0)
    counters_ptr,  # [>= M * cdiv(N, BLOCK_N)] int32 zeros (SPLIT_MODE == 2)
    x_scale_ptr,  # [M] fp32 (X_KIND 0)
    w_scale_ptr,  # [N] fp32
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K
    stride_xm,  # elements, a multiple of 4
    stride_wn,  # elements (bytes), a multiple of 4
    stride_split,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # a multiple of 16
    SPLIT_MODE: tl.constexpr,  # see split_k.store_split
    USE_PDL: tl.constexpr = False,  # pdl.py: the first weight tile loads before the wait
    X_KIND: tl.constexpr = 0,  # x: 0 e4m3 with its per-token scale (W8A8), 1 bf16, 2 fp16
    AMAX_BLOCK: tl.constexpr = 1024,  # 16-bit x: values a step of the split's |x| maximum
    SILU_OUT: tl.constexpr = False,  # w: gate | up; out: [M, N / 2] silu(gate) * up
    rope=None,  # as `_gemv_kernel`'s
    ROPE_HALF: tl.constexpr = 0,
    KV_FP8_MAX: tl.constexpr = 0.0,
):
    """`_gemv_kernel` for e4m3 weights in packed fp16 arithmetic (`_e4m3_quad_dot`): about half
    the instructions a weight of the float32 path. CUDA only (inline PTX).

    W8A8 (e4m3 x): x's values times 2^-9 (`_X_SCALE_INVERSE`). W8A16 (16-bit x, the layer's
    activations as they are: no quantization pass before the layer): x times 1 / its largest
    |value| over the split's K range, so every |x'| <= 1, a product with an e4m3 weight below
    448 and a lane's 8 below fp16's 65504 whatever the activations' size; bf16's 8-bit
    mantissa fits fp16's 11, so x' is x to within the scaling's rounding, each product is
    rounded once to 11 bits (~5e-4 relative; W8A8's e4m3 activations keep 3), and the sums are
    scaled back by that maximum."""
    row = tl.program_id(0).to(tl.int64)
    offs_n, mask_n = tile_rows(tl.program_id(1), N, BLOCK_N, SILU_OUT, ROPE_HALF)
    pid_k = tl.program_id(2)
    offs_w = tl.arange(0, BLOCK_K // 4)  # weight words of a step
    if X_KIND == 0:
        x_words = x_ptr.to(tl.pointer_type(tl.int32)) + row * (stride_xm // 4)
    else:
        x_words = x_ptr.to(tl.pointer_type(tl.int32)) + row * (stride_xm // 2)
    w_rows = w_ptr.to(tl.pointer_type(tl.int32)) + offs_n.to(tl.int64)[:, None] * (stride_wn // 4)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros([BLOCK_N, BLOCK_K // 16], dtype=tl.float32)
    ws = k_start // 4 + offs_w
    w = tl.load(w_rows + ws[None, :], mask=mask_n[:, None] & (ws < k_end // 4)[None, :], other=0)
    wait_for_prior_grids(USE_PDL)  # x and the outputs are the earlier kernels'
    rope_epilogue = rope_prologue(rope, row, BLOCK_N, ROPE_HALF, out_ptr)
    if X_KIND == 0:
        x_inv = 1.0  # unused: the e4m3 pairs carry their fixed 2^-9
    else:
        x_amax = abs_max(x_ptr + row * stride_xm, k_start, k_end, K, False, AMAX_BLOCK)
        x_inv = 1.0 / x_amax
    for k in range(k_start, k_end, BLOCK_K):
        next_ws = (k + BLOCK_K) // 4 + offs_w
        next_w = tl.load(
            w_rows + next_ws[None, :], mask=mask_n[:, None] & (next_ws < k_end // 4)[None, :],
            other=0,
        )  # fmt: skip
        p0, p1, p2, p3, p4, p5, p6, p7 = _x_step_pairs(x_words, k, k_end, x_inv, BLOCK_K, X_KIND)
        w0, w1, w2, w3 = _split_quads(tl.reshape(w, [BLOCK_N, BLOCK_K // 16, 2, 2]))
        acc += _e4m3_quad_dot(w0, w1, w2, w3, (p0, p1), (p2, p3), (p4, p5), (p6, p7))
        w = next_w
    sums = tl.sum(acc, axis=1)  # [BLOCK_N]
    if X_KIND == 0:
        x_scale = tl.load(x_scale_ptr + row) * _X_SCALE_INVERSE
    else:
        x_scale = x_amax
    w_scale = tl.load(w_scale_ptr + offs_n, mask=mask_n, other=0.0)
    sums = sums * (x_scale * w_scale)
    tile = row * tl.num_programs(1) + tl.program_id(1)
    silu_offsets, silu_mask = silu_columns(row, tl.program_id(1), N, BLOCK_N, SILU_OUT)
    store_split(
        sums, out_ptr, partial_ptr, counters_ptr + tile, row * N + offs_n, mask_n,
        pid_k, tl.num_programs(2), stride_split, SPLIT_MODE, WIDE_REDUCE=True,
        silu_offsets=silu_offsets, silu_mask=silu_mask, SILU_OUT=SILU_OUT, rope=rope_epilogue,
        ROPE_HALF=ROPE_HALF, KV_FP8_MAX=KV_FP8_MAX,
    )  # fmt: skip


def gemv_counter_slots(out_features: int, max_tokens: int = 4) -> int:
    """Counters that let every `gemv` of an N-row weight up to `max_tokens` tokens sum its
    splits in-kernel (one per output block of the narrowest tile the sweep tries, 8 rows; a
    launch whose tiles outnumber them sums with a second launch instead)."""
    return max_tokens * triton.cdiv(out_features, 8)


def gemv(
    x: torch.Tensor,  # [M, K] bf16/fp16/fp32 (or e4m3 with x_scale), contiguous in K
    weight: torch.Tensor,  # [N, K], x's dtype or e4m3 (with weight_scale), contiguous in K
    config: GemvConfig,
    split_k_counters: torch.Tensor | None = None,  # int32 zeros, >= M * cdiv(N, block_n)
    *,
    x_scale: torch.Tensor | None = None,  # [M] fp32: e4m3 x only
    weight_scale: torch.Tensor | None = None,  # [N] fp32: e4m3 weights only
    out_dtype: torch.dtype | None = None,  # e4m3 x: required; else x's dtype
    gated: bool = False,  # x is [M, 2K] gate | up: multiplies silu(gate) * up
    silu_out: bool = False,  # weight is gate | up: returns silu(gate) * up, [M, N / 2]
    add_norm: AddNorm | None = None,  # returns (rms_norm(out + residual), out + residual)
    rope_store: RopeStore | None = None,  # weight is q | k | v: returns rotated q, stores k, v
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # [M, N] out_dtype (silu: [M, N / 2])
    """`x @ weight.T` by the split-K GEMV (any device Triton runs on: the interpreter on the
    CPU). With `split_k_counters` the splits are summed in the same launch, else by a second.
    FP8 (e4m3 x and weight, `fp8_gemm`'s W8A8): `(x @ weight.T) * x_scale[:, None] *
    weight_scale[None, :]` in `out_dtype`. W8A16 (16-bit or fp32 x, e4m3 weight): `(x @
    weight.T) * weight_scale[None, :]` in x's dtype, x as it is (no quantization).
    `gated` (16-bit or fp32 x): `silu_and_mul(x) @ weight.T`, the activation computed as the
    GEMV loads x (an MLP's down projection without the activation kernel before it), equal to
    the two kernels' result. `silu_out` (the weight an MLP's merged gate | up projection):
    `silu_and_mul(x @ weight.T)`, the activation computed in the epilogue of the tile that
    holds both its gate and up sums (one launch instead of the GEMV and the activation kernel;
    the same bits); with K splits it needs `split_k_counters`. `add_norm` (16-bit or fp32 x
    and weight, the float32 path): `fused_add_rms_norm(x @ weight.T, add_norm.residual,
    add_norm.weight, add_norm.eps)` as `(normed, h)`, each tile storing its part of `h = out +
    residual` and the row's last tile normalizing the row (one launch instead of the GEMV and
    the norm kernel; `h` the same bits, `normed` within the norm kernel's rounding: its sum of
    squares runs in another order); with K splits it needs `split_k_counters`. `rope_store`
    (the weight Llama's merged q | k | v heads, `kernels/rope_store.py`): the rotated q `[M,
    num_heads * head_dim]`, with the rotated k and the v written into the caches at the
    slots, as the GEMV then `rotary_embedding_and_store_kv` would; with K splits it needs
    `split_k_counters`.

    Raises:
        ValueError/TypeError naming the argument on bad shapes, dtypes or strides.
    """
    if add_norm is not None:
        _check_add_norm(add_norm, x, weight, config, gated or silu_out)
    if rope_store is not None and (gated or silu_out or add_norm is not None):
        raise ValueError("rope_store is not with gated, silu_out or add_norm")
    if silu_out and (gated or weight.shape[0] % 2 or config.block_n < 2):
        raise ValueError(
            "silu_out needs an even number of weight rows (gate | up), block_n >= 2 and no gated"
        )
    x_width = 2 * weight.shape[-1] if gated else weight.shape[-1]
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != x_width:
        raise ValueError(
            f"x must be [M, {'2K' if gated else 'K'}] and weight [N, K], got {tuple(x.shape)} "
            f"and {tuple(weight.shape)}"
        )
    e4m3 = torch.float8_e4m3fn
    if gated and (x.dtype == e4m3 or config.packed_f16):
        raise ValueError("gated takes a 16-bit or fp32 gate | up x, not e4m3 activations")
    # W8A16: e4m3 weights, x in a float type (its own scale: none).
    w8a16 = weight.dtype == e4m3 and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
    if x.dtype != weight.dtype and not w8a16:
        raise TypeError(f"weight must be x's dtype {x.dtype} (or e4m3), got {weight.dtype}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("x and weight must be contiguous in K")
    m, k = x.shape[0], weight.shape[1]
    n = weight.shape[0]
    scaled = weight.dtype == e4m3
    x_scaled = x.dtype == e4m3
    if scaled:
        scales = (("x_scale", x_scale, m),) if x_scaled else ()
        for name, scale, size in (*scales, ("weight_scale", weight_scale, n)):
            if scale is None or scale.shape != (size,) or scale.dtype != torch.float32:
                raise ValueError(f"{name} must be a float32 [{size}] tensor for FP8 operands")
        if w8a16 and x_scale is not None:
            raise ValueError("x_scale is for e4m3 x only (16-bit x enters unscaled)")
        if w8a16 and out_dtype not in (None, x.dtype):
            raise TypeError(f"out_dtype is x's dtype {x.dtype} for 16-bit x, got {out_dtype}")
        if x_scaled and out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"out_dtype must be bf16/fp16/fp32 for FP8 operands, got {out_dtype}")
    elif x_scale is not None or weight_scale is not None:
        raise ValueError("x_scale and weight_scale are for e4m3 operands only")
    out_dtype = out_dtype if x_scaled else x.dtype
    out_width = n // 2 if silu_out else n
    rope_launch = {}
    if rope_store is not None:
        rope_launch, out_width = rope_store.launch_args(m, n, out_dtype), rope_store.q_width
    out = torch.empty((m, out_width), dtype=out_dtype, device=x.device)
    if m == 0:
        return out
    k_per_split = triton.cdiv(triton.cdiv(k, config.split_k), config.block_k) * config.block_k
    splits = triton.cdiv(k, k_per_split)  # no empty splits
    # silu_out / rope_store: a tile holds block_n / 2 pairs of rows (`split_k.tile_rows`).
    paired = silu_out or rope_store is not None
    tiles_n = paired_tiles(n, config.block_n) if paired else triton.cdiv(n, config.block_n)
    grid = (m, tiles_n, splits)
    split_mode, partial, counters = split_buffers(
        out, splits, m * tiles_n, split_k_counters, weight_rows=n,
        in_kernel=silu_out or add_norm is not None or rope_store is not None,
    )  # fmt: skip
    # The packed kernel reads both operands as 32-bit words.
    words_fit = all(t.stride(0) % 4 == 0 and t.data_ptr() % 4 == 0 for t in (x, weight))
    words_fit = words_fit and k % 4 == 0
    x16 = x.dtype in (torch.bfloat16, torch.float16)
    if config.packed_f16 and (x_scaled or w8a16 and x16) and x.is_cuda and words_fit:
        # 16-bit x: the split's |x| maximum in at most 4,096-value steps (one for the 8B
        # model's 4,096-wide inputs, two for a split of the 14,336-wide down projection's).
        x_kind = 0 if x_scaled else 1 if x.dtype == torch.bfloat16 else 2
        _gemv_e4m3_packed_kernel[grid](
            x, weight, out, partial, counters, x_scale if x_scaled else weight_scale,
            weight_scale, n, k, k_per_split, x.stride(0), weight.stride(0), m * n,
            BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_MODE=split_mode,
            X_KIND=x_kind, AMAX_BLOCK=min(triton.next_power_of_2(k_per_split), 4096),
            SILU_OUT=silu_out, num_warps=config.num_warps, **rope_launch,
            **pdl_launch_options(x.device),
        )  # fmt: skip
        return finish_splits(split_mode, partial, out)
    norm_args, normed = {}, None
    if add_norm is not None:
        normed = torch.empty_like(out)
        norm_args = dict(
            norm_residual_ptr=add_norm.residual, norm_weight_ptr=add_norm.weight,
            normed_ptr=normed, norm_counters_ptr=add_norm.counters, norm_eps=add_norm.eps,
            NORM_BLOCK=triton.next_power_of_2(n),
        )  # fmt: skip
    _gemv_kernel[grid](
        x, weight, out, partial, counters, x_scale if x_scaled else out,
        weight_scale if scaled else out, n, k, k_per_split, x.stride(0), weight.stride(0),
        m * n, BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_MODE=split_mode,
        SCALED=scaled, X_SCALED=x_scaled, GATED=gated, SILU_OUT=silu_out,
        num_warps=config.num_warps, **norm_args, **rope_launch, **pdl_launch_options(x.device),
    )  # fmt: skip
    out = finish_splits(split_mode, partial, out)
    return out if add_norm is None else (normed, out)


def _check_add_norm(
    add_norm: AddNorm, x: torch.Tensor, weight: torch.Tensor, config: GemvConfig, fused: bool
) -> None:
    """Raises ValueError/TypeError naming the field of a GEMV's `add_norm` that does not fit."""
    m, n = x.shape[0], weight.shape[0]
    if fused or config.packed_f16 or x.dtype == torch.float8_e4m3fn:
        raise ValueError(
            "add_norm takes the float32 path with 16-bit or fp32 x, not gated/silu_out"
        )
    if weight.dtype != x.dtype:
        raise TypeError(f"add_norm takes the weight in x's dtype {x.dtype}, got {weight.dtype}")
    residual, norm_weight, _, counters = add_norm
    if residual.shape != (m, n) or residual.dtype != x.dtype or not residual.is_contiguous():
        raise ValueError(f"add_norm.residual must be a contiguous [{m}, {n}] {x.dtype} tensor")
    if norm_weight.shape != (n,) or norm_weight.dtype != x.dtype:
        raise ValueError(f"add_norm.weight must be a [{n}] {x.dtype} tensor")
    if counters.dtype != torch.int32 or counters.numel() < m:
        raise ValueError(f"add_norm.counters must be int32 zeros, at least {m}")
