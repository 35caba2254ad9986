"""The one dataclass that carries a batch through the model, `ForwardBatch`, and its builder.

`build_forward_batch` turns per-request lists (token ids, request rows, prefix lengths) plus
the new tokens' KV slots into a `ForwardBatch`, and records those slots in the requests'
`req_to_token` rows, so the attention backend can read every request's history.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.host_copy import ALIGN_BYTES, host_parts_to_device
from radixgen.kernels.lora import LoRASegments, make_lora_segments

if TYPE_CHECKING:
    from radixgen.kernels.tree_decode_plan import SharedSegment
    from radixgen.radix_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixgen.runtime.attention.base import AttentionBackend


class ForwardMode(enum.Enum):
    # New tokens of each request attend causally to themselves and to their cached prefix
    # (prefill, chunked prefill, jump-forward appends). Any number of tokens per request.
    EXTEND = "extend"
    # Exactly one new token per request.
    DECODE = "decode"


@dataclass
class ForwardBatch:
    """Inputs of one model forward over a batch of requests.

    Tokens of all requests are packed along one axis: request i owns
    `extend_lens[i]` consecutive tokens (1 in DECODE mode).
    """

    mode: ForwardMode
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64, position of each token in its request
    req_pool_indices: torch.Tensor  # [batch] int64, each request's row of req_to_token
    seq_lens: torch.Tensor  # [batch] int64, prefix + new tokens, after this forward
    prefix_lens: torch.Tensor  # [batch] int64, tokens already in the KV cache
    extend_lens: torch.Tensor  # [batch] int64, new tokens this forward (all 1 in DECODE)
    out_cache_loc: torch.Tensor  # [num_tokens] int64, KV slot of each new token
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: TokenToKVPool
    attn_backend: AttentionBackend
    # Host copies, so that planning never syncs with the device.
    seq_lens_cpu: list[int] = field(default_factory=list)
    prefix_lens_cpu: list[int] = field(default_factory=list)
    extend_lens_cpu: list[int] = field(default_factory=list)
    # If True the model returns logits for every token ([num_tokens, vocab]; prompt logprobs
    # and select() need them); otherwise only for the last token of each request ([batch, vocab]).
    return_all_logits: bool = False
    # DECODE with tree attention: the cached prefixes that several rows share (members are row
    # indices; runtime/attention/tree_grouping.py). None: plain decode attention.
    shared_prefixes: tuple[SharedSegment, ...] | None = None
    # Each token's LoRA adapter slot, as segments (kernels/lora.py); None: no request of the
    # batch uses an adapter.
    lora_segments: LoRASegments | None = None

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def last_token_indices(self) -> torch.Tensor:  # [batch] int64
        """Index of each request's last new token in the packed token axis."""
        return torch.cumsum(self.extend_lens, dim=0) - 1


def build_forward_batch(
    *,
    mode: ForwardMode,
    input_ids: Sequence[Sequence[int]] | torch.Tensor,
    req_pool_indices: Sequence[int],
    prefix_lens: Sequence[int],
    out_cache_loc: torch.Tensor,
    req_to_token_pool: ReqToTokenPool,
    token_to_kv_pool: TokenToKVPool,
    attn_backend: AttentionBackend,
    return_all_logits: bool = False,
    shared_prefixes: tuple[SharedSegment, ...] | None = None,
    lora_slots: Sequence[int] | None = None,
) -> ForwardBatch:
    """Packs a batch and writes its new tokens' slots into `req_to_token`.

    Request i brings the new tokens `input_ids[i]`, at positions `prefix_lens[i]` onwards,
    in row `req_pool_indices[i]`; its first `prefix_lens[i]` positions must already be
    filled in that row (a cached prefix). After this call, `req_to_token[row, prefix:seq]`
    holds the request's slice of `out_cache_loc`.

    Args:
        mode: EXTEND (any number >= 1 of new tokens per request) or DECODE (exactly 1).
        input_ids: the new token ids of each request; in DECODE mode also a `[batch]` int64
            tensor on the device (the previous step's sampled ids, never copied to the host).
        req_pool_indices: each request's row in `req_to_token_pool`.
        prefix_lens: tokens of each request already in the KV cache.
        out_cache_loc: [sum of new tokens] KV slots of the new tokens, request by request.
        req_to_token_pool, token_to_kv_pool, attn_backend: the runner's pools and backend.
        return_all_logits: return logits for every token instead of each request's last.
        shared_prefixes: DECODE only: the shared cached prefixes, for tree attention.
        lora_slots: each request's LoRA adapter pool slot (-1: the base model), or None.

    Raises:
        ValueError: mismatched lengths, a request without new tokens, a DECODE request with
            more than one, or a sequence longer than the pool's context length.
    """
    if not isinstance(mode, ForwardMode):
        raise TypeError(f"mode must be a ForwardMode, got {mode!r}")
    ids_on_device = isinstance(input_ids, torch.Tensor)
    if ids_on_device and (mode != ForwardMode.DECODE or input_ids.ndim != 1):
        raise ValueError("input_ids as a tensor must be 1-D, in DECODE mode")
    batch_size = len(input_ids)
    if batch_size == 0:
        raise ValueError("input_ids must hold at least one request")
    if len(req_pool_indices) != batch_size or len(prefix_lens) != batch_size:
        raise ValueError(
            f"input_ids ({batch_size}), req_pool_indices ({len(req_pool_indices)}) and "
            f"prefix_lens ({len(prefix_lens)}) must have one entry per request"
        )
    extend_lens_cpu = [1] * batch_size if ids_on_device else [len(ids) for ids in input_ids]
    prefix_lens_cpu = [int(n) for n in prefix_lens]
    seq_lens_cpu = [p + e for p, e in zip(prefix_lens_cpu, extend_lens_cpu, strict=True)]
    if min(extend_lens_cpu) < 1:
        raise ValueError("input_ids: every request needs at least one new token")
    if mode == ForwardMode.DECODE and max(extend_lens_cpu) != 1:
        raise ValueError("input_ids: DECODE takes exactly one new token per request")
    if shared_prefixes is not None and mode != ForwardMode.DECODE:
        raise ValueError("shared_prefixes are for DECODE batches only")
    if min(prefix_lens_cpu) < 0:
        raise ValueError(f"prefix_lens must be >= 0, got {prefix_lens_cpu}")
    if max(seq_lens_cpu) > req_to_token_pool.max_context_len:
        raise ValueError(
            f"a sequence of {max(seq_lens_cpu)} tokens exceeds the context length "
            f"{req_to_token_pool.max_context_len}"
        )
    num_tokens = sum(extend_lens_cpu)
    if out_cache_loc.ndim != 1 or out_cache_loc.numel() != num_tokens:
        raise ValueError(
            f"out_cache_loc must be a 1-D tensor of {num_tokens} slots, "
            f"got shape {tuple(out_cache_loc.shape)}"
        )
    if not 0 <= min(req_pool_indices) <= max(req_pool_indices) < req_to_token_pool.size:
        raise ValueError(f"req_pool_indices must be rows in [0, {req_to_token_pool.size})")

    device = req_to_token_pool.device
    # One host-to-device copy for all host lists: ids, then rows, prefix and extend lengths.
    # chain.from_iterable flattens in C: no Python-level loop per prompt token.
    # The sequence lengths too: the host has them, and copying them is cheaper than a device add.
    parts = [] if ids_on_device else [list(itertools.chain.from_iterable(input_ids))]
    parts += [[int(row) for row in req_pool_indices], prefix_lens_cpu, extend_lens_cpu]
    parts.append(seq_lens_cpu)
    packed_parts = host_parts_to_device(parts, device)
    if ids_on_device:
        input_ids_tensor = input_ids.to(device=device, dtype=torch.int64)
        rows, prefix_lens_tensor, extend_lens_tensor, seq_lens_tensor = packed_parts
    else:
        input_ids_tensor, rows, prefix_lens_tensor, extend_lens_tensor, seq_lens_tensor = (
            packed_parts
        )
    out_cache_loc = out_cache_loc.to(device=device, dtype=torch.int64)
    if out_cache_loc.data_ptr() % ALIGN_BYTES:  # a view into the allocator's free list
        out_cache_loc = out_cache_loc.clone()

    if mode == ForwardMode.DECODE:
        # One token a request, at its prefix length: none of extend's packing (5 device ops;
        # the build took 233-286 us on the 2-core CPU machine at batch 1, 133-139 without them;
        # the H200's batch-1 `bench latency` step did not move, 4.94 -> 5.08 ms, within noise).
        positions = prefix_lens_tensor  # [batch]
        token_rows = rows
    else:
        # Vectorised over tokens: each token's request, then its position inside the request.
        token_request = torch.repeat_interleave(
            torch.arange(batch_size, device=device), extend_lens_tensor, output_size=num_tokens
        )  # [num_tokens]
        request_starts = torch.cumsum(extend_lens_tensor, dim=0) - extend_lens_tensor  # [batch]
        positions = (
            torch.arange(num_tokens, device=device)
            - request_starts[token_request]
            + prefix_lens_tensor[token_request]
        )  # [num_tokens]
        token_rows = rows[token_request]
    req_to_token_pool.req_to_token[token_rows, positions] = out_cache_loc.to(torch.int32)
    lora_segments = None
    if lora_slots is not None and max(lora_slots) >= 0:
        if len(lora_slots) != batch_size:
            raise ValueError(f"lora_slots needs one entry per request ({batch_size})")
        lora_segments = make_lora_segments(
            [int(slot) for slot in lora_slots],
            extend_lens_cpu,
            device,
            merge_requests=mode == ForwardMode.EXTEND,  # decode: one row each (CUDA graphs)
        )
    return ForwardBatch(
        mode=mode,
        input_ids=input_ids_tensor,
        positions=positions,
        req_pool_indices=rows,
        seq_lens=seq_lens_tensor,
        prefix_lens=prefix_lens_tensor,
        extend_lens=extend_lens_tensor,
        out_cache_loc=out_cache_loc,
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool=token_to_kv_pool,
        attn_backend=attn_backend,
        seq_lens_cpu=seq_lens_cpu,
        prefix_lens_cpu=prefix_lens_cpu,
        extend_lens_cpu=extend_lens_cpu,
        return_all_logits=return_all_logits,
        shared_prefixes=shared_prefixes,
        lora_segments=lora_segments,
    )
