"""Token-level KV memory: the request-to-token table, the KV buffers and the slot allocator.

Every token of every request owns one KV *slot*: an index into per-layer K and V buffers.
A request's history is a row of `ReqToTokenPool.req_to_token` (position -> slot), so any
prefix length can be shared between requests by copying slot indices, never KV data.

Slot 0 is a padding dummy: it is never handed out, so padded entries (CUDA-graph padding,
masked positions) can point at it and write there harmlessly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class SlotAllocator:
    """Free list of KV slots kept in a device tensor; alloc and free are vectorised.

    Args:
        num_slots: slots in the KV buffers, including the padding slot 0.
        device: where the free list lives (the KV buffers' device).
    """

    def __init__(self, num_slots: int, device: torch.device | str = "cpu"):
        if num_slots < 2:
            raise ValueError(f"num_slots must be >= 2 (slot 0 is padding), got {num_slots}")
        self.num_slots = num_slots
        self.device = torch.device(device)
        self.clear()

    def clear(self) -> None:
        # [num_free] int64; slots 1..num_slots-1, slot 0 reserved for padding.
        self.free_slots = torch.arange(1, self.num_slots, dtype=torch.int64, device=self.device)

    @property
    def capacity(self) -> int:
        """Allocatable slots (all but the padding slot)."""
        return self.num_slots - 1

    def available_size(self) -> int:
        return int(self.free_slots.numel())

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Take `num_tokens` slots. Returns an int64 tensor, or None when too few are free."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if num_tokens > self.free_slots.numel():
            return None
        taken = self.free_slots[:num_tokens]
        self.free_slots = self.free_slots[num_tokens:]
        return taken

    def free(self, slots: torch.Tensor) -> None:
        """Give slots back. `slots` is any int tensor of slot indices (never slot 0)."""
        if slots.numel() == 0:
            return
        self.free_slots = torch.cat((self.free_slots, slots.to(self.device, torch.int64).flatten()))


class ReqToTokenPool:
    """Rows of `req_to_token[max_running_requests, max_context_len]` (int32 slot indices).

    A running request holds one row; position p of the request lives in slot
    `req_to_token[row, p]`.
    """

    def __init__(self, max_running_requests: int, max_context_len: int, device="cpu"):
        if max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        if max_context_len < 1:
            raise ValueError(f"max_context_len must be >= 1, got {max_context_len}")
        self.size = max_running_requests
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        # [max_running_requests, max_context_len] int32
        self.req_to_token = torch.zeros(
            (max_running_requests, max_context_len), dtype=torch.int32, device=self.device
        )
        self.free_rows: list[int] = list(range(max_running_requests))

    def available_size(self) -> int:
        return len(self.free_rows)

    def alloc(self, num_rows: int = 1) -> list[int] | None:
        """Take `num_rows` rows, or None when too few are free."""
        if num_rows > len(self.free_rows):
            return None
        rows, self.free_rows = self.free_rows[:num_rows], self.free_rows[num_rows:]
        return rows

    def free(self, rows: int | list[int]) -> None:
        rows = [rows] if isinstance(rows, int) else list(rows)
        self.free_rows.extend(rows)

    def clear(self) -> None:
        self.free_rows = list(range(self.size))


class TokenToKVPool:
    """Per-layer K and V buffers, each `[num_slots, num_kv_heads, head_dim]`.

    `kv_dtype` is the storage dtype; it may differ from the compute dtype later (fp8 KV):
    `store_dtype` is what the buffers hold and reads are cast back to `dtype` by callers.
    """

    def __init__(
        self,
        *,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device="cpu",
        kv_dtype: torch.dtype | None = None,
    ):
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.store_dtype = kv_dtype or dtype
        self.device = torch.device(device)
        shape = (num_slots, num_kv_heads, head_dim)
        # k_buffers[layer]: [num_slots, num_kv_heads, head_dim]
        self.k_buffers = [
            torch.zeros(shape, dtype=self.store_dtype, device=self.device)
            for _ in range(num_layers)
        ]
        self.v_buffers = [
            torch.zeros(shape, dtype=self.store_dtype, device=self.device)
            for _ in range(num_layers)
        ]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    def set_kv(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write new tokens' K/V. slots: [num_tokens]; k, v: [num_tokens, num_kv_heads, head_dim]."""
        if k.dtype != self.store_dtype:
            k, v = k.to(self.store_dtype), v.to(self.store_dtype)
        self.k_buffers[layer_id][slots] = k
        self.v_buffers[layer_id][slots] = v

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class KVBudget:
    """How many KV slots to allocate, from exactly one of three budgets."""

    num_tokens: int | None = None
    num_bytes: int | None = None
    fraction_of_free_memory: float | None = None

    def resolve(self, *, bytes_per_token: int, device) -> int:
        """Returns the number of token slots (including the padding slot)."""
        given = [
            x for x in (self.num_tokens, self.num_bytes, self.fraction_of_free_memory) if x
        ]
        if len(given) != 1:
            raise ValueError(
                "KVBudget needs exactly one of num_tokens, num_bytes, fraction_of_free_memory"
            )
        if self.num_tokens is not None:
            return int(self.num_tokens) + 1
        if self.num_bytes is not None:
            return max(2, int(self.num_bytes) // bytes_per_token)
        fraction = self.fraction_of_free_memory
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"fraction_of_free_memory must be in (0, 1), got {fraction}")
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError("fraction_of_free_memory needs a CUDA device; give num_tokens")
        free_bytes, _total = torch.cuda.mem_get_info(device)
        return max(2, int(free_bytes * fraction) // bytes_per_token)
