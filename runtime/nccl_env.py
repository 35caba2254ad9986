"""The environment that keeps NCCL, symmetric memory and NVSHMEM off NVLink multicast; torch-free,
so that the server's launcher sets it before it starts (and without importing torch itself)."""

from __future__ import annotations

import os

# What the server starts never uses NVLink multicast (NVLS): some lent machines expose
# multicast objects that cannot be created, and NCCL/NVSHMEM/symmetric memory then fail or hang.
MULTICAST_OFF_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def disable_nvlink_multicast(environ: dict[str, str] | None = None) -> None:
    """Sets MULTICAST_OFF_ENV in `environ` (default os.environ), before NCCL initialises; a
    value the user set explicitly is kept."""
    environ = os.environ if environ is None else environ
    for name, value in MULTICAST_OFF_ENV.items():
        environ.setdefault(name, value)
