"""Packed allowed-token bitmasks and their application to a batch of logits.

Layout: `bitmask[row, w]` is an int32 whose bit j (least significant first) allows token
`32 * w + j`; tokens past `32 * bitmask.shape[1]` are disallowed. The Triton kernel
`radixgen.kernels.vocab_mask.apply_token_bitmask_` has the same signature and semantics and is
used for CUDA logits; the torch version here serves CPU (and is the semantic reference).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def allocate_token_bitmask(batch_size: int, vocab_size: int, device="cpu") -> torch.Tensor:
    """An all-allowed int32 bitmask [batch_size, ceil(vocab_size / 32)].

    Rows of unconstrained requests can stay all-ones; on CPU it is pinned when CUDA exists, so
    the copy to the GPU can be asynchronous.
    """
    import torch

    if batch_size < 0 or vocab_size <= 0:
        raise ValueError(f"batch_size={batch_size} and vocab_size={vocab_size} must be positive")
    pin = torch.device(device).type == "cpu" and torch.cuda.is_available()
    return torch.full(
        (batch_size, (vocab_size + 31) // 32), -1, dtype=torch.int32, device=device, pin_memory=pin
    )


def apply_token_bitmask_(
    logits: torch.Tensor,  # [batch, vocab], float
    bitmask: torch.Tensor,  # [batch, num_words] int32
    rows: torch.Tensor | None = None,  # [num_rows] int: the constrained rows; None: all rows
) -> None:
    """Sets `logits[r, t] = -inf` for every token t disallowed in row r, for r in `rows`, in place.

    Raises:
        ValueError/TypeError naming the argument on bad shapes, dtypes or devices.
    """
    import torch

    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a float [batch, vocab] tensor, got {tuple(logits.shape)}")
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise TypeError(f"bitmask must be an int32 [batch, num_words] tensor, got {bitmask.dtype}")
    if bitmask.shape[0] != logits.shape[0]:
        raise ValueError(f"bitmask rows ({bitmask.shape[0]}) must match logits ({logits.shape[0]})")
    if bitmask.device != logits.device:
        raise ValueError(f"bitmask must be on {logits.device}, got {bitmask.device}")
    if rows is not None and (rows.dim() != 1 or rows.dtype not in (torch.int32, torch.int64)):
        raise TypeError(f"rows must be a 1-D integer tensor, got {rows.dtype} {tuple(rows.shape)}")
    if logits.is_cuda:
        from radixgen.kernels.vocab_mask import apply_token_bitmask_ as apply_with_triton

        apply_with_triton(logits, bitmask, rows)
        return
    vocab_size = logits.shape[1]
    row_bitmask = bitmask if rows is None else bitmask.index_select(0, rows.long())
    bit_positions = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    # [num_rows, num_words, 32] -> [num_rows, 32 * num_words]: one bool per token
    allowed = ((row_bitmask.unsqueeze(-1) >> bit_positions) & 1).bool().flatten(1)
    disallowed = torch.ones((allowed.shape[0], vocab_size), dtype=torch.bool, device=logits.device)
    covered = min(vocab_size, allowed.shape[1])
    disallowed[:, :covered] = ~allowed[:, :covered]
    if rows is None:
        logits.masked_fill_(disallowed, float("-inf"))
    else:
        row_index = rows.long()
        logits[row_index] = logits[row_index].masked_fill(disallowed, float("-inf"))
