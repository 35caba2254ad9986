"""`TorchAttentionBackend`: the plain-PyTorch reference attention over the paged KV pool.

Runs on CPU and GPU. Every forward first writes the new tokens' K/V to their slots
(`out_cache_loc`), then reads each request's whole history back through `req_to_token`:

- EXTEND: request i's new tokens (positions prefix_i .. seq_i - 1) attend causally to all of
  its seq_i tokens. One `scaled_dot_product_attention` per request (lengths differ).
- DECODE: one new token per request, attending to all of its seq_i tokens; vectorised over
  the batch by padding the histories to the longest one and masking.

Kernels are checked against this backend, so it favours clarity over speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixgen.runtime.attention.base import AttentionBackend
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from radixgen.runtime.model_runner import ModelRunner


@dataclass
class _ExtendMetadata:
    forward_batch: ForwardBatch  # the batch this was computed for
    slots: list[torch.Tensor]  # per request: [seq_len] int64, the KV slots of its history
    masks: list[torch.Tensor]  # per request: [extend_len, seq_len] bool, True = attend


@dataclass
class _DecodeMetadata:
    forward_batch: ForwardBatch
    slots: torch.Tensor  # [batch, max_seq_len] int64 (padding rows point at valid slots)
    mask: torch.Tensor  # [batch, 1, 1, max_seq_len] bool, True = attend


class TorchAttentionBackend(AttentionBackend):
    """Reference attention. `model_runner` is accepted for a uniform backend constructor."""

    def __init__(self, model_runner: ModelRunner | None = None):
        self.metadata: _ExtendMetadata | _DecodeMetadata | None = None

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Gathers the slot indices and masks shared by all layers of this batch."""
        req_to_token = forward_batch.req_to_token_pool.req_to_token
        device = req_to_token.device
        rows = forward_batch.req_pool_indices
        if forward_batch.mode == ForwardMode.DECODE:
            max_seq_len = max(forward_batch.seq_lens_cpu)
            slots = req_to_token[rows, :max_seq_len].long()  # [batch, max_seq_len]
            key_positions = torch.arange(max_seq_len, device=device)
            mask = key_positions[None, :] < forward_batch.seq_lens[:, None]
            self.metadata = _DecodeMetadata(forward_batch, slots=slots, mask=mask[:, None, None, :])
            return
        all_slots, masks = [], []
        for i, (prefix_len, seq_len) in enumerate(
            zip(forward_batch.prefix_lens_cpu, forward_batch.seq_lens_cpu, strict=True)
        ):
            all_slots.append(req_to_token[rows[i], :seq_len].long())
            query_positions = torch.arange(prefix_len, seq_len, device=device)
            key_positions = torch.arange(seq_len, device=device)
            masks.append(key_positions[None, :] <= query_positions[:, None])
        self.metadata = _ExtendMetadata(forward_batch, slots=all_slots, masks=masks)

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
        # Metadata of another batch would silently mix histories: recompute if stale.
        if self.metadata is None or self.metadata.forward_batch is not forward_batch:
            self.init_forward_metadata(forward_batch)
        pool = forward_batch.token_to_kv_pool
        if not kv_stored:
            pool.set_kv(layer_id, forward_batch.out_cache_loc, k, v)
        k_buffer, v_buffer = pool.get_kv_buffer(layer_id)
        k_scale, v_scale = pool.kv_scales(layer_id)
        group_size = q.shape[1] // k_buffer.shape[1]
        if isinstance(self.metadata, _DecodeMetadata):
            return self._decode(q, k_buffer, v_buffer, group_size, scaling, k_scale, v_scale)
        return self._extend(
            q, k_buffer, v_buffer, group_size, scaling, forward_batch, k_scale, v_scale
        )

    def _decode(self, q, k_buffer, v_buffer, group_size, scaling, k_scale, v_scale):
        metadata = self.metadata
        # [batch, num_kv_heads, max_seq_len, head_dim]
        keys = _dequantize(k_buffer[metadata.slots], k_scale, q.dtype).transpose(1, 2)
        values = _dequantize(v_buffer[metadata.slots], v_scale, q.dtype).transpose(1, 2)
        keys = keys.repeat_interleave(group_size, dim=1)  # [batch, num_heads, ...]
        values = values.repeat_interleave(group_size, dim=1)
        queries = q.unsqueeze(2)  # [batch, num_heads, 1, head_dim]
        output = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=metadata.mask, scale=scaling
        )
        return output.squeeze(2)  # [batch, num_heads, head_dim]

    def _extend(self, q, k_buffer, v_buffer, group_size, scaling, forward_batch, k_scale, v_scale):
        metadata = self.metadata
        outputs = []
        start = 0
        for slots, mask, extend_len in zip(
            metadata.slots, metadata.masks, forward_batch.extend_lens_cpu, strict=True
        ):
            queries = q[start : start + extend_len].transpose(0, 1)  # [heads, extend, dim]
            # [kv_heads, seq_len, dim]
            keys = _dequantize(k_buffer[slots], k_scale, q.dtype).transpose(0, 1)
            values = _dequantize(v_buffer[slots], v_scale, q.dtype).transpose(0, 1)
            keys = keys.repeat_interleave(group_size, dim=0)
            values = values.repeat_interleave(group_size, dim=0)
            output = F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=mask, scale=scaling
            )
            outputs.append(output.transpose(0, 1))  # [extend_len, num_heads, head_dim]
            start += extend_len
        return torch.cat(outputs, dim=0)


def _dequantize(stored: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """KV rows as stored (model dtype, or FP8 with a per-tensor scale) -> `dtype` values."""
    if scale == 1.0:
        return stored.to(dtype)
    return (stored.float() * scale).to(dtype)
