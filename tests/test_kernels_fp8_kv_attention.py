"""decode_attention and extend_attention over an FP8 KV pool (e4m3 / e5m2 with per-tensor scales):
on the Triton interpreter (fp32 queries) and on CUDA (bf16), against the plain-torch references
given the same FP8 pool (tight) and against full-precision attention (within FP8's error)."""

from __future__ import annotations

import pytest
import torch
from test_kernels_decode_attention import make_decode_case, relative_error
from test_kernels_extend_attention import make_extend_case

from radixgen.kernels.decode_attention import (
    decode_attention,
    decode_attention_ref,
    default_decode_blocks,
)
from radixgen.kernels.extend_attention import extend_attention, extend_attention_ref

# Relative error of attention over FP8-rounded K/V against full precision (random N(0, 1) K/V;
# measured ~0.03 for e4m3 and ~0.06 for e5m2 on these cases).
FP8_ERROR = {torch.float8_e4m3fn: 0.06, torch.float8_e5m2: 0.12}


def to_fp8_pool(args: dict, fp8_dtype: torch.dtype, k_scale: float, v_scale: float) -> dict:
    """The case with its pool stored as FP8 (`stored = value / scale`), scales passed along."""
    limit = torch.finfo(fp8_dtype).max
    fp8 = dict(args)
    for name, scale in (("k_buffer", k_scale), ("v_buffer", v_scale)):
        fp8[name] = (args[name].float() / scale).clamp(-limit, limit).to(fp8_dtype)
    return fp8 | {"k_scale": k_scale, "v_scale": v_scale}


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("k_scale,v_scale", [(1.0, 1.0), (0.05, 2.0)])
def test_decode_attention_reads_fp8_pool(fp8_dtype, k_scale, v_scale):
    args = make_decode_case(
        seq_lens=[1, 70, 33], num_heads=8, num_kv_heads=2, head_dim=64, dtype=torch.float32
    )
    fp8_args = to_fp8_pool(args, fp8_dtype, k_scale, v_scale)
    for kv_lhs in (False, True):  # the converted tiles on either side of the dots
        out = decode_attention(**fp8_args, num_kv_splits=4, kv_lhs=kv_lhs)
        assert relative_error(out, decode_attention_ref(**fp8_args)) < 1e-5
        assert relative_error(out, decode_attention_ref(**args)) < FP8_ERROR[fp8_dtype]


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_v_read_as_words_gives_the_same_attention(fp8_dtype):
    """fp16 dots with V read as 32-bit words and converted before the dot (CUDA's default;
    here the exact integer conversion the interpreter can run) against V converted after its
    load, and against the reference: the same attention."""
    args = make_decode_case(
        seq_lens=[1, 70, 33], num_heads=8, num_kv_heads=2, head_dim=64, dtype=torch.float16
    )
    fp8_args = to_fp8_pool(args, fp8_dtype, k_scale=0.5, v_scale=3.0)
    words = decode_attention(**fp8_args, num_kv_splits=4, fp8_v_words=True)
    plain = decode_attention(**fp8_args, num_kv_splits=4, fp8_v_words=False)
    # Bitwise equal for e4m3; for e5m2 the interpreter's own conversion (`plain`) reads the
    # case's one subnormal V element differently (~2e-6).
    assert relative_error(words, plain) < 1e-5
    assert relative_error(words, decode_attention_ref(**fp8_args)) < 2e-3


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_extend_attention_reads_fp8_prefix(fp8_dtype):
    args = make_extend_case(
        prefix_lens=[5, 0, 40],
        extend_lens=[3, 33, 1],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        dtype=torch.float32,
    )
    fp8_args = to_fp8_pool(args, fp8_dtype, k_scale=0.5, v_scale=3.0)
    out = extend_attention(**fp8_args)
    assert relative_error(out, extend_attention_ref(**fp8_args)) < 1e-5
    assert relative_error(out, extend_attention_ref(**args)) < FP8_ERROR[fp8_dtype]


def test_fp8_pool_dtype_checks():
    args = make_decode_case(
        seq_lens=[4], num_heads=2, num_kv_heads=1, head_dim=64, dtype=torch.float32
    )
    mixed = dict(args, k_buffer=args["k_buffer"].to(torch.float8_e4m3fn))  # v stays fp32
    with pytest.raises(TypeError, match="k_buffer/v_buffer dtype"):
        decode_attention(**mixed)
    with pytest.raises(TypeError, match="k_buffer/v_buffer dtype"):
        decode_attention(
            **dict(
                args,
                k_buffer=args["k_buffer"].to(torch.int8),
                v_buffer=args["v_buffer"].to(torch.int8),
            )
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_kv_attention_cuda_bf16(fp8_dtype):
    llama_8b = dict(num_heads=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    decode = make_decode_case(seq_lens=[1, 700, 3000, 64], device="cuda", **llama_8b)
    fp8_decode = to_fp8_pool(decode, fp8_dtype, k_scale=0.5, v_scale=1.5)
    # The tiles as bf16, or as fp16 (the FP8 conversion's type), on either side of the dots.
    # V read as words and converted by PTX before the dot (the default), or after its load.
    for dot_fp16, kv_lhs, v_words in (
        (False, False, False), (True, False, True), (True, False, False), (True, True, False)
    ):  # fmt: skip
        out = decode_attention(
            **fp8_decode, fp8_dot_fp16=dot_fp16, kv_lhs=kv_lhs, fp8_v_words=v_words
        )
        assert relative_error(out, decode_attention_ref(**fp8_decode)) < 1e-2
        assert relative_error(out, decode_attention_ref(**decode)) < FP8_ERROR[fp8_dtype]
    # A batch whose grid takes the one-warp launch (`default_decode_blocks`), as large
    # offline batches do, at its default and the two-warp one.
    seq_lens = [1 + 37 * i % 300 for i in range(256)]
    big = make_decode_case(seq_lens=seq_lens, device="cuda", **llama_8b)
    fp8_big = to_fp8_pool(big, fp8_dtype, k_scale=0.5, v_scale=1.5)
    assert default_decode_blocks(128, big["q"].device, fp8_pool=True, programs=256 * 8)[1] == 1
    reference = decode_attention_ref(**fp8_big)
    for launch in ({}, {"block_n": 32, "num_warps": 2, "num_stages": 5}):
        out = decode_attention(**fp8_big, **launch)
        assert relative_error(out, reference) < 1e-2
    extend = make_extend_case(
        prefix_lens=[0, 300, 1000, 7], extend_lens=[1024, 77, 500, 1], device="cuda", **llama_8b
    )
    fp8_extend = to_fp8_pool(extend, fp8_dtype, k_scale=0.5, v_scale=1.5)
    out = extend_attention(**fp8_extend)
    assert relative_error(out, extend_attention_ref(**fp8_extend)) < 1e-2
    assert relative_error(out, extend_attention_ref(**extend)) < FP8_ERROR[fp8_dtype]
