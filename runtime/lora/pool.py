"""`LoRAMemoryPool`: adapters' weights on the device, stacked per layer for the batched kernels.

For every decoder layer and adapted projection (`qkv_proj`, `o_proj`, `gate_up_proj`,
`down_proj`) the pool holds `lora_a: [num_slots, num_shards * max_rank, in]` and
`lora_b: [num_slots, out, max_rank]` (kernels/lora.py's layout), plus one `scalings:
[num_slots]`. An adapter occupies one slot, zero-padded to `max_rank` and in the shards it does
not adapt (zeros add nothing), so adapters of any rank and target set mix in one batch.

Slots are reference counted by the requests running with them. An adapter without running
requests stays loaded (idle) until its slot is needed: then the least recently used idle adapter
is evicted. An adapter in use is never evicted; when every slot is in use, `acquire` returns None
and the request waits. So a batch never holds more than `num_slots` (= max_loras_per_batch)
adapters.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from radixgen.runtime.lora.adapter import TARGET_MODULES, LoRAAdapter


@dataclass(frozen=True)
class LoRALayerShape:
    """An adaptable projection: its input size and stacked output sizes (one per shard)."""

    input_size: int
    output_sizes: tuple[int, ...]


class LoRAMemoryPool:
    """Device buffers for `num_slots` adapters.

    Args:
        shapes: (layer, fused parameter) -> its shape, for every projection the pool serves.
        num_slots: adapters on the device at once (max_loras_per_batch).
        max_rank: rank the buffers are padded to (max_lora_rank).
        dtype, device: of the buffers (the model's).
    """

    def __init__(
        self,
        shapes: dict[tuple[int, str], LoRALayerShape],
        *,
        num_slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        if num_slots < 1 or max_rank < 1:
            raise ValueError(f"num_slots and max_rank must be >= 1, got {num_slots}, {max_rank}")
        self.shapes = dict(shapes)
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.lora_a: dict[tuple[int, str], torch.Tensor] = {}
        self.lora_b: dict[tuple[int, str], torch.Tensor] = {}
        for key, shape in self.shapes.items():
            stacked_rank = len(shape.output_sizes) * max_rank
            self.lora_a[key] = torch.zeros(
                num_slots, stacked_rank, shape.input_size, dtype=dtype, device=device
            )
            self.lora_b[key] = torch.zeros(
                num_slots, sum(shape.output_sizes), max_rank, dtype=dtype, device=device
            )
        self.scalings = torch.zeros(num_slots, dtype=torch.float32, device=device)
        self.slot_names: list[str | None] = [None] * num_slots
        self.slot_of: dict[str, int] = {}
        self.in_use: dict[str, int] = {}  # name -> running requests (> 0 only)
        self.idle: OrderedDict[str, None] = OrderedDict()  # loaded, unused; oldest first

    @property
    def served_modules(self) -> frozenset[str]:
        """PEFT module names the buffers can hold."""
        params = {param for _, param in self.shapes}
        return frozenset(m for m, (param, _) in TARGET_MODULES.items() if param in params)

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in (*self.lora_a.values(), *self.lora_b.values())
        )

    def can_acquire(self, name: str) -> bool:
        """Whether `acquire` of adapter `name` would find a slot now."""
        return name in self.slot_of or None in self.slot_names or bool(self.idle)

    def acquire(self, adapter: LoRAAdapter) -> int | None:
        """The slot holding `adapter` (copied in, evicting the least recently used idle adapter,
        if it is not loaded), counted as used once more; None if every slot is in use."""
        slot = self.slot_of.get(adapter.name)
        if slot is None:
            slot = self._free_slot()
            if slot is None:
                return None
            self._write(slot, adapter)
        self.idle.pop(adapter.name, None)
        self.in_use[adapter.name] = self.in_use.get(adapter.name, 0) + 1
        return slot

    def release(self, name: str) -> None:
        """One running request of `name` is done; at zero the adapter becomes idle (evictable)."""
        count = self.in_use[name] - 1
        if count:
            self.in_use[name] = count
        else:
            del self.in_use[name]
            self.idle[name] = None  # most recently used: evicted last

    def evict(self, name: str) -> None:
        """Frees `name`'s slot if it is loaded and idle.

        Raises:
            ValueError: `name` is in use by running requests.
        """
        if name in self.in_use:
            raise ValueError(f"LoRA adapter {name!r} is in use by {self.in_use[name]} request(s)")
        slot = self.slot_of.pop(name, None)
        if slot is not None:
            self.idle.pop(name)
            self.slot_names[slot] = None

    def place(self, slot: int, adapter: LoRAAdapter) -> None:
        """A tensor-parallel follower's pool: puts `adapter` in `slot` because rank 0's pool
        holds it there (followers never acquire; their slots mirror the leader's). Whatever
        held the slot, and the adapter's copy in another slot, are dropped."""
        if self.slot_names[slot] == adapter.name:
            return
        previous = self.slot_of.pop(adapter.name, None)
        if previous is not None:
            self.slot_names[previous] = None
            self.idle.pop(adapter.name)
        occupant = self.slot_names[slot]
        if occupant is not None:
            del self.slot_of[occupant]
            self.idle.pop(occupant)
        self._write(slot, adapter)
        self.idle[adapter.name] = None  # loaded and not counted as used, as check_integrity wants

    def _free_slot(self) -> int | None:
        if None in self.slot_names:
            return self.slot_names.index(None)
        if not self.idle:
            return None
        oldest = next(iter(self.idle))
        slot = self.slot_of[oldest]
        self.evict(oldest)
        return slot

    def _write(self, slot: int, adapter: LoRAAdapter) -> None:
        """Copies the adapter's A/B into `slot`, zeroing what it does not adapt."""
        for key in self.shapes:
            self.lora_a[key][slot].zero_()
            self.lora_b[key][slot].zero_()
        for (layer, module), (lora_a, lora_b) in adapter.weights.items():
            param, shard = TARGET_MODULES[module]
            shape = self.shapes[(layer, param)]
            rows = slice(shard * self.max_rank, shard * self.max_rank + adapter.rank)
            offset = sum(shape.output_sizes[:shard])
            out_rows = slice(offset, offset + shape.output_sizes[shard])
            self.lora_a[(layer, param)][slot, rows].copy_(lora_a)
            self.lora_b[(layer, param)][slot, out_rows, : adapter.rank].copy_(lora_b)
        self.scalings[slot] = adapter.scaling
        self.slot_names[slot] = adapter.name
        self.slot_of[adapter.name] = slot

    def check_integrity(self) -> None:
        """Every loaded adapter is either in use or idle, never both."""
        loaded = {name for name in self.slot_names if name is not None}
        assert loaded == set(self.slot_of) == set(self.in_use) | set(self.idle)
        assert not set(self.in_use) & set(self.idle)
