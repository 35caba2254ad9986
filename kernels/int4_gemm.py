"""int4 weight-only linear layers (AWQ / GPTQ checkpoints after the load-time repack):

    y[m, n] = sum_k x[m, k] * (q[k, n] - zero[g(k), n]) * scale[g(k), n]   (+ bias[n])

with 4-bit codes `q` in 0..15, one `scale` and integer `zero` (0..16: checkpoint zero points)
per group of `group_size` consecutive input rows, `g(k) = k // group_size`.

Runtime layout (every checkpoint format is repacked into it at load time,
runtime/models/int4_linear.py; kernels/int4_reference.py has it in torch):
- `qweight: [K / 8, N] int32`, packed along K: word `[i, n]` holds eight input rows of column n,
  one per nibble (bits 4j..4j+3). With the span S of `runtime_span(group_size)` (W = S / 8),
  nibble j of word i is row `(i // W) S + j W + i % W`: for group sizes that are multiples of
  128, S = 128 and nibble j of a 128-row chunk's 16 words is 16 consecutive rows (one
  tensor-core dot's K side); else S = 8, GPTQ's order (row 8 i + j). A program owning BLOCK_N
  output columns reads, per K step, `BLOCK_K / 8` rows of BLOCK_N contiguous words (BLOCK_N * 4
  bytes each, 128-bit vector loads along N); every word is loaded once and unpacked in the
  registers of the thread that loaded it;
- `scales: [K / group_size, N]` and `zeros: [K / group_size, N]` in the activation dtype
  (zeros are small integers, exact in fp16/bf16): one row per group, read once per K step.

Unpacking without integer-to-float conversions (I2F runs at 1/8 of the FP32 rate on sm_90 and
bounded the first kernels): OR-ing a nibble's bits into the mantissa of the float 2^23 gives the
float `2^23 + q * 16^p` exactly (p the nibble's position in the word, p <= 4 so it stays below
2^24), and one subtraction of `2^23 + zero * 16^p` leaves `(q - zero) * 16^p` exactly. In the
GEMV, nibbles 0..4 are masked in place (no shift) and nibbles 5..7 after one shift of the word
by 20 bits, the 16^-p factors going into the activations (exact powers of two); the GEMM and
the dequantizer shift every nibble down to p = 0.

Three paths, chosen by the number of tokens M (`int4_linear` dispatches; `int4_gemm_configs`
holds the tuned per-shape table):
- M = 1 (decode; up to GEMV_M_LIMIT tokens where the tuned table says so): `_int4_gemv_kernel`,
  a split-K GEMV on the CUDA cores. Grid `(M, cdiv(N, BLOCK_N), split_k)`; each program
  accumulates `[BLOCK_K / 8, BLOCK_N]` fp32 partial sums over its K range with no cross-thread
  traffic, applying the group's scale once per word, and reduces across threads once at the
  end. The other tokens' programs re-read the same words from L2.
- 2 to 255 tokens, S = 128: `_int4_nibble_gemm_kernel`, a tiled dequantize-GEMM on the tensor
  cores, one `tl.dot` per nibble: nibble j of the step's 16 words is the `[16, BLOCK_N]` weight
  tile of input rows 16 j.., so the unpacked tile stays in registers (Triton loads the words
  straight into the dot operand's layout when the weights are the register operand) and is
  never reshaped. On 16-bit activations two weights unpack per instruction (`_unpack_pair`:
  packed bf16x2 / f16x2 arithmetic, inline PTX), rounded once to x's dtype as the reference
  does. On the H200 its prototype took the 32-layer GEMMs of a 16 / 32 / 64-token step from
  4.05 / 5.49 / 5.58 ms (the kernel below) to 2.86 / 3.78 / 5.49 ms (docs/benchmarks.md,
  sixteenth session);
- 2 to 255 tokens, S = 8 (or S = 128 where the table says `per_nibble: false`):
  `_int4_gemm_kernel`, the same product with the whole tile unpacked and reshaped to
  `[BLOCK_K, BLOCK_N]` (permuted to row order first at S = 128; one dot, the tile through
  shared memory); up to 16 tokens as `out^T = W^T x^T`, the tokens on the tensor cores'
  narrow side.
  Both GEMMs split K for the mid-size M whose tile grid is small;
- M >= DEQUANTIZE_M_MIN (prefill): `dequantize_int4` writes the weight in x's dtype in one pass,
  then cuBLAS multiplies (compute-bound: cuBLAS's tiles beat a Triton tile that also
  dequantizes).
Split-K programs write fp32 partials; with the caller's `split_k_counters` the last program
of each output tile sums them in split order in-kernel (no second launch: a launch costs ~2 us
in a CUDA graph, 128 of them per decode step), else one reduce launch does. Both deterministic.
On the CPU `int4_linear` runs `int4_linear_ref` (dequantize to float32, then matmul).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from radixgen.kernels.gated_silu import abs_max, load_x
from radixgen.kernels.int4_gemm_configs import (
    GEMV_M_LIMIT,
    GEMV_M_MAX,
    Int4GemmConfig,
    int4_config,
    largest_block_k,
)
from radixgen.kernels.int4_reference import (
    INTERLEAVED_SPAN,
    check_int4_inputs,
    dequantize_int4_ref,
    int4_linear_ref,
    pack_int4_rows,
    runtime_span,
    unpack_int4_rows,
)

# The split-K epilogues and buffers shared with the FP8 GEMM and the bf16 GEMV.
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

__all__ = [
    "DEQUANTIZE_M_MIN",
    "GEMV_M_LIMIT",
    "GEMV_M_MAX",
    "check_int4_inputs",
    "dequantize_int4",
    "dequantize_int4_ref",
    "int4_gemm",
    "int4_linear",
    "int4_linear_ref",
    "int4_takes_gated_input",
    "int4_takes_rope_store",
    "int4_takes_silu_output",
    "pack_int4_rows",
    "runtime_span",
    "unpack_int4_rows",
]
# Tokens from which dequantizing the weight (one pass, bf16 [K, N]) and multiplying with cuBLAS
# beats the fused dequantize-GEMM: the product is compute-bound there, and cuBLAS's bf16 GEMM is
# faster than a Triton tile that also dequantizes (prefill).
DEQUANTIZE_M_MIN = 256
# x dtypes the packed 16-bit arithmetic takes (inline PTX: CUDA only).
_PACKED_DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _load_words(
    qweight_ptr, scales_ptr, zeros_ptr, k, k_end, offs_n, mask_n, N,
    GROUP_SIZE: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The packed words `[BLOCK_K / 8, BLOCK_N]` int32 of rows `k..k+BLOCK_K` (row `k + 8 r + j`
    in nibble j of `[r, :]`), and its group's scales and zeros `[BLOCK_N]` float32 (the tile lies
    in one group: BLOCK_K divides GROUP_SIZE and k is a multiple of BLOCK_K)."""
    rows = k // 8 + tl.arange(0, BLOCK_K // 8)
    words = tl.load(
        qweight_ptr + rows.to(tl.int64)[:, None] * N + offs_n[None, :],
        mask=(rows * 8 < k_end)[:, None] & mask_n[None, :],
        other=0,
        eviction_policy="evict_first",  # streamed once per forward
    )
    # < 2^31: K / group_size * N is small. A prefetch past the last step (k >= k_end) loads no
    # words and re-reads the last group's scales (in L1), never past the end.
    group_row = (tl.minimum(k, k_end - 1) // GROUP_SIZE) * N
    scale = tl.load(scales_ptr + group_row + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    zero = tl.load(zeros_ptr + group_row + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    return words, scale, zero


@triton.jit
def _nibble_minus_zero(src_magic, zero, P: tl.constexpr):
    """`(q - zero) * 16^P` `[R, BLOCK_N]` float32, exactly, for the codes q in bits 4P..4P+3 of
    the packed words (P <= 4) and the zeros `[BLOCK_N]`: the bits OR-ed into the mantissa of 2^23
    make the float `2^23 + q 16^P` (< 2^24), one subtraction removes `2^23 + zero 16^P`.

    `src_magic` is the words OR 0x4B000000 (the float 2^23; disjoint from bits 0..19), once per
    word: each nibble is then one AND with an immediate, where `(src & mask) | magic` would need
    a register for one of its two constants (ptxas re-creates it before every use)."""
    bits = src_magic & ((0xF << (4 * P)) | 0x4B000000)
    # The zeros' side stays 1-D until the broadcast: a [1, BLOCK_N] tensor would get a layout
    # of its own and a shared-memory conversion per use.
    return bits.to(tl.float32, bitcast=True) - (zero * (1 << (4 * P)) + 8388608.0)[None, :]


@triton.jit
def _dequantize_tile(words, zero):
    """`q - zero` `[BLOCK_K / 8, 8, BLOCK_N]` float32 of a packed tile (row 8 r + j at [r, j])."""
    shifts = tl.arange(0, 8) * 4
    codes = ((words[:, None, :] >> shifts[None, :, None]) & 0xF) | 0x4B000000
    return codes.to(tl.float32, bitcast=True) - (zero + 8388608.0)[None, None, :]


@triton.jit
def _int4_gemv_kernel(
    x_ptr,  # [M, K]
    qweight_ptr,  # [K / 8, N] int32
    scales_ptr,  # [K / GROUP_SIZE, N]
    zeros_ptr,  # [K / GROUP_SIZE, N]
    out_ptr,  # [M, N] x's dtype
    partial_ptr,  # [num_splits, M, N] fp32 (SPLIT_MODE > 0)
    counters_ptr,  # [>= M * cdiv(N, BLOCK_N)] int32 zeros (SPLIT_MODE == 2)
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K
    stride_xm,
    stride_split,
    float_2p23_bits,  # 0x4B000000
    GROUP_SIZE: tl.constexpr,
    SPAN: tl.constexpr,  # the packing's rows per interleaved chunk (runtime_span): 8 or 128
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_MODE: tl.constexpr,  # see split_k.store_split
    PREFETCH: tl.constexpr,  # K steps whose words are in flight while one computes: 1 or 2
    USE_PDL: tl.constexpr = False,  # pdl.py: the first weight words load before the wait
    PACKED_F16: tl.constexpr = False,  # `_packed_f16_step` (CUDA: inline PTX)
    GATED: tl.constexpr = False,  # x_ptr: [M, 2K] gate | up; x = silu(gate) * up (`load_x`)
    SILU_OUT: tl.constexpr = False,  # columns gate | up; out: [M, N / 2] silu(gate) * up
    rope=None,  # `RopeStore.launch_args` (ROPE_HALF > 0): columns q | k | v, out: [M, q]
    ROPE_HALF: tl.constexpr = 0,  # > 0: head_dim / 2 of the rotary + KV-store epilogue
    KV_FP8_MAX: tl.constexpr = 0.0,  # > 0: the FP8 cache format's largest value
):
    row = tl.program_id(0).to(tl.int64)
    offs_n, mask_n = tile_rows(tl.program_id(1), N, BLOCK_N, SILU_OUT, ROPE_HALF)
    pid_k = tl.program_id(2)
    x_row = x_ptr + row * stride_xm
    # A run-time value: the compiler cannot fold it into the ANDs of _nibble_minus_zero, which
    # it otherwise turns back into two-constant LOP3s with a constant re-created before each.
    magic = float_2p23_bits
    # Per-thread partial sums over the K range: no cross-thread reduction inside the loop.
    acc = tl.zeros([BLOCK_K // 8, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    words, scale, zero = _load_words(
        qweight_ptr, scales_ptr, zeros_ptr, k_start, k_end, offs_n, mask_n, N, GROUP_SIZE, BLOCK_K
    )  # words: [R, BLOCK_N], R = BLOCK_K / 8
    if PREFETCH == 2:
        words_2, scale_2, zero_2 = _load_words(
            qweight_ptr, scales_ptr, zeros_ptr, k_start + BLOCK_K, k_end, offs_n, mask_n, N,
            GROUP_SIZE, BLOCK_K,
        )  # fmt: skip
    wait_for_prior_grids(USE_PDL)  # x and the outputs are the earlier kernels'
    rope_epilogue = rope_prologue(rope, row, BLOCK_N, ROPE_HALF, out_ptr)
    if PACKED_F16:  # over the whole SPAN-row chunks the split's words reach into
        x_amax = abs_max(
            x_row, (k_start // SPAN) * SPAN, tl.minimum(tl.cdiv(k_end, SPAN) * SPAN, K), K, GATED
        )
        x_inv = 1.0 / x_amax
    for k in range(k_start, k_end, BLOCK_K):
        # The next steps' words are in flight while this one computes: Triton pipelines only
        # the loads that feed a tl.dot, and a GEMV is bound by the bytes in flight per SM.
        next_words, next_scale, next_zero = _load_words(
            qweight_ptr, scales_ptr, zeros_ptr, k + PREFETCH * BLOCK_K, k_end, offs_n, mask_n, N,
            GROUP_SIZE, BLOCK_K,
        )  # fmt: skip
        # Every step is a whole tile (K is a multiple of BLOCK_K): no masks on x. Nibble j of
        # word i is input row (i // W) SPAN + j W + i % W (W = SPAN / 8 words a chunk).
        if BLOCK_K <= SPAN and SPAN > 8:  # the step's words lie in one chunk: contiguous rows
            rows = (k // SPAN) * SPAN + (k % SPAN) // 8 + tl.arange(0, BLOCK_K // 8)
        else:
            rows = k // 8 + tl.arange(0, BLOCK_K // 8)
            rows = (rows // (SPAN // 8)) * SPAN + rows % (SPAN // 8)  # nibble 0's input rows
        if PACKED_F16:
            dot = _packed_f16_step(words, zero, x_row, rows, x_inv, K, SPAN, GATED)
            acc += dot * (scale * x_amax)[None, :]
        else:
            low = words | magic  # nibbles 0..4 in place
            high = (words >> 20) | magic  # nibbles 5..7 at bits 0..11: one shift for three
            dot = tl.zeros([BLOCK_K // 8, BLOCK_N], dtype=tl.float32)
            for j in tl.static_range(8):  # nibble j of every word
                x_j = load_x(x_row, rows + j * (SPAN // 8), K, GATED)  # [R]
                if j < 5:
                    w = _nibble_minus_zero(low, zero, j)  # (q - z) 16^j
                    dot += w * (x_j * (1.0 / (1 << (4 * j))))[:, None]
                else:
                    w = _nibble_minus_zero(high, zero, j - 5)  # (q - z) 16^(j - 5)
                    dot += w * (x_j * (1.0 / (1 << (4 * (j - 5)))))[:, None]
            acc += dot * scale[None, :]
        if PREFETCH == 2:
            words, scale, zero = words_2, scale_2, zero_2
            words_2, scale_2, zero_2 = next_words, next_scale, next_zero
        else:
            words, scale, zero = next_words, next_scale, next_zero
    tile = row * tl.num_programs(1) + tl.program_id(1)
    silu_offsets, silu_mask = silu_columns(row, tl.program_id(1), N, BLOCK_N, SILU_OUT)
    store_split(
        tl.sum(acc, axis=0), out_ptr, partial_ptr, counters_ptr + tile, row * N + offs_n, mask_n,
        pid_k, tl.num_programs(2), stride_split, SPLIT_MODE, WIDE_REDUCE=True,
        silu_offsets=silu_offsets, silu_mask=silu_mask, SILU_OUT=SILU_OUT, rope=rope_epilogue,
        ROPE_HALF=ROPE_HALF, KV_FP8_MAX=KV_FP8_MAX,
    )  # fmt: skip


@triton.jit
def _f16_pair(lo, hi):
    """`[R]` int32: the float32 `lo` and `hi` rounded to fp16, lo in the low half."""
    return tl.inline_asm_elementwise(
        "{ .reg .f16 a, b; cvt.rn.f16.f32 a, $1; cvt.rn.f16.f32 b, $2; mov.b32 $0, {a, b}; }",
        "=r,f,f", [lo, hi], dtype=tl.int32, is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _packed_f16_step(
    words, zero, x_row, rows, x_inv, K, SPAN: tl.constexpr, GATED: tl.constexpr = False
):
    """One GEMV K step in packed fp16 arithmetic, two weights an instruction: the `[R, BLOCK_N]`
    float32 sums over each word's 8 nibbles of `(q - zero) x x_inv` (the caller scales them by
    the group's scale and `1 / x_inv`).

    Per word: nibbles (j, j + 4) share one fp16 pair. One LOP3 each puts the nibbles at bits 0-3
    or 4-7 of both halves into the mantissa of fp16 1024 (`1024 + q` or `1024 + 16 q`, exactly;
    nibbles 2, 3, 6, 7 after one shift by 8), a packed subtraction of `1024 + zero` (or
    `1024 + 16 zero`) leaves `(q - zero)` or `16 (q - zero)` exactly, and four packed FMAs with
    x's pairs (x x_inv in fp16, the 16x ones also / 16) sum the 8 products in two fp16 lanes,
    which one addition turns into float32. With `x_inv` 1 / the largest |x| of the program's
    K range every product stays within 15 and a lane's sum within 60, far from fp16's range,
    whatever the activations' size; the lanes' fp16 rounding (11 bits) is the one difference
    from the float32 path (<= ~5e-4 relative). CUDA only (inline PTX)."""
    x_0 = load_x(x_row, rows + 0 * (SPAN // 8), K, GATED)  # [R]
    x_1 = load_x(x_row, rows + 1 * (SPAN // 8), K, GATED)
    x_2 = load_x(x_row, rows + 2 * (SPAN // 8), K, GATED)
    x_3 = load_x(x_row, rows + 3 * (SPAN // 8), K, GATED)
    x_4 = load_x(x_row, rows + 4 * (SPAN // 8), K, GATED)
    x_5 = load_x(x_row, rows + 5 * (SPAN // 8), K, GATED)
    x_6 = load_x(x_row, rows + 6 * (SPAN // 8), K, GATED)
    x_7 = load_x(x_row, rows + 7 * (SPAN // 8), K, GATED)
    inv16 = x_inv * 0.0625
    x_a = _f16_pair(x_0 * x_inv, x_4 * x_inv)  # nibbles 0, 4: bits 0-3 of each half
    x_b = _f16_pair(x_1 * inv16, x_5 * inv16)  # nibbles 1, 5: bits 4-7 (16 q)
    x_c = _f16_pair(x_2 * x_inv, x_6 * x_inv)  # nibbles 2, 6: bits 8-11, shifted to 0-3
    x_d = _f16_pair(x_3 * inv16, x_7 * inv16)  # nibbles 3, 7: bits 12-15, shifted to 4-7
    zero_1 = _f16_pair(zero + 1024.0, zero + 1024.0)  # [BLOCK_N]
    zero_16 = _f16_pair(zero * 16.0 + 1024.0, zero * 16.0 + 1024.0)
    return tl.inline_asm_elementwise(
        "{ .reg .b32 a, b, c, d, w8, s; .reg .f16 lo, hi; .reg .f32 flo, fhi; "
        "lop3.b32 a, $1, 0x000F000F, 0x64006400, 0xEA; "
        "lop3.b32 b, $1, 0x00F000F0, 0x64006400, 0xEA; "
        "shr.u32 w8, $1, 8; "
        "lop3.b32 c, w8, 0x000F000F, 0x64006400, 0xEA; "
        "lop3.b32 d, w8, 0x00F000F0, 0x64006400, 0xEA; "
        "sub.rn.f16x2 a, a, $2; sub.rn.f16x2 b, b, $3; "
        "sub.rn.f16x2 c, c, $2; sub.rn.f16x2 d, d, $3; "
        "mul.rn.f16x2 s, a, $4; fma.rn.f16x2 s, b, $5, s; "
        "fma.rn.f16x2 s, c, $6, s; fma.rn.f16x2 s, d, $7, s; "
        "mov.b32 {lo, hi}, s; cvt.f32.f16 flo, lo; cvt.f32.f16 fhi, hi; "
        "add.f32 $0, flo, fhi; }",
        "=f,r,r,r,r,r,r,r",
        [words, zero_1[None, :], zero_16[None, :], x_a[:, None], x_b[:, None], x_c[:, None],
         x_d[:, None]],
        dtype=tl.float32, is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _int4_gemm_kernel(
    x_ptr,  # [M, K]
    qweight_ptr,  # [K / 8, N] int32
    scales_ptr,  # [K / GROUP_SIZE, N]
    zeros_ptr,  # [K / GROUP_SIZE, N]
    out_ptr,  # [M, N] x's dtype
    partial_ptr,  # [num_splits, M, N] fp32 (SPLIT_MODE > 0)
    counters_ptr,  # [>= cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)] int32 zeros (SPLIT_MODE == 2)
    M,
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K
    stride_xm,
    stride_split,
    GROUP_SIZE: tl.constexpr,
    SPAN: tl.constexpr,  # the packing's span: 8, or 128 with BLOCK_K == 128
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_MODE: tl.constexpr,  # see split_k.store_split
    SWAP_AB: tl.constexpr,
    USE_PDL: tl.constexpr = False,  # pdl.py
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    pid_k = tl.program_id(2)
    wait_for_prior_grids(USE_PDL)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k in range(k_start, k_end, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + ks[None, :], mask=mask_m[:, None] & (ks < k_end)[None, :], other=0.0)
        words, scale, zero = _load_words(
            qweight_ptr, scales_ptr, zeros_ptr, k, k_end, offs_n, mask_n, N, GROUP_SIZE, BLOCK_K
        )
        # The weight rounded once to x's dtype, as `dequantize_int4` writes it; accumulating
        # inside tl.dot lets the tensor cores overlap the next tile's dequantization.
        w = _dequantize_tile(words, zero) * scale[None, None, :]  # [R, 8, BLOCK_N]
        if SPAN == 8:  # [r, j] is row 8 r + j: the order is kept
            w = tl.reshape(w, [BLOCK_K, BLOCK_N]).to(x.dtype)
        else:  # one 128-row chunk: [r, j] is row 16 j + r
            w = tl.reshape(tl.permute(w, (1, 0, 2)), [BLOCK_K, BLOCK_N]).to(x.dtype)
        if SWAP_AB:  # acc^T += w^T x^T: the weights are wgmma's A operand, from registers
            acc = tl.trans(tl.dot(tl.trans(w), tl.trans(x), tl.trans(acc)))
        else:  # the weights go through shared memory as the B operand
            acc = tl.dot(x, w, acc)
    tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    offsets = offs_m[:, None] * N + offs_n[None, :]  # int32: see the nibble GEMM's epilogue
    store_split(
        acc, out_ptr, partial_ptr, counters_ptr + tile, offsets, mask_m[:, None] & mask_n[None, :],
        pid_k, tl.num_programs(2), stride_split, SPLIT_MODE, WIDE_REDUCE=False,
    )  # fmt: skip


@triton.jit
def _unpack_pair(words, zero_pair, scale_pair, J: tl.constexpr, DTYPE: tl.constexpr):
    """Nibbles J and J + 4 of `words` `[16, BLOCK_N]` as two tiles of `(q - zero) * scale` in
    DTYPE (bf16 or fp16), two weights per instruction: one LOP3 puts both nibbles into the low
    mantissa bits of a 16-bit float pair whose exponent makes it `magic + q` exactly (128 in
    bf16, 1024 in fp16); a packed subtraction of `magic + zero` (`zero_pair`) leaves the exact
    `q - zero`, a packed multiplication by `scale_pair` rounds it once to DTYPE, as the
    reference's float32 product rounded to x's dtype. ~1.5 instructions a weight against ~5
    through float32 (the GEMM's bound at these M). CUDA only: inline PTX (sm_90 for bf16x2)."""
    if DTYPE == tl.bfloat16:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; lop3.b32 t, $2, 0x000F000F, 0x43004300, 0xEA; "
            "sub.rn.bf16x2 t, t, $3; mul.rn.bf16x2 t, t, $4; mov.b32 {$0, $1}, t; }",
            "=h,=h,r,r,r", [words >> (4 * J), zero_pair, scale_pair],
            dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1,
        )  # fmt: skip
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; lop3.b32 t, $2, 0x000F000F, 0x64006400, 0xEA; "
            "sub.rn.f16x2 t, t, $3; mul.rn.f16x2 t, t, $4; mov.b32 {$0, $1}, t; }",
            "=h,=h,r,r,r", [words >> (4 * J), zero_pair, scale_pair],
            dtype=(tl.float16, tl.float16), is_pure=True, pack=1,
        )  # fmt: skip


@triton.jit
def _pair_bits(value, DTYPE: tl.constexpr):
    """`[BLOCK_N]` int32 with `value` rounded to the 16-bit DTYPE in both halves."""
    bits = value.to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return bits | (bits << 16)


@triton.jit
def _nibble_tile(words, zero, scale, J: tl.constexpr):
    """Nibble J of `words` `[16, BLOCK_N]` as `(q - zero) * scale` in float32 (`q - zero`
    exactly; the float32 path: the interpreter, float32 x)."""
    bits = ((words >> (4 * J)) & 0xF) | 0x4B000000
    return (bits.to(tl.float32, bitcast=True) - (zero + 8388608.0)[None, :]) * scale[None, :]


@triton.jit
def _nibble_dot(acc, w, x_ptr, offs_m, mask_m, stride_xm, rows, SWAP_AB: tl.constexpr):
    """acc += x[:, rows] w (`w`: `[R, BLOCK_N]` weights of input rows `rows` `[R]`, R = 16 or
    the chunk's 128)."""
    # x^T `[R, BLOCK_M]`: R consecutive rows (32 or 256 bytes) a token. Every step is a whole
    # tile (K is a multiple of 128), so only the tokens are masked.
    x_t = tl.load(
        x_ptr + offs_m.to(tl.int64)[None, :] * stride_xm + rows[:, None], mask=mask_m[None, :],
        other=0.0,
    )  # fmt: skip
    w = w.to(x_t.dtype)
    # (Both branches assign: Triton compiles the statements after an early `return` too.)
    if SWAP_AB:  # acc^T += w^T x^T: the weights are wgmma's register operand, never in smem
        acc = tl.dot(tl.trans(w), x_t, acc)
    else:
        acc = tl.dot(tl.trans(x_t), w, acc)
    return acc


@triton.jit
def _int4_nibble_gemm_kernel(
    x_ptr,  # [M, K]
    qweight_ptr,  # [K / 8, N] int32, span 128
    scales_ptr,  # [K / GROUP_SIZE, N]
    zeros_ptr,  # [K / GROUP_SIZE, N]
    out_ptr,  # [M, N] x's dtype
    partial_ptr,  # [num_splits, M, N] fp32 (SPLIT_MODE > 0)
    counters_ptr,  # [>= cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)] int32 zeros (SPLIT_MODE == 2)
    M,
    N,
    K,
    k_per_split,  # a multiple of 128
    stride_xm,
    stride_split,
    GROUP_SIZE: tl.constexpr,  # a multiple of 128
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT_MODE: tl.constexpr,  # see split_k.store_split
    SWAP_AB: tl.constexpr,
    PACKED: tl.constexpr,  # unpack two weights per instruction (16-bit x on CUDA)
    USE_PDL: tl.constexpr = False,  # pdl.py
    CHUNK_DOT: tl.constexpr = False,  # the chunk's 8 tiles in one [128, BLOCK_N] dot
    PREFETCH_WORDS: tl.constexpr = False,  # the next chunk's words load before this one's dot
    SILU_OUT: tl.constexpr = False,  # columns gate | up; out: [M, N / 2] silu(gate) * up
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n, mask_n = tile_rows(tl.program_id(1), N, BLOCK_N, SILU_OUT)
    pid_k = tl.program_id(2)
    mask_m = offs_m < M
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # A multiple of 128: x's 16-row parts are 32-byte aligned (vector loads).
    k_start = tl.multiple_of(pid_k * k_per_split, 128)
    k_end = tl.minimum(k_start + k_per_split, K)
    sub = tl.arange(0, 16)
    if PREFETCH_WORDS:  # the weights are no earlier kernel's output: loaded before the wait
        words, scale, zero = _load_words(
            qweight_ptr, scales_ptr, zeros_ptr, k_start, k_end, offs_n, mask_n, N, GROUP_SIZE, 128
        )  # [16, BLOCK_N] words: one 128-row chunk
    wait_for_prior_grids(USE_PDL)
    # One 128-row chunk a step (16 words a column): nibble j holds rows k + 16 j + 0..15.
    for k in range(k_start, k_end, 128):
        if PREFETCH_WORDS:
            # Triton pipelines only the loads feeding a tl.dot directly (x here): the words
            # reach the dot through the unpacking, so without this each step waits out their
            # load with only the SM's other programs to hide it.
            next_words, next_scale, next_zero = _load_words(
                qweight_ptr, scales_ptr, zeros_ptr, k + 128, k_end, offs_n, mask_n, N,
                GROUP_SIZE, 128,
            )  # fmt: skip
        else:
            words, scale, zero = _load_words(
                qweight_ptr, scales_ptr, zeros_ptr, k, k_end, offs_n, mask_n, N, GROUP_SIZE, 128
            )
        if PACKED:
            dtype: tl.constexpr = x_ptr.dtype.element_ty
            magic: tl.constexpr = 128.0 if dtype == tl.bfloat16 else 1024.0
            zero_pair = tl.broadcast_to(_pair_bits(zero + magic, dtype)[None, :], [16, BLOCK_N])
            scale_pair = tl.broadcast_to(_pair_bits(scale, dtype)[None, :], [16, BLOCK_N])
        if CHUNK_DOT:
            # Tile j is rows k + 16 j + 0..15: the 8 stacked on new minor axes in each
            # thread's registers (joins), then laid out as the chunk's 128 rows, one dot. Per
            # nibble, Triton waits for each dot before the next (its A operand's registers);
            # the chunk's 8 wgmma steps of one dot run back to back (sm_90 compile: 7 pending).
            if PACKED:
                t0, t4 = _unpack_pair(words, zero_pair, scale_pair, 0, dtype)
                t1, t5 = _unpack_pair(words, zero_pair, scale_pair, 1, dtype)
                t2, t6 = _unpack_pair(words, zero_pair, scale_pair, 2, dtype)
                t3, t7 = _unpack_pair(words, zero_pair, scale_pair, 3, dtype)
            else:  # float32 unpacking (the interpreter, float32 x)
                t0 = _nibble_tile(words, zero, scale, 0)
                t1 = _nibble_tile(words, zero, scale, 1)
                t2 = _nibble_tile(words, zero, scale, 2)
                t3 = _nibble_tile(words, zero, scale, 3)
                t4 = _nibble_tile(words, zero, scale, 4)
                t5 = _nibble_tile(words, zero, scale, 5)
                t6 = _nibble_tile(words, zero, scale, 6)
                t7 = _nibble_tile(words, zero, scale, 7)
            low = tl.join(tl.join(t0, t2), tl.join(t1, t3))  # [16, BN, x, y]: nibble 2 x + y
            high = tl.join(tl.join(t4, t6), tl.join(t5, t7))  # nibble 4 + 2 x + y
            w = tl.join(low, high)  # [16, BLOCK_N, x, y, z]: nibble 4 z + 2 x + y
            w = tl.reshape(tl.permute(w, (4, 2, 3, 0, 1)), [128, BLOCK_N])  # row 16 j + r
            acc = _nibble_dot(acc, w, x_ptr, offs_m, mask_m, stride_xm, k + tl.arange(0, 128),
                              SWAP_AB)  # fmt: skip
        elif PACKED:
            for j in tl.static_range(4):
                low, high = _unpack_pair(words, zero_pair, scale_pair, j, dtype)
                acc = _nibble_dot(acc, low, x_ptr, offs_m, mask_m, stride_xm, k + 16 * j + sub,
                                  SWAP_AB)  # fmt: skip
                acc = _nibble_dot(acc, high, x_ptr, offs_m, mask_m, stride_xm,
                                  k + 16 * (j + 4) + sub, SWAP_AB)  # fmt: skip
        else:  # float32 unpacking (the interpreter, float32 x)
            for j in tl.static_range(8):
                acc = _nibble_dot(acc, _nibble_tile(words, zero, scale, j), x_ptr, offs_m, mask_m,
                                  stride_xm, k + 16 * j + sub, SWAP_AB)  # fmt: skip
        if PREFETCH_WORDS:
            words, scale, zero = next_words, next_scale, next_zero
    if SWAP_AB:
        result = tl.trans(acc)
    else:
        result = acc
    tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    # int32 (the host checks M N < 2^31): int64 offsets of a 64 x 64 tile, live across the
    # split-K epilogue's atomic, cost ~90 registers a thread (ptxas sm_90: 240 -> 148).
    offsets = offs_m[:, None] * N + offs_n[None, :]
    if SILU_OUT:  # the tile's B/2 activation columns of its tokens in the [M, N / 2] output
        columns = tl.program_id(1) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        silu_offsets = offs_m[:, None] * (N // 2) + columns[None, :]
        silu_mask = mask_m[:, None] & (columns < N // 2)[None, :]
    else:  # unused (compiled away)
        silu_offsets, silu_mask = offs_m, mask_m
    store_split(
        result, out_ptr, partial_ptr, counters_ptr + tile, offsets,
        mask_m[:, None] & mask_n[None, :], pid_k, tl.num_programs(2), stride_split, SPLIT_MODE,
        WIDE_REDUCE=False, silu_offsets=silu_offsets, silu_mask=silu_mask, SILU_OUT=SILU_OUT,
    )  # fmt: skip


@triton.jit
def _dequantize_int4_kernel(
    qweight_ptr,  # [K / 8, N] int32
    scales_ptr,  # [K / GROUP_SIZE, N]
    zeros_ptr,  # [K / GROUP_SIZE, N]
    out_ptr,  # [K, N]
    N,
    K,
    GROUP_SIZE: tl.constexpr,
    SPAN: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    k = tl.program_id(0) * BLOCK_K
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    words, scale, zero = _load_words(
        qweight_ptr, scales_ptr, zeros_ptr, k, K, offs_n, mask_n, N, GROUP_SIZE, BLOCK_K
    )
    weight = _dequantize_tile(words, zero) * scale[None, None, :]  # [R, 8, BLOCK_N]
    word = k // 8 + tl.arange(0, BLOCK_K // 8)  # [R]: nibble j is row (i // W) SPAN + j W + i % W
    first = (word // (SPAN // 8)) * SPAN + word % (SPAN // 8)
    rows = first[:, None] + tl.arange(0, 8)[None, :] * (SPAN // 8)  # [R, 8]
    out = out_ptr + rows.to(tl.int64)[:, :, None] * N + offs_n[None, None, :]
    mask = (rows < K)[:, :, None] & mask_n[None, None, :]
    tl.store(out, weight.to(out_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _multiprocessor_count(device_index: int | None) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_int4_config(
    m: int, n: int, k: int, group_size: int, device: torch.device
) -> Int4GemmConfig:
    """The launch `int4_gemm` makes for an `[m, k] x [k, n]` product: the tuned table's row
    (kernels/int4_gemm_configs.json), else the untuned fallback."""
    num_sms = _multiprocessor_count(device.index) if device.type == "cuda" else 8
    return int4_config(m, n, k, group_size, num_sms)


def split_k_counter_slots(n: int) -> int:
    """Size of the int32 `split_k_counters` that lets every int4_gemm launch of an N-column
    weight below DEQUANTIZE_M_MIN tokens reduce its split-K partials in-kernel: one counter per
    output tile (GEMV: M <= 4 tokens x cdiv(N, 32); GEMM: cdiv(255, 16) x cdiv(N, 64))."""
    return 16 * triton.cdiv(n, 32)


def int4_gemm(
    x: torch.Tensor,  # [M, K] bf16/fp16/fp32
    qweight: torch.Tensor,  # [K / 8, N] int32
    scales: torch.Tensor,  # [K / group_size, N]
    zeros: torch.Tensor,  # [K / group_size, N] integers 0..16
    group_size: int,
    split_k_counters: torch.Tensor | None = None,
    gated: bool = False,
    silu_out: bool = False,
    rope_store: RopeStore | None = None,
    **overrides,
) -> torch.Tensor:  # [M, N] x's dtype ([M, N / 2] with silu_out, [M, q] with rope_store)
    """The Triton int4 product `x @ dequantize_int4_ref(...)` (no bias); with `gated`, x is an
    MLP's `[M, 2K]` gate | up and the product is `silu_and_mul(x) @ ...`, the activation
    computed as the GEMV loads x (GEMV launches only: `takes_gated_input`); with `silu_out`,
    the weight's columns are an MLP's gate | up and the result is `silu_and_mul` of the
    product, computed in the epilogue of the GEMV or the nibble GEMM (`int4_takes_silu_output`;
    with K splits it needs `split_k_counters`); with `rope_store` (GEMV launches only), the
    weight's columns are Llama's q | k | v heads and the result is the rotated q, the rotated
    k and the v written into the caches (`kernels/rope_store.py`, as `gemv`'s).

    Args:
        split_k_counters: int32 zeros, one per output tile (`split_k_counter_slots`), owned by
            the caller and left zeroed: with them a split-K launch sums its partials in-kernel
            (the last split of each tile); without them (or too few), one more launch does.
            Launches sharing them must be ordered (one stream).
        overrides: fields of `Int4GemmConfig` (benchmarks and tests).

    Raises:
        ValueError naming the argument on bad shapes, dtypes, strides, group size or config.
    """
    k = qweight.shape[0] * 8
    if gated and (x.dim() != 2 or x.shape[1] != 2 * k):
        raise ValueError(f"gated x must be [M, 2K] = [M, {2 * k}], got {tuple(x.shape)}")
    check_int4_inputs(x[:, :k] if gated else x, qweight, scales, zeros, group_size)
    m, k = x.shape[0], k
    n = qweight.shape[1]
    config = default_int4_config(m, n, k, group_size, x.device).with_overrides(**overrides)
    if gated and not config.gemv:
        raise ValueError("gated x takes the GEMV launch (int4_takes_gated_input)")
    span = runtime_span(group_size)
    nibble_gemm = not config.gemv and span == INTERLEAVED_SPAN and config.per_nibble
    if silu_out and (not (config.gemv or nibble_gemm) or gated or n % 2 or config.block_n < 2):
        raise ValueError(
            "silu_out takes the GEMV or nibble-GEMM launch, an even number of columns "
            "(gate | up), block_n >= 2 and no gated x"
        )
    if rope_store is not None and (not config.gemv or gated or silu_out or config.block_n < 2):
        raise ValueError("rope_store takes the GEMV launch, block_n >= 2, no gated or silu_out")
    block_k = config.block_k
    if group_size % block_k:
        raise ValueError(f"block_k={block_k} must divide group_size={group_size}")
    if not config.gemv and span == INTERLEAVED_SPAN and block_k != INTERLEAVED_SPAN:
        raise ValueError(f"block_k must be {INTERLEAVED_SPAN} for group_size={group_size}")
    k_per_split = triton.cdiv(triton.cdiv(k, config.split_k), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)  # no empty splits
    out_width = n // 2 if silu_out else n
    rope_launch = {}
    if rope_store is not None:
        rope_launch, out_width = rope_store.launch_args(m, n, x.dtype), rope_store.q_width
    out = torch.empty((m, out_width), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    # silu_out / rope_store: a tile holds block_n / 2 pairs of columns (`tile_rows`).
    paired = silu_out or rope_store is not None
    grid = (
        m if config.gemv else triton.cdiv(m, config.block_m),
        paired_tiles(n, config.block_n) if paired else triton.cdiv(n, config.block_n),
        splits,
    )
    if not config.gemv and m * n >= 2**31:  # the GEMMs' int32 output offsets
        raise ValueError(f"the int4 GEMM takes fewer than 2^31 outputs, got {m} x {n}")
    split_mode, partial, counters = split_buffers(
        out, splits, grid[0] * grid[1], split_k_counters, weight_rows=n,
        in_kernel=silu_out or rope_store is not None,
    )  # fmt: skip
    common = dict(
        GROUP_SIZE=group_size, BLOCK_N=config.block_n, BLOCK_K=block_k, SPLIT_MODE=split_mode
    )
    launch = dict(num_warps=config.num_warps, num_stages=config.num_stages)
    if config.gemv:
        _int4_gemv_kernel[grid](
            x, qweight, scales, zeros, out, partial, counters, n, k, k_per_split, x.stride(0),
            m * n, 0x4B000000, SPAN=span, PREFETCH=config.prefetch, **common, **launch,
            PACKED_F16=config.packed_f16 and x.is_cuda and x.dtype in _PACKED_DTYPES,
            GATED=gated, SILU_OUT=silu_out, **rope_launch, **pdl_launch_options(x.device),
        )  # fmt: skip
    elif nibble_gemm:
        packed = x.is_cuda and x.dtype in _PACKED_DTYPES
        _int4_nibble_gemm_kernel[grid](
            x, qweight, scales, zeros, out, partial, counters, m, n, k, k_per_split, x.stride(0),
            m * n, GROUP_SIZE=group_size, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
            SPLIT_MODE=split_mode, SWAP_AB=config.swap_ab, PACKED=packed,
            CHUNK_DOT=config.chunk_dot, PREFETCH_WORDS=config.prefetch_words,
            SILU_OUT=silu_out, **launch,
            **pdl_launch_options(x.device),
        )  # fmt: skip
    else:
        _int4_gemm_kernel[grid](
            x, qweight, scales, zeros, out, partial, counters, m, n, k, k_per_split, x.stride(0),
            m * n, SPAN=span, BLOCK_M=config.block_m, SWAP_AB=config.swap_ab, **common, **launch,
            **pdl_launch_options(x.device),
        )  # fmt: skip
    # A few outputs per reduce program: N / 256 programs read the partials.
    return finish_splits(split_mode, partial, out, block=256)


def int4_takes_gated_input(m: int, qweight: torch.Tensor, group_size: int) -> bool:
    """Whether the layer passes `gated=True` at m tokens on this weight: where the tuned table's
    launch is a GEMV row marked `gated`."""
    if not qweight.is_cuda or m >= DEQUANTIZE_M_MIN:
        return False
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    config = default_int4_config(m, n, k, group_size, qweight.device)
    return config.gemv and config.gated


def int4_takes_silu_output(m: int, qweight: torch.Tensor, group_size: int) -> bool:
    """Whether the layer passes `silu_out=True` at m tokens on this (merged gate | up) weight:
    where the tuned table's launch is a GEMV or nibble-GEMM row marked `silu_out`."""
    if not qweight.is_cuda or m >= DEQUANTIZE_M_MIN:
        return False
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    config = default_int4_config(m, n, k, group_size, qweight.device)
    nibble_gemm = config.per_nibble and runtime_span(group_size) == INTERLEAVED_SPAN
    return config.silu_out and (config.gemv or nibble_gemm)


def int4_takes_rope_store(m: int, qweight: torch.Tensor, group_size: int) -> bool:
    """Whether the layer passes `rope_store=` at m tokens on this (merged q | k | v) weight:
    where the tuned table's launch is a GEMV row marked `rope_store`."""
    if not qweight.is_cuda or m >= DEQUANTIZE_M_MIN:
        return False
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    config = default_int4_config(m, n, k, group_size, qweight.device)
    return config.gemv and config.rope_store


def dequantize_int4(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:  # [K, N] scales' dtype
    """The Triton twin of `dequantize_int4_ref`: `(q - zero) * scale` in one pass over the
    packed weight, rounded once to the scales' dtype."""
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    check_int4_inputs(torch.empty(0, k, device=qweight.device), qweight, scales, zeros, group_size)
    out = torch.empty((k, n), dtype=scales.dtype, device=qweight.device)
    block_n, block_k = 128, largest_block_k(group_size, 64)
    grid = (triton.cdiv(k, block_k), triton.cdiv(n, block_n))
    _dequantize_int4_kernel[grid](
        qweight, scales, zeros, out, n, k, GROUP_SIZE=group_size, SPAN=runtime_span(group_size),
        BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip
    return out


def int4_linear(
    x: torch.Tensor,  # [..., K]
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    split_k_counters: torch.Tensor | None = None,
) -> torch.Tensor:  # [..., N] x's dtype
    """`x @ W + bias` with an int4 W: on CUDA the Triton GEMV or GEMM by M (`split_k_counters`:
    see `int4_gemm`), or from DEQUANTIZE_M_MIN tokens the dequantized weight through cuBLAS; the
    reference on CPU."""
    if x.device.type != "cuda":
        return int4_linear_ref(x, qweight, scales, zeros, group_size, bias)
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] >= DEQUANTIZE_M_MIN:
        weight = dequantize_int4(qweight, scales, zeros, group_size).to(x.dtype)  # [K, N]
        out = flat @ weight if bias is None else torch.addmm(bias, flat, weight)
        return out.reshape(*x.shape[:-1], out.shape[-1])
    flat = flat if flat.stride(-1) == 1 else flat.contiguous()
    out = int4_gemm(flat, qweight, scales, zeros, group_size, split_k_counters)
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], out.shape[-1])
