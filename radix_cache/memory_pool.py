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


def _require_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class SlotAllocator:
    """Free list of KV slots kept in a device tensor; alloc and free are vectorised.

    Freed slots are queued and merged into the free list only when an allocation needs
    them, so `free` costs O(1) instead of copying the whole free list (which is up to
    millions of slots) on every finished request.

    Args:
        num_slots: slots in the KV buffers, including the padding slot 0.
        device: where the free list lives (the KV buffers' device).
    """

    def __init__(self, num_slots: int, device: torch.device | str = "cpu"):
        if not isinstance(num_slots, int) or num_slots < 2:
            raise ValueError(f"num_slots must be an int >= 2 (slot 0 is padding), got {num_slots}")
        self.num_slots = num_slots
        self.device = torch.device(device)
        self.clear()

    def clear(self) -> None:
        """Make every slot but the padding slot free again."""
        # [num_free] int64; slots 1..num_slots-1, slot 0 reserved for padding.
        self.free_slots = torch.arange(1, self.num_slots, dtype=torch.int64, device=self.device)
        # Freed but not yet merged into `free_slots`; each a 1-D int64 tensor.
        self._released: list[torch.Tensor] = []
        self._num_released = 0

    @property
    def capacity(self) -> int:
        """Allocatable slots (all but the padding slot)."""
        return self.num_slots - 1

    def available_size(self) -> int:
        """Slots that `alloc` can hand out now (host-side count, no device sync)."""
        return int(self.free_slots.numel()) + self._num_released

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Take `num_tokens` slots.

        Returns:
            A 1-D int64 tensor of distinct slot indices on `device`, or None (and nothing
            taken) when fewer than `num_tokens` are free.
        Raises:
            ValueError: `num_tokens` is negative.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if num_tokens > self.free_slots.numel():
            if num_tokens > self.available_size():
                return None
            self._merge_released()
        taken = self.free_slots[:num_tokens]
        self.free_slots = self.free_slots[num_tokens:]
        return taken

    def free(self, slots: torch.Tensor) -> None:
        """Give slots back. `slots` is any int tensor of allocated slot indices (never 0).

        Raises:
            TypeError: `slots` is not an integer tensor.
        """
        if not isinstance(slots, torch.Tensor) or slots.is_floating_point() or slots.is_complex():
            raise TypeError(f"slots must be an integer torch.Tensor, got {type(slots).__name__}")
        if slots.numel() == 0:
            return
        # Copy: the caller's tensor may be a view of req_to_token that is overwritten later.
        flat = slots.to(self.device, torch.int64, copy=True).flatten()
        self._released.append(flat)
        self._num_released += int(flat.numel())

    def free_slot_indices(self) -> torch.Tensor:
        """Every free slot, [available_size()] int64 (for integrity checks, not hot paths)."""
        if self._released:
            self._merge_released()
        return self.free_slots

    def _merge_released(self) -> None:
        self.free_slots = torch.cat([self.free_slots, *self._released])
        self._released = []
        self._num_released = 0


class ReqToTokenPool:
    """Rows of `req_to_token[max_running_requests, max_context_len]` (int32 slot indices).

    A running request holds one row; position p of the request lives in slot
    `req_to_token[row, p]`.
    """

    def __init__(self, max_running_requests: int, max_context_len: int, device="cpu"):
        _require_positive("max_running_requests", max_running_requests)
        _require_positive("max_context_len", max_context_len)
        self.size = max_running_requests
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        # [max_running_requests, max_context_len] int32
        self.req_to_token = torch.zeros(
            (max_running_requests, max_context_len), dtype=torch.int32, device=self.device
        )
        self.clear()

    def available_size(self) -> int:
        return len(self.free_rows)

    def alloc(self, num_rows: int = 1) -> list[int] | None:
        """Take `num_rows` rows, or None (and nothing taken) when too few are free."""
        if num_rows < 0:
            raise ValueError(f"num_rows must be >= 0, got {num_rows}")
        if num_rows > len(self.free_rows):
            return None
        rows, self.free_rows = self.free_rows[:num_rows], self.free_rows[num_rows:]
        self._rows_in_use.update(rows)
        return rows

    def free(self, rows: int | list[int]) -> None:
        """Give rows back.

        Raises:
            ValueError: a row is out of range or not currently allocated (double free).
        """
        rows = [rows] if isinstance(rows, int) else list(rows)
        for row in rows:
            if row not in self._rows_in_use:
                raise ValueError(f"rows: row {row} is not allocated (out of range or freed twice)")
        self._rows_in_use.difference_update(rows)
        self.free_rows.extend(rows)

    def clear(self) -> None:
        self.free_rows: list[int] = list(range(self.size))
        self._rows_in_use: set[int] = set()


FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


class TokenToKVPool:
    """Per-layer K and V buffers, each `[num_slots, num_kv_heads, head_dim]`.

    `dtype` is the compute dtype of the model; `kv_dtype` (default: `dtype`) the storage
    dtype, kept as `store_dtype`. `set_kv` casts on write. An FP8 store (e4m3 or e5m2) keeps
    `value / scale` with one scale per layer for K and one for V (`kv_scales`, default 1.0,
    as vLLM and SGLang do without checkpoint scales), clamped to the format's range so an
    outlier saturates instead of becoming NaN; readers dequantize with `kv_scales(layer)`.
    FP8 writes go through a uint8 view (index_put has no fp8 kernels on some builds).
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
        kv_scales: list[tuple[float, float]] | None = None,
    ):
        for name, value in (
            ("num_slots", num_slots),
            ("num_layers", num_layers),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            _require_positive(name, value)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.store_dtype = kv_dtype or dtype
        self.is_fp8 = self.store_dtype in FP8_KV_DTYPES
        if kv_scales is None:
            kv_scales = [(1.0, 1.0)] * num_layers
        if len(kv_scales) != num_layers or not all(k > 0 and v > 0 for k, v in kv_scales):
            raise ValueError(
                f"kv_scales must be {num_layers} pairs of positive (k_scale, v_scale), "
                f"got {kv_scales!r}"
            )
        self._kv_scales = [(float(k), float(v)) for k, v in kv_scales]
        if not self.is_fp8 and any(scales != (1.0, 1.0) for scales in self._kv_scales):
            raise ValueError(f"kv_scales apply to an FP8 store only, not {self.store_dtype}")
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

    def kv_scales(self, layer_id: int) -> tuple[float, float]:
        """(k_scale, v_scale) of one layer: stored value * scale = K/V (1.0 unless FP8)."""
        return self._kv_scales[layer_id]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (k, v) of one layer, each `[num_slots, num_kv_heads, head_dim]`."""
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    def set_kv(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write new tokens' K/V. slots: [num_tokens]; k, v: [num_tokens, num_kv_heads, head_dim]."""
        if self.is_fp8:
            k_scale, v_scale = self._kv_scales[layer_id]
            self.k_buffers[layer_id].view(torch.uint8)[slots] = self._to_fp8(k, k_scale)
            self.v_buffers[layer_id].view(torch.uint8)[slots] = self._to_fp8(v, v_scale)
            return
        if k.dtype != self.store_dtype:
            k, v = k.to(self.store_dtype), v.to(self.store_dtype)
        self.k_buffers[layer_id][slots] = k
        self.v_buffers[layer_id][slots] = v

    def _to_fp8(self, x: torch.Tensor, scale: float) -> torch.Tensor:  # -> uint8 view
        limit = torch.finfo(self.store_dtype).max
        # Scale 1.0 (the default): clamp in the model dtype, which holds both formats' maxima
        # exactly; two kernels per tensor instead of four.
        scaled = (
            x.clamp(-limit, limit) if scale == 1.0 else (x.float() / scale).clamp_(-limit, limit)
        )
        return scaled.to(self.store_dtype).view(torch.uint8)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype) -> int:
        """KV bytes of one token over all layers (K and V), stored as `dtype`."""
        return (
            2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
        )


@dataclass(frozen=True)
class KVBudget:
    """How many KV slots to allocate, from exactly one of three budgets."""

    num_tokens: int | None = None
    num_bytes: int | None = None
    fraction_of_free_memory: float | None = None

    def resolve(self, *, bytes_per_token: int, device) -> int:
        """Returns the number of token slots (including the padding slot).

        Raises:
            ValueError: not exactly one budget is given, or it is not positive, or a memory
                fraction is asked for on a device that cannot report its free memory.
        """
        given = {
            name: value
            for name, value in (
                ("num_tokens", self.num_tokens),
                ("num_bytes", self.num_bytes),
                ("fraction_of_free_memory", self.fraction_of_free_memory),
            )
            if value is not None
        }
        if len(given) != 1:
            raise ValueError(
                "KVBudget needs exactly one of num_tokens, num_bytes, fraction_of_free_memory; "
                f"got {sorted(given) or 'none'}"
            )
        _require_positive("bytes_per_token", bytes_per_token)
        if self.num_tokens is not None:
            _require_positive("num_tokens", self.num_tokens)
            return self.num_tokens + 1
        if self.num_bytes is not None:
            _require_positive("num_bytes", self.num_bytes)
            return max(2, self.num_bytes // bytes_per_token)
        fraction = self.fraction_of_free_memory
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"fraction_of_free_memory must be in (0, 1), got {fraction}")
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError("fraction_of_free_memory needs a CUDA device; give num_tokens")
        free_bytes, _total = torch.cuda.mem_get_info(device)
        return max(2, int(free_bytes * fraction) // bytes_per_token)
