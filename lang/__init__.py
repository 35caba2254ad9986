"""radixgen: write LLM programs as Python functions; run them fast.

    import radixgen as rg

    @rg.function
    def qa(s, question):
        s += rg.user(question)
        s += rg.assistant(rg.gen("answer", max_tokens=64))

    state = qa.run(question="What is a radix tree?", backend=rg.Engine())
    print(state["answer"])

`import radixgen as rg` stays light: the runtime (torch, transformers) is imported only
when an in-process Engine is created, and the HTTP clients only when a backend is built.
"""

from radixgen.backends.base import Backend
from radixgen.context import get_default_backend, set_default_backend
from radixgen.errors import (
    BackendError,
    BackendUnreachableError,
    ExpressionOutsideProgramError,
    NoBackendError,
    ProgramError,
    RoleNestingError,
    StateClosedError,
    UnknownVariableError,
    UnsupportedFeatureError,
)
from radixgen.ir import ChoicesMethod
from radixgen.primitives import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from radixgen.program import Program, function
from radixgen.state import ForkGroup, ProgramState

__version__ = "0.1.0"

# SGLang-style names for the select methods: rg.select(..., choices_method=rg.greedy_token_selection)
token_length_normalized = ChoicesMethod.TOKEN_LENGTH_NORMALIZED
greedy_token_selection = ChoicesMethod.GREEDY_TOKEN_SELECTION
unconditional_likelihood_normalized = ChoicesMethod.UNCONDITIONAL_LIKELIHOOD_NORMALIZED

__all__ = [
    "Backend",
    "BackendError",
    "BackendUnreachableError",
    "ChoicesMethod",
    "Engine",
    "ExpressionOutsideProgramError",
    "ForkGroup",
    "NoBackendError",
    "OpenAI",
    "Program",
    "ProgramError",
    "ProgramState",
    "RoleNestingError",
    "RuntimeEndpoint",
    "ServerArgs",
    "StateClosedError",
    "UnknownVariableError",
    "UnsupportedFeatureError",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "function",
    "gen",
    "get_default_backend",
    "greedy_token_selection",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
]


def __getattr__(name):
    # Lazy: `rg.Engine` imports the runtime (torch) on first use only; the HTTP backends
    # import httpx / openai on first use.
    if name == "Engine":
        from radixgen.runtime.engine import Engine

        return Engine
    if name == "ServerArgs":
        from radixgen.runtime.server_args import ServerArgs

        return ServerArgs
    if name in ("RuntimeEndpoint", "OpenAI"):
        import radixgen.backends

        return getattr(radixgen.backends, name)
    raise AttributeError(f"module 'radixgen' has no attribute {name!r}")
