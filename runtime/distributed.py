"""Tensor-parallel process groups over torch.distributed: gloo on CPU, NCCL on CUDA.

No global state of ours: `init_tensor_parallel` returns a `TensorParallel` context that the
model and the runner receive explicitly; its collectives are no-ops at `size == 1`, so the
single-device path runs exactly the code it ran before tensor parallelism existed.
(torch.distributed keeps its default group process-wide; every call here names the group.)

Every group gets a `timeout`: a peer that died makes the survivors' next collective raise
instead of hanging, and the launcher (which watches every rank's process) stops the server.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from radixgen.runtime.nccl_env import disable_nvlink_multicast
from radixgen.runtime.peer_all_reduce import create_peer_all_reduce

# Seconds a collective waits for a peer before it raises (start-up included: loading an 8B
# checkpoint on every rank takes well under this).
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in its tensor-parallel group.

    Attributes:
        rank: 0 .. size-1; rank 0 schedules, the others follow its batches.
        size: ranks sharing each layer.
        group: the process group of the collectives (None when size == 1).
        cpu_group: a gloo group for host objects (batch metadata); the same as `group` on CPU.
        local_rank: the rank's GPU index on its node.
        peer_all_reduce: the small-message all-reduce over CUDA peer memory
            (runtime/peer_all_reduce.py), or None: NCCL (gloo on CPU) for every message.
    """

    rank: int = 0
    size: int = 1
    group: Any = None
    cpu_group: Any = None
    local_rank: int = 0
    peer_all_reduce: Any = None

    def __post_init__(self):
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"tensor parallel rank {self.rank} outside [0, size={self.size})")
        if self.size > 1 and self.group is None:
            raise ValueError("a tensor-parallel context of size > 1 needs a process group")

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def split(self, total: int, what: str) -> tuple[int, int]:
        """(start, size) of this rank's equal part of `total` items.

        Raises:
            ValueError: `total` is not a multiple of the group size (naming `what`).
        """
        if total % self.size:
            raise ValueError(f"{what} ({total}) must be a multiple of tp_size ({self.size})")
        part = total // self.size
        return self.rank * part, part

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place; returns `tensor`. Small CUDA messages go through
        peer memory when the group has it, the rest through the process group."""
        if self.size == 1:
            return tensor
        if self.peer_all_reduce is not None and self.peer_all_reduce.takes(tensor):
            return self.peer_all_reduce.all_reduce_(tensor)
        dist.all_reduce(tensor, group=self.group)
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenates every rank's `tensor: [..., n]` along the last dim: `[..., size * n]`."""
        if self.size == 1:
            return tensor
        tensor = tensor.contiguous()
        if tensor.is_cuda:  # one buffer, graph-capturable: [size, ...] then moved last
            gathered = torch.empty(
                (self.size, *tensor.shape), dtype=tensor.dtype, device=tensor.device
            )
            dist.all_gather_into_tensor(gathered, tensor, group=self.group)
            return torch.cat(gathered.unbind(0), dim=-1)
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(parts, tensor, group=self.group)
        return torch.cat(parts, dim=-1)

    def broadcast_object(self, value: object = None) -> object:
        """Rank 0's `value` on every rank (pickled over the gloo group)."""
        if self.size == 1:
            return value
        holder = [value if self.is_leader else None]
        dist.broadcast_object_list(holder, group=self.cpu_group, group_src=0)
        return holder[0]

    def broadcast_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's `tensor` into every rank's `tensor` (same shape and dtype), in place."""
        if self.size > 1:
            dist.broadcast(tensor, group=self.group, group_src=0)
        return tensor


def init_tensor_parallel(
    *,
    rank: int,
    size: int,
    init_method: str,
    device: torch.device,
    local_rank: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    peer_all_reduce: bool = False,
) -> TensorParallel:
    """Joins the process group of `size` ranks at `init_method` (e.g. "tcp://127.0.0.1:29500").

    `local_rank` (default: `rank`) is the GPU this rank uses on its node. `peer_all_reduce`
    (CUDA, every rank on this node): small messages sum through peer memory
    (runtime/peer_all_reduce.py), else NCCL.

    NCCL on CUDA (plus a gloo group for host objects), gloo on CPU. At `size == 1` no group is
    created and the collectives do nothing.

    Raises:
        ValueError: a rank outside [0, size).
        RuntimeError / DistBackendError: a peer that never joined within `timeout_s`.
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size}), got {rank}")
    if size == 1:
        return TensorParallel()
    local_rank = rank if local_rank is None else local_rank
    timeout = datetime.timedelta(seconds=timeout_s)
    if device.type == "cuda":
        disable_nvlink_multicast()
        torch.cuda.set_device(local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend=backend, init_method=init_method, rank=rank, world_size=size, timeout=timeout
    )
    group = dist.new_group(list(range(size)), backend=backend, timeout=timeout)
    cpu_group = group
    if backend != "gloo":
        cpu_group = dist.new_group(list(range(size)), backend="gloo", timeout=timeout)
    peer = None
    if peer_all_reduce and device.type == "cuda":
        peer = create_peer_all_reduce(group, cpu_group, torch.device("cuda", local_rank))
    return TensorParallel(
        rank=rank,
        size=size,
        group=group,
        cpu_group=cpu_group,
        local_rank=local_rank,
        peer_all_reduce=peer,
    )


def destroy_tensor_parallel(parallel: TensorParallel) -> None:
    """Leaves the process groups (a no-op at size 1)."""
    if parallel.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
