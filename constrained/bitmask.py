"""Packed allowed-token bitmasks: what the constrained layer produces.

Layout: `bitmask[row, w]` is an int32 whose bit j (least significant first) allows token
`32 * w + j`; tokens past `32 * bitmask.shape[1]` are disallowed. Applying a bitmask to logits
is `radixgen.kernels.vocab_mask.apply_token_bitmask_` (Triton on CUDA, torch elsewhere).
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
    import torch  # here, not at the top: `import radixgen.constrained` stays torch-free

    if batch_size < 0 or vocab_size <= 0:
        raise ValueError(f"batch_size={batch_size} and vocab_size={vocab_size} must be positive")
    pin = torch.device(device).type == "cpu" and torch.cuda.is_available()
    return torch.full(
        (batch_size, (vocab_size + 31) // 32), -1, dtype=torch.int32, device=device, pin_memory=pin
    )
