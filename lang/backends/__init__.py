"""Backends: where the DSL sends its generations.

- `EngineBackend` wraps an in-process `rg.Engine` (any object with its `generate()`).
- `RuntimeEndpoint` talks to `radixgen serve` over its native HTTP API.
- `OpenAI` talks to any OpenAI-compatible server.

The HTTP backends import httpx / openai only when constructed.
"""

from radixgen.backends.base import (
    Backend,
    GenerateOutput,
    Prompt,
    SelectOutcome,
    StreamDelta,
)
from radixgen.backends.engine_backend import EngineBackend

__all__ = [
    "Backend",
    "EngineBackend",
    "GenerateOutput",
    "OpenAI",
    "Prompt",
    "RuntimeEndpoint",
    "SelectOutcome",
    "StreamDelta",
]


def __getattr__(name):
    if name == "RuntimeEndpoint":
        from radixgen.backends.runtime_endpoint import RuntimeEndpoint

        return RuntimeEndpoint
    if name == "OpenAI":
        from radixgen.backends.openai_backend import OpenAI

        return OpenAI
    raise AttributeError(f"module 'radixgen.backends' has no attribute {name!r}")
