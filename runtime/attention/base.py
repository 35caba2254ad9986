"""The attention-backend interface: attention over the token-level KV pool."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixgen.runtime.forward_batch import ForwardBatch


class AttentionBackend(abc.ABC):
    """Computes attention for one layer, after writing the new tokens' K/V to their slots
    (unless the caller did).

    The model calls `forward` once per layer; `init_forward_metadata` once per batch, so a
    backend can precompute index tensors shared by all layers.
    """

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:  # noqa: B027
        """Per-batch precomputation; the default needs none."""

    @abc.abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor | None,  # [num_tokens, num_kv_heads, head_dim]; None: see kv_stored
        v: torch.Tensor | None,  # [num_tokens, num_kv_heads, head_dim]
        layer_id: int,
        forward_batch: ForwardBatch,
        scaling: float,
        *,
        kv_stored: bool = False,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """`kv_stored`: the caller already wrote k and v to the layer's slots
        (`forward_batch.out_cache_loc`), e.g. with the fused rotary kernel; at decode, which
        reads them from the cache, k and v may then be None (the qkv GEMV's `rope_store`)."""
