"""The one dataclass that carries a batch through the model: `ForwardBatch`."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
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

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
