"""Small-message all-reduce over CUDA peer memory, for tensor parallelism within one node.

At batch 1 a decoder layer all-reduces two [1, hidden] activations (8 KiB in bf16 for an 8B
model): latency, not bandwidth, which is what vLLM and SGLang replace NCCL's ring for (not yet
measured here: no 2-GPU machine). Below a size threshold the ranks sum through one buffer that every
rank can read directly (torch's symmetric memory: allocated once per rank, its peers' copies
mapped over NVLink P2P by a rendezvous at start-up), as vLLM's and SGLang's custom all-reduces
do:

- one-shot (messages up to ONE_SHOT_MAX_BYTES): every rank copies its tensor into its buffer,
  then reads all ranks' buffers and sums them itself: one kernel, one synchronisation;
- two-shot (up to the communicator's `max_bytes`): each rank sums one slice of all buffers, then
  gathers the others' sums (reduce-scatter + all-gather through peer memory);
- NCCL above that, and for dtypes or sizes the kernels do not take.

Multicast (NVLink SHARP) is never used: the lent machines expose multicast objects that cannot be
created (runtime/distributed.py turns it off), and two-shot and one-shot need only P2P. The ops
are torch's (`torch.ops.symm_mem`); they synchronise through signal pads in the symmetric
allocation, so they capture into CUDA graphs like the NCCL call they replace. `--disable-custom-
all-reduce` (SGLang's flag) keeps NCCL for everything.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

ONE_SHOT_MAX_BYTES = 256 << 10  # one-shot below this (latency), two-shot above (bandwidth)
DEFAULT_MAX_BYTES = 8 << 20  # NCCL above this; a decode batch of 256 x 4096 bf16 is 2 MiB
ALIGNMENT_BYTES = 16  # the peer-memory kernels move 16-byte vectors
PEER_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def choose_all_reduce(num_bytes: int, dtype: torch.dtype, max_bytes: int) -> str:
    """Which all-reduce a message of `num_bytes` takes: "one_shot", "two_shot" or "nccl".
    Two-shot splits the message into a slice per rank (up to 8), each a whole number of
    16-byte vectors."""
    if dtype not in PEER_DTYPES or num_bytes % ALIGNMENT_BYTES or num_bytes > max_bytes:
        return "nccl"
    if num_bytes <= ONE_SHOT_MAX_BYTES:
        return "one_shot"
    return "nccl" if num_bytes % (8 * ALIGNMENT_BYTES) else "two_shot"


class PeerMemoryAllReduce:
    """Sums small tensors over the ranks of `group` (all on this node) through symmetric memory.

    Args:
        group: the NCCL process group of the tensor-parallel ranks.
        device: this rank's GPU.
        max_bytes: the largest message it takes (NCCL above).

    Construction is collective (every rank of `group` must build one) and raises RuntimeError
    where the GPUs or torch cannot map peer memory; `create_peer_all_reduce` turns that into
    NCCL-only on every rank.
    """

    def __init__(self, group, device: torch.device, max_bytes: int = DEFAULT_MAX_BYTES):
        import torch.distributed._symmetric_memory as symm_mem

        self.group_name = group.group_name
        self.max_bytes = max_bytes
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed before rendezvous <= 2.8
            symm_mem.enable_symm_mem_for_group(self.group_name)
        # One buffer of bytes, viewed as each message's dtype: [max_bytes] uint8.
        self.buffer = symm_mem.empty(max_bytes, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(self.buffer, self.group_name)
        ops = torch.ops.symm_mem
        # The `_out` form writes the sum straight into the caller's tensor (torch >= 2.7).
        self._one_shot_out = getattr(ops, "one_shot_all_reduce_out", None)
        self._one_shot, self._two_shot = ops.one_shot_all_reduce, ops.two_shot_all_reduce_

    def takes(self, tensor: torch.Tensor) -> bool:
        num_bytes = tensor.numel() * tensor.element_size()
        path = choose_all_reduce(num_bytes, tensor.dtype, self.max_bytes)
        return path != "nccl" and tensor.is_cuda and tensor.is_contiguous()

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks into `tensor` (in place; `takes(tensor)` must hold)."""
        num_bytes = tensor.numel() * tensor.element_size()
        flat = tensor.view(-1)
        staged = self.buffer[:num_bytes].view(tensor.dtype)  # [numel] in symmetric memory
        staged.copy_(flat)
        if choose_all_reduce(num_bytes, tensor.dtype, self.max_bytes) == "two_shot":
            self._two_shot(staged, "sum", self.group_name)  # in place, in the buffer
            flat.copy_(staged)
        elif self._one_shot_out is not None:
            self._one_shot_out(staged, "sum", self.group_name, flat)
        else:
            flat.copy_(self._one_shot(staged, "sum", self.group_name))
        return tensor


def create_peer_all_reduce(
    group, cpu_group, device: torch.device, max_bytes: int = DEFAULT_MAX_BYTES
) -> PeerMemoryAllReduce | None:
    """A `PeerMemoryAllReduce` on every rank, or None on every rank (NCCL only) if any rank
    could not build one (the ranks agree over the gloo group, so none waits in a peer-memory
    op that another rank skips)."""
    communicator, error = None, None
    try:
        communicator = PeerMemoryAllReduce(group, device, max_bytes)
    except (RuntimeError, AttributeError, ImportError) as caught:
        error = caught
    built = torch.tensor([0 if communicator is None else 1], dtype=torch.int32)
    dist.all_reduce(built, op=dist.ReduceOp.MIN, group=cpu_group)
    if int(built.item()) == 1:
        return communicator
    if error is not None:
        logger.warning("custom all-reduce off (NCCL for every message): %s", error)
    else:
        logger.warning("custom all-reduce off: a peer rank could not map peer memory")
    return None
