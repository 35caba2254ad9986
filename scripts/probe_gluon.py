"""Which of Gluon's Hopper building blocks this machine's Triton has (run on the H200).

    python scripts/probe_gluon.py

[7/14]'s extend attention sits at 0.87-0.91x torch SDPA (FlashAttention-3-class on the H200):
Triton 3.6 gives its loop no Hopper warp specialization and waits on each wgmma result
(docs/benchmarks.md, seventeenth session). A warp-specialized kernel (a TMA producer warp, two
consumer warpgroups alternating softmax and wgmma) needs Gluon's explicit primitives; the
CPU machine's Triton 3.9 has them (`warpgroup_mma`, `mbarrier`, `tma`, `warp_specialize`),
and Gluon's API moves between releases, so this lists what the H200's Triton offers before
any kernel is written against it.
"""

from __future__ import annotations

import importlib

import triton

WANTED = {
    "triton.experimental.gluon.language": (
        "warp_specialize",
        "allocate_shared_memory",
        "NVMMASharedLayout",
    ),
    "triton.experimental.gluon.language.nvidia.hopper": (
        "warpgroup_mma",
        "warpgroup_mma_wait",
        "warpgroup_mma_init",
        "fence_async_shared",
        "mbarrier",
        "tma",
    ),
    "triton.experimental.gluon.language.nvidia.hopper.tma": ("async_copy_global_to_shared",),
    "triton.experimental.gluon.language.nvidia.hopper.mbarrier": (
        "init",
        "expect",
        "wait",
        "arrive",
    ),
}


def main() -> None:
    print(f"triton {triton.__version__}")
    for module_name, names in WANTED.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            print(f"{module_name}: missing ({error})")
            continue
        present = {name: hasattr(module, name) for name in names}
        print(f"{module_name}: {present}")


if __name__ == "__main__":
    main()
