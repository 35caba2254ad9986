"""`LoRASlots`: the scheduler's side of the adapters: which names exist, and a pool slot for
every admitted request that uses one. `namespace`: the radix namespace of a request.

Slots follow the KV rows: a request acquires its adapter's slot when `KVCacheManager.admit`
gives it a row and releases it with the row (finished, aborted or retracted), so an adapter with
running requests is never evicted, and a request whose adapter finds no slot waits.
"""

from __future__ import annotations

from collections.abc import Hashable

from radixgen.runtime.lora.manager import LoRAManager
from radixgen.runtime.req import Req


class LoRASlots:
    """Args: manager: the model runner's LoRAManager, or None (LoRA off)."""

    def __init__(self, manager: LoRAManager | None):
        self.manager = manager

    def names(self) -> list[str]:
        return sorted(self.manager.adapters) if self.manager else []

    def namespace(self, cache_salt: str | None, lora_path: str | None) -> Hashable:
        """The radix cache namespace: the salt alone for the base model (namespaces without
        adapters are unchanged), else (salt, adapter name, its load id): KV computed under one
        adapter is never reused by another, by the base model, or by an adapter loaded later
        under the same name. Call for a loaded adapter (`unknown_adapter_error` is None)."""
        if lora_path is None:
            return cache_salt
        return (cache_salt, lora_path, self.manager.adapters[lora_path].load_id)

    def unknown_adapter_error(self, name: str) -> str | None:
        """Why requests cannot use adapter `name` (None: they can)."""
        if self.manager is None:
            return (
                f"LoRA adapter {name!r} requested, but LoRA is off (start the server with "
                "--lora-paths or --lora-target-modules)"
            )
        if name not in self.manager.adapters:
            return f"LoRA adapter {name!r} is not loaded (loaded: {self.names()})"
        return None

    def can_admit(self, req: Req) -> bool:
        """Whether `req`'s adapter has (or can get) a slot now."""
        if req.lora_path is None or req.lora_slot >= 0:
            return True
        return self.manager.pool.can_acquire(req.lora_path)

    def acquire(self, req: Req) -> bool:
        """Gives `req` its adapter's slot; False if every slot is in use by other adapters."""
        if req.lora_path is None:
            return True
        slot = self.manager.acquire(req.lora_path)
        if slot is None:
            return False
        req.lora_slot = slot
        return True

    def release(self, req: Req) -> None:
        if req.lora_slot >= 0:
            self.manager.release(req.lora_path)
            req.lora_slot = -1

    def check_integrity(self, holding_kv: list[Req]) -> None:
        """Each adapter's in-use count equals its admitted requests (no slot leaked)."""
        if self.manager is None:
            return
        self.manager.pool.check_integrity()
        expected: dict[str, int] = {}
        for req in holding_kv:
            if req.lora_slot >= 0:
                expected[req.lora_path] = expected.get(req.lora_path, 0) + 1
        assert self.manager.pool.in_use == expected, (self.manager.pool.in_use, expected)

    def load(self, name: str, path: str) -> str | None:
        """Loads adapter `path` as `name`; the error message, or None on success."""
        if self.manager is None:
            return self.unknown_adapter_error(name)
        try:
            self.manager.load_adapter(name, path)
        except (ValueError, OSError) as error:
            return str(error)
        return None

    def unload(self, name: str, queued: list[Req]) -> str | None:
        """Unloads adapter `name` unless requests (running or `queued`) use it; the error
        message, or None on success."""
        error = self.unknown_adapter_error(name)
        if error is not None:
            return error
        waiting = sum(1 for req in queued if req.lora_path == name)
        if waiting:
            return f"LoRA adapter {name!r} has {waiting} queued request(s)"
        try:
            self.manager.unload_adapter(name)
        except ValueError as error:
            return str(error)
        return None
