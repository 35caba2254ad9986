"""Compiles Triton kernels for sm_90 (H100 / H200) with Triton's compiler and ptxas, no GPU
needed, so that the CPU suite fails on a kernel that would not compile or would spill registers
on the H200. Pointer and `stride*` arguments carry the divisibility-by-16 hint that Triton's
launcher gives them at real shapes. It runs in a subprocess: the suite's TRITON_INTERPRET=1
turns @triton.jit into interpreted functions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# argv[1]: JSON list of [module, kernel name, signature, constexprs, num_warps]; prints one
# line per kernel: ptxas's return code, then its report.
_SCRIPT = """
import glob, importlib, json, os, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

binaries = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas*"))
ptxas = max(binaries, key=lambda path: "blackwell" in path)  # the one that reads Triton's PTX
for module, name, signature, constexprs, num_warps, *options in json.loads(sys.argv[1]):
    kernel = getattr(importlib.import_module(module), name)
    # As Triton's launcher specializes them at the engine's shapes: pointers and strides are
    # multiples of 16 (bytes / elements). Without the hint the loads stay scalar and are not
    # pipelined: another kernel than the one the H200 runs.
    aligned = [arg for arg, kind in signature.items()
               if kind.startswith("*") or arg.startswith("stride")]
    attrs = {(kernel.arg_names.index(arg),): [["tt.divisibility", 16]] for arg in aligned}
    source = ASTSource(kernel, {**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs,
                       attrs)
    options = {"num_warps": num_warps, "num_stages": 3, **(options[0] if options else {})}
    forbidden = options.pop("forbid_ptx", [])
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    found = [text for text in forbidden if text in compiled.asm["ptx"]]
    if found:
        print(1, name, "PTX has", found)
        continue
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.asm["ptx"])
        ptx.flush()
        done = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", ptx.name, "-o", os.devnull],
                              capture_output=True, text=True)
    print(done.returncode, name, done.stderr.replace(chr(10), " "))
"""

# (module, kernel name, signature, constexprs, num_warps[, compile options such as
# {"num_stages": 5, "maxnreg": 128}, and "forbid_ptx": instructions the PTX must not hold])
Kernel = tuple


def assert_compile_for_sm90_without_spills(kernels: list[Kernel]) -> None:
    """Each (module, kernel name, signature, constexprs, num_warps[, options]) compiles for
    sm_90a with no register spills."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(kernels)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reports = done.stdout.strip().splitlines()
    assert len(reports) == len(kernels), done.stdout
    for report in reports:
        assert report.startswith("0 ") and "0 bytes spill stores" in report, report
