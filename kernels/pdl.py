"""Programmatic dependent launch (PDL; Hopper and later) for the decode step's small kernels.

A batch-1 decode step is ~300 kernels of a few microseconds each, and each one normally starts
only after the previous one has completely finished: its launch, the ramp of its first loads and
the previous kernel's tail are not overlapped. Launched with PDL, a kernel's programs start as
soon as every program of the previous kernel has signalled (`gdc_launch_dependents`), and wait
(`gdc_wait`, which returns once the previous kernel has finished and its writes are visible)
before touching its inputs. What it does before the wait overlaps the previous kernel: setup,
and for the GEMVs the load of their first weight tile (weights are constant during a step).

The rule every PDL kernel keeps: `wait_for_prior_grids(USE_PDL)` before it reads anything an
earlier kernel wrote or writes anything an earlier kernel may still read (an output buffer can
be memory the caching allocator just reused); only constant data is read before it. Kernels
launched without PDL (cuBLAS, torch) are ordered as usual; the wait is transitive, since each
kernel waits for the one before it. CUDA graphs keep the launches' programmatic edges.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait_for_prior_grids(USE_PDL: tl.constexpr):
    """Waits for the previous kernel in the stream (and so every earlier one) to finish, then
    lets the next PDL kernel start its programs. No-op unless USE_PDL."""
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_to_l2(pointers, USE_PDL: tl.constexpr):
    """Asks L2 for the 128-byte line at each of `pointers` (any shape; valid addresses), before
    `wait_for_prior_grids`: a kernel whose first tiles go through a pipeline it cannot start
    before the wait (the FP8 GEMM's `tl.dot` loop) still overlaps their DRAM latency with the
    previous kernel's tail. No-op unless USE_PDL (CUDA only: inline PTX)."""
    if USE_PDL:
        tl.inline_asm_elementwise(
            "mov.u32 $0, 0; prefetch.global.L2 [$1];",
            "=r,l",
            [pointers],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


@functools.cache
def _capability(device_index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def pdl_supported(device: torch.device) -> bool:
    """NVIDIA CUDA on compute capability 9.0 or later, outside Triton's interpreter (ROCm
    reports its own architecture numbers as the capability and has no PDL), unless the
    environment sets `RADIXGEN_PDL=0` (an escape hatch, and a same-tree A/B for benchmarks:
    the kernels then launch as before, read at each launch)."""
    if device.type != "cuda" or torch.version.hip or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if os.environ.get("RADIXGEN_PDL", "1") == "0":
        return False
    return _capability(device.index) >= (9, 0)


def pdl_launch_options(device: torch.device, enabled: bool | None = None) -> dict:
    """The launch keywords of a kernel that takes `USE_PDL`: `USE_PDL` and Triton's
    `launch_pdl` together (one without the other is a race or a no-op), or nothing.
    `enabled` None: wherever PDL is supported (`pdl_supported`)."""
    if enabled is None:
        enabled = pdl_supported(device)
    if not enabled:
        return {}
    if not pdl_supported(device):
        raise ValueError(f"PDL needs a CUDA device of compute capability >= 9.0, got {device}")
    return {"USE_PDL": True, "launch_pdl": True}
