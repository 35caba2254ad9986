"""`TritonAttentionBackend`: attention over the paged KV pool with the Triton kernels.

- EXTEND: `extend_attention` reads each request's cached prefix from the pool through
  `req_to_token` and its new tokens' K/V straight from the projections (no gather).
- DECODE: `decode_attention`, split-KV flash-decoding with a merge stage; or, when the batch
  carries `shared_prefixes` (tree attention), `tree_decode_attention`, which reads each shared
  prefix once for all the requests holding it.

`init_forward_metadata` computes, once per batch, what all layers share: the new tokens' start
offsets (extend) or the split count and the fp32 split workspaces (decode). Decode metadata
depends only on the batch size and no host value of the lengths, so the CUDA-graph runner can
build it before capture and keep it alive for replays. Tree metadata for a graph
(`make_graph_tree_metadata`) holds a `TreeDecodePlan` of fixed capacities; each replay copies the
batch's plan into it (`fill_graph_tree_plan`), or falls back to the plain graph if it does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.decode_attention import decode_attention, default_num_kv_splits
from radixgen.kernels.extend_attention import extend_attention
from radixgen.kernels.tree_decode_attention import tree_decode_attention
from radixgen.kernels.tree_decode_plan import (
    SharedSegment,
    TreeDecodePlan,
    TreeDecodeWorkspace,
    build_tree_decode_plan,
    default_members_per_item,
    graph_plan_capacity,
)
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
    # [batch * num_kv_heads] int32 zeros: the splits merge inside the split kernel (each
    # layer's call leaves them zero for the next; one batch's layers run one after another).
    merge_counters: torch.Tensor


@dataclass
class TritonTreeDecodeMetadata:
    forward_batch: ForwardBatch
    num_kv_splits: int
    plan: TreeDecodePlan  # device tables of the batch's shared prefixes
    workspace: TreeDecodeWorkspace  # fp32 partials (shared entries, suffix splits)
    # CUDA graphs: the grouping whose plan the static tables hold (refilled when it changes).
    filled_key: object = None


class TritonAttentionBackend(AttentionBackend):
    """Triton kernels for EXTEND and DECODE.

    Args:
        model_runner: gives the head counts and the device (`model_config`, `device`).
    """

    def __init__(self, model_runner: ModelRunner):
        config = model_runner.model_config
        self.num_heads = model_runner.num_local_heads  # this rank's heads under TP
        self.num_kv_heads = model_runner.num_local_kv_heads
        self.head_dim = config.head_dim
        self.device = model_runner.device
        self.metadata: (
            TritonExtendMetadata | TritonDecodeMetadata | TritonTreeDecodeMetadata | None
        ) = None
        # The last eager tree plan, reused while the grouping is unchanged (a running batch
        # keeps its rows and prefixes for many steps).
        self._cached_plan: tuple[object, TreeDecodePlan] | None = None
        self._graph_shared_partials: tuple[torch.Tensor, torch.Tensor] | None = None

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Precomputes the index tensors / workspaces shared by all layers of this batch."""
        self.metadata = self.make_metadata(forward_batch)

    def make_metadata(self, forward_batch: ForwardBatch):
        """The metadata of `forward_batch`, without installing it (the graph runner keeps one
        per captured batch size)."""
        batch = forward_batch.batch_size
        if forward_batch.mode == ForwardMode.DECODE and forward_batch.shared_prefixes is not None:
            return self._make_tree_metadata(forward_batch)
        if forward_batch.mode == ForwardMode.DECODE:
            num_kv_splits = default_num_kv_splits(batch, self.num_kv_heads, self.device)
            shape = (batch, self.num_heads, num_kv_splits, self.head_dim)
            return TritonDecodeMetadata(
                forward_batch=forward_batch,
                num_kv_splits=num_kv_splits,
                partial_out=torch.empty(shape, dtype=torch.float32, device=self.device),
                partial_lse=torch.empty(shape[:3], dtype=torch.float32, device=self.device),
                merge_counters=torch.zeros(
                    batch * self.num_kv_heads, dtype=torch.int32, device=self.device
                ),
            )
        extend_lens = forward_batch.extend_lens
        return TritonExtendMetadata(
            forward_batch=forward_batch,
            extend_start_loc=torch.cumsum(extend_lens, dim=0) - extend_lens,
            # The host copy avoids a sync; a batch built without it pays one.
            max_extend_len=max(forward_batch.extend_lens_cpu or [int(extend_lens.max())]),
        )

    def _plan_options(self) -> dict:
        return dict(group_size=self.num_heads // self.num_kv_heads, num_kv_heads=self.num_kv_heads)

    def _make_tree_metadata(self, forward_batch: ForwardBatch) -> TritonTreeDecodeMetadata:
        segments = forward_batch.shared_prefixes
        batch = forward_batch.batch_size
        key = (batch, segments)
        if self._cached_plan is not None and self._cached_plan[0] == key:
            plan = self._cached_plan[1]
        else:
            plan = build_tree_decode_plan(
                segments, batch_size=batch, device=self.device, **self._plan_options()
            )
            self._cached_plan = (key, plan)
        num_kv_splits = default_num_kv_splits(batch, self.num_kv_heads, self.device)
        workspace = TreeDecodeWorkspace.allocate(
            max_entries=plan.max_entries,
            batch_size=batch,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            num_kv_splits=num_kv_splits,
            device=self.device,
        )
        return TritonTreeDecodeMetadata(forward_batch, num_kv_splits, plan, workspace)

    def make_graph_tree_metadata(self, forward_batch: ForwardBatch) -> TritonTreeDecodeMetadata:
        """Tree metadata of fixed capacities for a CUDA graph of this batch size, with an empty
        plan (no sharing) until `fill_graph_tree_plan`. The shared partials of every batch size
        are views of one buffer (graphs replay one at a time); capture the largest first."""
        batch = forward_batch.batch_size
        max_items, max_entries = graph_plan_capacity(
            batch, num_kv_heads=self.num_kv_heads, device=self.device
        )
        if self._graph_shared_partials is None:
            self._graph_shared_partials = (
                torch.empty(
                    (max_entries, self.num_heads, self.head_dim),
                    dtype=torch.float32,
                    device=self.device,
                ),
                torch.empty((max_entries, self.num_heads), dtype=torch.float32, device=self.device),
            )
        shared_out, shared_lse = self._graph_shared_partials
        if shared_out.shape[0] < max_entries:
            raise RuntimeError("capture tree graphs largest batch first")
        num_kv_splits = default_num_kv_splits(batch, self.num_kv_heads, self.device)
        suffix_shape = (batch, self.num_heads, num_kv_splits, self.head_dim)
        workspace = TreeDecodeWorkspace(
            shared_out=shared_out[:max_entries],
            shared_lse=shared_lse[:max_entries],
            suffix_out=torch.empty(suffix_shape, dtype=torch.float32, device=self.device),
            suffix_lse=torch.empty(suffix_shape[:3], dtype=torch.float32, device=self.device),
            merge_counters=torch.zeros(
                batch * self.num_kv_heads, dtype=torch.int32, device=self.device
            ),
        )
        plan = TreeDecodePlan.empty(
            batch_size=batch,
            members_per_item=default_members_per_item(self.num_heads // self.num_kv_heads),
            max_items=max_items,
            max_entries=max_entries,
            device=self.device,
        )
        return TritonTreeDecodeMetadata(forward_batch, num_kv_splits, plan, workspace)

    def fill_graph_tree_plan(
        self, metadata: TritonTreeDecodeMetadata, segments: tuple[SharedSegment, ...]
    ) -> bool:
        """Copies the plan of `segments` into a graph's static plan; False if it does not fit
        (the caller replays the plain decode graph)."""
        if metadata.filled_key == segments:
            return True  # a running batch keeps its grouping for many steps
        static = metadata.plan
        plan = build_tree_decode_plan(
            segments,
            batch_size=static.batch_size,
            device=self.device,
            members_per_item=static.members_per_item,
            max_items=static.max_items,
            max_entries=static.max_entries,
            **self._plan_options(),
        )
        if plan is None:
            return False
        static.packed.copy_(plan.packed, non_blocking=True)
        metadata.filled_key = segments
        return True

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
        if isinstance(metadata, TritonTreeDecodeMetadata):
            return tree_decode_attention(
                q,
                k_buffer,
                v_buffer,
                req_to_token,
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                metadata.plan,
                scaling,
                num_kv_splits=metadata.num_kv_splits,
                workspace=metadata.workspace,
                k_scale=k_scale,
                v_scale=v_scale,
            )
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
                merge_counters=metadata.merge_counters,
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
            max_prefix_len=max(forward_batch.prefix_lens_cpu, default=None),
        )
