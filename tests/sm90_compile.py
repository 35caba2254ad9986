"""Compiles Triton kernels for sm_90 (H100 / H200) with Triton's compiler and ptxas, no GPU
needed, so that the CPU suite fails on a kernel that would not compile or would spill registers
on the H200. Pointer and `stride*` arguments carry the divisibility-by-16 hint that Triton's
launcher gives them at real shapes. It runs in a subprocess: the suite's TRITON_INTERPRET=1
turns @triton.jit into interpreted functions. One subprocess serves the session: importing
Triton and the kernels costs ~1.4 s on 2 cores, a check's compiles ~0.2 s."""

from __future__ import annotations

import atexit
import functools
import json
import os
import subprocess
import sys
import tempfile
from typing import IO

# stdin: one JSON list of [module, kernel name, signature, constexprs, num_warps] a line;
# prints one line per kernel (ptxas's return code, then its report), then "done".
_SCRIPT = """
import glob, importlib, json, os, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

binaries = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas*"))
ptxas = max(binaries, key=lambda path: "blackwell" in path)  # the one that reads Triton's PTX
for line in sys.stdin:
    for module, name, signature, constexprs, num_warps, *options in json.loads(line):
        kernel = getattr(importlib.import_module(module), name)
        # A tuple argument's types arrive as a JSON list (Triton takes a tuple).
        signature = {arg: tuple(kind) if isinstance(kind, list) else kind
                     for arg, kind in signature.items()}
        # Constexprs the case leaves out take their defaults, as a launch does.
        # So do optional arguments the signature leaves out (None: a constexpr at launch).
        constexprs = {**{param.name: param.default for param in kernel.params
                         if param.has_default and (param.is_constexpr
                                                   or param.name not in signature)},
                      **constexprs}
        # As Triton's launcher specializes them at the engine's shapes: pointers and strides are
        # multiples of 16 (bytes / elements). Without the hint the loads stay scalar and are not
        # pipelined: another kernel than the one the H200 runs.
        options = {"num_warps": num_warps, "num_stages": 3, **(options[0] if options else {})}
        # Size arguments the caller knows to be multiples of 16 at real shapes (Triton's
        # launcher specializes those too).
        divisible = options.pop("divisible", [])
        aligned = [arg for arg, kind in signature.items() if isinstance(kind, str)
                   and (kind.startswith("*") or arg.startswith("stride") or arg in divisible)]
        attrs = {(kernel.arg_names.index(arg),): [["tt.divisibility", 16]] for arg in aligned}
        source = ASTSource(kernel, {**signature, **dict.fromkeys(constexprs, "constexpr")},
                           constexprs, attrs)
        forbidden = options.pop("forbid_ptx", [])
        required = options.pop("require_ptx", [])
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
        found = [text for text in forbidden if text in compiled.asm["ptx"]]
        missing = [text for text in required if text not in compiled.asm["ptx"]]
        if found or missing:
            print(1, name, "PTX has", found, "lacks", missing)
            continue
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
            ptx.write(compiled.asm["ptx"])
            ptx.flush()
            command = [ptxas, "-v", "--gpu-name", "sm_90a", ptx.name, "-o", os.devnull]
            done = subprocess.run(command, capture_output=True, text=True)
        print(done.returncode, name, done.stderr.replace(chr(10), " "))
    print("done", flush=True)
"""

# The compile options of a kernel with programmatic dependent launch (kernels/pdl.py): its PTX
# waits for the previous kernel and lets the next one start.
PDL_PTX = {"require_ptx": ["griddepcontrol.wait", "griddepcontrol.launch_dependents"]}

# (module, kernel name, signature, constexprs, num_warps[, compile options such as
# {"num_stages": 5, "maxnreg": 128}, "forbid_ptx": instructions the PTX must not hold,
# "require_ptx": instructions it must, and "divisible": size arguments that are multiples of 16)
Kernel = tuple


def assert_compile_for_sm90_without_spills(kernels: list[Kernel]) -> None:
    """Each (module, kernel name, signature, constexprs, num_warps[, options]) compiles for
    sm_90a with no register spills."""
    compiler, stderr = _compiler()
    compiler.stdin.write(json.dumps(kernels) + "\n")
    compiler.stdin.flush()
    reports = []
    while (line := compiler.stdout.readline()) not in ("done\n", ""):
        reports.append(line.rstrip("\n"))
    if not line:  # it exited: a kernel raised (the next check starts another)
        _compiler.cache_clear()
        stderr.seek(0)
        raise AssertionError(f"exit code {compiler.wait()}: {stderr.read()[-2000:]}")
    assert len(reports) == len(kernels), reports
    for report in reports:
        assert report.startswith("0 ") and "0 bytes spill stores" in report, report


@functools.cache
def _compiler() -> tuple[subprocess.Popen, IO[str]]:
    """The compiler subprocess, started on first use, and the file that takes its stderr (a
    pipe nobody reads could fill and block it); it exits with the session (stdin closed)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    stderr = tempfile.TemporaryFile("w+")
    compiler = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
    )
    atexit.register(_close, compiler)
    return compiler, stderr


def _close(compiler: subprocess.Popen) -> None:
    compiler.stdin.close()
    compiler.wait(timeout=30)
