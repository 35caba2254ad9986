"""apply_token_bitmask_ (Triton) against apply_token_bitmask_ref_, on the interpreter and CUDA.

`use_triton=True` forces the kernel on CPU (the dispatcher picks torch there)."""


# TRITON_INTERPRET=1 on CPU-only machines is set by tests/conftest.py

import pytest
import torch

from radixgen.kernels.vocab_mask import apply_token_bitmask_, apply_token_bitmask_ref_


def random_bitmask(batch, num_words, gen):
    # Full int32 range: bit 31 (negative words) must work too.
    return torch.randint(-(2**31), 2**31, (batch, num_words), generator=gen, dtype=torch.int64).to(
        torch.int32
    )


@pytest.mark.parametrize("vocab_size,num_words", [(100, 4), (2048, 64), (3000, 90), (77, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows", [None, [2, 0], []])
def test_apply_token_bitmask_matches_reference(vocab_size, num_words, dtype, rows):
    gen = torch.Generator().manual_seed(vocab_size)
    logits = torch.randn(4, vocab_size, generator=gen).to(dtype)
    bitmask = random_bitmask(4, num_words, gen)
    rows_tensor = None if rows is None else torch.tensor(rows, dtype=torch.int64)
    expected = logits.clone()
    apply_token_bitmask_ref_(expected, bitmask, rows_tensor)
    apply_token_bitmask_(logits, bitmask, rows_tensor, use_triton=True)
    assert torch.equal(logits, expected)


def test_apply_token_bitmask_bit_order():
    """Bit j of word w allows token 32*w + j; untouched rows keep their logits."""
    logits = torch.zeros(2, 70)
    bitmask = torch.zeros(2, 3, dtype=torch.int32)
    bitmask[1, 0] = 1 << 5
    bitmask[1, 1] = -(2**31)  # bit 31 of word 1: token 63
    bitmask[1, 2] = 1 << 3  # token 67
    apply_token_bitmask_(logits, bitmask, torch.tensor([1], dtype=torch.int32), use_triton=True)
    assert torch.equal(logits[0], torch.zeros(70))
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [5, 63, 67]


def test_apply_token_bitmask_short_mask_disallows_uncovered_tokens():
    logits = torch.zeros(1, 40)
    apply_token_bitmask_(logits, torch.full((1, 1), -1, dtype=torch.int32), use_triton=True)
    assert torch.isfinite(logits[0, :32]).all() and torch.isinf(logits[0, 32:]).all()


def test_dispatcher_runs_torch_off_cuda_with_the_same_result():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 100, generator=gen)
    bitmask = random_bitmask(3, 4, gen)
    rows = torch.tensor([0, 2])
    by_kernel, by_dispatch = logits.clone(), logits.clone()
    apply_token_bitmask_(by_kernel, bitmask, rows, use_triton=True)
    apply_token_bitmask_(by_dispatch, bitmask, rows)
    assert torch.equal(by_kernel, by_dispatch)


def test_apply_token_bitmask_rejects_bad_inputs():
    logits = torch.zeros(2, 64)
    with pytest.raises(TypeError, match="bitmask"):
        apply_token_bitmask_(logits, torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="bitmask rows"):
        apply_token_bitmask_(logits, torch.zeros(3, 2, dtype=torch.int32))
    with pytest.raises(TypeError, match="rows"):
        apply_token_bitmask_(logits, torch.zeros(2, 2, dtype=torch.int32), torch.tensor([0.0]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_apply_token_bitmask_cuda_bf16():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 128256, generator=gen).to(torch.bfloat16).cuda()
    bitmask = random_bitmask(64, 4008, gen).cuda()
    rows = torch.arange(0, 64, 3, device="cuda")
    expected = logits.clone()
    apply_token_bitmask_ref_(expected, bitmask, rows)
    apply_token_bitmask_(logits, bitmask, rows)  # on CUDA the dispatcher runs the kernel
    assert torch.equal(logits, expected)
