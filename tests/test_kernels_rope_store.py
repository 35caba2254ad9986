"""The qkv GEMV's rotary + KV-store epilogue (`rope_store`, kernels/rope_store.py): the bf16 /
fp16 / fp32 GEMV and the int4 GEMV on the interpreter, the packed FP8 and int4 GEMVs on CUDA,
the sm_90 compile of all three kernels with it."""

from __future__ import annotations

import pytest
import torch

from radixgen.kernels.gemv import GemvConfig, gemv, gemv_counter_slots
from radixgen.kernels.int4_gemm import int4_gemm, split_k_counter_slots
from radixgen.kernels.rope_store import RopeStore, rope_store_ref
from radixgen.kernels.rotary import rotary_embedding_and_store_kv
from tests.sm90_compile import PDL_PTX, assert_compile_for_sm90_without_spills
from tests.test_kernels_int4_gemm import random_int4

HEADS, KV_HEADS = 4, 2


def _rope_tables(head_dim: int, positions: int = 32, device="cpu"):
    inverse = 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(positions).float(), inverse)
    angles = torch.cat((angles, angles), dim=-1)  # [positions, head_dim]
    return angles.cos().to(device), angles.sin().to(device)


def _rope(m: int, head_dim: int, cache_dtype, generator, device="cpu", scales=(1.0, 1.0)):
    """A RopeStore of m tokens at distinct random positions and slots (caches of 16 slots)."""
    cos, sin = _rope_tables(head_dim, device=device)
    positions = torch.randperm(32, generator=generator)[:m].to(device)
    slots = torch.randperm(16, generator=generator)[:m].to(device)
    shape = (16, KV_HEADS, head_dim)
    k_cache = torch.zeros(shape, device=device).to(cache_dtype)
    v_cache = torch.zeros(shape, device=device).to(cache_dtype)
    return RopeStore(
        positions, slots, cos, sin, k_cache, v_cache, scales, HEADS, KV_HEADS, head_dim
    )


def _twin(rope: RopeStore) -> RopeStore:
    """The same store into fresh copies of its caches (for the reference)."""
    return rope._replace(k_cache=rope.k_cache.clone(), v_cache=rope.v_cache.clone())


def _assert_stored_alike(rope: RopeStore, reference: RopeStore) -> None:
    for ours, theirs in ((rope.k_cache, reference.k_cache), (rope.v_cache, reference.v_cache)):
        assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8))
    assert rope.k_cache.float().abs().sum() > 0  # the slots were written


@pytest.mark.parametrize(
    "dtype,block_n,split_k,head_dim",
    [
        (torch.float16, 16, 1, 16),  # tiles within a head
        (torch.float32, 64, 2, 16),  # a tile over 4 heads' pairs, splits summed in-kernel
        (torch.float16, 8, 2, 32),
    ],
)
def test_gemv_rope_store_rotates_q_and_stores_k_v(dtype, block_n, split_k, head_dim):
    """q rotated into the output and the rotated k and v written at the slots, as the plain
    GEMV then the rotary kernel (its torch reference) give them; the counters left zeroed."""
    generator = torch.Generator().manual_seed(block_n + head_dim)
    n, k, m = (HEADS + 2 * KV_HEADS) * head_dim, 64, 2
    x = torch.randn(m, k, generator=generator).to(dtype)
    weight = (torch.randn(n, k, generator=generator) * 0.1).to(dtype)
    config = GemvConfig(block_n, 16, split_k, 1)
    counters = torch.zeros(gemv_counter_slots(n), dtype=torch.int32)
    rope = _rope(m, head_dim, dtype, generator)
    reference = _twin(rope)
    q = gemv(x, weight, config, counters, rope_store=rope)
    expected = rope_store_ref(gemv(x, weight, config, counters), reference)
    assert q.shape == (m, HEADS * head_dim) and torch.equal(q, expected)
    _assert_stored_alike(rope, reference)
    assert not counters.any()


def test_gemv_rope_store_quantizes_into_an_fp8_cache():
    """Into an e4m3 cache k and v go divided by the layer's scales, as the rotary kernel's
    quantizing store (the pool's `set_kv`) writes them."""
    generator = torch.Generator().manual_seed(3)
    head_dim, m = 16, 1
    n, k = (HEADS + 2 * KV_HEADS) * head_dim, 64
    x = torch.randn(m, k, generator=generator)
    weight = torch.randn(n, k, generator=generator) * 0.1
    rope = _rope(m, head_dim, torch.float8_e4m3fn, generator, scales=(0.05, 0.02))
    reference = _twin(rope)
    config = GemvConfig(16, 16, 1, 1)
    q = gemv(x, weight, config, rope_store=rope)
    torch.testing.assert_close(q, rope_store_ref(gemv(x, weight, config), reference))
    _assert_stored_alike(rope, reference)


def test_rope_store_refuses_what_it_cannot_store():
    generator = torch.Generator().manual_seed(4)
    head_dim, m, k = 16, 1, 64
    n = (HEADS + 2 * KV_HEADS) * head_dim
    x, weight = torch.randn(m, k), torch.randn(n, k)
    rope = _rope(m, head_dim, torch.float32, generator)
    config = GemvConfig(16, 16, 2, 1)
    with pytest.raises(ValueError, match="rows must be"):
        gemv(x, weight[: n - 8], GemvConfig(8, 16, 1, 1), rope_store=rope)
    with pytest.raises(ValueError, match="needs split_k_counters"):
        gemv(x, weight, config, rope_store=rope)  # two splits: summed in-kernel only
    with pytest.raises(ValueError, match="not with gated"):
        gemv(x, weight, config, silu_out=True, rope_store=rope)
    with pytest.raises(ValueError, match="rope_store.positions"):
        gemv(
            x, weight, GemvConfig(16, 16, 1, 1), rope_store=rope._replace(positions=rope.slots[:0])
        )
    with pytest.raises(TypeError, match="caches must share"):
        half = rope._replace(k_cache=rope.k_cache.half(), v_cache=rope.v_cache.half())
        gemv(x, weight, GemvConfig(16, 16, 1, 1), rope_store=half)
    with pytest.raises(ValueError, match="rope_store needs block_n"):
        GemvConfig(1, 16, 1, 1, rope_store=True)


@pytest.mark.parametrize("split_k", [1, 2])
def test_int4_gemv_rope_store(split_k):
    """The int4 GEMV's epilogue: the plain launch then the rotary reference, ragged nothing."""
    generator = torch.Generator().manual_seed(split_k)
    head_dim, m, k = 16, 2, 256
    n = (HEADS + 2 * KV_HEADS) * head_dim
    weights = random_int4(n, k, 128, torch.float16, generator)
    x = torch.randn(m, k, generator=generator).half()
    launch = dict(gemv=True, block_m=1, block_n=16, block_k=32, split_k=split_k, num_warps=1,
                  num_stages=1)  # fmt: skip
    counters = torch.zeros(split_k_counter_slots(n), dtype=torch.int32)
    rope = _rope(m, head_dim, torch.float16, generator)
    reference = _twin(rope)
    q = int4_gemm(x, *weights, 128, counters, rope_store=rope, **launch)
    expected = rope_store_ref(int4_gemm(x, *weights, 128, counters, **launch), reference)
    assert torch.equal(q, expected)
    _assert_stored_alike(rope, reference)
    with pytest.raises(ValueError, match="rope_store takes the GEMV launch"):
        int4_gemm(x, *weights, 128, counters, rope_store=rope, gemv=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["bf16", "fp8_w8a8", "fp8_a16", "int4"])
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
def test_rope_store_matches_the_gemv_then_the_rotary_kernel_on_cuda(kind, cache):
    """Llama-3.1-8B's qkv shape at batch 1 (32 + 8 + 8 heads of 128): each GEMV kind's
    epilogue against its plain launch followed by `rotary_embedding_and_store_kv`: the GEMV's
    outputs rounded alike (v stored bit for bit), the rotation within an ulp."""
    from radixgen.kernels.fp8_gemm import quantize_fp8_per_token

    generator = torch.Generator().manual_seed(5)
    heads, kv_heads, head_dim, k = 32, 8, 128, 4096
    n = (heads + 2 * kv_heads) * head_dim
    x = torch.randn(1, k, generator=generator).bfloat16().cuda()
    cache_dtype = torch.bfloat16 if cache == "bf16" else torch.float8_e4m3fn
    cos, sin = _rope_tables(head_dim, 256, "cuda")
    slots = torch.tensor([37], device="cuda")

    def store():
        caches = [torch.zeros(64, kv_heads, head_dim, device="cuda").to(cache_dtype) for _ in "kv"]
        return RopeStore(torch.tensor([200], device="cuda"), slots, cos, sin, *caches,
                         (0.5, 0.25), heads, kv_heads, head_dim)  # fmt: skip

    counters = torch.zeros(gemv_counter_slots(n) + split_k_counter_slots(n), dtype=torch.int32,
                           device="cuda")  # fmt: skip
    if kind == "int4":
        weights = random_int4(n, k, 128, torch.bfloat16, generator, device="cuda")
        launch = dict(gemv=True, block_m=1, block_n=64, block_k=128, split_k=8, num_warps=2,
                      num_stages=1, packed_f16=True)  # fmt: skip

        def run(**epilogue):
            return int4_gemm(x, *weights, 128, counters, **launch, **epilogue)
    else:
        if kind == "bf16":
            weight, scales = (torch.randn(n, k, generator=generator) * 0.02).bfloat16().cuda(), {}
        else:
            weight_values = torch.randn(n, k, generator=generator).cuda() * 0.02
            weight, weight_scale = quantize_fp8_per_token(weight_values)
            scales = {"weight_scale": weight_scale}
            if kind == "fp8_w8a8":
                xq, x_scale = quantize_fp8_per_token(x)
                scales.update(x_scale=x_scale, out_dtype=torch.bfloat16)
        x_in = xq if kind == "fp8_w8a8" else x
        config = GemvConfig(16, 512, 4, 4, packed_f16=kind != "bf16", a16=kind == "fp8_a16")

        def run(**epilogue):
            return gemv(x_in, weight, config, counters, **scales, **epilogue)

    rope, reference = store(), store()
    q = run(rope_store=rope)
    plain = run().view(1, heads + 2 * kv_heads, head_dim)
    q_ref, _ = rotary_embedding_and_store_kv(
        reference.positions, plain[:, :heads], plain[:, heads : heads + kv_heads],
        plain[:, heads + kv_heads :], cos, sin, reference.k_cache, reference.v_cache, slots,
        kv_scales=reference.kv_scales,
    )  # fmt: skip
    # The two kernels contract the rotation's products into fused multiply-adds differently:
    # ~14% of the rotated values differ by an ulp of their terms (the H200, twentieth
    # session), which a cancelling sum makes large relative to itself but not to the head's
    # values; a wrong pairing or angle would be off by their size.
    q_ref = q_ref.reshape(1, -1)
    torch.testing.assert_close(q, q_ref, atol=q_ref.abs().max().item() / 64, rtol=1e-2)
    k, k_ref = rope.k_cache[37].float(), reference.k_cache[37].float()
    # One bf16 ulp of a rotated key may move its e4m3 rounding by one e4m3 ulp (1/8).
    torch.testing.assert_close(k, k_ref, atol=k_ref.abs().max().item() / 8, rtol=0.13)
    assert torch.equal(rope.v_cache.view(torch.uint8), reference.v_cache.view(torch.uint8))
    assert not counters.any()


_ROPE = ["*i64", "*i64", "*fp32", "*fp32", "i32", "*bf16", "*bf16", "i32", "fp32", "fp32",
         "i32", "i32"]  # fmt: skip
_SIZES = ("N", "K", "k_per_split", "stride_xm", "stride_wn", "stride_split")


def test_rope_store_compiles_for_sm90_without_spills():
    """The three GEMV kernels with the epilogue (bf16 and FP8 caches), with PDL: no GPU."""
    gemv_signature = {
        "x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "partial_ptr": "*fp32",
        "counters_ptr": "*i32", "x_scale_ptr": "*fp32", "w_scale_ptr": "*fp32",
        **dict.fromkeys(_SIZES, "i32"),
    }  # fmt: skip
    int4_signature = {
        "x_ptr": "*bf16", "qweight_ptr": "*i32", "scales_ptr": "*bf16", "zeros_ptr": "*bf16",
        "out_ptr": "*bf16", "partial_ptr": "*fp32", "counters_ptr": "*i32",
        **dict.fromkeys(("N", "K", "k_per_split", "stride_xm", "stride_split"), "i32"),
        "float_2p23_bits": "i32",
    }  # fmt: skip
    fp8_cache = _ROPE[:5] + ["*fp8e4nv", "*fp8e4nv"] + _ROPE[7:]
    options = {"divisible": ["N", "K", "k_per_split"], "require_ptx": PDL_PTX["require_ptx"]}
    kernels = []
    for rope, fp8_max in ((_ROPE, 0.0), (fp8_cache, 448.0)):
        epilogue = {"ROPE_HALF": 64, "KV_FP8_MAX": fp8_max, "USE_PDL": True, "SPLIT_MODE": 2}
        kernels += [
            ("radixgen.kernels.gemv", "_gemv_kernel", gemv_signature | {"rope": rope},
             {"BLOCK_N": 16, "BLOCK_K": 256, "SCALED": False, **epilogue}, 4, options),
            ("radixgen.kernels.gemv", "_gemv_e4m3_packed_kernel",
             gemv_signature | {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "rope": rope},
             {"BLOCK_N": 16, "BLOCK_K": 512, **epilogue}, 4, options),
            ("radixgen.kernels.int4_gemm", "_int4_gemv_kernel", int4_signature | {"rope": rope},
             {"GROUP_SIZE": 128, "SPAN": 128, "BLOCK_N": 64, "BLOCK_K": 128, "PREFETCH": 1,
              "PACKED_F16": True, **epilogue}, 2, options),
        ]  # fmt: skip
    assert_compile_for_sm90_without_spills(kernels)
