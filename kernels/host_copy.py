"""Host lists to device tensors without waiting for the device, index tensors aligned.

A blocking host-to-device copy synchronizes the stream, i.e. waits for every kernel already
queued (under the overlapped schedule: the step in flight). From pinned memory the copy is
queued like a kernel; the caching host allocator keeps the pinned buffer alive until the copy
has run.

Index tensors handed to Triton kernels start at 16-byte boundaries: Triton compiles a variant
per pointer alignment, so a batch whose packed lists happened to split at an odd offset
compiled a kernel inside a user's request, after the warm-up (H200, sixth session: one
extend-attention variant in a fresh server's first benchmark run).
"""

from __future__ import annotations

import torch

ALIGN_BYTES = 16


def host_values_to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A `dtype` tensor of `values` on `device`, copied without waiting for the device."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def host_ints_to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """An int64 tensor of `values` on `device`, copied without waiting for the device."""
    return host_values_to_device(values, torch.int64, device)


def host_parts_to_device(
    parts: list[list], device: torch.device, dtype: torch.dtype = torch.int64
) -> list[torch.Tensor]:
    """`dtype` tensors of each list of `parts`, through one copy that does not wait for the
    device, each starting ALIGN_BYTES-aligned (the packed lists padded)."""
    per_align = ALIGN_BYTES // dtype.itemsize
    padded, sizes = [], []
    for values in parts:
        size = -(-len(values) // per_align) * per_align
        padded += values
        padded += [0] * (size - len(values))
        sizes.append(size)
    views = host_values_to_device(padded, dtype, device).split(sizes)
    return [view[: len(values)] for view, values in zip(views, parts, strict=True)]
