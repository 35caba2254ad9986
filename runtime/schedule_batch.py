"""`ScheduleBatch`: the requests of one forward, and how they become a `ForwardBatch`.

The running decode batch is one long-lived `ScheduleBatch`: finished and retracted requests
are filtered out, newly prefilled ones merged in; its `SamplingBatchInfo` follows. A request
that a jump-forward extended stays in it: its next forward computes the forced run as one
multi-token row among the one-token decode rows (the forward is then an extend forward).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixgen.runtime.attention.tree_grouping import decode_shared_prefixes
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode
from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.req import Req
from radixgen.runtime.sampling_batch_info import SamplingBatchInfo


@dataclass
class ScheduleBatch:
    mode: ForwardMode
    reqs: list[Req]
    # Decode batches keep theirs across steps; extend batches build one for the rows that
    # sample after the forward.
    sampling_info: SamplingBatchInfo | None = None
    # Mixed batches: running requests that decode one token inside this EXTEND forward
    # (after `reqs`), so long prefills do not stall them.
    mixed_decode_reqs: list[Req] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return len(self.reqs)

    @property
    def wants_all_logits(self) -> bool:
        return self.mode == ForwardMode.EXTEND and any(r.wants_input_logprobs for r in self.reqs)

    @property
    def forward_reqs(self) -> list[Req]:
        """Every request in the forward, in row order."""
        return self.reqs + self.mixed_decode_reqs

    def new_token_counts(self) -> list[int]:
        """Tokens each request of the forward computes, in row order: decode rows 1, or the
        forced run of a jump-forward; extend rows their chunk."""
        if self.mode == ForwardMode.DECODE:
            return [r.num_uncommitted for r in self.reqs]
        decode_counts = [r.num_uncommitted for r in self.mixed_decode_reqs]
        return [r.extend_input_len for r in self.reqs] + decode_counts

    def prepare_forward(self, kv: KVCacheManager, runner) -> ForwardBatch:
        """Allocates the new tokens' KV slots and packs the batch.

        Raises:
            RuntimeError: the slots cannot be allocated (the scheduler checks before).
        """
        counts = self.new_token_counts()
        out_cache_loc = kv.alloc_slots(sum(counts))
        if out_cache_loc is None:
            raise RuntimeError(
                f"out of KV slots for {sum(counts)} tokens; admission or retraction is wrong"
            )
        reqs = self.forward_reqs
        mode = self.mode
        if mode == ForwardMode.DECODE and sum(counts) > len(counts):
            mode = ForwardMode.EXTEND  # jump-forward runs: multi-token rows (no CUDA graph)
        if mode == ForwardMode.DECODE:
            # The one new token of a decoding request is its last output token.
            input_ids = [req.output_ids[-1:] for req in reqs]
        else:
            input_ids = [
                req.fill_slice(req.kv_committed_len, req.kv_committed_len + count)
                for req, count in zip(reqs, counts, strict=True)
            ]
        return runner.build_forward_batch(
            mode=mode,
            input_ids=input_ids,
            req_pool_indices=[r.req_pool_idx for r in reqs],
            prefix_lens=[r.kv_committed_len for r in reqs],
            out_cache_loc=out_cache_loc,
            return_all_logits=self.wants_all_logits,
            shared_prefixes=decode_shared_prefixes(runner, reqs, mode),
            lora_slots=[r.lora_slot for r in reqs],
        )

    def filter(self, keep: list[int]) -> None:
        """Keeps rows `keep` (indices into `reqs`)."""
        self.reqs = [self.reqs[i] for i in keep]
        if self.sampling_info is not None:
            self.sampling_info.filter(keep)

    def merge(self, other: ScheduleBatch) -> None:
        self.reqs.extend(other.reqs)
        if self.sampling_info is None:
            self.sampling_info = other.sampling_info
        elif other.sampling_info is not None:
            self.sampling_info.merge(other.sampling_info)


def last_token_rows(counts: list[int], device: torch.device) -> torch.Tensor:
    """Index of each request's last new token in the packed token axis: [batch] int64."""
    return torch.tensor(counts, dtype=torch.int64, device=device).cumsum(0) - 1
