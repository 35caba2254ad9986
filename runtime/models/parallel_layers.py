"""Tensor-parallel pieces of the Llama family: how heads, features and the vocabulary split.

- Attention heads split evenly; KV heads too, unless there are fewer KV heads than ranks:
  then each rank keeps the one KV head its query heads read (KV heads are replicated).
- q/k/v and gate/up are column parallel (each rank computes its output features), o and down
  row parallel (each rank multiplies its input features; the partial sums are all-reduced).
- The embedding and the LM head split the vocabulary in contiguous parts (the last may be
  short); lookups outside a rank's part read zeros and are all-reduced, logits all-gathered.

At tp_size 1 every piece computes exactly what the single-device model computed before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.runtime.distributed import TensorParallel
from radixgen.runtime.models.linear import CheckpointSlice


def kv_head_partition(num_kv_heads: int, parallel: TensorParallel) -> tuple[int, int]:
    """(first KV head, number of KV heads) of this rank.

    Raises:
        ValueError: the KV heads neither divide among nor evenly replicate over the ranks.
    """
    if num_kv_heads >= parallel.size:
        return parallel.split(num_kv_heads, "num_key_value_heads")
    if parallel.size % num_kv_heads:
        raise ValueError(
            f"tp_size ({parallel.size}) must be a multiple of num_key_value_heads "
            f"({num_kv_heads}) when it exceeds it"
        )
    # Ranks [h * size / num_kv, (h + 1) * size / num_kv) hold query heads of KV head h.
    return parallel.rank * num_kv_heads // parallel.size, 1


def column_slice(
    parallel: TensorParallel, starts: tuple[int, ...], full_sizes: tuple[int, ...]
) -> CheckpointSlice | None:
    """Output rows `starts[i]...` of each checkpoint module (None without parallelism)."""
    if parallel.size == 1:
        return None
    return CheckpointSlice(dim=0, starts=starts, full_sizes=full_sizes)


def row_slice(parallel: TensorParallel, start: int, full_size: int) -> CheckpointSlice | None:
    """Input columns from `start` of a `full_size`-wide projection; rank 0 adds the bias."""
    if parallel.size == 1:
        return None
    return CheckpointSlice(
        dim=1, starts=(start,), full_sizes=(full_size,), keep_bias=parallel.is_leader
    )


class VocabParallelEmbedding(nn.Module):
    """An embedding (and, tied or not, an LM head) whose rows split over the ranks.

    Rank r holds rows `[r * part, min((r + 1) * part, vocab_size))`, part = ceil(vocab / size).
    Parameter name `weight`, as in `nn.Embedding`, so checkpoints load unchanged.
    """

    def __init__(self, vocab_size: int, hidden_size: int, parallel: TensorParallel):
        super().__init__()
        self.vocab_size = vocab_size
        self.parallel = parallel
        self.rows_per_rank = -(-vocab_size // parallel.size)
        self.vocab_start = parallel.rank * self.rows_per_rank
        self.num_local_rows = max(0, min(self.rows_per_rank, vocab_size - self.vocab_start))
        self.weight = nn.Parameter(torch.empty(self.num_local_rows, hidden_size))

    @classmethod
    def whole(cls, weight: torch.Tensor) -> VocabParallelEmbedding:
        """A one-device table over the whole vocabulary holding `weight: [vocab, hidden]`."""
        with torch.device("meta"):  # no placeholder of the table's size
            table = cls(weight.shape[0], weight.shape[1], TensorParallel())
        table.weight = nn.Parameter(weight, requires_grad=False)
        return table

    def gathered_weight(self) -> torch.Tensor:
        """The whole `[vocab_size, hidden]` table, on every rank: a collective, so every rank
        calls it at the same point (a draft head on rank 0 alone reads the whole vocabulary)."""
        if self.parallel.size == 1:
            return self.weight.data
        padding = self.rows_per_rank - self.num_local_rows  # the short last part
        local = F.pad(self.weight.data, (0, 0, 0, padding))  # [rows_per_rank, hidden]
        rows = self.parallel.all_gather(local.T.contiguous()).T  # [size * rows_per_rank, hidden]
        return rows[: self.vocab_size].contiguous()

    def shard_checkpoint(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the full `[vocab_size, hidden]` checkpoint tensor (a copy)."""
        if self.parallel.size == 1 or tensor.shape[0] != self.vocab_size:
            return tensor  # a wrong shape is reported by the loader's shape check
        return tensor.narrow(0, self.vocab_start, self.num_local_rows).clone()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [num_tokens] int64
        if self.parallel.size == 1:
            return F.embedding(input_ids, self.weight)  # [num_tokens, hidden]
        if self.num_local_rows == 0:  # a tiny vocabulary over many ranks: nothing held here
            embedded = input_ids.new_zeros(
                (*input_ids.shape, self.weight.shape[1]), dtype=self.weight.dtype
            )
            return self.parallel.all_reduce(embedded)
        local_ids = input_ids - self.vocab_start
        is_local = (local_ids >= 0) & (local_ids < self.num_local_rows)  # [num_tokens]
        # Ids of other ranks read row 0 and are zeroed: no data-dependent shapes (graphable).
        embedded = F.embedding(local_ids.masked_fill(~is_local, 0), self.weight)
        embedded = embedded.masked_fill(~is_local.unsqueeze(-1), 0.0)
        return self.parallel.all_reduce(embedded)  # [num_tokens, hidden]

    def logits(self, hidden_states: torch.Tensor) -> torch.Tensor:  # [n, hidden]
        """`hidden_states @ W.T` over the whole vocabulary: `[n, vocab_size]` on every rank."""
        local = F.linear(hidden_states, self.weight)  # [n, num_local_rows]
        if self.parallel.size == 1:
            return local
        padding = self.rows_per_rank - self.num_local_rows  # the short last part
        if padding:
            local = F.pad(local, (0, padding))
        return self.parallel.all_gather(local)[:, : self.vocab_size]  # [n, vocab_size]
