"""Compiles every fused-sampling kernel variant for sm_90 (H100/H200) with Triton's compiler and
ptxas, no GPU needed: prints one line per variant, `ok <variant> <ptxas report>` or
`FAIL <variant> <error>`, and exits 1 on any failure or register spill.

    python scripts/compile_fused_sampling_sm90.py

Imports the kernel module by path (it needs only Triton), so it also runs in a bare venv with
another Triton version (the H200 has Triton 3.6).
"""

from __future__ import annotations

import glob
import importlib.util
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

MODULE = Path(__file__).resolve().parent.parent / "kernels" / "fused_sampling_kernels.py"


def load_kernels():
    spec = importlib.util.spec_from_file_location("fused_sampling_kernels", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def variants(kernels, logits_type: str):
    """(name, kernel, signature, constexprs) for every compiled variant the host can launch."""
    sizes = {"vocab_size": "i32", "num_words": "i32", "chunk": "i32"}
    row_strides = {"stride_logits_row": "i32", "stride_bitmask_row": "i32"}
    common = {"logits_ptr": f"*{logits_type}", "bitmask_ptr": "*i32", "temperatures_ptr": "*fp32"}
    partials = {"part_max_ptr": "*fp32", "part_arg_ptr": "*i32", "part_mass_ptr": "*fp64"}
    filters = {"top_ks_ptr": "*i64", "top_ps_ptr": "*fp32", "min_ps_ptr": "*fp32",
               "part_max_ptr": "*fp32"}  # fmt: skip
    radix = {"state_i_ptr": "*i32", "state_f_ptr": "*fp64", "hist_counts_ptr": "*i32",
             "hist_masses_ptr": "*fp64"}  # fmt: skip
    filter_sizes = {**sizes, "num_splits": "i32", "batch": "i32", **row_strides}
    for mask, sample in itertools.product((False, True), repeat=2):
        yield (f"partials mask={mask} sample={sample}", kernels._split_partials_kernel,
               {**common, **partials, **sizes, **row_strides},
               {"HAS_MASK": mask, "SAMPLE": sample, "BLOCK": 1024})  # fmt: skip
        for filtered in (False, True) if sample else (False,):
            yield (f"draw mask={mask} sample={sample} filtered={filtered}", kernels._draw_kernel,
                   {**common, "seeds_ptr": "*i64", "steps_ptr": "*i64", **partials,
                    "kept_mass_ptr": "*fp64", "threshold_ptr": "*i32", "out_ptr": "*i64",
                    **sizes, "num_splits": "i32", **row_strides},
                   {"HAS_MASK": mask, "SAMPLE": sample, "FILTERED": filtered, "BLOCK": 1024})  # fmt: skip
    for mask, min_p, top_k_or_p in itertools.product((False, True), repeat=3):
        if not (min_p or top_k_or_p):
            continue
        flags = {"HAS_MASK": mask, "HAS_MIN_P": min_p}
        yield (f"kept mask={mask} min_p={min_p} top_k_or_p={top_k_or_p}",
               kernels._kept_mass_kernel,
               {**common, **filters, **radix, "kept_mass_ptr": "*fp64", "threshold_ptr": "*i32",
                **filter_sizes},
               {"PASSES": 6, **flags, "HAS_TOP_K_OR_P": top_k_or_p, "BLOCK": 1024,
                "RADIX_BITS": 5})  # fmt: skip
        if top_k_or_p:
            for pass_index in range(6):
                yield (f"radix pass={pass_index} mask={mask} min_p={min_p}",
                       kernels._radix_pass_kernel, {**common, **filters, **radix, **filter_sizes},
                       {"PASS": pass_index, **flags, "SEARCH_BLOCK": 256, "RADIX_BITS": 5})  # fmt: skip


def main() -> int:
    kernels = load_kernels()
    binaries = glob.glob(
        os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas*")
    )
    ptxas = max(binaries, key=lambda path: "blackwell" in path)
    failures = 0
    print(f"# triton {triton.__version__}")
    for logits_type in ("fp32", "bf16"):
        for name, kernel, signature, constexprs in variants(kernels, logits_type):
            name = f"{name} logits={logits_type}"
            source = ASTSource(
                kernel, {**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs
            )
            try:
                compiled = triton.compile(
                    source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}
                )
            except Exception as error:  # report every variant, then fail
                failures += 1
                print(f"FAIL {name} {str(error).splitlines()[-1][:300]!r}")
                continue
            with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
                ptx.write(compiled.asm["ptx"])
                ptx.flush()
                done = subprocess.run(
                    [ptxas, "-v", "--gpu-name", "sm_90a", ptx.name, "-o", os.devnull],
                    capture_output=True, text=True,
                )  # fmt: skip
            registers = re.findall(r"Used (\d+) registers", done.stderr)
            spilled = [int(n) for n in re.findall(r"(\d+) bytes spill stores", done.stderr)]
            spills = not spilled or max(spilled) > 0
            report = f"registers={registers} spill_stores={spilled}"
            failures += done.returncode != 0 or spills
            print(f"{'FAIL' if done.returncode or spills else 'ok'} {name} {report}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
