"""radixgen: write LLM programs as Python functions; run them fast.

`import radixgen as rg` stays light: the runtime (torch, transformers) is imported only
when an in-process Engine is created.
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy: `rg.Engine` imports the runtime (torch) on first use only.
    if name == "Engine":
        from radixgen.runtime.engine import Engine

        return Engine
    if name == "ServerArgs":
        from radixgen.runtime.server_args import ServerArgs

        return ServerArgs
    raise AttributeError(f"module 'radixgen' has no attribute {name!r}")
