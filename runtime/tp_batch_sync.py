"""Rank 0 leads, the other tensor-parallel ranks follow: one batch message per forward.

Only rank 0 schedules: it owns the radix tree and allocates request rows and KV slots. The
followers hold the same pools (their own heads' KV) at the same slot numbers, so each forward
they need the batch as rank 0 built it: a small host header (mode, lengths, flags), then one
int64 tensor over the device group with the token ids, positions, rows, lengths, the new
tokens' slots and the batch's `req_to_token` rows (the cached prefixes rank 0 matched). A
follower writes those rows into its own pool and runs the same forward; the collectives inside
the model pair up because every rank runs the same layers on the same shapes.

With LoRA, the header names each request's adapter slot and which adapter (name and load id)
rank 0's pool holds in each slot the batch uses; a follower puts the same adapters in the same
slots of its pool (`LoRAManager.mirror_slots`) and rebuilds the segments. Rank 0's adapter
loads and unloads travel on the same channel, between batches, as `AdapterChange`s.

A `None` header tells the followers to stop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixgen.kernels.lora import make_lora_segments
from radixgen.runtime.distributed import TensorParallel
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode
from radixgen.runtime.lora.manager import AdapterChange, LoRAManager

# The packed tensor's parts, in order (the req_to_token rows come last).
_PER_TOKEN = ("input_ids", "positions", "out_cache_loc")
_PER_REQUEST = ("req_pool_indices", "seq_lens", "prefix_lens", "extend_lens")


@dataclass(frozen=True)
class BatchHeader:
    """The host-side part of a `ForwardBatch` (everything that is not a device tensor)."""

    mode: ForwardMode
    num_tokens: int
    batch_size: int
    max_seq_len: int  # columns of req_to_token sent per request
    seq_lens_cpu: list[int]
    prefix_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    return_all_logits: bool
    shared_prefixes: tuple | None
    # LoRA: each request's slot (-1: base) and (slot, adapter name, load id) of the slots used.
    lora_request_slots: tuple[int, ...] | None = None
    lora_slot_adapters: tuple[tuple[int, str, int], ...] = ()

    @property
    def packed_size(self) -> int:
        return (
            len(_PER_TOKEN) * self.num_tokens
            + len(_PER_REQUEST) * self.batch_size
            + self.batch_size * self.max_seq_len
        )


def broadcast_forward_batch(
    parallel: TensorParallel, batch: ForwardBatch, lora_manager: LoRAManager | None = None
) -> None:
    """Rank 0: sends `batch` to the followers (before its own forward)."""
    segments = batch.lora_segments
    lora_slots, slot_adapters = None, ()
    if segments is not None:
        lora_slots = segments.request_slots
        slot_adapters = lora_manager.slot_adapters(segments.slots_present)
    header = BatchHeader(
        mode=batch.mode,
        num_tokens=batch.num_tokens,
        batch_size=batch.batch_size,
        max_seq_len=max(batch.seq_lens_cpu),
        seq_lens_cpu=batch.seq_lens_cpu,
        prefix_lens_cpu=batch.prefix_lens_cpu,
        extend_lens_cpu=batch.extend_lens_cpu,
        return_all_logits=batch.return_all_logits,
        shared_prefixes=batch.shared_prefixes,
        lora_request_slots=lora_slots,
        lora_slot_adapters=slot_adapters,
    )
    parallel.broadcast_object(header)
    # [batch, max_seq_len] slots of every request's tokens, prefix included
    rows = batch.req_to_token_pool.req_to_token[batch.req_pool_indices, : header.max_seq_len]
    parts = [getattr(batch, name).to(torch.int64) for name in _PER_TOKEN + _PER_REQUEST]
    packed = torch.cat([*parts, rows.reshape(-1).to(torch.int64)])  # [packed_size]
    parallel.broadcast_tensor(packed)


def announce_adapter_change(parallel: TensorParallel, change: AdapterChange) -> None:
    """Rank 0: a LoRA adapter was loaded or unloaded; the followers do the same."""
    parallel.broadcast_object(change)


def stop_followers(parallel: TensorParallel) -> None:
    """Rank 0: ends the followers' `receive_forward_batch` loop."""
    parallel.broadcast_object(None)


def receive_forward_batch(parallel: TensorParallel, runner) -> ForwardBatch | None:
    """A follower: the next batch of rank 0, over `runner`'s pools (None: stop).

    Writes the batch's `req_to_token` rows into the runner's pool, as rank 0's are, and
    repeats the adapter loads and unloads announced before it.
    """
    header = parallel.broadcast_object()
    while isinstance(header, AdapterChange):
        runner.lora_manager.apply_change(header)
        header = parallel.broadcast_object()
    if header is None:
        return None
    packed = torch.empty(header.packed_size, dtype=torch.int64, device=runner.device)
    parallel.broadcast_tensor(packed)
    sizes = [header.num_tokens] * len(_PER_TOKEN) + [header.batch_size] * len(_PER_REQUEST)
    sizes.append(header.batch_size * header.max_seq_len)
    *parts, rows = packed.split(sizes)
    fields = dict(zip(_PER_TOKEN + _PER_REQUEST, parts, strict=True))
    pool = runner.req_to_token_pool
    pool.req_to_token[fields["req_pool_indices"], : header.max_seq_len] = rows.reshape(
        header.batch_size, header.max_seq_len
    ).to(pool.req_to_token.dtype)
    lora_segments = None
    if header.lora_request_slots is not None:
        runner.lora_manager.mirror_slots(header.lora_slot_adapters)
        lora_segments = make_lora_segments(
            list(header.lora_request_slots),
            header.extend_lens_cpu,
            runner.device,
            merge_requests=header.mode == ForwardMode.EXTEND,  # as build_forward_batch does
        )
    return ForwardBatch(
        mode=header.mode,
        req_to_token_pool=pool,
        token_to_kv_pool=runner.token_to_kv_pool,
        attn_backend=runner.attn_backend,
        seq_lens_cpu=header.seq_lens_cpu,
        prefix_lens_cpu=header.prefix_lens_cpu,
        extend_lens_cpu=header.extend_lens_cpu,
        return_all_logits=header.return_all_logits,
        shared_prefixes=header.shared_prefixes,
        lora_segments=lora_segments,
        **fields,
    )
