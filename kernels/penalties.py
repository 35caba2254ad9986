"""Repetition, frequency and presence penalties applied in place to a batch's logits.

`apply_penalties_` is the one penalty function of radixgen: the sampler calls it, and it runs
the Triton kernel on CUDA and the plain-torch `apply_penalties_ref_` elsewhere. The math
(SGLang's and vLLM's): a token seen in the prompt or the output so far has its logit divided by
the repetition penalty when positive, multiplied by it otherwise; then every token loses
`frequency * count + presence * (count > 0)` for its count among the outputs.

Why a kernel: in torch the penalties take about a dozen passes over `[batch, vocab]` (compares,
`where`s, casts of the counts, the subtractions), each reading and writing the whole logits:
~4.6 ms of a 46 ms decode step at batch 1024 on the H200 with the 128k vocabulary (the eleventh
session's profile, when a bug ran them on every batch; ~1 ms of 23 ms at batch 256 in the
seventh's). The kernel reads the logits, counts and seen flags once and writes the logits once:
grid `(batch, cdiv(vocab, BLOCK))`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _apply_penalties_kernel(
    logits_ptr,  # [batch, vocab] float
    counts_ptr,  # [batch, vocab] int32
    seen_ptr,  # [batch, vocab] bool, as uint8
    frequency_ptr,  # [batch] float32
    presence_ptr,  # [batch] float32
    repetition_ptr,  # [batch] float32
    vocab_size,
    stride_logits_row,
    stride_counts_row,
    stride_seen_row,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < vocab_size
    frequency = tl.load(frequency_ptr + row)
    presence = tl.load(presence_ptr + row)
    repetition = tl.load(repetition_ptr + row)
    logits = tl.load(logits_ptr + row * stride_logits_row + offs, mask=mask, other=0.0)
    counts = tl.load(counts_ptr + row * stride_counts_row + offs, mask=mask, other=0)
    seen = tl.load(seen_ptr + row * stride_seen_row + offs, mask=mask, other=0) != 0
    values = logits.to(tl.float32)
    penalised = tl.where(values > 0, values / repetition, values * repetition)
    values = tl.where(seen, penalised, values)
    values -= frequency * counts.to(tl.float32)
    values -= tl.where(counts > 0, presence, 0.0)
    tl.store(
        logits_ptr + row * stride_logits_row + offs,
        values.to(logits_ptr.dtype.element_ty),
        mask=mask,
    )


def apply_penalties_ref_(
    logits: torch.Tensor,  # [batch, vocab] float
    counts: torch.Tensor,  # [batch, vocab] int
    seen: torch.Tensor,  # [batch, vocab] bool
    frequency: torch.Tensor,  # [batch, 1] float32
    presence: torch.Tensor,  # [batch, 1] float32
    repetition: torch.Tensor,  # [batch, 1] float32
) -> None:
    """Plain-torch `apply_penalties_`."""
    penalised = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits.copy_(torch.where(seen, penalised, logits))
    float_counts = counts.to(logits.dtype)
    logits -= frequency * float_counts
    logits -= presence * (float_counts > 0).to(logits.dtype)


def apply_penalties_(
    logits: torch.Tensor,  # [batch, vocab] float
    counts: torch.Tensor,  # [batch, vocab] int32, each token's count among the outputs
    seen: torch.Tensor,  # [batch, vocab] bool, in the prompt or the outputs
    frequency: torch.Tensor,  # [batch, 1] float32
    presence: torch.Tensor,  # [batch, 1] float32
    repetition: torch.Tensor,  # [batch, 1] float32
    *,
    use_triton: bool | None = None,
) -> None:
    """Applies the repetition, frequency and presence penalties to `logits` in place.

    Args:
        logits, counts, seen: the batch's rows (see the module docstring); rows may be strided
            (the vocabulary dimension contiguous).
        frequency, presence, repetition: each row's penalties (0, 0 and 1 leave it unchanged).
        use_triton: the Triton kernel (True), the torch reference (False), or the kernel exactly
            when `logits` is on CUDA (None). Tests force the kernel on CPU under
            TRITON_INTERPRET=1.

    Raises:
        ValueError naming the argument on bad shapes, dtypes or devices.
    """
    if logits.dim() != 2 or not logits.is_floating_point() or logits.stride(1) != 1:
        raise ValueError(f"logits must be a float [batch, vocab] tensor, got {tuple(logits.shape)}")
    for name, table, dtype in (("counts", counts, torch.int32), ("seen", seen, torch.bool)):
        if table.shape != logits.shape or table.dtype != dtype or table.stride(1) != 1:
            raise ValueError(f"{name} must be a {dtype} tensor shaped like logits")
        if table.device != logits.device:
            raise ValueError(f"{name} must be on {logits.device}, got {table.device}")
    batch = logits.shape[0]
    for name, column in (
        ("frequency", frequency),
        ("presence", presence),
        ("repetition", repetition),
    ):
        if column.shape != (batch, 1) or column.dtype != torch.float32:
            raise ValueError(f"{name} must be a float32 [{batch}, 1] tensor")
        if column.device != logits.device:
            raise ValueError(f"{name} must be on {logits.device}, got {column.device}")
    if use_triton is None:
        use_triton = logits.is_cuda
    if not use_triton:
        apply_penalties_ref_(logits, counts, seen, frequency, presence, repetition)
        return
    if batch == 0:
        return
    vocab_size = logits.shape[1]
    _apply_penalties_kernel[(batch, triton.cdiv(vocab_size, BLOCK))](
        logits,
        counts,
        seen.view(torch.uint8),
        frequency.reshape(-1).contiguous(),
        presence.reshape(-1).contiguous(),
        repetition.reshape(-1).contiguous(),
        vocab_size,
        logits.stride(0),
        counts.stride(0),
        seen.stride(0),
        BLOCK=BLOCK,
        num_warps=4,
    )
