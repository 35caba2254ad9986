"""Importing Hugging Face transformers' models from a radixgen checkout.

transformers >= 5.25 requires and imports Hugging Face's `kernels` package. In a checkout the
`radixgen.kernels` layer is the folder `kernels/` at the repository root, so wherever the root is
on sys.path (`python -m ...` run from it, `python -m pytest`) that folder shadows the installed
package under the same top-level name, and `from transformers import LlamaForCausalLM` fails
(`cannot import name 'CUDAProperties' from 'kernels'`). In an installed radixgen the layer sits
inside the `radixgen` package and nothing is shadowed.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The folder holding radixgen's layer folders: the repository root in a checkout.
_LAYERS_ROOT = Path(__file__).resolve().parents[1]


def import_installed_kernels() -> None:
    """Imports the installed `kernels` package (where there is one) with the folder holding
    radixgen's layers hidden from sys.path, so later imports find it in sys.modules. Call it
    before importing a transformers model; a no-op once `kernels` is imported."""
    if "kernels" in sys.modules:
        return
    saved = list(sys.path)
    sys.path[:] = [entry for entry in saved if Path(entry or ".").resolve() != _LAYERS_ROOT]
    try:
        import kernels  # noqa: F401  (Hugging Face's)
    except ImportError:  # not installed: transformers before 5.25 does without it
        pass
    finally:
        sys.path[:] = saved
