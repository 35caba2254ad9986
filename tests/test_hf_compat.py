"""Hugging Face's `kernels` package against the checkout's `kernels/` folder (runtime/hf_compat.py)."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_kernels_package_wins_over_the_checkout_folder():
    try:
        importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("Hugging Face's kernels package is not installed (transformers < 5.25)")
    code = (
        "from radixgen.runtime.hf_compat import import_installed_kernels;"
        "import_installed_kernels(); import kernels; print(kernels.__file__)"
    )
    # `python -c` from the repository root puts the root (and our kernels/ folder) on sys.path.
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = Path(done.stdout.strip().splitlines()[-1]).resolve()
    assert not imported.is_relative_to(ROOT / "kernels"), imported
