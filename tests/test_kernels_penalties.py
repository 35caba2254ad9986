"""apply_penalties_ (Triton) against apply_penalties_ref_, on the interpreter and CUDA.

`use_triton=True` forces the kernel on CPU (the dispatcher picks torch there)."""

# TRITON_INTERPRET=1 on CPU-only machines is set by tests/conftest.py

import pytest
import torch

from radixgen.kernels.penalties import apply_penalties_, apply_penalties_ref_


def penalty_case(batch: int, vocab: int, device="cpu", seed=0):
    """Logits of both signs, output counts 0-3 on a third of the tokens, prompt tokens seen,
    and per-row penalties including neutral rows (0, 0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=gen) * 4
    counts = torch.randint(0, 4, (batch, vocab), generator=gen, dtype=torch.int32)
    counts *= torch.rand(batch, vocab, generator=gen) < 0.3
    seen = (counts > 0) | (torch.rand(batch, vocab, generator=gen) < 0.1)
    frequency = torch.rand(batch, 1, generator=gen) * 2 - 0.5
    presence = torch.rand(batch, 1, generator=gen) * 2 - 0.5
    repetition = 0.5 + torch.rand(batch, 1, generator=gen) * 1.5
    frequency[0] = presence[0] = 0.0  # a row without penalties
    repetition[0] = 1.0
    tensors = (logits, counts, seen, frequency, presence, repetition)
    return [t.to(device) for t in tensors]


@pytest.mark.parametrize("batch,vocab", [(3, 100), (2, 1024), (4, 3001), (2, 7)])
def test_kernel_matches_reference(batch, vocab):
    logits, *state = penalty_case(batch, vocab, seed=vocab)
    expected = logits.clone()
    apply_penalties_ref_(expected, *state)
    apply_penalties_(logits, *state, use_triton=True)
    torch.testing.assert_close(logits, expected, rtol=1e-6, atol=1e-6)
    assert not torch.equal(expected[1:], penalty_case(batch, vocab, seed=vocab)[0][1:])  # acts


def test_rows_of_a_larger_buffer_and_neutral_rows():
    """Strided rows (a view of a wider buffer) are penalised in place; a neutral row and the
    columns outside the view are untouched."""
    logits, *state = penalty_case(3, 50, seed=1)
    wide = torch.zeros(3, 64)
    wide[:, :50] = logits
    expected = logits.clone()
    apply_penalties_ref_(expected, *state)
    apply_penalties_(wide[:, :50], *state, use_triton=True)
    torch.testing.assert_close(wide[:, :50], expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(wide[0, :50], logits[0]) and not wide[:, 50:].any()


def test_bad_inputs_are_refused_by_name():
    logits, counts, seen, frequency, presence, repetition = penalty_case(2, 10)
    with pytest.raises(ValueError, match="counts"):
        apply_penalties_(logits, counts.long(), seen, frequency, presence, repetition)
    with pytest.raises(ValueError, match="seen"):
        apply_penalties_(logits, counts, seen[:, :5], frequency, presence, repetition)
    with pytest.raises(ValueError, match="repetition"):
        apply_penalties_(logits, counts, seen, frequency, presence, repetition.reshape(-1))
    with pytest.raises(ValueError, match="logits"):
        apply_penalties_(logits.long(), counts, seen, frequency, presence, repetition)


@pytest.mark.gpu
def test_cuda_kernel_matches_reference_at_the_llama_vocabulary():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    logits, *state = penalty_case(64, 128256, device="cuda", seed=3)
    expected = logits.clone()
    apply_penalties_ref_(expected, *state)
    apply_penalties_(logits, *state)  # the dispatcher picks the kernel on CUDA
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
