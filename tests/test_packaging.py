"""The folder-per-layer layout maps to one import package, `radixgen`, in a built wheel too."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYER_FOLDERS = {"lang": "radixgen", "runtime": "radixgen/runtime", "radix_cache": "radixgen/radix_cache",
                 "constrained": "radixgen/constrained", "kernels": "radixgen/kernels"}  # fmt: skip


def test_wheel_holds_every_package_and_imports(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("radixgen-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every package folder of the source tree is in the wheel (pyproject lists them by hand).
    for folder, package in LAYER_FOLDERS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.relative_to(REPO / folder).as_posix()
            assert f"{package}/{relative}" in names, f"{folder}/{relative} missing from the wheel"
    assert "radixgen/runtime/tiny_assets/tokenizer.json" in names
    extracted = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(extracted)
    code = (
        "import radixgen, radixgen.runtime.engine, radixgen.radix_cache, radixgen.constrained, "
        "radixgen.kernels, radixgen.backends; print(radixgen.__file__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": str(extracted), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(extracted))
