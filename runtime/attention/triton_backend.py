"""`TritonAttentionBackend`: attention over the paged KV pool with the Triton kernels.

- EXTEND: `extend_attention` reads each request's cached prefix from the pool through
  `req_to_token` and its new tokens' K/V straight from the projections (no gather).
- DECODE: `decode_attention`, split-KV flash-decoding with a merge stage.

`init_forward_metadata` computes, once per batch, what all layers share: the new tokens' start
offsets (extend) or the split count and the fp32 split workspaces (decode). Decode metadata
depends only on the batch size and no host value of the lengths, so the CUDA-graph runner can
build it before capture and keep it alive for replays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.decode_attention import decode_attention, default_num_kv_splits
from radixgen.kernels.extend_attention import extend_attention
from radixgen.runtime.attention.base import AttentionBackend
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from radixgen.runtime.model_runner import ModelRunner


@dataclass
class TritonExtendMetadata:
    forward_batch: ForwardBatch  # the batch this was computed for
    extend_start_loc: torch.Tensor  # [batch] int64, each request's first token in q
    max_extend_len: int  # host int: sizes the grid, no device sync


@dataclass
class TritonDecodeMetadata:
    forward_batch: ForwardBatch
    num_kv_splits: int
    partial_out: torch.Tensor  # [batch, num_heads, num_kv_splits, head_dim] fp32 workspace
    partial_lse: torch.Tensor  # [batch, num_heads, num_kv_splits] fp32 workspace


class TritonAttentionBackend(AttentionBackend):
    """Triton kernels for EXTEND and DECODE.

    Args:
        model_runner: gives the head counts and the device (`model_config`, `device`).
    """

    def __init__(self, model_runner: ModelRunner):
        config = model_runner.model_config
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.device = model_runner.device
        self.metadata: TritonExtendMetadata | TritonDecodeMetadata | None = None

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Precomputes the index tensors / workspaces shared by all layers of this batch."""
        self.metadata = self.make_metadata(forward_batch)

    def make_metadata(self, forward_batch: ForwardBatch):
        """The metadata of `forward_batch`, without installing it (the graph runner keeps one
        per captured batch size)."""
        batch = forward_batch.batch_size
        if forward_batch.mode == ForwardMode.DECODE:
            num_kv_splits = default_num_kv_splits(batch, self.num_kv_heads, self.device)
            shape = (batch, self.num_heads, num_kv_splits, self.head_dim)
            return TritonDecodeMetadata(
                forward_batch=forward_batch,
                num_kv_splits=num_kv_splits,
                partial_out=torch.empty(shape, dtype=torch.float32, device=self.device),
                partial_lse=torch.empty(shape[:3], dtype=torch.float32, device=self.device),
            )
        extend_lens = forward_batch.extend_lens
        return TritonExtendMetadata(
            forward_batch=forward_batch,
            extend_start_loc=torch.cumsum(extend_lens, dim=0) - extend_lens,
            # The host copy avoids a sync; a batch built without it pays one.
            max_extend_len=max(forward_batch.extend_lens_cpu or [int(extend_lens.max())]),
        )

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        layer_id: int,
        forward_batch: ForwardBatch,
        scaling: float,
        *,
        kv_stored: bool = False,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        # Metadata of another batch would mix histories: recompute if stale.
        if self.metadata is None or self.metadata.forward_batch is not forward_batch:
            self.init_forward_metadata(forward_batch)
        metadata = self.metadata
        pool = forward_batch.token_to_kv_pool
        if not kv_stored:
            pool.set_kv(layer_id, forward_batch.out_cache_loc, k, v)
        k_buffer, v_buffer = pool.get_kv_buffer(layer_id)
        k_scale, v_scale = pool.kv_scales(layer_id)
        req_to_token = forward_batch.req_to_token_pool.req_to_token
        if isinstance(metadata, TritonDecodeMetadata):
            return decode_attention(
                q,
                k_buffer,
                v_buffer,
                req_to_token,
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                scaling,
                num_kv_splits=metadata.num_kv_splits,
                partial_out=metadata.partial_out,
                partial_lse=metadata.partial_lse,
                k_scale=k_scale,
                v_scale=v_scale,
            )
        # An FP8 pool takes the new tokens' K/V unquantized (in q's dtype).
        new_dtype = q.dtype if pool.is_fp8 else k_buffer.dtype
        return extend_attention(
            q,
            k.to(new_dtype),
            v.to(new_dtype),
            k_buffer,
            v_buffer,
            req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.prefix_lens,
            forward_batch.extend_lens,
            metadata.extend_start_loc,
            metadata.max_extend_len,
            scaling,
            k_scale=k_scale,
            v_scale=v_scale,
        )
