"""Every ```python block of README.md and docs/*.md runs, as written, on CPU with `tiny`; so do
the `curl` commands of the ```bash blocks.

A block that cannot run here says so in the docs, with `<!-- not run: REASON -->` right before
its fence (doc_blocks.py), and must still compile; a fragment that uses the objects of the block
before it says `<!-- continues the previous block -->`. Every other block runs here, except the
ones in RUN_ELSEWHERE, which another named test runs with stronger checks: nothing is skipped
silently. Two things are substituted in the code before it runs, and only these: the docs'
server address (127.0.0.1:30000 or localhost:30000) becomes the address of the suite's shared
`radixgen serve --model-path tiny` (shared_servers.py), and the docs' example checkpoint folder
becomes tiny's own Hugging Face folder.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shlex
import subprocess

import pytest
from doc_blocks import DocBlock, code_blocks, documentation_files, run_block

import radixgen as rg

DOCS_SERVER_ADDRESS = re.compile(r"(?:127\.0\.0\.1|localhost):30000")
DOCS_CHECKPOINT_FOLDER = "/models/Llama-3.1-8B-Instruct"

PYTHON_BLOCKS = [block for file in documentation_files() for block in code_blocks(file)]
BASH_BLOCKS = [block for file in documentation_files() for block in code_blocks(file, "bash")]

# Blocks that another test runs with stronger checks, by that test's module and name: running
# them twice would only cost time (the perplexity example takes seconds on 2 cores).
RUN_ELSEWHERE = {
    "docs/model.md[2]": (
        "test_tiny_quality",
        "test_heldout_perplexity_matches_transformers_and_stays_low",
    )
}


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


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
    if DOCS_SERVER_ADDRESS.search(code):
        address = request.getfixturevalue("server").base_url.removeprefix("http://")
        code = DOCS_SERVER_ADDRESS.sub(address, code)
    if DOCS_CHECKPOINT_FOLDER in code:
        code = code.replace(DOCS_CHECKPOINT_FOLDER, request.getfixturevalue("tiny_model_path"))
    return code


def run_doc_block(block: DocBlock, request, namespaces: dict) -> tuple[dict, str]:
    """Runs `block` (after the block it continues, if that has not run yet)."""
    namespace = {"__name__": "doc_example"}
    if block.continues_previous:
        assert block.index > 0, f"{block.id} continues a block, but is its file's first"
        previous = PYTHON_BLOCKS[PYTHON_BLOCKS.index(block) - 1]
        assert previous.not_run_reason is None, f"{block.id} continues a block that is not run"
        if previous.id not in namespaces:
            run_doc_block(previous, request, namespaces)
        namespace = namespaces[previous.id]
    namespace, printed = run_block(runnable_code(block, request), namespace, name=block.id)
    namespace["__doc_block__"] = block.id
    namespaces[block.id] = namespace
    return namespace, printed


def check_readme_lead_example(namespace: dict, printed: str) -> None:
    assert namespace["state"].text().startswith("def read_lines(path):")
    assert len(namespace["state"]["body"]) > 0
    assert printed.splitlines()[-1] == "print(i)"
    pairs = zip(namespace["states"], namespace["stubs"], strict=True)
    assert all(state.text().startswith(stub) for state, stub in pairs)
    assert all(state["body"] for state in namespace["states"])


def check_openai_reply(namespace: dict, printed: str) -> None:
    usage = namespace["reply"].usage
    assert 0 < usage.completion_tokens <= 16, usage  # sampled: the text itself may be anything


def check_printed_as_documented(namespace: dict, printed: str) -> None:
    """Every `print` result equals the `# ...` comment the docs show under it, in order."""
    block = next(b for b in PYTHON_BLOCKS if b.code and namespace.get("__doc_block__") == b.id)
    shown = [line[2:] for line in block.code.splitlines() if line.startswith("# ")]
    assert printed.splitlines()[: len(shown)] == shown, (block.id, printed)


# What some blocks must have computed, beyond running without an error.
CHECKS = {
    "README.md[0]": check_readme_lead_example,
    "README.md[2]": check_openai_reply,
    "docs/lora.md[0]": check_printed_as_documented,
    "docs/quantization.md[6]": check_printed_as_documented,
    "docs/lora.md[1]": check_printed_as_documented,
    "docs/lora.md[2]": check_printed_as_documented,
}


def python_block_param(block: DocBlock):
    # A block that starts a server of its own costs a server start-up (~10-25 s on 2 cores).
    marks = [pytest.mark.slow] if "ServerProcess(" in block.code else []
    return pytest.param(block, id=block.id, marks=marks)


@pytest.mark.parametrize("block", [python_block_param(block) for block in PYTHON_BLOCKS])
def test_python_block_runs(block, request, namespaces):
    reason = block.not_run_reason
    if reason is not None:
        assert len(reason) > 10, f"{block.id}: say why the block cannot run here"
        compile(block.code, block.id, "exec")  # still valid Python
        pytest.skip(f"not run: {reason}")
    assert not block.note or block.continues_previous, f"{block.id}: unknown note {block.note!r}"
    if block.id in RUN_ELSEWHERE:
        module, test = RUN_ELSEWHERE[block.id]
        assert callable(getattr(importlib.import_module(module), test, None)), (module, test)
        pytest.skip(f"run by {module}.py::{test}")
    namespace, printed = run_doc_block(block, request, namespaces)
    if block.id in CHECKS:
        CHECKS[block.id](namespace, printed)


def curl_commands(block: DocBlock) -> list[list[str]]:
    """The block's `curl` commands as argument lists (a command may span lines in quotes)."""
    commands, pending = [], ""
    for line in block.code.splitlines():
        pending += line + "\n"
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        pending = ""
        if words and words[0] == "curl":
            commands.append(words)
    assert not pending, f"{block.id}: unbalanced quotes"
    return commands


CURL_COMMANDS = [(block, words) for block in BASH_BLOCKS for words in curl_commands(block)]


@pytest.mark.parametrize(
    "block,words",
    CURL_COMMANDS,
    ids=[f"{block.id}:{' '.join(words)[:40]}" for block, words in CURL_COMMANDS],
)
def test_bash_curl_command_runs(block, words, server):
    address = server.base_url.removeprefix("http://")
    argv = [DOCS_SERVER_ADDRESS.sub(address, word) for word in words]
    assert argv != words, f"{block.id}: curl not aimed at the docs' server address"
    done = subprocess.run(
        [*argv, "--fail-with-body", "--max-time", "60"], capture_output=True, text=True
    )
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    if "--data" in argv or "-d" in argv:
        body = json.loads(argv[argv.index("-d" if "-d" in argv else "--data") + 1])
        if body.get("stream"):
            events = [line for line in done.stdout.splitlines() if line.startswith("data: ")]
            assert events[-1] == "data: [DONE]" and len(events) > 1, done.stdout
            return
    reply = json.loads(done.stdout)
    assert "error" not in reply, reply


def test_every_documentation_file_is_scanned():
    # A block under another language name (```py, ```sh, ```console) would escape the test.
    for file in documentation_files():
        languages = set(re.findall(r"^```(\w+)", file.read_text(), flags=re.MULTILINE))
        assert languages <= {"python", "bash"}, (file, languages)
    files = {block.file for block in PYTHON_BLOCKS}
    assert {"README.md", "docs/server.md", "docs/engine.md", "docs/dsl.md"} <= files
    assert len(CURL_COMMANDS) >= 4
    assert set(RUN_ELSEWHERE) <= {block.id for block in PYTHON_BLOCKS}


def test_every_openai_example_bounds_its_output():
    # The chat default is the rest of the context (thousands of tokens: minutes on a CPU), so
    # every documented request gives a bound, in Python and in curl.
    for block in PYTHON_BLOCKS:
        for node in ast.walk(ast.parse(block.code)):
            is_create = isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "create"
            if is_create and "completions" in ast.unparse(node.func):
                given = {keyword.arg for keyword in node.keywords}
                assert given & {"max_tokens", "max_completion_tokens"}, (
                    block.id,
                    ast.unparse(node),
                )
    for block, words in CURL_COMMANDS:
        if "-d" in words or "--data" in words:
            body = json.loads(words[words.index("-d" if "-d" in words else "--data") + 1])
            if any("/v1/" in word for word in words):
                assert "max_tokens" in body, (block.id, body)
            elif any(word.endswith("/generate") for word in words):
                assert "max_new_tokens" in body.get("sampling_params", {}), (block.id, body)
