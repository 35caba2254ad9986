"""FP8 (e4m3) W8A8 linear: the per-token quantizer, the Triton skinny GEMM (interpreter and
CUDA), cuBLASLt `_scaled_mm` and the `fp8_linear` dispatcher, against the dequantized reference."""

from __future__ import annotations

import pytest
import torch

from radixgen.kernels.fp8_gemm import (
    FP8_DTYPE,
    FP8_MAX,
    SMALL_M_MAX,
    default_gemm_config,
    fp8_gemm,
    fp8_linear,
    fp8_linear_ref,
    fp8_scaled_mm,
    fp8_split_k_counter_slots,
    gemm_config,
    load_fp8_gemm_table,
    parse_fp8_gemm_table,
    quantize_fp8_per_token,
    quantize_fp8_per_token_ref,
)
from tests.sm90_compile import PDL_PTX, assert_compile_for_sm90_without_spills


def relative_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def test_per_token_quantization_roundtrip():
    x = torch.randn(6, 200, generator=torch.Generator().manual_seed(0)) * torch.tensor(
        [[1e-3], [1.0], [30.0], [1e3], [0.0], [5.0]]
    )
    xq, scale = quantize_fp8_per_token_ref(x)
    assert xq.dtype == FP8_DTYPE and scale.shape == (6,)
    # Each non-zero row's largest magnitude maps to the format's max; a zero row stays zero.
    assert torch.allclose(xq.float().abs().amax(-1)[[0, 1, 2, 3, 5]], torch.tensor(FP8_MAX))
    assert torch.all(xq[4].float() == 0) and scale[4] > 0
    dequantized = xq.float() * scale[:, None]
    for row in (0, 1, 2, 3, 5):  # e4m3 keeps 3 mantissa bits: < 2^-4 relative per element
        assert relative_error(dequantized[row], x[row]) < 0.04


def test_emulated_linear_is_close_to_full_precision():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(9, 256, generator=generator)
    weight = torch.randn(96, 256, generator=generator) * 0.02
    bias = torch.randn(96, generator=generator)
    weight_q, weight_scale = quantize_fp8_per_token_ref(weight)
    out = fp8_linear(x, weight_q, weight_scale, bias)  # CPU: the reference path
    assert out.dtype == x.dtype and out.shape == (9, 96)
    assert torch.equal(out, fp8_linear_ref(x, weight_q, weight_scale, bias))
    reference = torch.nn.functional.linear(x, weight, bias)
    assert relative_error(out, reference) < 0.05
    cosine = torch.nn.functional.cosine_similarity(out.flatten(), reference.flatten(), dim=0)
    assert cosine > 0.999


@pytest.mark.parametrize("m,n,k,split_k", [(1, 70, 300, 3), (17, 64, 256, 1), (5, 33, 128, 2)])
def test_triton_gemm_matches_reference(m, n, k, split_k):
    """On the interpreter without CUDA (ragged M, N and K against the blocks; split-K)."""
    generator = torch.Generator().manual_seed(m + n)
    x = torch.randn(m, k, generator=generator)
    weight_q, weight_scale = quantize_fp8_per_token_ref(torch.randn(n, k, generator=generator))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, weight_q, weight_scale = x.to(device), weight_q.to(device), weight_scale.to(device)
    x_q, x_scale = quantize_fp8_per_token_ref(x)
    out = fp8_gemm(x_q, x_scale, weight_q, weight_scale, torch.float32, block_k=32, split_k=split_k)
    reference = fp8_linear_ref(x, weight_q, weight_scale)
    assert relative_error(out, reference) < 1e-5
    # The weight rows on the dot's M side (out^T = W x^T): the same product.
    swapped = fp8_gemm(
        x_q, x_scale, weight_q, weight_scale, torch.float32, block_n=64, block_k=32,
        split_k=split_k, swap_ab=True,
    )  # fmt: skip
    assert relative_error(swapped, reference) < 1e-5


@pytest.mark.parametrize("m,n,k,split_k", [(1, 70, 300, 3), (5, 33, 512, 4)])
def test_triton_gemm_sums_splits_in_kernel_with_counters(m, n, k, split_k, monkeypatch):
    """With the layer's counters each tile's last split program sums the partials in split
    order: the same output as the reduce launch, bit for bit, and the counters left zero for
    the next call (five calls in a row)."""
    from radixgen.kernels import fp8_gemm as fp8_module

    modes = []
    finish = fp8_module.finish_splits
    monkeypatch.setattr(
        fp8_module, "finish_splits", lambda mode, *a: modes.append(mode) or finish(mode, *a)
    )
    generator = torch.Generator().manual_seed(m + n)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x_q, x_scale = quantize_fp8_per_token_ref(torch.randn(m, k, generator=generator).to(device))
    weight = quantize_fp8_per_token_ref(torch.randn(n, k, generator=generator).to(device))
    options = {"block_m": 16, "block_n": 16, "block_k": 32, "split_k": split_k}
    reduced = fp8_gemm(x_q, x_scale, *weight, torch.float32, **options)
    counters = torch.zeros(fp8_split_k_counter_slots(n), dtype=torch.int32, device=device)
    for _ in range(5):
        out = fp8_gemm(x_q, x_scale, *weight, torch.float32, **options, split_k_counters=counters)
        assert torch.equal(out, reduced)
        assert not counters.any()
    assert modes == [1] + [2] * 5  # a reduce launch without counters, in-kernel with them
    with pytest.raises(ValueError, match="split_k_counters"):
        fp8_gemm(x_q, x_scale, *weight, torch.float32, **options, split_k_counters=counters.long())


def test_gemm_compiles_for_sm90_without_spills():
    """The skinny GEMM's decode tile (one split, partials for a reduce launch, summed
    in-kernel) through Triton's compiler and ptxas for sm_90: no GPU needed. At 8 warps: the
    default's 4 warps use all 255 registers and spill a few bytes (16-20 here, 56 before the
    weight tile was loaded K-major), which the H200 sweep (`bench_fp8_gemm.py --sweep`) is to
    weigh against the wider tile."""
    sizes = ("M", "N", "K", "k_per_split", "stride_xm", "stride_wn", "stride_om", "stride_split")
    signature = {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "x_scale_ptr": "*fp32",
                 "w_scale_ptr": "*fp32", "out_ptr": "*bf16", "partial_ptr": "*fp32",
                 "counters_ptr": "*i32", **dict.fromkeys(sizes, "i32")}  # fmt: skip
    assert_compile_for_sm90_without_spills([
        ("radixgen.kernels.fp8_gemm", "_fp8_gemm_kernel", signature,
         {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_MODE": mode}, 8)
        for mode in (0, 1, 2)
    ] + [
        # Swapped (the weight rows on the M side): FP8 wgmma at 16 tokens, with PDL.
        ("radixgen.kernels.fp8_gemm", "_fp8_gemm_kernel", signature,
         {"BLOCK_M": 16, "BLOCK_N": block_n, "BLOCK_K": 128, "SPLIT_MODE": 2, "SWAP_AB": True,
          "USE_PDL": True}, 4,
         {"num_stages": 4, "divisible": ["N", "K", "k_per_split"],
          "require_ptx": ["wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3",
                          "cp.async.cg.shared.global", "prefetch.global.L2",
                          *PDL_PTX["require_ptx"]]})
        for block_n in (64, 128)
    ])  # fmt: skip


def test_launch_table_rows_by_token_count():
    """A table row serves token counts up to its bound (the M = 1 row one token, the M = 64 row
    2-64); a shape or token count past the table takes the heuristic, whose BLOCK_M and
    BLOCK_K the table never changes."""
    rows = [{"max_tokens": 1, "block_n": 32, "split_k": 4, "num_warps": 4},
            {"max_tokens": 64, "block_n": 128, "split_k": 1, "num_warps": 8}]  # fmt: skip
    table = parse_fp8_gemm_table({"source": "test", "shapes": {"4096x6144": rows}})
    cpu = torch.device("cpu")

    def launch(m, n=6144, k=4096):
        config = gemm_config(m, n, k, cpu, table)
        return config["block_m"], config["block_n"], config["split_k"], config["num_warps"]

    assert launch(1) == (16, 32, 4, 4)
    assert launch(2) == (16, 128, 1, 8) and launch(64) == (64, 128, 1, 8)
    heuristic = default_gemm_config(65, 6144, 4096, cpu)
    assert gemm_config(65, 6144, 4096, cpu, table) == heuristic
    assert gemm_config(1, 4096, 4096, cpu, table) == default_gemm_config(1, 4096, 4096, cpu)


@pytest.mark.parametrize(
    "row,match",
    [({"max_tokens": None}, "max_tokens"), ({"max_tokens": 128}, "SMALL_M_MAX"),
     ({"max_tokens": 1, "block_n": 8}, "block_n"), ({"max_tokens": 1, "split_k": 0}, "split_k"),
     ({"max_tokens": 1, "num_warps": 3}, "num_warps"), ({"max_tokens": 1, "stages": 3}, "stages"),
     ({"max_tokens": 1, "block_n": 32, "swap_ab": True}, "swap_ab")],
)  # fmt: skip
def test_launch_table_rejects_bad_rows(row, match):
    base = {"block_n": 64, "split_k": 4, "num_warps": 4}
    with pytest.raises(ValueError, match=match):
        parse_fp8_gemm_table({"shapes": {"4096x4096": [{**base, **row}]}})


def test_shipped_launch_table_covers_the_8b_projections():
    """The H200 sweep's table: every Llama-3.1-8B projection at one token and up to 64, and its
    counters still cover every tile (block_n >= 16)."""
    table = load_fp8_gemm_table()
    for shape in ((4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)):
        assert [bound for bound, _ in table[shape]] == [1, SMALL_M_MAX]
    for (_, n), rows in table.items():
        for _bound, launch in rows:
            tiles = -(-SMALL_M_MAX // 16) * -(-n // launch.block_n)
            assert tiles <= fp8_split_k_counter_slots(n)


def test_gemm_rejects_bad_inputs():
    x_q, x_scale = quantize_fp8_per_token_ref(torch.randn(2, 64))
    w_q, w_scale = quantize_fp8_per_token_ref(torch.randn(8, 64))
    with pytest.raises(ValueError, match="same K"):
        fp8_gemm(x_q, x_scale, w_q[:, :32], w_scale, torch.float32)
    with pytest.raises(TypeError, match="weight must be"):
        fp8_gemm(x_q, x_scale, w_q.float(), w_scale, torch.float32)
    with pytest.raises(ValueError, match="weight_scale"):
        fp8_gemm(x_q, x_scale, w_q, w_scale[:4], torch.float32)
    with pytest.raises(ValueError, match="contiguous in K"):
        quantize_fp8_per_token(torch.randn(64, 2).t())


# Llama-3.1-8B projections (N, K): qkv, o, gate_up, down.
LLAMA_8B_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n,k", LLAMA_8B_SHAPES)
@pytest.mark.parametrize("m", [1, 7, 16, 64, 65, 256, 1000])
def test_fp8_linear_cuda_matches_dequantized_reference(m, n, k):
    generator = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, device="cuda", generator=generator).bfloat16()
    weight = torch.randn(n, k, device="cuda", generator=generator) * 0.02
    weight_q, weight_scale = quantize_fp8_per_token_ref(weight)
    x_q, x_scale = quantize_fp8_per_token(x)
    ref_q, ref_scale = quantize_fp8_per_token_ref(x)
    assert torch.allclose(x_scale, ref_scale, rtol=1e-6)
    assert (x_q.float() != ref_q.float()).float().mean() < 1e-3  # rounding ties at most
    reference = fp8_linear_ref(x.float(), weight_q, weight_scale)  # fp32 emulation
    triton_out = fp8_gemm(x_q, x_scale, weight_q, weight_scale, torch.bfloat16)
    assert relative_error(triton_out, reference) < 1e-2
    if m <= 64:  # the swapped launch (FP8 wgmma with the weight rows on its M side)
        for block_n, split_k in ((64, 4), (128, 1)):
            swapped = fp8_gemm(
                x_q, x_scale, weight_q, weight_scale, torch.bfloat16, block_n=block_n,
                split_k=split_k, swap_ab=True,
            )  # fmt: skip
            assert relative_error(swapped, reference) < 1e-2
    if m >= 16:
        cublas_out = fp8_scaled_mm(x_q, x_scale, weight_q, weight_scale, torch.bfloat16)
        assert relative_error(cublas_out, reference) < 1e-2
    out = fp8_linear(x, weight_q, weight_scale)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert relative_error(out, reference) < 1e-2
    # Fast accumulation (the engine's default) stays within bf16 output rounding of fp32's.
    fast = fp8_linear(x, weight_q, weight_scale, fast_accum=True)
    assert relative_error(fast, reference) < 1e-2
    if m > SMALL_M_MAX:
        assert not torch.equal(fast, out)  # the flag reached cuBLASLt
    full = x.float() @ weight.t()
    assert relative_error(out, full) < 0.05  # FP8 against full precision


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp8_linear_cuda_graph_replay():
    """The decode path (quantize + skinny GEMM + split-K sum) captures and replays."""
    weight_q, weight_scale = quantize_fp8_per_token_ref(torch.randn(4096, 4096, device="cuda"))
    x = torch.randn(8, 4096, device="cuda").bfloat16()
    assert x.shape[0] <= SMALL_M_MAX
    fp8_linear(x, weight_q, weight_scale)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_linear(x, weight_q, weight_scale)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(out, fp8_linear(x, weight_q, weight_scale))
