"""Compiles Triton kernels for sm_90 (H100 / H200) with Triton's compiler and ptxas, no GPU
needed, so that the CPU suite fails on a kernel that would not compile or would spill registers
on the H200. It runs in a subprocess: the suite's TRITON_INTERPRET=1 turns @triton.jit into
interpreted functions."""

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
for module, name, signature, constexprs, num_warps in json.loads(sys.argv[1]):
    kernel = getattr(importlib.import_module(module), name)
    source = ASTSource(kernel, {**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs)
    options = {"num_warps": num_warps, "num_stages": 3}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.asm["ptx"])
        ptx.flush()
        done = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", ptx.name, "-o", os.devnull],
                              capture_output=True, text=True)
    print(done.returncode, name, done.stderr.replace(chr(10), " "))
"""

Kernel = tuple[str, str, dict[str, str], dict[str, object], int]


def assert_compile_for_sm90_without_spills(kernels: list[Kernel]) -> None:
    """Each (module, kernel name, signature, constexprs, num_warps) compiles for sm_90a with
    no register spills."""
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
