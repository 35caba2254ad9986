"""Shared fixtures. The suite builds the `tiny` model once, into a temporary cache.

Unless RADIXGEN_CACHE is already set, the session points it at a temporary folder (inherited by
any subprocess a test starts), so tests never touch ~/.cache and always use a fresh build.
The servers that several modules share (shared_servers.py) start on first use and stop at the
end of the session.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from shared_servers import (
    CHAT_TEMPLATE_FILE_TEXT,
    DEFAULT_FLAGS,
    HOSTILE_FLAGS,
    OPENAI_API_KEY,
    openai_flags,
)

from radixgen.runtime.server.subprocess_launcher import ServerProcess

_SESSION_CACHE_KEY = "_radixgen_session_cache"


def _set_triton_interpreter() -> None:
    """Without CUDA, Triton kernels run through the interpreter; it must be chosen before
    triton is imported, so this runs at conftest import. On a GPU the real compiler is used."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


_set_triton_interpreter()


def pytest_configure(config):
    if not os.environ.get("RADIXGEN_CACHE"):
        cache = tempfile.mkdtemp(prefix="radixgen-test-cache-")
        os.environ["RADIXGEN_CACHE"] = cache
        setattr(config, _SESSION_CACHE_KEY, cache)


def pytest_unconfigure(config):
    cache = getattr(config, _SESSION_CACHE_KEY, None)
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
        os.environ.pop("RADIXGEN_CACHE", None)


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """The local folder of the `tiny` checkpoint (built on first use in the session cache)."""
    from radixgen.runtime.tiny_model import resolve_model_path

    return resolve_model_path("tiny")


@pytest.fixture(scope="session")
def default_server(tiny_model_path):  # built once, before the server needs it
    """`radixgen serve --model-path tiny`, as the docs start it."""
    with ServerProcess(DEFAULT_FLAGS) as running:
        yield running


@pytest.fixture(scope="session")
def hostile_server(tiny_model_path):
    """A small context, a body limit and a short header timeout, for bad requests."""
    with ServerProcess(HOSTILE_FLAGS) as running:
        yield running


@pytest.fixture(scope="session")
def openai_server(tiny_model_path, tmp_path_factory):
    """An API key, tool calls, open /metrics and a chat template file, for OpenAI clients."""
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(CHAT_TEMPLATE_FILE_TEXT)
    with ServerProcess(openai_flags(str(template)), api_key=OPENAI_API_KEY) as running:
        yield running


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests need CUDA: skipped on CPU machines (CI), run on the H200."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def greedy_output_ids():
    """`(prompts, max_new_tokens, **server_args) -> output ids`: greedy continuations of
    token-id prompts through a real `Engine` (scheduler, radix cache, sampler), ignoring EOS."""
    return _greedy_output_ids


def _greedy_output_ids(
    prompts: list[list[int]], max_new_tokens: int, **server_args
) -> list[list[int]]:
    from radixgen.runtime.engine import Engine

    with Engine(**server_args) as engine:
        outputs = engine.generate(
            input_ids=prompts,
            sampling_params={
                "max_new_tokens": max_new_tokens,
                "temperature": 0,
                "ignore_eos": True,
            },
        )
    return [output["output_ids"] for output in outputs]
