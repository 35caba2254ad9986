"""radixgen: write LLM programs as Python functions; run them fast.

    import radixgen as rg

    @rg.function
    def qa(s, question):
        s += rg.user(question)
        s += rg.assistant(rg.gen("answer", max_tokens=64))

    state = qa.run(question="What is a radix tree?", backend=rg.Engine())
    print(state["answer"])

Every export is lazy (PEP 562): `import radixgen` imports nothing else, so
`import radixgen.radix_cache` (or any other layer) does not load the DSL; `rg.gen` loads the
DSL on first use, `rg.Engine` the runtime (torch, transformers), and the HTTP backends
httpx / openai when one is built.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Public name -> the module that defines it (imported on first access).
_EXPORTS: dict[str, str] = {
    "Backend": "radixgen.backends.base",
    "get_default_backend": "radixgen.context",
    "set_default_backend": "radixgen.context",
    "ChoicesMethod": "radixgen.ir",
    "Program": "radixgen.program",
    "function": "radixgen.program",
    "ForkGroup": "radixgen.state",
    "ProgramState": "radixgen.state",
    "Engine": "radixgen.runtime.engine",
    "ServerArgs": "radixgen.runtime.server_args",
    "RuntimeEndpoint": "radixgen.backends",
    "OpenAI": "radixgen.backends",
}
_EXPORTS.update(
    dict.fromkeys(
        [
            "BackendError",
            "BackendUnreachableError",
            "ExpressionOutsideProgramError",
            "NoBackendError",
            "ProgramError",
            "RoleNestingError",
            "StateClosedError",
            "UnknownVariableError",
            "UnsupportedFeatureError",
        ],
        "radixgen.errors",
    )
)
_EXPORTS.update(
    dict.fromkeys(
        [
            "assistant",
            "assistant_begin",
            "assistant_end",
            "gen",
            "select",
            "system",
            "system_begin",
            "system_end",
            "user",
            "user_begin",
            "user_end",
        ],
        "radixgen.primitives",
    )
)
# SGLang-style names for the select methods: rg.select(..., choices_method=rg.greedy_token_selection)
_CHOICES_METHODS = {
    "token_length_normalized": "TOKEN_LENGTH_NORMALIZED",
    "greedy_token_selection": "GREEDY_TOKEN_SELECTION",
    "unconditional_likelihood_normalized": "UNCONDITIONAL_LIKELIHOOD_NORMALIZED",
}

__all__ = sorted([*_EXPORTS, *_CHOICES_METHODS])


def __getattr__(name: str):
    if name in _CHOICES_METHODS:
        value = getattr(__getattr__("ChoicesMethod"), _CHOICES_METHODS[name])
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'radixgen' has no attribute {name!r}")
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
