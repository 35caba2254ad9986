"""Vocabulary masks: packed allowed-token bitmasks applied in place to logits.

`apply_token_bitmask_` is the one mask function of radixgen: the sampler calls it, and it
runs the Triton kernel on CUDA and the plain-torch `apply_token_bitmask_ref_` elsewhere
(radixgen.constrained only produces the bitmasks).

Bitmask layout (the usual one of grammar engines): `bitmask[row, w]` is an int32 whose bit j
(least significant first) allows token `32 * w + j`. Tokens beyond `32 * bitmask.shape[1]` are
not covered by the grammar and are disallowed too.

Algorithm: grid `(num_rows, cdiv(vocab, 32 * BLOCK_WORDS))`. Each program loads BLOCK_WORDS words
of one constrained row, expands them to a `[BLOCK_WORDS, 32]` tile of bits and stores -inf to
exactly the disallowed logits; allowed logits are neither read nor written. Unconstrained rows
(absent from `rows`) are untouched, so a batch mixing free and constrained requests needs one
launch and no copies.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _apply_token_bitmask_kernel(
    logits_ptr,  # [batch, vocab]
    bitmask_ptr,  # [batch, num_words] int32
    rows_ptr,  # [num_rows]
    vocab_size,
    num_words,
    stride_logits_row,
    stride_bitmask_row,
    BLOCK_WORDS: tl.constexpr,
):
    row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
    offs_w = tl.program_id(1) * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)
    offs_bit = tl.arange(0, 32)
    words = tl.load(
        bitmask_ptr + row * stride_bitmask_row + offs_w, mask=offs_w < num_words, other=0
    )  # [BLOCK_WORDS]; words past the mask read as 0: disallowed
    allowed = ((words[:, None] >> offs_bit[None, :]) & 1) != 0  # [BLOCK_WORDS, 32]
    tokens = offs_w[:, None] * 32 + offs_bit[None, :]
    tl.store(
        logits_ptr + row * stride_logits_row + tokens,
        tl.full([BLOCK_WORDS, 32], float("-inf"), dtype=logits_ptr.dtype.element_ty),
        mask=(tokens < vocab_size) & ~allowed,
    )


def apply_token_bitmask_(
    logits: torch.Tensor,  # [batch, vocab], float
    bitmask: torch.Tensor,  # [batch, num_words] int32
    rows: torch.Tensor | None = None,  # [num_rows] int, the constrained rows; None: all
    *,
    use_triton: bool | None = None,
) -> None:
    """Sets `logits[r, t] = -inf` for every disallowed token t of every row r in `rows`, in place.

    Args:
        logits: the batch's next-token logits; only the listed rows change.
        bitmask: allowed-token bits, row r for logits row r (see the module docstring).
        rows: indices of the constrained rows (on logits' device); None means every row.
        use_triton: run the Triton kernel (True), the torch reference (False), or the
            kernel exactly when `logits` is on CUDA (None). Tests force the kernel on CPU
            under TRITON_INTERPRET=1.

    Raises:
        ValueError/TypeError naming the argument on bad shapes, dtypes or devices.
    """
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a float [batch, vocab] tensor, got {tuple(logits.shape)}")
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise TypeError(f"bitmask must be an int32 [batch, num_words] tensor, got {bitmask.dtype}")
    if bitmask.shape[0] != logits.shape[0]:
        raise ValueError(
            f"bitmask rows ({bitmask.shape[0]}) must match logits rows ({logits.shape[0]})"
        )
    if bitmask.device != logits.device:
        raise ValueError(f"bitmask must be on {logits.device}, got {bitmask.device}")
    if rows is not None:
        if rows.dim() != 1 or rows.dtype not in (torch.int32, torch.int64):
            raise TypeError(
                f"rows must be a 1-D int32/int64 tensor, got {rows.dtype} {tuple(rows.shape)}"
            )
        if rows.device != logits.device:
            raise ValueError(f"rows must be on {logits.device}, got {rows.device}")
    if use_triton is None:
        use_triton = logits.is_cuda
    if not use_triton:
        apply_token_bitmask_ref_(logits, bitmask, rows)
        return
    if logits.stride(1) != 1:
        raise ValueError("logits must be contiguous along the vocabulary")
    if bitmask.stride(1) != 1:
        bitmask = bitmask.contiguous()
    if rows is None:
        rows = torch.arange(logits.shape[0], device=logits.device)
    vocab_size = logits.shape[1]
    if rows.numel() == 0 or vocab_size == 0:
        return
    block_words = 32 if logits.device.type == "cuda" else 64  # 1024 / 2048 tokens a program
    grid = (rows.numel(), triton.cdiv(triton.cdiv(vocab_size, 32), block_words))
    _apply_token_bitmask_kernel[grid](
        logits,
        bitmask,
        rows,
        vocab_size,
        bitmask.shape[1],
        logits.stride(0),
        bitmask.stride(0),
        BLOCK_WORDS=block_words,
        num_warps=4,
    )


def apply_token_bitmask_ref_(
    logits: torch.Tensor,  # [batch, vocab]
    bitmask: torch.Tensor,  # [batch, num_words] int32
    rows: torch.Tensor | None = None,  # [num_rows] int; None: all rows
) -> None:
    """Plain-torch `apply_token_bitmask_` (unpacks the bits, then masked_fill); the CPU path."""
    vocab_size = logits.shape[1]
    row_bitmask = bitmask if rows is None else bitmask.index_select(0, rows.long())
    bit_positions = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    # [num_rows, num_words, 32] -> [num_rows, 32 * num_words]: one bool per token
    allowed = ((row_bitmask.unsqueeze(-1) >> bit_positions) & 1).bool().flatten(1)
    disallowed = torch.ones((allowed.shape[0], vocab_size), dtype=torch.bool, device=logits.device)
    covered = min(vocab_size, allowed.shape[1])
    disallowed[:, :covered] = ~allowed[:, :covered]  # tokens past the mask stay disallowed
    if rows is None:
        logits.masked_fill_(disallowed, float("-inf"))
    else:
        row_index = rows.long()
        logits[row_index] = logits[row_index].masked_fill(disallowed, float("-inf"))
