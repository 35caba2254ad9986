"""The split-K GEMV (kernels/gemv.py) against `F.linear` (interpreter: fp32/fp16, ragged shapes,
split-K reduced by a second launch and in-kernel), its launch table, its sm_90 compile, and on
the GPU the linear layer's dispatch to it."""

from __future__ import annotations

import pytest
import torch

from radixgen.kernels.gated_silu import silu_times_up_ref as gated_activation
from radixgen.kernels.gemv import (
    GemvConfig,
    gemv,
    gemv_counter_slots,
    load_gemv_table,
    parse_gemv_table,
    select_gemv_config,
)
from tests.sm90_compile import PDL_PTX, assert_compile_for_sm90_without_spills


def operands(m, n, k, dtype, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype).to(device)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(device)
    return x, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "m,n,k,config",
    [
        (1, 70, 300, GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=1)),
        (2, 33, 128, GemvConfig(block_n=8, block_k=64, split_k=1, num_warps=2)),
        (1, 64, 520, GemvConfig(block_n=32, block_k=16, split_k=8, num_warps=1)),
    ],
)
def test_gemv_matches_linear(m, n, k, config, dtype, monkeypatch):
    """Ragged N and K against the blocks; one split, and splits summed by a second launch and
    in-kernel (bit-identical to each other: the same order), the counters left zero."""
    from radixgen.kernels import gemv as gemv_module

    modes = []
    finish = gemv_module.finish_splits
    monkeypatch.setattr(
        gemv_module, "finish_splits", lambda mode, *a: modes.append(mode) or finish(mode, *a)
    )
    x, weight = operands(m, n, k, dtype, seed=m + n)
    expected = torch.nn.functional.linear(x.float(), weight.float())
    reduced = gemv(x, weight, config)
    tol = 1e-4 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(reduced.float(), expected, atol=tol, rtol=tol)
    counters = torch.zeros(gemv_counter_slots(n, m), dtype=torch.int32)
    for _ in range(3):
        assert torch.equal(gemv(x, weight, config, counters), reduced)
        assert not counters.any()
    split = config.split_k > 1  # the second launch without counters, in-kernel with them
    assert modes == ([1, 2, 2, 2] if split else [0, 0, 0, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "m,config",
    [
        (1, GemvConfig(block_n=8, block_k=32, split_k=1, num_warps=1)),
        (2, GemvConfig(block_n=16, block_k=64, split_k=3, num_warps=2)),
    ],
)
def test_silu_out_gemv_writes_the_activation_of_its_gate_and_up_sums(m, config, dtype):
    """`silu_out`: a merged gate | up weight's GEMV writes `silu(gate) * up` from its tiles'
    sums (each tile holds block_n / 2 gate rows and their up rows), as the plain launch followed
    by the activation kernel would, ragged halves and in-kernel K splits included (the counters
    left zero); W8A16 alike. Bad requests are refused."""
    intermediate, k = 70, 300  # 70 is no multiple of block_n / 2: masked tiles
    x, weight = operands(m, 2 * intermediate, k, dtype, seed=m)
    counters = torch.zeros(gemv_counter_slots(2 * intermediate, m), dtype=torch.int32)
    plain = gemv(x, weight, config, counters)  # [m, 2 * intermediate]
    out = gemv(x, weight, config, counters, silu_out=True)
    assert out.shape == (m, intermediate) and out.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(out, gated_activation(plain), atol=tol, rtol=tol)
    assert not counters.any()
    _, _, wq, w_scale, _ = fp8_operands(m, 2 * intermediate, k, seed=k)
    plain = gemv(x, wq, config, counters, weight_scale=w_scale)
    out = gemv(x, wq, config, counters, weight_scale=w_scale, silu_out=True)
    torch.testing.assert_close(out, gated_activation(plain), atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="even number of weight rows"):
        gemv(x, weight[1:], config, counters, silu_out=True)
    if config.split_k > 1:  # the activation needs the tile's whole sums: in-kernel splits
        with pytest.raises(ValueError, match="needs split_k_counters"):
            gemv(x, weight, config, silu_out=True)
    with pytest.raises(ValueError, match="silu_out needs block_n >= 2"):
        GemvConfig(block_n=1, block_k=32, split_k=1, num_warps=1, silu_out=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "m,config",
    [
        (1, GemvConfig(block_n=8, block_k=32, split_k=1, num_warps=1)),
        (2, GemvConfig(block_n=16, block_k=64, split_k=3, num_warps=2)),
    ],
)
def test_add_norm_gemv_adds_the_residual_and_normalizes_the_row(m, config, dtype):
    """`add_norm`: the GEMV's tiles store `h = out + residual` (the same bits as the GEMV then
    `fused_add_rms_norm`) and the row's last tile writes its RMSNorm (within the norm kernel's
    rounding), ragged rows and in-kernel K splits included, the counters left zero. Bad
    requests are refused."""
    from radixgen.kernels.gemv import AddNorm
    from radixgen.kernels.rms_norm import fused_add_rms_norm

    n, k = 70, 300
    x, weight = operands(m, n, k, dtype, seed=m + 7)
    residual = torch.randn(m, n).to(dtype)
    norm_weight = (torch.rand(n) + 0.5).to(dtype)
    counters = torch.zeros(gemv_counter_slots(n, m), dtype=torch.int32)
    norm_counters = torch.zeros(4, dtype=torch.int32)
    add_norm = AddNorm(residual, norm_weight, 1e-5, norm_counters)
    normed, h = gemv(x, weight, config, counters, add_norm=add_norm)
    expected_normed, expected_h = fused_add_rms_norm(
        gemv(x, weight, config, counters), residual, norm_weight, 1e-5
    )
    assert torch.equal(h, expected_h)
    tol = 1e-6 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(normed, expected_normed, atol=tol, rtol=tol)
    assert not counters.any() and not norm_counters.any()
    if config.split_k > 1:
        with pytest.raises(ValueError, match="needs split_k_counters"):
            gemv(x, weight, config, add_norm=add_norm)
    with pytest.raises(ValueError, match="add_norm.residual"):
        gemv(x, weight, config, counters, add_norm=add_norm._replace(residual=residual[:, 1:]))
    with pytest.raises(ValueError, match="add_norm.weight"):
        gemv(x, weight, config, counters, add_norm=add_norm._replace(weight=norm_weight[1:]))
    with pytest.raises(ValueError, match="not gated/silu_out"):
        gemv(x, torch.cat([weight, weight]), config, counters, add_norm=add_norm, silu_out=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gated_gemv_applies_the_activation_as_it_loads_x(dtype):
    """`gated`: x is gate | up and the GEMV multiplies `silu(gate) * up` (an MLP's down
    projection without the activation kernel), as the two kernels would; W8A16 alike."""
    m, n, k = 2, 40, 300
    config = GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=1)
    gate_up, weight = operands(m, n, 2 * k, dtype, seed=5)
    weight = weight[:, :k].contiguous()
    expected = gemv(gated_activation(gate_up), weight, config)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-3
    gated = gemv(gate_up, weight, config, gated=True)
    torch.testing.assert_close(gated, expected, atol=tolerance, rtol=tolerance)
    counters = torch.zeros(gemv_counter_slots(n, m), dtype=torch.int32)
    assert torch.equal(gemv(gate_up, weight, config, counters, gated=True), gated)
    _, _, wq, w_scale, _ = fp8_operands(m, n, k, seed=1)
    a16 = GemvConfig(block_n=8, block_k=64, split_k=1, num_warps=2, a16=True)
    torch.testing.assert_close(
        gemv(gate_up, wq, a16, weight_scale=w_scale, gated=True),
        gemv(gated_activation(gate_up), wq, a16, weight_scale=w_scale),
        atol=tolerance, rtol=tolerance,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"x must be \[M, 2K\]"):
        gemv(gate_up[:, :k], weight, config, gated=True)


def test_gemv_rejects_bad_inputs():
    x, weight = operands(1, 8, 32, torch.float32)
    config = GemvConfig(block_n=8, block_k=16, split_k=2, num_warps=1)
    with pytest.raises(ValueError, match=r"x must be \[M, K\]"):
        gemv(x, weight[:, :16], config)
    with pytest.raises(TypeError, match="dtype"):
        gemv(x, weight.half(), config)
    with pytest.raises(ValueError, match="contiguous"):
        gemv(x, weight.t().contiguous().t(), config)
    with pytest.raises(ValueError, match="split_k_counters"):
        gemv(x, weight, config, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="power of two"):
        GemvConfig(block_n=24, block_k=16, split_k=1, num_warps=1)


def test_gemv_table():
    row = {"block_n": 16, "block_k": 256, "split_k": 4, "num_warps": 4}
    table = parse_gemv_table(
        {"source": "test", "shapes": {"4096x6144": [dict(row, max_tokens=1),
                                                    dict(row, max_tokens=4, split_k=2)]}}
    )  # fmt: skip
    assert select_gemv_config(4096, 6144, 1, table).split_k == 4
    assert select_gemv_config(4096, 6144, 3, table).split_k == 2
    assert select_gemv_config(4096, 6144, 5, table) is None  # past every bound: F.linear
    assert select_gemv_config(4096, 4096, 1, table) is None  # shape not in the table
    load_gemv_table.cache_clear()
    # The shipped table (the H200 sweep): the GEMV at 1 token for qkv, o and down, and for
    # gate_up where it writes silu(gate) * up (nineteenth session; plain, it tied cuBLAS); more
    # tokens on cuBLAS.
    shipped = load_gemv_table()
    assert set(shipped) == {(4096, 6144), (4096, 4096), (14336, 4096), (4096, 28672)}
    assert shipped[(4096, 28672)][0][1].silu_out
    assert not any(rows[0][1].add_norm for rows in shipped.values())  # measured no faster
    assert select_gemv_config(4096, 6144, 1) is not None
    assert select_gemv_config(4096, 28672, 2) is None and select_gemv_config(4096, 6144, 2) is None
    with pytest.raises(ValueError, match="max_tokens"):
        parse_gemv_table({"shapes": {"8x8": [dict(row, max_tokens=None)]}})
    with pytest.raises(ValueError, match="INxOUT"):
        parse_gemv_table({"shapes": {"8": [dict(row, max_tokens=1)]}})


def test_gemv_compiles_for_sm90_without_spills():
    """The kernel at the sweep's tiles, bf16 and FP8, all three split modes: no GPU needed."""
    sizes = ("N", "K", "k_per_split", "stride_xm", "stride_wn", "stride_split")
    signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "partial_ptr": "*fp32",
                 "counters_ptr": "*i32", "x_scale_ptr": "*fp32", "w_scale_ptr": "*fp32",
                 **dict.fromkeys(sizes, "i32")}  # fmt: skip
    fp8 = {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv"}
    assert_compile_for_sm90_without_spills([
        ("radixgen.kernels.gemv", "_gemv_kernel", signature | (fp8 if scaled else {}),
         {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_MODE": mode, "SCALED": scaled}, warps)
        for block_n, block_k, warps, mode, scaled in (
            (16, 256, 4, 2, False), (32, 512, 8, 2, False), (8, 512, 4, 0, False),
            (32, 128, 4, 1, False), (16, 512, 4, 2, True), (8, 512, 4, 2, True),
            (8, 1024, 4, 0, True),
        )
    ] + [  # with programmatic dependent launch (kernels/pdl.py)
        ("radixgen.kernels.gemv", "_gemv_kernel", signature,
         {"BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_MODE": 2, "SCALED": False, "USE_PDL": True}, 4,
         PDL_PTX),
    ] + [  # gated (silu(gate) * up as x loads: a down projection), bf16 and W8A16, with PDL
        ("radixgen.kernels.gemv", "_gemv_kernel", signature | weights,
         {"BLOCK_N": 8, "BLOCK_K": block_k, "SPLIT_MODE": 2, "SCALED": scaled,
          "X_SCALED": False, "USE_PDL": True, "GATED": True}, warps,
         {"divisible": ["N", "K", "k_per_split"], "require_ptx": PDL_PTX["require_ptx"]})
        for block_k, warps, scaled, weights in (
            (512, 8, False, {}), (1024, 4, True, {"w_ptr": "*fp8e4nv"}),
        )
    ] + [  # W8A16 (a16): e4m3 weights, bf16 x, with PDL
        ("radixgen.kernels.gemv", "_gemv_kernel", signature | {"w_ptr": "*fp8e4nv"},
         {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_MODE": 2, "SCALED": True,
          "X_SCALED": False, "USE_PDL": True}, 4,
         {"divisible": ["N", "K", "k_per_split"], "require_ptx": PDL_PTX["require_ptx"]})
        for block_n, block_k in ((16, 256), (8, 1024))
    ] + [  # e4m3 in packed fp16 arithmetic (packed_f16), with PDL
        ("radixgen.kernels.gemv", "_gemv_e4m3_packed_kernel",
         signature | fp8,
         {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_MODE": 2, "USE_PDL": True}, 4,
         {"divisible": ["N", "K", "k_per_split"],
          "require_ptx": ["cvt.rn.f16x2.e4m3x2", "fma.rn.f16x2", *PDL_PTX["require_ptx"]]})
        for block_n, block_k in ((16, 512), (8, 1024), (32, 256))
    ] + [  # W8A16 in packed fp16 arithmetic (a16 + packed_f16), bf16 and fp16 x, with PDL
        ("radixgen.kernels.gemv", "_gemv_e4m3_packed_kernel",
         signature | {"x_ptr": x_type, "w_ptr": "*fp8e4nv", "out_ptr": x_type},
         {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_MODE": 2, "USE_PDL": True,
          "X_KIND": 1 if x_type == "*bf16" else 2, "AMAX_BLOCK": 4096}, warps,
         {"divisible": ["N", "K", "k_per_split"],
          "require_ptx": ["cvt.rn.f16x2.e4m3x2", "fma.rn.f16x2", "cvt.rn.f16x2.f32",
                          *PDL_PTX["require_ptx"]]})
        for block_n, block_k, warps, x_type in (
            (16, 512, 4, "*bf16"), (8, 1024, 8, "*bf16"), (32, 512, 4, "*bf16"),
            (16, 1024, 4, "*fp16"),
        )
    ] + [  # add_norm (the residual add and the row's RMSNorm in the epilogue): bf16, with PDL
        ("radixgen.kernels.gemv", "_gemv_kernel",
         signature | {"norm_residual_ptr": "*bf16", "norm_weight_ptr": "*bf16",
                      "normed_ptr": "*bf16", "norm_counters_ptr": "*i32", "norm_eps": "fp32"},
         {"BLOCK_N": 8, "BLOCK_K": 512, "SPLIT_MODE": split_mode, "SCALED": False,
          "USE_PDL": True, "NORM_BLOCK": 4096}, 8,
         {"divisible": ["N", "K", "k_per_split"], "require_ptx": PDL_PTX["require_ptx"]})
        for split_mode in (0, 2)
    ] + [  # silu_out (a gate | up weight's activation in the epilogue): bf16, packed W8A8
        ("radixgen.kernels.gemv", "_gemv_kernel", signature,
         {"BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_MODE": 2, "SCALED": False, "USE_PDL": True,
          "SILU_OUT": True}, 4, {"divisible": ["N", "K", "k_per_split"]}),
        ("radixgen.kernels.gemv", "_gemv_e4m3_packed_kernel", signature | fp8,
         {"BLOCK_N": 32, "BLOCK_K": 512, "SPLIT_MODE": 0, "USE_PDL": True, "SILU_OUT": True}, 4,
         {"divisible": ["N", "K", "k_per_split"]}),
    ])  # fmt: skip


@pytest.mark.gpu
def test_gpu_linear_layer_takes_the_gemv_from_the_table(monkeypatch):
    """A bf16 layer whose shape the table lists runs the GEMV at 1 token (matching F.linear
    within bf16 rounding, also inside a CUDA graph) and F.linear at 8."""
    from radixgen.kernels import gemv as gemv_module
    from radixgen.runtime.models.linear import RowLinear

    row = {"max_tokens": 1, "block_n": 16, "block_k": 256, "split_k": 4, "num_warps": 4}
    table = parse_gemv_table({"shapes": {"4096x1024": [row]}})
    monkeypatch.setattr(gemv_module, "load_gemv_table", lambda: table)
    layer = RowLinear(4096, 1024, bias=False)
    x, weight = operands(8, 1024, 4096, torch.bfloat16, device="cuda")
    layer.load_weight("weight", weight)
    assert layer.gemv_configs == {1: GemvConfig(16, 256, 4, 4)}
    expected = torch.nn.functional.linear(x, weight)
    torch.testing.assert_close(layer(x[:1]), expected[:1], atol=2e-2, rtol=2e-2)
    assert torch.equal(layer(x), expected)  # 8 tokens: F.linear
    # A down projection's GEMV with the MLP's activation inside: as the two kernels.
    from radixgen.kernels.activation import silu_and_mul

    assert not layer.takes_gated_input(1)  # opt-in per table row
    table = parse_gemv_table({"shapes": {"4096x1024": [{**row, "gated": True}]}})
    monkeypatch.setattr(gemv_module, "load_gemv_table", lambda: table)
    gated_layer = RowLinear(4096, 1024, bias=False)
    gated_layer.load_weight("weight", weight)
    gate_up = torch.randn(8, 8192, device="cuda", dtype=torch.bfloat16)
    assert gated_layer.takes_gated_input(1) and not gated_layer.takes_gated_input(8)
    activated = silu_and_mul(gate_up[:1])
    assert torch.equal(gated_layer(gate_up[:1], gated=True), layer(activated))
    static = x[:1].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(static)
    for i in range(3):
        static.copy_(x[i : i + 1])
        graph.replay()
        torch.testing.assert_close(out, expected[i : i + 1], atol=2e-2, rtol=2e-2)
    assert not layer.split_k_counters.any()


def fp8_operands(m, n, k, seed=0):
    """e4m3 activations and weights with their per-token / per-channel scales (`fp8_gemm`'s
    quantization), and their product in float32."""
    from radixgen.kernels.fp8_gemm import quantize_fp8_per_token_ref

    x, weight = operands(m, n, k, torch.float32, seed)
    xq, x_scale = quantize_fp8_per_token_ref(x)
    wq, w_scale = quantize_fp8_per_token_ref(weight)
    expected = (xq.float() @ wq.float().t()) * x_scale[:, None] * w_scale[None, :]
    return xq, x_scale, wq, w_scale, expected


@pytest.mark.parametrize(
    "m,n,k,config",
    [
        (1, 70, 300, GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=1)),
        (2, 40, 256, GemvConfig(block_n=8, block_k=64, split_k=1, num_warps=2)),
    ],
)
def test_fp8_gemv_matches_the_w8a8_product(m, n, k, config):
    """e4m3 operands, scales applied per split: `fp8_gemm`'s W8A8 math, in each output dtype;
    split-K summed by a second launch and in-kernel alike."""
    xq, x_scale, wq, w_scale, expected = fp8_operands(m, n, k, seed=n)
    scales = {"x_scale": x_scale, "weight_scale": w_scale}
    out = gemv(xq, wq, config, **scales, out_dtype=torch.float32)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    counters = torch.zeros(gemv_counter_slots(n, m), dtype=torch.int32)
    assert torch.equal(gemv(xq, wq, config, counters, **scales, out_dtype=torch.float32), out)
    assert not counters.any()
    half = gemv(xq, wq, config, **scales, out_dtype=torch.float16)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), expected, atol=2e-3, rtol=2e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_packed_fp16_fp8_gemv_is_as_exact_as_the_float32_one():
    """e4m3 operands summed in packed fp16 (x's values times 2^-9, 16 weights a thread a step)
    against the float32 GEMV and the W8A8 product: within 5e-4 relative of the float32 GEMV's
    own error, at the 8B projections' widths, including x rows at e4m3's largest values."""
    for n, k in ((1024, 4096), (512, 14336)):
        xq, x_scale, wq, w_scale, expected = (
            t.cuda() for t in fp8_operands(1, n, k, seed=k)
        )  # fmt: skip
        xq[0, ::7] = torch.tensor(448.0).to(xq.dtype)  # e4m3's largest, every 7th
        expected = (xq.float() @ wq.float().t()) * x_scale[:, None] * w_scale[None, :]
        scales = {"x_scale": x_scale, "weight_scale": w_scale, "out_dtype": torch.float32}
        counters = torch.zeros(gemv_counter_slots(n), dtype=torch.int32, device="cuda")

        def relative_error(out, ref):
            return ((out.double() - ref.double()).norm() / ref.double().norm()).item()

        for block_n, block_k, split_k in ((16, 512, 4), (8, 1024, 1), (32, 256, 8)):
            plain = GemvConfig(block_n, block_k, split_k, num_warps=4)
            packed = GemvConfig(block_n, block_k, split_k, num_warps=4, packed_f16=True)
            error = relative_error(gemv(xq, wq, plain, counters, **scales), expected)
            out = gemv(xq, wq, packed, counters, **scales)
            assert torch.isfinite(out).all()
            assert error < 1e-5
            assert relative_error(out, expected) < error + 5e-4, (n, k, block_n, block_k)
            assert not counters.any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_silu_out_gemv_equals_the_gemv_then_the_activation_kernel():
    """At the 8B gate | up shape, the GEMV writing silu(gate) * up gives the bits of the plain
    launch followed by `silu_and_mul`: bf16, packed W8A8 and packed W8A16, one split and
    in-kernel splits."""
    from radixgen.kernels.activation import silu_and_mul
    from radixgen.kernels.fp8_gemm import quantize_fp8_per_token

    n, k = 2 * 14336, 4096
    x, weight = operands(1, n, k, torch.bfloat16, seed=5, device="cuda")
    _, _, wq, w_scale, _ = (t.cuda() for t in fp8_operands(1, n, k, seed=6))
    xq, x_scale = quantize_fp8_per_token(x)
    counters = torch.zeros(gemv_counter_slots(n), dtype=torch.int32, device="cuda")
    cases = [  # (x, weight, packed_f16, scales)
        (x, weight, False, {}),
        (xq, wq, True, {"x_scale": x_scale, "weight_scale": w_scale, "out_dtype": x.dtype}),
        (x, wq, True, {"weight_scale": w_scale}),
    ]
    for operand, w, packed, scales in cases:
        for split_k in (1, 4):
            a16 = packed and "x_scale" not in scales
            config = GemvConfig(16, 512, split_k, 4, packed_f16=packed, a16=a16)
            expected = silu_and_mul(gemv(operand, w, config, counters, **scales))
            out = gemv(operand, w, config, counters, silu_out=True, **scales)
            assert torch.equal(out, expected), (operand.dtype, packed, split_k)
    assert not counters.any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_add_norm_gemv_equals_the_gemv_then_the_norm_kernel():
    """At the 8B o and down shapes in bf16, the GEMV adding the residual and normalizing the
    row gives the new residual's bits and the normed row within the norm kernel's rounding
    (its sum of squares runs in another order), one split and in-kernel splits."""
    from radixgen.kernels.gemv import AddNorm
    from radixgen.kernels.rms_norm import fused_add_rms_norm

    counters = torch.zeros(gemv_counter_slots(4096), dtype=torch.int32, device="cuda")
    norm_counters = torch.zeros(4, dtype=torch.int32, device="cuda")
    residual = torch.randn(1, 4096, device="cuda").to(torch.bfloat16)
    norm_weight = (torch.rand(4096, device="cuda") + 0.5).to(torch.bfloat16)
    for k in (4096, 14336):
        x, weight = operands(1, 4096, k, torch.bfloat16, seed=k, device="cuda")
        for split_k in (1, 4):
            config = GemvConfig(8, 512, split_k, 8)
            expected_normed, expected_h = fused_add_rms_norm(
                gemv(x, weight, config, counters), residual, norm_weight, 1e-5
            )
            add_norm = AddNorm(residual, norm_weight, 1e-5, norm_counters)
            normed, h = gemv(x, weight, config, counters, add_norm=add_norm)
            assert torch.equal(h, expected_h), (k, split_k)
            error = (
                normed.float() - expected_normed.float()
            ).norm() / expected_normed.float().norm()
            assert error < 4e-3, (k, split_k, error.item())
    assert not counters.any() and not norm_counters.any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_w8a16_gemv_takes_the_activations_unquantized(dtype):
    """e4m3 weights with 16-bit (or fp32) x as it is (`a16` launches): `x @ dequant(W).T`
    weight-scaled only, in x's dtype; no x_scale, and split-K summed in-kernel alike."""
    m, n, k = 2, 70, 300
    config = GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=1, a16=True)
    x, _ = operands(m, n, k, dtype, seed=3)
    _, _, wq, w_scale, _ = fp8_operands(m, n, k, seed=n)
    expected = (x.float() @ wq.float().t()) * w_scale[None, :]
    out = gemv(x, wq, config, weight_scale=w_scale)
    assert out.dtype == dtype
    tolerance = 1e-4 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)
    counters = torch.zeros(gemv_counter_slots(n, m), dtype=torch.int32)
    assert torch.equal(gemv(x, wq, config, counters, weight_scale=w_scale), out)
    assert not counters.any()
    with pytest.raises(ValueError, match="x_scale is for e4m3 x only"):
        gemv(x, wq, config, x_scale=torch.ones(m), weight_scale=w_scale)
    with pytest.raises(TypeError, match="out_dtype"):
        gemv(x, wq, config, weight_scale=w_scale, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weight_scale"):
        gemv(x, wq, config)
    with pytest.raises(ValueError, match="not with packed_f16"):
        GemvConfig(block_n=16, block_k=32, split_k=1, num_warps=1, gated=True, packed_f16=True)
    # Packed W8A16 is CUDA's (inline PTX): elsewhere the same launch runs the float32 path.
    packed = GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=1, a16=True, packed_f16=True)
    assert torch.equal(gemv(x, wq, packed, weight_scale=w_scale), out)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_packed_w8a16_gemv_is_within_fp16_rounding_of_the_float32_one(dtype):
    """e4m3 weights times 16-bit x in packed fp16 (x scaled by 1 / its split's largest |value|):
    within 1e-3 relative (beyond the output's rounding) of the exact product at the 8B
    projections' widths and every split mode, whatever the activations' size (bf16 x at 1e4 and
    x at 1e-3 alike: no overflow, no lost precision), with the splits' counters left at zero."""
    for n, k in ((1024, 4096), (512, 14336)):
        _, _, wq, w_scale, _ = (t.cuda() for t in fp8_operands(1, n, k, seed=k))
        counters = torch.zeros(gemv_counter_slots(n), dtype=torch.int32, device="cuda")
        # fp16 tops out at 65504: its large x stays below it, outliers included.
        for size in (1.0, 1e4 if dtype == torch.bfloat16 else 1e2, 1e-3):
            x = (torch.randn(2, k, device="cuda") * size).to(dtype)
            x[:, ::11] *= 30  # outliers, as real activations have
            expected = (x.double() @ wq.double().t()) * w_scale.double()[None, :]
            # The output's own rounding to x's dtype (bf16: ~2e-3 relative).
            rounding = ((expected.to(dtype).double() - expected).norm() / expected.norm()).item()
            for block_n, block_k, split_k in ((16, 512, 4), (8, 1024, 1), (32, 256, 8)):
                packed = GemvConfig(block_n, block_k, split_k, 4, a16=True, packed_f16=True)
                for use_counters in (counters, None):
                    out = gemv(x, wq, packed, use_counters, weight_scale=w_scale)
                    assert out.dtype == dtype and torch.isfinite(out).all()
                    error = ((out.double() - expected).norm() / expected.norm()).item()
                    assert error < rounding + 1e-3, (n, k, size, block_n, block_k, split_k)
                assert not counters.any()


def test_fp8_layer_wants_quantized_activations_except_where_its_gemv_is_a16():
    """The kernels before an FP8 layer quantize for it, except at the token counts whose FP8
    GEMV launch takes 16-bit activations (W8A16): there they pass them as they are."""
    from radixgen.runtime.models.linear import FP8_FROM_HIGH_PRECISION, Fp8LinearMethod, RowLinear

    layer = RowLinear(64, 32, bias=False, method=Fp8LinearMethod(FP8_FROM_HIGH_PRECISION))
    layer.load_weight("weight", torch.randn(32, 64))
    assert layer.takes_fp8_activations(1) and layer.takes_fp8_activations(8)
    layer.fp8_gemv_configs = {1: GemvConfig(8, 64, 1, 4, a16=True), 2: GemvConfig(8, 64, 1, 4)}
    assert [layer.takes_fp8_activations(n) for n in (1, 2, 3)] == [False, True, True]
    assert not RowLinear(64, 32, bias=False).takes_fp8_activations(1)


def test_gate_up_layer_writes_the_activation_where_its_gemv_row_says_silu_out():
    """A merged gate | up layer whose GEMV row at 1 token is marked `silu_out` writes the
    MLP's activation itself (the activation kernel after it goes), in the unquantized and the
    FP8 method alike; other token counts, a bias, or a qkv-like layer keep the plain output."""
    from radixgen.runtime.models.linear import (
        FP8_FROM_HIGH_PRECISION,
        Fp8LinearMethod,
        MergedLinear,
    )

    x = torch.randn(1, 64)
    for method in (None, Fp8LinearMethod(FP8_FROM_HIGH_PRECISION)):
        layer = MergedLinear(64, (40, 40), bias=False, method=method)
        for shard in (0, 1):
            layer.load_weight("weight", torch.randn(40, 64), shard)
        plain_row, silu_row = GemvConfig(16, 32, 2, 1), GemvConfig(16, 32, 2, 1, silu_out=True)
        configs = {1: silu_row, 2: plain_row}
        if method is None:
            layer.gemv_configs = configs
        else:
            layer.fp8_gemv_configs = configs
        counters = torch.zeros(gemv_counter_slots(80), dtype=torch.int32)
        layer.register_buffer("split_k_counters", counters, persistent=False)
        assert [layer.takes_silu_output(n) for n in (1, 2)] == [True, False]
        expected = gated_activation(layer(x))  # the plain launch at 1 token, then the activation
        torch.testing.assert_close(layer(x, silu_out=True), expected, atol=1e-6, rtol=1e-6)
        assert not counters.any()
    layer.bias = torch.nn.Parameter(torch.zeros(80), requires_grad=False)
    assert not layer.takes_silu_output(1)  # the activation would need the biased sums
    qkv = MergedLinear(64, (32, 16, 16), bias=False)
    qkv.gemv_configs = {1: silu_row}
    assert not qkv.takes_silu_output(1)


def test_fp8_gemv_rejects_bad_scales():
    xq, x_scale, wq, w_scale, _ = fp8_operands(1, 8, 32)
    config = GemvConfig(block_n=8, block_k=16, split_k=1, num_warps=1)
    with pytest.raises(ValueError, match="x_scale"):
        gemv(xq, wq, config, weight_scale=w_scale, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weight_scale"):
        gemv(xq, wq, config, x_scale=x_scale, weight_scale=w_scale[:4], out_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="out_dtype"):
        gemv(xq, wq, config, x_scale=x_scale, weight_scale=w_scale)
    x, weight = operands(1, 8, 32, torch.float32)
    with pytest.raises(ValueError, match="e4m3 operands only"):
        gemv(x, weight, config, x_scale=x_scale)


def test_fp8_gemv_table_ships_the_h200_packed_rows():
    from radixgen.kernels.gemv import FP8_TABLE_PATH

    table = load_gemv_table(FP8_TABLE_PATH)  # the eighteenth and nineteenth sessions' sweeps
    assert set(table) == {(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)}
    assert all(config.packed_f16 for rows in table.values() for _, config in rows)
    # W8A16 for o and down (no quantization pass before them), W8A8 for qkv and gate_up.
    assert {shape for shape, rows in table.items() if rows[0][1].a16} == {
        (4096, 4096),
        (14336, 4096),
    }


@pytest.mark.gpu
def test_gpu_fp8_layer_takes_the_fp8_gemv_from_its_table(monkeypatch):
    """An FP8 layer whose shape the FP8 GEMV table lists runs the GEMV at 1 token (matching the
    skinny GEMM within bf16 rounding: the same W8A8 math) and the skinny GEMM at 8."""
    from radixgen.kernels.fp8_gemm import fp8_linear
    from radixgen.runtime.models import linear as linear_module
    from radixgen.runtime.models.linear import FP8_FROM_HIGH_PRECISION, Fp8LinearMethod, RowLinear

    row = {"max_tokens": 1, "block_n": 16, "block_k": 512, "split_k": 4, "num_warps": 4}
    table = parse_gemv_table({"shapes": {"4096x1024": [row]}})
    monkeypatch.setattr(linear_module, "load_gemv_table", lambda path: table)
    layer = RowLinear(4096, 1024, bias=False, method=Fp8LinearMethod(FP8_FROM_HIGH_PRECISION))
    x, weight = operands(8, 1024, 4096, torch.bfloat16, device="cuda")
    layer.load_weight("weight", weight)
    assert layer.fp8_gemv_configs == {1: GemvConfig(16, 512, 4, 4)}
    skinny = fp8_linear(x, layer.weight, layer.weight_scale)  # no GEMV configs
    torch.testing.assert_close(layer(x[:1]), skinny[:1], atol=2e-2, rtol=2e-2)
    assert torch.equal(layer(x), skinny)  # 8 tokens: the skinny GEMM
    assert not layer.split_k_counters.any()
    # An `a16` row: at 1 token the bf16 activations enter unquantized (W8A16).
    table = parse_gemv_table({"shapes": {"4096x1024": [{**row, "a16": True}]}})
    monkeypatch.setattr(linear_module, "load_gemv_table", lambda path: table)
    layer = RowLinear(4096, 1024, bias=False, method=Fp8LinearMethod(FP8_FROM_HIGH_PRECISION))
    layer.load_weight("weight", weight)
    assert not layer.takes_fp8_activations(1) and layer.takes_fp8_activations(8)
    assert not layer.takes_gated_input(1)  # a16 without gated
    dequantized = (x[:1].float() @ layer.weight.float().t()) * layer.weight_scale[None, :]
    torch.testing.assert_close(layer(x[:1]).float(), dequantized, atol=2e-2, rtol=2e-2)
    assert torch.equal(layer(x), skinny)
    assert not layer.split_k_counters.any()
