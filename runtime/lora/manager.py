"""`LoRAManager`: the adapters a model serves, their device pool, and the wrapped layers.

Built by the model runner when LoRA is on (`lora_paths` or `lora_target_modules` set). It reads
the start-up adapters, sizes the pool (`max_loras_per_batch` slots of `max_lora_rank` over the
target modules), wraps every targeted projection's method in a `LoRALinearMethod`, and at run
time loads and unloads adapters by name. The scheduler acquires a request's slot at admission
and releases it when the request leaves the batch (`acquire` / `release`).

Under tensor parallelism every rank keeps its part of each adapter, cut as the base layer's
weight is: B's output rows of the rank's heads / features for column-parallel projections (q, k,
v, gate, up), A's input columns for row-parallel ones (o, down; each rank's shrink is then a
partial sum that the layer's all-reduce adds up with the base output's, since the expand is
linear). Rank 0 decides which slot holds which adapter; its batches name the slots they use and
its loads and unloads reach the followers as `AdapterChange`s (runtime/tp_batch_sync.py), so a
follower's pool mirrors rank 0's (`mirror_slots`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from radixgen.runtime.lora.adapter import (
    TARGET_MODULES,
    LoRAAdapter,
    load_lora_adapter,
    read_adapter_config,
)
from radixgen.runtime.lora.layer import LoRABatchState, LoRALinearMethod
from radixgen.runtime.lora.pool import LoRALayerShape, LoRAMemoryPool
from radixgen.runtime.models.linear import CheckpointSlice, LinearBase

logger = logging.getLogger(__name__)

# The fused projections of a decoder layer (runtime/models/llama.py) and where they live.
_PROJECTIONS = {
    "qkv_proj": "self_attn.qkv_proj",
    "o_proj": "self_attn.o_proj",
    "gate_up_proj": "mlp.gate_up_proj",
    "down_proj": "mlp.down_proj",
}
MAX_SUPPORTED_RANK = 64


@dataclass(frozen=True)
class AdapterChange:
    """An adapter rank 0 loaded (`path` set) or unloaded (`path` None), for its
    tensor-parallel followers to repeat in the same order (so load ids agree)."""

    name: str
    path: str | None = None


def resolve_target_modules(
    requested: tuple[str, ...] | None, initial: list[dict]
) -> frozenset[str]:
    """`lora_target_modules` ("all" or PEFT names), or the union of the start-up adapters'.

    Raises:
        ValueError: an unknown module name, or neither option given.
    """
    if requested:
        names = set(TARGET_MODULES) if "all" in requested else set(requested)
        unknown = names - set(TARGET_MODULES)
        if unknown:
            raise ValueError(
                f"lora_target_modules: {sorted(unknown)} unknown; expected 'all' or names of "
                f"{sorted(TARGET_MODULES)}"
            )
        return frozenset(names)
    names: set[str] = set()
    for config in initial:
        targets = config.get("target_modules") or []
        if isinstance(targets, str) or "all-linear" in targets:  # a regex, or PEFT's shortcut
            return frozenset(TARGET_MODULES)
        names |= {name for name in targets if name in TARGET_MODULES}
    if not names:
        raise ValueError("LoRA needs lora_paths or lora_target_modules to size its pool")
    return frozenset(names)


class LoRAManager:
    """Adapters by name, their pool, and the batch state the wrapped layers read.

    Args:
        model: the loaded LlamaForCausalLM (its projections get wrapped).
        lora_paths: start-up adapters, name -> folder.
        max_loras_per_batch: pool slots.
        max_lora_rank: pool rank (None: the largest start-up rank).
        target_modules: PEFT module names the pool serves (None: the start-up adapters').
        use_triton: the Triton kernels (SGMV, decode) or the torch reference.

    Raises:
        ValueError: a bad option or adapter (named).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        lora_paths: dict[str, str],
        max_loras_per_batch: int,
        max_lora_rank: int | None,
        target_modules: tuple[str, ...] | None,
        dtype: torch.dtype,
        device: torch.device,
        use_triton: bool,
    ):
        paths = lora_paths
        configs = [read_adapter_config(path) for path in paths.values()]
        rank = max_lora_rank or max((config["r"] for config in configs), default=0)
        if not 1 <= rank <= MAX_SUPPORTED_RANK:
            raise ValueError(
                f"max_lora_rank must be in [1, {MAX_SUPPORTED_RANK}], got {rank} (set it when "
                "no adapter is loaded at start-up)"
            )
        modules = resolve_target_modules(target_modules, configs)
        params = {TARGET_MODULES[name][0] for name in modules}
        self.num_layers = len(model.model.layers)
        self.dtype = dtype
        # CUDA with the Triton kernels: decode shrinks beside the base GEMMs (layer.py).
        side = torch.cuda.Stream(device) if use_triton and device.type == "cuda" else None
        self.state = LoRABatchState(shrink_stream=side)
        layers = {}
        for layer_id, decoder_layer in enumerate(model.model.layers):
            for param in params:
                layers[(layer_id, param)] = decoder_layer.get_submodule(_PROJECTIONS[param])
        shapes = {
            key: LoRALayerShape(linear.input_size, linear.output_sizes)
            for key, linear in layers.items()
        }
        self.pool = LoRAMemoryPool(
            shapes, num_slots=max_loras_per_batch, max_rank=rank, dtype=dtype, device=device
        )
        self.linears = layers
        # Rank 0 of a tensor-parallel group: tells the followers of each load and unload.
        self.announce: Callable[[AdapterChange], None] | None = None
        for key, linear in layers.items():
            self._wrap(linear, key, use_triton)
        self.adapters: dict[str, LoRAAdapter] = {}
        self._loads = 0
        for name, path in paths.items():
            self.load_adapter(name, path)
        logger.info(
            "LoRA: %d slot(s) of rank %d over %s (%.1f MiB), adapters %s",
            max_loras_per_batch,
            rank,
            sorted(modules),
            self.pool.nbytes() / 2**20,
            sorted(self.adapters),
        )

    def _wrap(self, linear: LinearBase, key: tuple[int, str], use_triton: bool) -> None:
        linear.method = LoRALinearMethod(
            linear.method,
            lora_a=self.pool.lora_a[key],
            lora_b=self.pool.lora_b[key],
            scalings=self.pool.scalings,
            state=self.state,
            use_triton=use_triton,
        )

    def load_adapter(self, name: str, path: str) -> LoRAAdapter:
        """Reads adapter `path` under `name` (onto the host; the device copy happens when a
        request first uses it).

        Raises:
            ValueError: a name already loaded, or an adapter the pool cannot serve (named).
        """
        if not name or "=" in name:
            raise ValueError(f"LoRA adapter name must be non-empty without '=', got {name!r}")
        if name in self.adapters:
            raise ValueError(f"LoRA adapter {name!r} is already loaded")
        adapter = load_lora_adapter(
            name, path, num_layers=self.num_layers, max_rank=self.pool.max_rank, dtype=self.dtype
        )
        outside = adapter.target_modules - self.pool.served_modules
        if outside:
            raise ValueError(
                f"LoRA adapter {str(path)!r} targets {sorted(outside)}, outside "
                f"lora_target_modules {sorted(self.pool.served_modules)}"
            )
        weights = {}
        for (layer, module), (lora_a, lora_b) in adapter.weights.items():
            param, shard = TARGET_MODULES[module]
            linear = self.linears[(layer, param)]
            expected_in, expected_out = _full_sizes(linear, shard)
            if lora_a.shape[1] != expected_in or lora_b.shape[0] != expected_out:
                raise ValueError(
                    f"LoRA adapter {str(path)!r}: layer {layer} {module} has A "
                    f"{tuple(lora_a.shape)} / B {tuple(lora_b.shape)}, the base model needs "
                    f"in={expected_in}, out={expected_out} (an adapter of another model?)"
                )
            weights[(layer, module)] = _rank_part(linear, shard, lora_a, lora_b)
        self._loads += 1
        adapter = dataclasses.replace(adapter, weights=weights, load_id=self._loads)
        self.adapters[name] = adapter
        if self.announce is not None:
            self.announce(AdapterChange(name, path))
        return adapter

    def unload_adapter(self, name: str) -> None:
        """Forgets `name` and frees its slot.

        Raises:
            KeyError: not loaded. ValueError: requests are running with it.
        """
        if name not in self.adapters:
            raise KeyError(f"LoRA adapter {name!r} is not loaded")
        self.pool.evict(name)
        del self.adapters[name]
        if self.announce is not None:
            self.announce(AdapterChange(name))

    def apply_change(self, change: AdapterChange) -> None:
        """A follower repeats rank 0's load or unload (an error here means the ranks can no
        longer agree: the follower stops, and the server with it)."""
        if change.path is None:
            self.unload_adapter(change.name)
        else:
            self.load_adapter(change.name, change.path)

    def slot_adapters(self, slots: tuple[int, ...]) -> tuple[tuple[int, str, int], ...]:
        """Rank 0: `(slot, adapter name, load id)` of each slot a batch uses."""
        named = ((slot, self.pool.slot_names[slot]) for slot in slots)
        return tuple((slot, name, self.adapters[name].load_id) for slot, name in named)

    def mirror_slots(self, slot_adapters: tuple[tuple[int, str, int], ...]) -> None:
        """A follower: puts each adapter in the slot rank 0's pool holds it in.

        Raises:
            RuntimeError: this rank does not hold that load of the adapter (out of step).
        """
        for slot, name, load_id in slot_adapters:
            adapter = self.adapters.get(name)
            if adapter is None or adapter.load_id != load_id:
                raise RuntimeError(
                    f"tensor-parallel ranks disagree on LoRA adapter {name!r} (load {load_id} "
                    f"on rank 0, {adapter.load_id if adapter else 'not loaded'} here)"
                )
            self.pool.place(slot, adapter)

    def acquire(self, name: str) -> int | None:
        """`name`'s slot for one more running request; None if every slot is in use."""
        return self.pool.acquire(self.adapters[name])

    def release(self, name: str) -> None:
        self.pool.release(name)


def _full_sizes(linear: LinearBase, shard: int) -> tuple[int, int]:
    """The whole model's (in, out) sizes of checkpoint module `shard` of `linear`."""
    part: CheckpointSlice | None = linear.checkpoint_slice
    full_in, full_out = linear.input_size, linear.output_sizes[shard]
    if part is not None and part.dim == 0:
        full_out = part.full_sizes[shard]
    elif part is not None:
        full_in = part.full_sizes[0]
    return full_in, full_out


def _rank_part(
    linear: LinearBase, shard: int, lora_a: torch.Tensor, lora_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's `(A [r, in], B [out, r])` of one module, cut as the base weight is."""
    part = linear.checkpoint_slice
    if part is None:
        return lora_a, lora_b
    if part.dim == 0:  # column parallel: the output rows this rank computes
        rows = lora_b.narrow(0, part.starts[shard], linear.output_sizes[shard])
        return lora_a, rows.contiguous()
    # Row parallel: the input columns this rank holds; the shrink's partial sums add up in the
    # layer's all-reduce (the expand is linear).
    return lora_a.narrow(1, part.starts[0], linear.input_size).contiguous(), lora_b
