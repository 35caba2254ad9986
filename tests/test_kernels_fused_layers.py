"""rms_norm, fused_add_rms_norm, silu_and_mul and rotary_embedding (Triton) against their
torch references."""


# TRITON_INTERPRET=1 on CPU-only machines is set by tests/conftest.py

import pytest
import torch

from radixgen.kernels.activation import silu_and_mul, silu_and_mul_ref
from radixgen.kernels.fp8_gemm import (
    fp8_linear,
    quantize_fp8_activations,
    quantize_fp8_per_token_ref,
    quantize_fp8_per_token_triton,
)
from radixgen.kernels.rms_norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)
from radixgen.kernels.rotary import (
    rotary_embedding,
    rotary_embedding_and_store_kv,
    rotary_embedding_and_store_kv_ref,
    rotary_embedding_ref,
    store_in_cache,
)
from radixgen.radix_cache.memory_pool import TokenToKVPool
from tests.sm90_compile import PDL_PTX, assert_compile_for_sm90_without_spills


def randn(*shape, dtype, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).to(device)


@pytest.mark.parametrize("shape", [(5, 256), (3, 4, 96), (1, 1000)])
@pytest.mark.parametrize("dtype,weight_dtype", [(torch.float32, torch.float32),
                                                (torch.float16, torch.float16),
                                                (torch.float16, torch.float32)])  # fmt: skip
def test_rms_norm_matches_reference(shape, dtype, weight_dtype):
    x = randn(*shape, dtype=dtype) * 3
    weight = randn(shape[-1], dtype=weight_dtype, seed=1)
    out = rms_norm(x, weight, 1e-5)
    ref = rms_norm_ref(x, weight, 1e-5)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref)


def test_rms_norm_rejects_bad_weight():
    with pytest.raises(ValueError, match="weight"):
        rms_norm(torch.zeros(2, 8), torch.ones(4), 1e-5)


@pytest.mark.parametrize("shape", [(5, 256), (2, 3, 96), (1, 1000)])
@pytest.mark.parametrize("dtype,weight_dtype", [(torch.float32, torch.float32),
                                                (torch.float16, torch.float16),
                                                (torch.float16, torch.float32)])  # fmt: skip
def test_fused_add_rms_norm_matches_reference(shape, dtype, weight_dtype):
    x = randn(*shape, dtype=dtype) * 3
    residual = randn(*shape, dtype=dtype, seed=2) * 5
    weight = randn(shape[-1], dtype=weight_dtype, seed=1)
    out, summed = fused_add_rms_norm(x, residual, weight, 1e-5)
    ref_out, ref_summed = fused_add_rms_norm_ref(x, residual, weight, 1e-5)
    # The sum is rounded exactly as torch's add rounds it: bit-identical.
    assert summed.dtype == dtype and torch.equal(summed, ref_summed)
    assert out.dtype == ref_out.dtype and out.shape == ref_out.shape
    torch.testing.assert_close(out, ref_out)


def test_fused_add_rms_norm_reads_strided_rows():
    # The attention output arrives contiguous, the residual may be a view: both work.
    x = randn(4, 2, 64, dtype=torch.float32)[:, 1]  # [4, 64], row stride 128
    residual = randn(4, 64, dtype=torch.float32, seed=3)
    weight = randn(64, dtype=torch.float32, seed=1)
    out, summed = fused_add_rms_norm(x, residual, weight, 1e-6)
    ref_out, ref_summed = fused_add_rms_norm_ref(x, residual, weight, 1e-6)
    torch.testing.assert_close(out, ref_out)
    assert torch.equal(summed, ref_summed)


def test_fused_add_rms_norm_rejects_a_mismatched_residual():
    with pytest.raises(ValueError, match="residual"):
        fused_add_rms_norm(torch.zeros(2, 8), torch.zeros(2, 4), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        fused_add_rms_norm(
            torch.zeros(2, 8), torch.zeros(2, 8, dtype=torch.float16), torch.ones(8), 1e-5
        )


@pytest.mark.parametrize("shape", [(4, 200), (2, 3, 1376), (1, 6)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_and_mul_matches_reference(shape, dtype):
    x = randn(*shape, dtype=dtype) * 4
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x))


@pytest.mark.parametrize("shape", [(4, 200), (2, 3, 1376)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_and_mul_adds_a_delta_as_the_unfused_sum(shape, dtype):
    # A LoRA delta computed beside the gate_up GEMM: the same as adding it into x first.
    x = randn(*shape, dtype=dtype) * 4
    delta = randn(*shape, dtype=torch.float32, seed=1)
    expected = silu_and_mul((x.float() + delta).to(dtype))
    assert torch.equal(silu_and_mul(x, delta=delta), expected)
    with pytest.raises(ValueError, match="delta"):
        silu_and_mul(x, delta=delta.half())  # not float32
    with pytest.raises(ValueError, match="delta"):
        silu_and_mul(x, quantize_fp8=True, delta=delta)


def test_silu_and_mul_rejects_odd_width():
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.zeros(2, 7))


def assert_same_fp8(fused, unfused):
    """Fused quantization equals the quantize kernel's of the unfused output, bit for bit (both
    under the interpreter, which rounds some e4m3 values unlike torch; the GPU tests check the
    kernels against torch)."""
    values, scales = quantize_fp8_per_token_triton(unfused.reshape(-1, unfused.shape[-1]))
    assert fused.dtype == unfused.dtype and fused.values.dtype == torch.float8_e4m3fn
    assert torch.equal(fused.values.view(torch.uint8), values.view(torch.uint8))
    assert torch.equal(fused.scales, scales)


@pytest.mark.parametrize("shape", [(5, 256), (2, 3, 96), (1, 1000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_norms_quantize_fp8_as_the_unfused_path(shape, dtype):
    """The norms' FP8 outputs (for an FP8 linear) are the unfused output quantized per token."""
    x, residual = randn(*shape, dtype=dtype) * 3, randn(*shape, dtype=dtype, seed=1)
    weight = (randn(shape[-1], dtype=torch.float32, seed=2) + 1).to(dtype)
    x[0, ..., :3] = 0  # a row's zeros and its amax
    assert_same_fp8(rms_norm(x, weight, 1e-6, quantize_fp8=True), rms_norm(x, weight, 1e-6))
    fused, summed = fused_add_rms_norm(x, residual, weight, 1e-6, quantize_fp8=True)
    normed, expected_sum = fused_add_rms_norm(x, residual, weight, 1e-6)
    assert_same_fp8(fused, normed)
    assert torch.equal(summed, expected_sum)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, weight.float() if dtype != torch.float32 else weight.half(), 1e-6, True)


@pytest.mark.parametrize("shape", [(4, 200), (1, 1376), (3, 6)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_and_mul_quantizes_fp8_as_the_unfused_path(shape, dtype):
    x = randn(*shape, dtype=dtype) * 4
    assert_same_fp8(silu_and_mul(x, quantize_fp8=True), silu_and_mul(x))


def test_fp8_linear_takes_quantized_activations():
    """An FP8 linear given `Fp8Activations` computes what it computes from the unquantized
    tensor (CPU: the emulated path; the GPU test covers the Triton and cuBLAS GEMMs)."""
    x = randn(3, 64, dtype=torch.float32)
    weight, weight_scale = quantize_fp8_per_token_ref(randn(48, 64, dtype=torch.float32, seed=1))
    bias = randn(48, dtype=torch.float32, seed=2)
    expected = fp8_linear(x, weight, weight_scale, bias)
    quantized = quantize_fp8_activations(x)
    assert torch.equal(fp8_linear(quantized, weight, weight_scale, bias), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 64, 300])
def test_gpu_fp8_producers_and_linear_in_bf16(num_tokens):
    """On the GPU, bf16 at Llama-3.1-8B widths: the norms' and SiLU-and-mul's FP8 outputs equal
    `quantize_fp8_per_token` of their unfused outputs bit for bit, and an FP8 linear given them
    (the Triton GEMM up to 64 tokens, cuBLASLt above) returns what it returns from the tensor."""
    from radixgen.kernels.fp8_gemm import quantize_fp8_per_token

    def same(fused, unfused):
        values, scales = quantize_fp8_per_token(unfused)
        assert torch.equal(fused.values.view(torch.uint8), values.view(torch.uint8))
        assert torch.equal(fused.scales, scales)

    bf16 = torch.bfloat16
    x = randn(num_tokens, 4096, dtype=bf16, device="cuda")
    residual = randn(num_tokens, 4096, dtype=bf16, seed=1, device="cuda")
    weight = randn(4096, dtype=bf16, seed=2, device="cuda") + 1
    same(rms_norm(x, weight, 1e-5, quantize_fp8=True), rms_norm(x, weight, 1e-5))
    fused, _ = fused_add_rms_norm(x, residual, weight, 1e-5, quantize_fp8=True)
    same(fused, fused_add_rms_norm(x, residual, weight, 1e-5)[0])
    gate_up = randn(num_tokens, 2 * 14336, dtype=bf16, seed=3, device="cuda") * 3
    same(silu_and_mul(gate_up, quantize_fp8=True), silu_and_mul(gate_up))
    w, w_scale = quantize_fp8_per_token(randn(1024, 4096, dtype=bf16, seed=4, device="cuda"))
    normed = rms_norm(x, weight, 1e-5)
    quantized = rms_norm(x, weight, 1e-5, quantize_fp8=True)
    assert torch.equal(fp8_linear(quantized, w, w_scale), fp8_linear(normed, w, w_scale))


def test_fp8_producers_compile_for_sm90_without_spills():
    """The norms (plain and FP8 output) and SiLU-and-mul's FP8 variant at Llama-3.1-8B widths,
    bf16, through Triton's compiler and ptxas for sm_90: no GPU needed."""
    quant = {"FP8_MAX_VALUE": 448.0, "MIN_AMAX": 1e-12}
    rows = {"stride_x_row": "i32", "stride_out_row": "i32"}
    kernels = []
    for fp8 in (False, True):
        out = "*fp8e4nv" if fp8 else "*bf16"
        constexprs = {"BLOCK": 4096, "QUANT": fp8, **quant}
        kernels += [
            ("radixgen.kernels.rms_norm", "_rms_norm_kernel",
             {"x_ptr": "*bf16", "weight_ptr": "*bf16", "out_ptr": out, "scale_ptr": "*fp32",
              **rows, "hidden": "i32", "eps": "fp32"}, constexprs, 16),
            ("radixgen.kernels.rms_norm", "_fused_add_rms_norm_kernel",
             {"x_ptr": "*bf16", "residual_ptr": "*bf16", "weight_ptr": "*bf16", "out_ptr": out,
              "sum_ptr": "*bf16", "scale_ptr": "*fp32", "stride_x_row": "i32",
              "stride_residual_row": "i32", "stride_out_row": "i32", "stride_sum_row": "i32",
              "hidden": "i32", "eps": "fp32"}, constexprs, 16),
        ]  # fmt: skip
    kernels.append(
        ("radixgen.kernels.activation", "_silu_and_mul_fp8_kernel",
         {"x_ptr": "*bf16", "out_ptr": "*fp8e4nv", "scale_ptr": "*fp32", **rows, "n": "i32"},
         {"BLOCK": 16384, **quant}, 16)
    )  # fmt: skip
    # With programmatic dependent launch (kernels/pdl.py).
    kernels += [(*kernel[:3], {**kernel[3], "USE_PDL": True}, kernel[4], PDL_PTX)
                for kernel in kernels[-2:]]  # fmt: skip
    assert_compile_for_sm90_without_spills(kernels)


def rope_tables(max_positions, head_dim):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(max_positions).float(), inv_freq).repeat(1, 2)
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(8, 4, 32), (4, 1, 128), (3, 3, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_tokens", [7, 12])  # a few tokens split their heads over programs
def test_rotary_embedding_matches_reference(num_heads, num_kv_heads, head_dim, dtype, num_tokens):
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype)
    q, k, _ = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1
    )
    q = q.reshape(num_tokens, num_heads, head_dim)  # strided views, as in the model
    k = k.reshape(num_tokens, num_kv_heads, head_dim)
    cos, sin = rope_tables(64, head_dim)
    positions = torch.tensor([0, 5, 63, 1, 1, 30, 2, 9, 40, 41, 3, 62])[:num_tokens]
    q_out, k_out = rotary_embedding(positions, q, k, cos, sin)
    q_ref, k_ref = rotary_embedding_ref(positions, q, k, cos, sin)
    torch.testing.assert_close(q_out, q_ref)
    torch.testing.assert_close(k_out, k_ref)
    assert not torch.equal(q_out, q)  # it rotated something


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(8, 4, 32), (3, 3, 96)])
@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float32, torch.float32),
                                               (torch.float16, torch.float16),
                                               (torch.float32, torch.float16)])  # fmt: skip
@pytest.mark.parametrize("num_tokens", [5, 10])  # a few tokens split their heads over programs
def test_rotary_embedding_and_store_kv_matches_reference(
    num_heads, num_kv_heads, head_dim, dtype, cache_dtype, num_tokens
):
    num_slots = 16
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype)
    q, k, v = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1
    )
    q = q.reshape(num_tokens, num_heads, head_dim)  # strided views, as in the model
    k = k.reshape(num_tokens, num_kv_heads, head_dim)
    v = v.reshape(num_tokens, num_kv_heads, head_dim)
    cos, sin = rope_tables(64, head_dim)
    positions = torch.tensor([3, 0, 63, 17, 4, 8, 50, 51, 2, 33])[:num_tokens]
    # scattered, as the allocator hands them out
    slots = torch.tensor([9, 2, 15, 1, 7, 0, 12, 4, 11, 6])[:num_tokens]
    caches = [randn(num_slots, num_kv_heads, head_dim, dtype=cache_dtype, seed=s) for s in (5, 6)]
    ref_caches = [cache.clone() for cache in caches]
    q_out, k_out = rotary_embedding_and_store_kv(positions, q, k, v, cos, sin, *caches, slots)
    q_ref, k_ref = rotary_embedding_and_store_kv_ref(
        positions, q, k, v, cos, sin, *ref_caches, slots
    )
    torch.testing.assert_close(q_out, q_ref)
    torch.testing.assert_close(k_out, k_ref)
    for cache, ref in zip(caches, ref_caches, strict=True):
        torch.testing.assert_close(cache, ref)
    untouched = torch.ones(num_slots, dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(caches[0][untouched], randn(num_slots, num_kv_heads, head_dim,
                                                   dtype=cache_dtype, seed=5)[untouched])  # fmt: skip
    assert torch.equal(caches[1][slots], v.to(cache_dtype))  # values stored unrotated


@pytest.mark.parametrize("fp8_cache", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotary_embedding_and_store_kv_adds_a_delta_as_the_unfused_sum(dtype, fp8_cache):
    # A LoRA delta computed beside the qkv GEMM: the same as adding it into q, k, v first
    # (into an FP8 cache too, quantized after the sum).
    num_tokens, num_heads, num_kv_heads, head_dim, num_slots = 4, 4, 2, 32, 8
    sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    qkv = randn(num_tokens, sum(sizes), dtype=dtype)
    delta = randn(num_tokens, sum(sizes), dtype=torch.float32, seed=1)

    def heads(tensor):
        q, k, v = tensor.split(sizes, -1)
        return (q.reshape(num_tokens, num_heads, head_dim),
                k.reshape(num_tokens, num_kv_heads, head_dim),
                v.reshape(num_tokens, num_kv_heads, head_dim))  # fmt: skip

    cos, sin = rope_tables(64, head_dim)
    positions, slots = torch.tensor([3, 0, 63, 17]), torch.tensor([5, 2, 7, 1])
    cache_dtype = torch.float8_e4m3fn if fp8_cache else dtype
    kv_scales = (0.5, 0.125) if fp8_cache else (1.0, 1.0)
    caches = [torch.zeros(num_slots, num_kv_heads, head_dim, dtype=cache_dtype) for _ in "kv"]
    expected_caches = [cache.clone() for cache in caches]
    q, k, v = heads(qkv)
    q_out, k_out = rotary_embedding_and_store_kv(
        positions, q, k, v, cos, sin, *caches, slots, delta=delta, kv_scales=kv_scales
    )
    q_sum, k_sum, v_sum = heads((qkv.float() + delta).to(dtype))
    q_expected, k_expected = rotary_embedding_and_store_kv(
        positions, q_sum, k_sum, v_sum, cos, sin, *expected_caches, slots, kv_scales=kv_scales
    )
    assert torch.equal(q_out, q_expected) and torch.equal(k_out, k_expected)
    for cache, expected in zip(caches, expected_caches, strict=True):
        assert torch.equal(cache.view(torch.uint8), expected.view(torch.uint8))
        assert cache.float().abs().sum() > 0
    with pytest.raises(ValueError, match="delta"):
        rotary_embedding_and_store_kv(
            positions, q, k, v, cos, sin, *caches, slots, delta=delta[:, :-1]
        )


def test_lora_delta_consumers_compile_for_sm90_without_spills():
    """SiLU-and-mul and the rotary + KV store with a LoRA delta, at Llama-3.1-8B sizes."""
    i32 = "i32"
    rotary = {
        "positions_ptr": "*i64", "q_ptr": "*bf16", "k_ptr": "*bf16", "q_out_ptr": "*bf16",
        "k_out_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "v_ptr": "*bf16",
        "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "slots_ptr": "*i64",
        "delta_ptr": "*fp32", "stride_delta_token": i32,
        **dict.fromkeys(
            ["stride_q_token", "stride_q_head", "stride_k_token", "stride_k_head",
             "stride_qo_token", "stride_qo_head", "stride_ko_token", "stride_ko_head",
             "stride_cos_row", "stride_v_token", "stride_v_head", "stride_kc_slot",
             "stride_kc_head", "stride_vc_slot", "stride_vc_head", "num_heads", "num_kv_heads"],
            i32,
        ),
        "k_scale": "fp32", "v_scale": "fp32",
    }  # fmt: skip
    fp8_caches = {"k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv"}
    assert_compile_for_sm90_without_spills([
        ("radixgen.kernels.activation", "_silu_and_mul_kernel",
         {"x_ptr": "*bf16", "delta_ptr": "*fp32", "out_ptr": "*bf16", "stride_x_row": i32,
          "stride_delta_row": i32, "stride_out_row": i32, "n": i32},
         {"HAS_DELTA": True, "BLOCK": 1024}, 4),
        ("radixgen.kernels.rotary", "_rotary_kernel", rotary,
         {"HALF": 64, "BLOCK_HALF": 64, "BLOCK_HQ": 32, "BLOCK_HK": 8, "STORE_KV": True,
          "HAS_DELTA": True, "FP8_MAX": 0.0}, 4),
        # The store into an e4m3 pool (quantized by the layer's scales), no delta.
        ("radixgen.kernels.rotary", "_rotary_kernel", rotary | fp8_caches,
         {"HALF": 64, "BLOCK_HALF": 64, "BLOCK_HQ": 32, "BLOCK_HK": 8, "STORE_KV": True,
          "HAS_DELTA": False, "FP8_MAX": 448.0}, 4),
        # With programmatic dependent launch (kernels/pdl.py).
        ("radixgen.kernels.activation", "_silu_and_mul_kernel",
         {"x_ptr": "*bf16", "delta_ptr": "*fp32", "out_ptr": "*bf16", "stride_x_row": i32,
          "stride_delta_row": i32, "stride_out_row": i32, "n": i32},
         {"HAS_DELTA": False, "BLOCK": 1024, "USE_PDL": True}, 4, PDL_PTX),
        ("radixgen.kernels.rotary", "_rotary_kernel", rotary,
         {"HALF": 64, "BLOCK_HALF": 64, "BLOCK_HQ": 32, "BLOCK_HK": 8, "STORE_KV": True,
          "HAS_DELTA": False, "FP8_MAX": 0.0, "USE_PDL": True}, 4, PDL_PTX),
        # A token's heads split over programs (batch 1): bf16 and e4m3 pools, with PDL.
        *(("radixgen.kernels.rotary", "_rotary_kernel", rotary | caches,
           {"HALF": 64, "BLOCK_HALF": 64, "BLOCK_HQ": 2, "BLOCK_HK": 2, "STORE_KV": True,
            "HAS_DELTA": False, "FP8_MAX": fp8_max, "USE_PDL": True, "HEADS_PER_PROGRAM": 2},
           4, PDL_PTX) for caches, fp8_max in (({}, 0.0), (fp8_caches, 448.0))),
    ])  # fmt: skip


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotary_embedding_and_store_kv_quantizes_into_an_fp8_cache(dtype, cache_dtype):
    """An FP8 cache gets value / scale, clamped to the format's range, as the pool's `set_kv`
    stores it. At position 0 (no rotation) and with values on the FP8 grid times a power-of-two
    scale every stored byte is exact, so the interpreter's FP8 conversion (which rounds some
    values unlike torch) cannot blur the check; the GPU test covers rotated, rounded values."""
    num_tokens, num_heads, num_kv_heads, head_dim, num_slots = 4, 4, 2, 32, 8
    kv_scales = (0.25, 4.0)
    limit = torch.finfo(cache_dtype).max

    def on_grid(seed, scale):
        values = randn(num_tokens, num_kv_heads, head_dim, dtype=torch.float32, seed=seed) * 8
        return values.to(cache_dtype).float() * scale

    k, v = on_grid(1, kv_scales[0]), on_grid(2, kv_scales[1])
    # Keys past the format's range (2 limit * 0.25 fits in fp16 for both formats): clamped.
    k[0, 0, :3] = torch.tensor([2.0, -2.0, 1.5]) * limit * kv_scales[0]
    k, v = k.to(dtype), v.to(dtype)
    q = randn(num_tokens, num_heads, head_dim, dtype=dtype)
    cos, sin = rope_tables(8, head_dim)
    positions, slots = torch.zeros(num_tokens, dtype=torch.int64), torch.tensor([6, 1, 3, 0])
    caches = [torch.zeros(num_slots, num_kv_heads, head_dim, dtype=cache_dtype) for _ in "kv"]
    expected = [cache.clone() for cache in caches]
    q_out, k_out = rotary_embedding_and_store_kv(
        positions, q, k, v, cos, sin, *caches, slots, kv_scales=kv_scales
    )
    rotary_embedding_and_store_kv_ref(
        positions, q, k, v, cos, sin, *expected, slots, kv_scales=kv_scales
    )
    for cache, reference in zip(caches, expected, strict=True):
        assert torch.equal(cache.view(torch.uint8), reference.view(torch.uint8))
    assert caches[0][slots[0], 0, :3].float().tolist() == [limit, -limit, limit]
    assert torch.equal(k_out, k)  # position 0: the key is not rotated
    with pytest.raises(TypeError, match="FP8"):
        rotary_embedding_and_store_kv(
            positions, q, k, v, cos, sin, caches[0], torch.zeros_like(caches[1], dtype=dtype),
            slots,
        )  # fmt: skip
    with pytest.raises(ValueError, match="kv_scales"):
        rotary_embedding_and_store_kv(
            positions, q, k, v, cos, sin, *caches, slots, kv_scales=(1.0, 0.0)
        )


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_store_in_cache_quantizes_as_the_pool_does(cache_dtype):
    """The fused store's torch definition (the CPU path and the kernel's reference) writes the
    bytes the pool's own `set_kv` writes, at scale 1 and at others, outliers included."""
    for k_scale, v_scale in ((1.0, 1.0), (0.05, 3.0)):
        pool = TokenToKVPool(
            num_slots=8, num_layers=1, num_kv_heads=2, head_dim=16, dtype=torch.bfloat16,
            kv_dtype=cache_dtype, kv_scales=[(k_scale, v_scale)],
        )  # fmt: skip
        k = randn(3, 2, 16, dtype=torch.bfloat16) * 500
        v = randn(3, 2, 16, dtype=torch.bfloat16, seed=1)
        slots = torch.tensor([5, 0, 2])
        pool.set_kv(0, slots, k, v)
        caches = [torch.zeros_like(buffer) for buffer in pool.get_kv_buffer(0)]
        store_in_cache(caches[0], slots, k, k_scale)
        store_in_cache(caches[1], slots, v, v_scale)
        for cache, buffer in zip(caches, pool.get_kv_buffer(0), strict=True):
            assert torch.equal(cache.view(torch.uint8), buffer.view(torch.uint8))


def test_rotary_embedding_and_store_kv_rejects_a_bad_cache():
    q = torch.zeros(2, 2, 8)
    cos, sin = rope_tables(4, 8)
    slots = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="k_cache"):
        rotary_embedding_and_store_kv(
            torch.zeros(2, dtype=torch.int64), q, q, q, cos, sin, torch.zeros(4, 3, 8),
            torch.zeros(4, 2, 8), slots,
        )  # fmt: skip


def test_rotary_embedding_rejects_bad_positions():
    q = torch.zeros(2, 2, 8)
    cos, sin = rope_tables(4, 8)
    with pytest.raises(ValueError, match="positions"):
        rotary_embedding(torch.zeros(3, dtype=torch.int64), q, q, cos, sin)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_layers_cuda_bf16():
    x = randn(64, 4096, dtype=torch.bfloat16, device="cuda")
    weight = randn(4096, dtype=torch.bfloat16, seed=1, device="cuda")
    torch.testing.assert_close(rms_norm(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5))
    residual = randn(64, 4096, dtype=torch.bfloat16, seed=3, device="cuda")
    out, summed = fused_add_rms_norm(x, residual, weight, 1e-5)
    ref_out, ref_summed = fused_add_rms_norm_ref(x, residual, weight, 1e-5)
    assert torch.equal(summed, ref_summed)
    torch.testing.assert_close(out, ref_out)
    gate_up = randn(64, 2 * 14336, dtype=torch.bfloat16, device="cuda")
    torch.testing.assert_close(silu_and_mul(gate_up), silu_and_mul_ref(gate_up))
    q = randn(64, 32, 128, dtype=torch.bfloat16, device="cuda")
    k = randn(64, 8, 128, dtype=torch.bfloat16, seed=2, device="cuda")
    cos, sin = (t.cuda() for t in rope_tables(4096, 128))
    positions = torch.randint(0, 4096, (64,), device="cuda")
    for out, ref in zip(rotary_embedding(positions, q, k, cos, sin),
                        rotary_embedding_ref(positions, q, k, cos, sin), strict=True):  # fmt: skip
        # On the H200 1.8% of elements differ by one bf16 ulp (max 0.0039 on O(1) values): the
        # GPU compiler fuses the multiply-add, which torch rounds in two steps.
        torch.testing.assert_close(out, ref, atol=1e-2, rtol=1.6e-2)
    v = randn(64, 8, 128, dtype=torch.bfloat16, seed=4, device="cuda")
    k_cache, v_cache = (torch.zeros(256, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in "kv")
    slots = torch.randperm(256, device="cuda")[:64]
    _, k_out = rotary_embedding_and_store_kv(positions, q, k, v, cos, sin, k_cache, v_cache, slots)
    assert torch.equal(k_cache[slots], k_out) and torch.equal(v_cache[slots], v)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_rotary_store_into_an_fp8_cache_cuda_bf16(cache_dtype):
    """Rotated, rounded keys and values quantized in the kernel: the bytes torch writes."""
    num_tokens, num_heads, num_kv_heads, head_dim, num_slots = 64, 32, 8, 128, 256
    q = randn(num_tokens, num_heads, head_dim, dtype=torch.bfloat16, device="cuda")
    k = randn(num_tokens, num_kv_heads, head_dim, dtype=torch.bfloat16, seed=1, device="cuda")
    v = randn(num_tokens, num_kv_heads, head_dim, dtype=torch.bfloat16, seed=2, device="cuda")
    k[0, 0, :4] = torch.tensor([1e4, -1e4, 3e3, 60.0])  # past e4m3's range at these scales
    cos, sin = (table.cuda() for table in rope_tables(4096, head_dim))
    positions = torch.randint(0, 4096, (num_tokens,), device="cuda")
    slots = torch.randperm(num_slots, device="cuda")[:num_tokens]
    for kv_scales in ((1.0, 1.0), (0.05, 3.0)):
        caches = [torch.zeros(num_slots, num_kv_heads, head_dim, device="cuda", dtype=cache_dtype)
                  for _ in "kv"]  # fmt: skip
        expected = [cache.clone() for cache in caches]
        rotary_embedding_and_store_kv(
            positions, q, k, v, cos, sin, *caches, slots, kv_scales=kv_scales
        )
        rotary_embedding_and_store_kv_ref(
            positions, q, k, v, cos, sin, *expected, slots, kv_scales=kv_scales
        )
        for cache, reference in zip(caches, expected, strict=True):
            # The rotation's products may fuse into one FMA on the GPU (one bf16 ulp, see
            # kernels/rotary.py), which can move a key across an FP8 rounding boundary.
            differ = (cache.view(torch.uint8) != reference.view(torch.uint8)).float().mean()
            assert differ < 0.01
            assert torch.equal(cache.float().abs().amax(), reference.float().abs().amax())
        assert torch.equal(caches[1].view(torch.uint8), expected[1].view(torch.uint8))  # V exact
