"""int4 weight-only GEMM: the Triton GEMV (split-K) and GEMM against the dequantize-then-matmul
reference (interpreter on the CPU; real sizes on the GPU), the `int4_linear` dispatcher, the
row packing, and input checks."""

from __future__ import annotations

import pytest
import torch

from radixgen.kernels.gated_silu import silu_times_up_ref as gated_activation
from radixgen.kernels.int4_gemm import (
    GEMV_M_MAX,
    default_int4_config,
    dequantize_int4,
    dequantize_int4_ref,
    int4_gemm,
    int4_linear,
    int4_linear_ref,
    pack_int4_rows,
    runtime_span,
    split_k_counter_slots,
    unpack_int4_rows,
)
from tests.sm90_compile import PDL_PTX, assert_compile_for_sm90_without_spills


def relative_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def random_int4(n: int, k: int, group_size: int, dtype, generator, device="cpu"):
    """qweight [K/8, N] int32, scales and zeros [K/G, N] in `dtype`."""
    codes = torch.randint(0, 16, (k, n), generator=generator)
    scales = torch.rand(k // group_size, n, generator=generator) * 0.02 + 1e-3
    zeros = torch.randint(0, 17, (k // group_size, n), generator=generator)  # 16: GPTQ v1
    return (
        pack_int4_rows(codes, runtime_span(group_size)).to(device),
        scales.to(dtype).to(device),
        zeros.to(dtype).to(device),
    )


def test_row_packing_byte_layout():
    """Nibble j of word [i, n] is row 8 i + j: rows 1..8 of one column pack to 0x87654321."""
    codes = torch.tensor([[1], [2], [3], [4], [5], [6], [7], [8]])
    assert pack_int4_rows(codes).item() == 0x87654321 - (1 << 32)  # int32: the sign bit is set
    codes = torch.randint(0, 16, (64, 24), generator=torch.Generator().manual_seed(0))
    assert torch.equal(unpack_int4_rows(pack_int4_rows(codes)).long(), codes)


def test_interleaved_packing_byte_layout():
    """Span 128 (group sizes that are multiples of 128): nibble j of word i holds row
    (i // 16) 128 + 16 j + i % 16, so nibble j of a chunk's 16 words is rows 16 j..16 j + 15."""
    assert runtime_span(128) == runtime_span(256) == 128
    assert runtime_span(64) == runtime_span(32) == 8  # GPTQ's order
    rows = torch.arange(256)[:, None]  # [K, 1]
    codes = (rows % 128) // 16 + 8 * (rows // 128)  # row 16 j + r of chunk c: j (+ 8 in chunk 1)
    packed = pack_int4_rows(codes % 16, 128)  # [32, 1]
    assert packed[:16].flatten().tolist() == [0x76543210] * 16
    assert packed[16:].flatten().tolist() == [0xFEDCBA98 - (1 << 32)] * 16
    codes = torch.randint(0, 16, (384, 8), generator=torch.Generator().manual_seed(1))
    assert torch.equal(unpack_int4_rows(pack_int4_rows(codes, 128), 128).long(), codes)
    with pytest.raises(ValueError, match="span"):
        pack_int4_rows(codes[:200], 128)


GEMV = {"gemv": True, "block_m": 1, "num_stages": 1}


@pytest.mark.parametrize(
    "m,n,k,group_size,dtype,overrides,counters",
    [
        (1, 72, 256, 128, torch.float32, {}, False),  # GEMV, split-K by default, reduce launch
        (1, 72, 256, 128, torch.float32, {}, True),  # GEMV, split-K reduced in-kernel
        (1, 72, 512, 64, torch.float32, {"prefetch": 1, "split_k": 2}, True),
        (2, 40, 640, 32, torch.float16, {**GEMV, "split_k": 16, "block_k": 32}, True),  # 10 splits
        (3, 40, 128, 32, torch.float16, {**GEMV, "split_k": 2}, True),  # GEMV, ragged N
        (2, 64, 256, 128, torch.float16, {**GEMV, "num_warps": 4, "block_k": 128}, False),
        (3, 40, 256, 64, torch.float16, {}, True),  # GEMM W^T x^T by default up to 16 tokens
        (20, 48, 256, 64, torch.float32, {}, False),  # GEMM, ragged M
        # group 128: the one-dot-per-nibble GEMM (float32 unpacking on the interpreter)
        (33, 64, 256, 128, torch.float16, {"split_k": 2}, True),  # split-K
        (5, 40, 384, 128, torch.float32, {"split_k": 4, "block_m": 16}, False),  # 3 splits
        (17, 64, 256, 128, torch.float16, {"swap_ab": True, "block_n": 32}, True),  # W^T x^T
        # ... with the chunk's 8 nibble tiles stacked into one dot (chunk_dot)
        (33, 64, 256, 128, torch.float16, {"chunk_dot": True, "split_k": 2}, True),
        (17, 40, 384, 128, torch.float32, {"chunk_dot": True, "swap_ab": True}, False),
        # ... with the next chunk's words loaded ahead (3 chunks a split: the last prefetch
        # reaches past the split's end and loads nothing)
        (
            33,
            64,
            768,
            128,
            torch.float16,
            {"chunk_dot": True, "prefetch_words": True, "split_k": 2},
            True,
        ),  # fmt: skip
        (17, 40, 384, 128, torch.float32, {"prefetch_words": True, "swap_ab": True}, False),
        # group 128, the whole chunk unpacked, permuted to row order and reshaped into one dot
        (20, 40, 256, 128, torch.float16, {"per_nibble": False, "split_k": 2}, True),
        (9, 64, 384, 128, torch.float32, {"per_nibble": False, "swap_ab": True}, False),
        (24, 40, 128, 64, torch.float32, {"swap_ab": True, "split_k": 2}, True),  # W^T x^T
    ],
)
def test_triton_int4_matches_reference(m, n, k, group_size, dtype, overrides, counters):
    """On the interpreter without CUDA: both kernels, fp32 and fp16 activations, split-K
    reduced by a second launch or in-kernel (whose counters are left zeroed for the next)."""
    generator = torch.Generator().manual_seed(m + n)
    weights = random_int4(n, k, group_size, dtype, generator)
    x = torch.randn(m, k, generator=generator).to(dtype)
    config = default_int4_config(m, n, k, group_size, x.device).with_overrides(**overrides)
    assert config.gemv == (m <= GEMV_M_MAX or overrides.get("gemv", False))
    split_k_counters = torch.zeros(split_k_counter_slots(n), dtype=torch.int32)
    for _ in range(2 if counters else 1):  # a second call reuses the counters
        out = int4_gemm(
            x, *weights, group_size, split_k_counters if counters else None, **overrides
        )
        assert out.dtype == dtype and out.shape == (m, n)
        reference = int4_linear_ref(x.float(), *weights, group_size)
        assert relative_error(out, reference) < (1e-5 if dtype == torch.float32 else 1e-3)
        assert not split_k_counters.any()


@pytest.mark.parametrize("group_size", [128, 64])
def test_gated_gemv_applies_the_activation_as_it_loads_x(group_size):
    """`gated`: x is an MLP's gate | up and the GEMV multiplies `silu(gate) * up` (the down
    projection without the activation kernel), as the two kernels would; only GEMV launches."""
    generator = torch.Generator().manual_seed(group_size)
    m, n, k = 1, 72, 256
    weights = random_int4(n, k, group_size, torch.float16, generator)
    gate_up = torch.randn(m, 2 * k, generator=generator).to(torch.float16)
    split_k_counters = torch.zeros(split_k_counter_slots(n), dtype=torch.int32)
    gated = int4_gemm(gate_up, *weights, group_size, split_k_counters, gated=True, **GEMV)
    expected = int4_gemm(gated_activation(gate_up), *weights, group_size, **GEMV)
    torch.testing.assert_close(gated, expected, atol=1e-3, rtol=1e-3)
    assert not split_k_counters.any()
    with pytest.raises(ValueError, match=r"gated x must be \[M, 2K\]"):
        int4_gemm(gate_up[:, :k], *weights, group_size, gated=True, **GEMV)
    with pytest.raises(ValueError, match="GEMV launch"):
        int4_gemm(gate_up, *weights, group_size, gated=True, gemv=False)
    # The layer opts in per table row (GEMV rows only).
    config = default_int4_config(m, n, k, group_size, gate_up.device)
    assert not config.gated and config.with_overrides(gated=True).gated
    with pytest.raises(ValueError, match="gated is a GEMV option"):
        config.with_overrides(gemv=False, block_m=16, gated=True)


@pytest.mark.parametrize("split_k", [1, 2])
def test_silu_out_gemv_writes_the_activation_of_its_gate_and_up_sums(split_k):
    """`silu_out`: the weight's columns are an MLP's gate | up and the GEMV writes
    `silu(gate) * up` from its tiles' sums (block_n / 2 gate columns and their up columns a
    tile), as the plain launch then the activation kernel would, ragged halves and in-kernel
    splits included; only GEMV launches, and K splits need the counters."""
    generator = torch.Generator().manual_seed(split_k)
    intermediate, k, group_size = 36, 256, 64  # 36 is no multiple of block_n / 2
    weights = random_int4(2 * intermediate, k, group_size, torch.float16, generator)
    x = torch.randn(1, k, generator=generator).to(torch.float16)
    counters = torch.zeros(split_k_counter_slots(2 * intermediate), dtype=torch.int32)
    launch = {**GEMV, "block_n": 16, "split_k": split_k}
    plain = int4_gemm(x, *weights, group_size, counters, **launch)
    out = int4_gemm(x, *weights, group_size, counters, silu_out=True, **launch)
    assert out.shape == (1, intermediate)
    torch.testing.assert_close(out, gated_activation(plain), atol=1e-3, rtol=1e-3)
    assert not counters.any()
    # Group 64 keeps GPTQ's order: its GEMM is the reshaped one, which has no such epilogue.
    with pytest.raises(ValueError, match="silu_out takes the GEMV or nibble-GEMM launch"):
        int4_gemm(x, *weights, group_size, counters, silu_out=True, gemv=False)
    if split_k > 1:
        with pytest.raises(ValueError, match="needs split_k_counters"):
            int4_gemm(x, *weights, group_size, silu_out=True, **launch)
    config = default_int4_config(1, 2 * intermediate, k, group_size, x.device)
    with pytest.raises(ValueError, match="silu_out is a GEMV or nibble-GEMM option"):
        config.with_overrides(gemv=False, block_m=16, per_nibble=False, silu_out=True)


@pytest.mark.parametrize(
    "m,dtype,overrides",
    [
        (20, torch.float16, {"split_k": 1}),
        (33, torch.float16, {"split_k": 2, "chunk_dot": True, "prefetch_words": True}),
        (17, torch.float32, {"split_k": 2, "swap_ab": True}),
    ],
)
def test_silu_out_nibble_gemm_writes_each_tokens_activation(m, dtype, overrides):
    """`silu_out` on the nibble GEMM (group 128, 2 to 255 tokens): every token's row of a
    `[BLOCK_M, BLOCK_N]` tile holds its gate then its up sums, and the launch writes
    `silu(gate) * up` as the plain launch then the activation kernel would (ragged halves,
    ragged tokens, in-kernel splits, the swapped and chunk-dot launches)."""
    generator = torch.Generator().manual_seed(m)
    intermediate, k = 36, 512  # 36 is no multiple of block_n / 2
    weights = random_int4(2 * intermediate, k, 128, dtype, generator)
    x = torch.randn(m, k, generator=generator).to(dtype)
    counters = torch.zeros(split_k_counter_slots(2 * intermediate), dtype=torch.int32)
    launch = {"gemv": False, "block_m": 16, "block_n": 16, **overrides}
    plain = int4_gemm(x, *weights, 128, counters, **launch)
    out = int4_gemm(x, *weights, 128, counters, silu_out=True, **launch)
    assert out.shape == (m, intermediate)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(out, gated_activation(plain), atol=tolerance, rtol=tolerance)
    assert not counters.any()


def test_reference_is_dequantize_then_matmul():
    generator = torch.Generator().manual_seed(5)
    qweight, scales, zeros = random_int4(16, 64, 32, torch.float32, generator)
    weight = dequantize_int4_ref(qweight, scales, zeros, 32)  # [K, N]
    codes = unpack_int4_rows(qweight).float()
    assert torch.equal(weight[40], (codes[40] - zeros[1]) * scales[1])  # row 40: group 1
    x, bias = torch.randn(2, 5, 64, generator=generator), torch.randn(16, generator=generator)
    out = int4_linear(x, qweight, scales, zeros, 32, bias)  # CPU: the reference
    assert out.shape == (2, 5, 16)
    assert torch.allclose(out, x @ weight + bias, atol=1e-5)
    # The Triton dequantizer (prefill's path on CUDA) writes the same weight (interpreter).
    assert torch.equal(dequantize_int4(qweight, scales, zeros, 32), weight)
    half = random_int4(24, 96, 32, torch.float16, generator)
    assert torch.equal(dequantize_int4(*half, 32), dequantize_int4_ref(*half, 32).half())


def test_bad_inputs_name_the_argument():
    generator = torch.Generator().manual_seed(0)
    qweight, scales, zeros = random_int4(16, 64, 32, torch.float32, generator)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="group_size"):
        int4_gemm(x, qweight, scales, zeros, 24)
    with pytest.raises(ValueError, match="qweight must be"):
        int4_gemm(torch.randn(2, 32), qweight, scales, zeros, 32)
    with pytest.raises(ValueError, match="zeros must be"):
        int4_gemm(x, qweight, scales, zeros[:1], 32)
    with pytest.raises(ValueError, match="block_k must be a power of two"):
        int4_gemm(x, qweight, scales, zeros, 32, block_k=48)
    interleaved = random_int4(16, 128, 128, torch.float32, generator)
    with pytest.raises(ValueError, match="block_k must be 128"):
        int4_gemm(torch.randn(20, 128), *interleaved, 128, block_k=64)


# Llama-3.1-8B projections (N, K) at decode and prefill sizes.
GPU_SHAPES = [(6144, 4096), (4096, 14336), (28672, 4096)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 3, 16, 64, 300, 2048])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int4_linear_on_cuda(m, dtype):
    generator = torch.Generator().manual_seed(m)
    for n, k in GPU_SHAPES:
        weights = random_int4(n, k, 128, dtype, generator, device="cuda")
        x = torch.randn(m, k, generator=generator).to(dtype).cuda()
        out = int4_linear(x, *weights, 128)
        reference = int4_linear_ref(x.float(), *weights, 128)
        assert out.dtype == dtype
        assert relative_error(out, reference) < 1e-2, (m, n, k)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_int4_kernels_agree_across_configs_on_cuda():
    """GEMV tiles and GEMM, with and without split-K, at M = 4 (both kernels accept it); the
    in-kernel split-K reduction equals the reduce launch bit for bit (same order), call after
    call, and leaves its counters zeroed."""
    generator = torch.Generator().manual_seed(0)
    weights = random_int4(4096, 4096, 128, torch.bfloat16, generator, device="cuda")
    x = torch.randn(4, 4096, generator=generator).bfloat16().cuda()
    reference = int4_linear_ref(x.float(), *weights, 128)
    counters = torch.zeros(split_k_counter_slots(4096), dtype=torch.int32, device="cuda")
    gemv = {"gemv": True, "block_m": 1, "num_stages": 1}
    for config in (
        {**gemv, "split_k": 1},
        {**gemv, "split_k": 32, "block_n": 128, "block_k": 32, "num_warps": 1, "prefetch": 2},
        {**gemv, "split_k": 16, "block_n": 128, "block_k": 32, "num_warps": 1, "prefetch": 1},
        {**gemv, "split_k": 8, "block_n": 256, "block_k": 32, "num_warps": 2},
        {**gemv, "split_k": 4, "block_n": 128, "block_k": 128, "num_warps": 4},
        # products summed in packed fp16 pairs within each word
        {**gemv, "split_k": 16, "block_n": 256, "block_k": 32, "num_warps": 1, "packed_f16": True},
        {**gemv, "split_k": 4, "block_n": 128, "block_k": 64, "num_warps": 1, "packed_f16": True},
        {"gemv": False, "block_m": 16, "split_k": 1},
        {"gemv": False, "block_m": 16, "split_k": 4},
        {"gemv": False, "block_m": 64, "block_n": 64, "split_k": 8, "num_warps": 4},
        {"gemv": False, "block_m": 16, "split_k": 2, "num_warps": 4, "swap_ab": True},
        # the whole chunk in one dot (permuted to row order), as the sweep may pick it
        {"gemv": False, "block_m": 64, "block_n": 128, "split_k": 2, "per_nibble": False},
        {"gemv": False, "block_m": 16, "split_k": 4, "swap_ab": True, "per_nibble": False},
        # the nibble GEMM's packed tiles stacked into one dot
        {"gemv": False, "block_m": 64, "block_n": 64, "split_k": 4, "swap_ab": True,
         "chunk_dot": True},
        {"gemv": False, "block_m": 64, "block_n": 128, "split_k": 2, "num_warps": 8,
         "chunk_dot": True},
        # ... with the next chunk's words loaded ahead
        {"gemv": False, "block_m": 64, "block_n": 64, "split_k": 4, "swap_ab": True,
         "chunk_dot": True, "prefetch_words": True},
        {"gemv": False, "block_m": 128, "block_n": 64, "split_k": 1, "swap_ab": True,
         "chunk_dot": True, "prefetch_words": True},
        {"gemv": False, "block_m": 32, "block_n": 128, "split_k": 2, "num_warps": 8,
         "chunk_dot": True, "prefetch_words": True},
    ):  # fmt: skip
        out = int4_gemm(x, *weights, 128, **config)
        assert relative_error(out, reference) < 1e-2, config
        for _ in range(20):
            assert torch.equal(int4_gemm(x, *weights, 128, counters, **config), out), config
        assert not counters.any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packed_f16_gemv_is_as_exact_as_the_float32_one_on_cuda(dtype):
    """The GEMV summing each word's 8 products in packed fp16 (x scaled by its range's amax)
    against the float32 reference: within 5e-4 relative of the float32 GEMV's own error, at
    both spans (group sizes 128 and 64) and with activations of any size (outliers of 3e4 in
    bf16, 1e-3-sized rows) without overflowing fp16."""
    generator = torch.Generator().manual_seed(0)
    gemv = {"gemv": True, "block_m": 1, "num_stages": 1, "num_warps": 1, "block_k": 32}
    for group_size in (128, 64):
        weights = random_int4(4096, 4096, group_size, dtype, generator, device="cuda")
        for scale, outliers in (
            (1.0, 0.0),
            (1e-3, 0.0),
            (1.0, 3e4 if dtype == torch.bfloat16 else 6e3),
        ):
            x = torch.randn(1, 4096, generator=generator) * scale
            x[0, ::97] += outliers
            x = x.to(dtype).cuda()
            reference = int4_linear_ref(x.float(), *weights, group_size)
            for block_n, split_k in ((256, 16), (128, 4)):
                config = {**gemv, "block_n": block_n, "split_k": split_k}
                exact = int4_gemm(x, *weights, group_size, **config)
                packed = int4_gemm(x, *weights, group_size, **config, packed_f16=True)
                assert torch.isfinite(packed).all()
                # Both round their output to x's dtype (bf16: ~1e-3 of it); the fp16 lanes add
                # at most 5e-4.
                error = relative_error(exact, reference)
                assert error < 1e-2
                assert relative_error(packed, reference) < error + 5e-4, (group_size, scale)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gated_gemv_equals_the_activation_kernel_then_the_gemv_on_cuda():
    """The down projection's GEMV computing silu(gate) * up as it loads x gives the bits of
    `silu_and_mul` then the GEMV, float32 and packed fp16 alike (the packed path's amax over
    the gated values)."""
    from radixgen.kernels.activation import silu_and_mul

    generator = torch.Generator().manual_seed(1)
    weights = random_int4(4096, 14336, 128, torch.bfloat16, generator, device="cuda")
    gate_up = torch.randn(1, 2 * 14336, generator=generator).to(torch.bfloat16).cuda()
    counters = torch.zeros(split_k_counter_slots(4096), dtype=torch.int32, device="cuda")
    gemv = {"gemv": True, "block_m": 1, "num_stages": 1, "num_warps": 4, "block_k": 32}
    for packed in (False, True):
        config = {**gemv, "block_n": 128, "split_k": 8, "packed_f16": packed}
        expected = int4_gemm(silu_and_mul(gate_up), *weights, 128, counters, **config)
        gated = int4_gemm(gate_up, *weights, 128, counters, gated=True, **config)
        assert torch.equal(gated, expected), packed
    assert not counters.any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_silu_out_gemv_equals_the_gemv_then_the_activation_kernel_on_cuda():
    """The gate | up GEMV writing silu(gate) * up gives the bits of the plain GEMV followed by
    `silu_and_mul`, float32 and packed fp16, one split and in-kernel splits."""
    from radixgen.kernels.activation import silu_and_mul

    generator = torch.Generator().manual_seed(2)
    weights = random_int4(2 * 14336, 4096, 128, torch.bfloat16, generator, device="cuda")
    x = torch.randn(1, 4096, generator=generator).to(torch.bfloat16).cuda()
    counters = torch.zeros(split_k_counter_slots(2 * 14336), dtype=torch.int32, device="cuda")
    gemv = {"gemv": True, "block_m": 1, "num_stages": 1, "num_warps": 1, "block_k": 64}
    for packed, split_k in ((False, 1), (True, 8), (True, 1)):
        config = {**gemv, "block_n": 64, "split_k": split_k, "packed_f16": packed}
        expected = silu_and_mul(int4_gemm(x, *weights, 128, counters, **config))
        out = int4_gemm(x, *weights, 128, counters, silu_out=True, **config)
        assert torch.equal(out, expected), (packed, split_k)
    assert not counters.any()
    # The nibble GEMM's epilogue at decode batches: the same bits as the plain launch + kernel.
    # (64 and 128 tokens, 128 columns, 8 warps: the shipped rows.)
    for m, block_n, warps, split_k, swap in (
        (64, 128, 8, 1, True), (128, 128, 8, 1, True), (64, 64, 4, 1, True),
        (128, 64, 4, 2, True), (32, 64, 4, 2, False),
    ):  # fmt: skip
        x = torch.randn(m, 4096, generator=generator).to(torch.bfloat16).cuda()
        config = {"gemv": False, "block_m": m, "block_n": block_n, "split_k": split_k,
                  "num_warps": warps, "swap_ab": swap, "chunk_dot": True,
                  "prefetch_words": True}  # fmt: skip
        expected = silu_and_mul(int4_gemm(x, *weights, 128, counters, **config))
        out = int4_gemm(x, *weights, 128, counters, silu_out=True, **config)
        assert torch.equal(out, expected), (m, split_k)
    assert not counters.any()


_INT4 = "radixgen.kernels.int4_gemm"
_POINTERS = {"x_ptr": "*bf16", "qweight_ptr": "*i32", "scales_ptr": "*bf16", "zeros_ptr": "*bf16",
             "out_ptr": "*bf16", "partial_ptr": "*fp32", "counters_ptr": "*i32"}  # fmt: skip
_SIZES = dict.fromkeys(("N", "K", "k_per_split", "stride_xm", "stride_split"), "i32")
_GEMV = {**_POINTERS, **_SIZES, "float_2p23_bits": "i32"}
_GEMM = {**_POINTERS, "M": "i32", **_SIZES}


def test_kernels_compile_for_sm90_without_spills():
    """The fallback GEMV, both GEMMs and dequantizer configs (at M = 1 and M = 64, and the
    GEMV's rows-over-warps tile; the nibble GEMM with its packed PTX unpacking) through Triton's compiler and ptxas for sm_90 (H100 / H200), no GPU
    needed: a kernel that does not compile, or spills registers, fails here."""
    gemv = [
        {"BLOCK_N": 128, "BLOCK_K": 32, "SPLIT_MODE": 2, "PREFETCH": 2, "SPAN": 128},
        {"BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_MODE": 0, "PREFETCH": 1, "SPAN": 8},
    ]
    nibble_gemm = [  # the tuned table's launches at 16 and 64 tokens (4 warps)
        {"BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_MODE": 2, "SWAP_AB": False, "PACKED": True},
        {"BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_MODE": 2, "SWAP_AB": True, "PACKED": True},
        {"BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_MODE": 0, "SWAP_AB": False, "PACKED": True},
        {"BLOCK_M": 32, "BLOCK_N": 64, "SPLIT_MODE": 2, "SWAP_AB": False, "PACKED": False},
    ]
    gemm = [
        {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_MODE": 2, "SWAP_AB": False},
        {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_MODE": 2, "SWAP_AB": True},
    ]
    dequantize = {
        "qweight_ptr": "*i32",
        "scales_ptr": "*bf16",
        "zeros_ptr": "*bf16",
        "out_ptr": "*bf16",
        "N": "i32",
        "K": "i32",
    }
    assert_compile_for_sm90_without_spills(
        [(_INT4, "_int4_gemv_kernel", _GEMV, {"GROUP_SIZE": 128, **c}, w)
         for c, w in zip(gemv, (1, 4), strict=True)]
        + [(_INT4, "_int4_gemv_kernel", _GEMV, {"GROUP_SIZE": 128, **gemv[0], "USE_PDL": True},
            1, PDL_PTX)]
        # The packed fp16 GEMV (two weights an instruction) at both spans.
        + [(_INT4, "_int4_gemv_kernel", _GEMV, {"GROUP_SIZE": 128, **c, "PACKED_F16": True}, w,
            {"require_ptx": ["fma.rn.f16x2", "lop3.b32"]})
           for c, w in zip(gemv, (1, 4), strict=True)]
        # gated (silu(gate) * up as x loads), float32 and packed fp16, with PDL
        + [(_INT4, "_int4_gemv_kernel", _GEMV, {"GROUP_SIZE": 128, **gemv[0], "USE_PDL": True,
            "GATED": True, "PACKED_F16": packed}, 1, PDL_PTX) for packed in (False, True)]
        # silu_out (the gate | up columns' activation in the epilogue), packed fp16, with PDL:
        # the two column halves still load as 16-byte vectors
        + [(_INT4, "_int4_gemv_kernel", _GEMV, {"GROUP_SIZE": 128, "BLOCK_N": 64, "BLOCK_K": 64,
            "SPLIT_MODE": split_mode, "PREFETCH": 2, "SPAN": 128, "USE_PDL": True,
            "SILU_OUT": True, "PACKED_F16": True}, 1,
            {"divisible": ["N", "K", "k_per_split"],
             "require_ptx": ["ld.global.L1::evict_first.L2::cache_hint.v4", *PDL_PTX["require_ptx"]]})
           for split_mode in (0, 2)]
        + [(_INT4, "_int4_nibble_gemm_kernel", _GEMM,
            {"GROUP_SIZE": 128, **nibble_gemm[1], "USE_PDL": True}, 4, PDL_PTX)]
        # The chunk's packed tiles in one dot (chunk_dot), swapped and not.
        + [(_INT4, "_int4_nibble_gemm_kernel", _GEMM,
            {"GROUP_SIZE": 128, "BLOCK_M": 64, "BLOCK_N": block_n, "SPLIT_MODE": 2,
             "SWAP_AB": swap, "PACKED": True, "CHUNK_DOT": True}, warps,
            {"divisible": ["N", "K", "k_per_split"], "require_ptx": ["wgmma.mma_async"]})
           for block_n, swap, warps in ((64, True, 4), (128, False, 8))]
        # ... with the next chunk's words loaded ahead, the first before the PDL wait, and the
        # gate | up activation in the epilogue
        + [(_INT4, "_int4_nibble_gemm_kernel", _GEMM,
            {"GROUP_SIZE": 128, "BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_MODE": split_mode,
             "SWAP_AB": True, "PACKED": True, "CHUNK_DOT": True, "PREFETCH_WORDS": True,
             "USE_PDL": True, "SILU_OUT": silu}, 4,
            {"divisible": ["N", "K", "k_per_split"],
             "require_ptx": ["wgmma.mma_async", *PDL_PTX["require_ptx"]]})
           for split_mode, silu in ((2, False), (0, True), (2, True))]
        + [(_INT4, "_int4_gemm_kernel", _GEMM, {"GROUP_SIZE": 128, "SPAN": 128, "BLOCK_M": 64,
            "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_MODE": 2, "SWAP_AB": False, "USE_PDL": True},
            8, PDL_PTX)]
        + [(_INT4, "_int4_gemm_kernel", _GEMM, {"GROUP_SIZE": 64, "SPAN": 8, **c}, 8)
           for c in gemm]
        + [(_INT4, "_int4_gemm_kernel", _GEMM, {"GROUP_SIZE": 128, "SPAN": 128, "BLOCK_M": 64,
            "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_MODE": 2, "SWAP_AB": False}, 8)]
        + [(_INT4, "_int4_nibble_gemm_kernel", _GEMM, {"GROUP_SIZE": 128, **c}, 4)
           for c in nibble_gemm]
        + [(_INT4, "_dequantize_int4_kernel", dequantize,
            {"GROUP_SIZE": 128, "SPAN": 128, "BLOCK_N": 128, "BLOCK_K": 64}, 4)]
    )  # fmt: skip
