"""Every ```python block of README.md and docs/*.md runs, as written, on CPU with `tiny`.

A block that cannot run here says so in the docs, with `<!-- not run: REASON -->` right before
its fence (doc_blocks.py); every other block runs, so nothing is skipped silently. Two things
are substituted in the code before it runs, and only these: the docs' server address
(`http://127.0.0.1:30000`) becomes the address of one `radixgen serve --model-path tiny` started
for this module, and the docs' example checkpoint folder becomes tiny's own Hugging Face folder.
The `curl` commands of the ```bash blocks run against the same server.
"""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

import radixgen as rg
from radixgen.runtime.server.subprocess_launcher import ServerProcess

from doc_blocks import DocBlock, code_blocks, documentation_files, run_block

DOCS_SERVER_URL = "http://127.0.0.1:30000"
DOCS_CHECKPOINT_FOLDER = "/models/Llama-3.1-8B-Instruct"

PYTHON_BLOCKS = [block for file in documentation_files() for block in code_blocks(file)]
BASH_BLOCKS = [block for file in documentation_files() for block in code_blocks(file, "bash")]


@pytest.fixture(scope="module")
def server(tiny_model_path):  # the tiny checkpoint is built once, before the server needs it
    with ServerProcess(["--model-path", "tiny", "--log-level", "warning"]) as running:
        yield running


@pytest.fixture(scope="module")
def namespaces():
    """Each block's globals after it ran, by block id (for the blocks that continue it); the
    engines the blocks started are shut down at the end of the module."""
    by_id: dict[str, dict] = {}
    yield by_id
    for namespace in by_id.values():
        for value in namespace.values():
            if isinstance(value, rg.Engine):
                value.shutdown()


def runnable_code(block: DocBlock, request: pytest.FixtureRequest) -> str:
    code = block.code
    if DOCS_SERVER_URL in code:
        code = code.replace(DOCS_SERVER_URL, request.getfixturevalue("server").base_url)
    if DOCS_CHECKPOINT_FOLDER in code:
        code = code.replace(DOCS_CHECKPOINT_FOLDER, request.getfixturevalue("tiny_model_path"))
    return code


def run_doc_block(block: DocBlock, request, namespaces: dict) -> tuple[dict, str]:
    """Runs `block` (after the block it continues, if that has not run yet)."""
    namespace = {"__name__": "doc_example"}
    if block.continues_previous:
        assert block.index > 0, f"{block.id} continues a block, but is its file's first"
        previous = PYTHON_BLOCKS[PYTHON_BLOCKS.index(block) - 1]
        if previous.id not in namespaces:
            run_doc_block(previous, request, namespaces)
        namespace = namespaces[previous.id]
    namespace, printed = run_block(runnable_code(block, request), namespace, name=block.id)
    namespaces[block.id] = namespace
    return namespace, printed


def check_readme_lead_example(namespace: dict, printed: str) -> None:
    assert namespace["state"].text().startswith("def read_lines(path):")
    assert len(namespace["state"]["body"]) > 0
    assert printed.splitlines()[-1] == "print(i)"
    pairs = zip(namespace["states"], namespace["stubs"], strict=True)
    assert all(state.text().startswith(stub) for state, stub in pairs)
    assert all(state["body"] for state in namespace["states"])


# What some blocks must have computed, beyond running without an error.
CHECKS = {"README.md[0]": check_readme_lead_example}


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[block.id for block in PYTHON_BLOCKS])
def test_python_block_runs(block, request, namespaces):
    reason = block.not_run_reason
    if reason is not None:
        assert len(reason) > 10, f"{block.id}: say why the block cannot run here"
        compile(block.code, block.id, "exec")  # still valid Python
        pytest.skip(f"{block.id}: {reason}")
    assert not block.note or block.continues_previous, f"{block.id}: unknown note {block.note!r}"
    namespace, printed = run_doc_block(block, request, namespaces)
    if block.id in CHECKS:
        CHECKS[block.id](namespace, printed)


def test_every_documentation_file_is_scanned():
    files = {block.file for block in PYTHON_BLOCKS}
    assert {"README.md", "docs/server.md", "docs/engine.md", "docs/dsl.md"} <= files
