"""Shared fixtures. The suite builds the `tiny` model once, into a temporary cache.

Unless RADIXGEN_CACHE is already set, the session points it at a temporary folder (inherited by
any subprocess a test starts), so tests never touch ~/.cache and always use a fresh build.
The servers that several modules share (shared_servers.py) start on first use and stop at the
end of the session; one that a test stopped starts again for its next user. Under `make test`'s
two pytest-xdist workers each worker is a session: it builds its own tiny and starts the shared
servers its modules use.
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

from radixgen.runtime.hf_compat import import_installed_kernels
from radixgen.runtime.server.subprocess_launcher import ServerProcess

_SESSION_CACHE_KEY = "_radixgen_session_cache"


def _set_triton_interpreter() -> None:
    """Without CUDA, Triton kernels run through the interpreter; it must be chosen before
    triton is imported, so this runs at conftest import. On a GPU the real compiler is used."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


_set_triton_interpreter()


# Before any test imports a transformers model: `python -m pytest` puts the repository root,
# and with it the `kernels/` folder, on sys.path (runtime/hf_compat.py says why it matters).
import_installed_kernels()


def _load_hypothesis_profile() -> None:
    """Property tests draw the same examples on every run ("ci", the default: a red CI means a
    change broke something, never an unlucky draw, as test_server_fuzz already did);
    `HYPOTHESIS_PROFILE=explore make test` draws new ones each run, to look for new failures."""
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, database=None)
    settings.register_profile("explore", derandomize=False)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


_load_hypothesis_profile()


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
def shared_servers(tiny_model_path):  # the checkpoint is built once, before a server needs it
    """The shared servers by name (see `shared_server`), stopped at the end of the session."""
    servers: dict[str, ServerProcess] = {}
    yield servers
    for server in servers.values():
        server.close()


def shared_server(
    servers: dict[str, ServerProcess], name: str, flags: list[str], api_key: str | None = None
) -> ServerProcess:
    """The running server `name`: started on first use, and again after a test stopped it
    (test_server_faults' crash test kills the default one)."""
    server = servers.get(name)
    if server is not None and server.process.poll() is None:
        return server
    if server is not None:
        server.close()
    server = ServerProcess(flags, api_key=api_key)
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    servers[name] = server
    return server


@pytest.fixture(scope="module")
def default_server(shared_servers):
    """`radixgen serve --model-path tiny`, as the docs start it."""
    return shared_server(shared_servers, "default", DEFAULT_FLAGS)


@pytest.fixture(scope="module")
def hostile_server(shared_servers):
    """A small context, a body limit and a short header timeout, for bad requests."""
    return shared_server(shared_servers, "hostile", HOSTILE_FLAGS)


@pytest.fixture(scope="session")
def chat_template_file(tmp_path_factory) -> str:
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(CHAT_TEMPLATE_FILE_TEXT)
    return str(template)


@pytest.fixture(scope="session")
def lora_adapter_paths(tiny_model_path, tmp_path_factory) -> dict[str, str]:
    """Two random PEFT LoRA adapters of tiny, "a" and "b", on every projection."""
    # Imported here: at the top they would import Triton before its interpreter is chosen.
    import torch
    import transformers
    from lora_fixtures import save_random_adapter

    root = tmp_path_factory.mktemp("server-lora")
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    return {
        name: str(save_random_adapter(base, root / name, "all", seed=seed))
        for name, seed in [("a", 1), ("b", 2)]
    }


@pytest.fixture(scope="module")
def openai_server(shared_servers, chat_template_file, lora_adapter_paths):
    """An API key, tool calls, open /metrics, a chat template file and LoRA adapter "a"."""
    flags = openai_flags(chat_template_file, lora_adapter_paths["a"])
    return shared_server(shared_servers, "openai", flags, api_key=OPENAI_API_KEY)


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
