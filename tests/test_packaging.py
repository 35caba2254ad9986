"""The folder-per-layer layout maps to one import package, `radixgen`, in a built wheel too."""

from __future__ import annotations

import ast
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


# Which layers each folder may import (see docs/architecture.md): layers only look down.
_ALLOWED_LAYERS = {
    "kernels": {"kernels"},
    "radix_cache": {"radix_cache"},
    "constrained": {"constrained", "kernels"},
    "runtime": {"runtime", "radix_cache", "constrained", "kernels"},
    "lang": {"lang", "runtime"},
}
_SUBPACKAGE_LAYERS = ("runtime", "radix_cache", "constrained", "kernels")


def _layer_of(module: str) -> str:
    """`radixgen.runtime.engine` -> "runtime"; the DSL's `radixgen.*` modules -> "lang"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in _SUBPACKAGE_LAYERS else "lang"


def _radixgen_imports(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.append(node.module)
    return [m for m in modules if m == "radixgen" or m.startswith("radixgen.")]


def test_layers_only_import_downwards():
    violations = []
    for folder, allowed in _ALLOWED_LAYERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            for module in _radixgen_imports(path):
                layer = _layer_of(module)
                # The DSL reaches the runtime only through its backends, the lazy `rg.Engine`
                # export in lang/__init__.py, and the torch-free request schema.
                lang_outside_backends = (
                    folder == "lang"
                    and layer == "runtime"
                    and module != "radixgen.runtime.request_schema"
                    and not relative.startswith("lang/backends/")
                    and relative != "lang/__init__.py"
                )
                if layer not in allowed or lang_outside_backends:
                    violations.append(f"{relative} imports {module}")
    assert not violations, violations


def _modules_after(statement: str, prefixes: tuple[str, ...]) -> list[str]:
    """The modules starting with `prefixes` that a fresh interpreter loads for `statement`."""
    code = f"import sys; {statement}; print(sorted(m for m in sys.modules if m.startswith({prefixes!r})))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return ast.literal_eval(result.stdout.strip())


def test_importing_a_layer_does_not_load_the_dsl():
    loaded = _modules_after("import radixgen.radix_cache", ("radixgen",))
    assert [m for m in loaded if "radix_cache" not in m] == ["radixgen"]
    # The DSL's one runtime module is torch-free (its field tables and tool schemas with it).
    assert _modules_after("import radixgen.runtime.request_schema", ("torch", "radixgen")) == [
        "radixgen",
        "radixgen.runtime",
        "radixgen.runtime.request_fields",
        "radixgen.runtime.request_schema",
        "radixgen.runtime.tool_schema",
    ]
    assert _modules_after("import radixgen", ("radixgen",)) == ["radixgen"]


def test_top_level_exports_are_listed_and_load_on_use():
    import radixgen

    assert {"Engine", "OpenAI", "RuntimeEndpoint", "gen", "function"} <= set(dir(radixgen))
    assert radixgen.greedy_token_selection is radixgen.ChoicesMethod.GREEDY_TOKEN_SELECTION
