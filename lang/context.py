"""Where programs find their backend when `run(...)` is not given one.

`rg.set_default_backend(backend)` stores the backend on `DEFAULT_CONTEXT`, the one
process-wide `BackendContext`. It is the only mutable module-level object of the DSL, kept
because scripts expect to set a backend once; programs can always pass `backend=`
explicitly instead, and tests should.
"""

from __future__ import annotations

import threading
from typing import Any

from radixgen.backends.base import Backend
from radixgen.errors import NoBackendError


class BackendContext:
    """Holds a default backend; reads and writes are thread-safe."""

    def __init__(self) -> None:
        self._backend: Backend | None = None
        self._lock = threading.Lock()

    def set(self, backend: Backend | None) -> None:
        with self._lock:
            self._backend = backend

    def get(self) -> Backend | None:
        with self._lock:
            return self._backend


DEFAULT_CONTEXT = BackendContext()


def as_backend(backend: Any) -> Backend:
    """A Backend as is; any object with a `generate()` method (an `rg.Engine`) wrapped in
    an `EngineBackend`.

    Raises:
        TypeError: `backend` is neither.
    """
    if isinstance(backend, Backend):
        return backend
    if callable(getattr(backend, "generate", None)):
        from radixgen.backends.engine_backend import EngineBackend

        return EngineBackend(backend)
    raise TypeError(
        "backend must be an rg.Engine, rg.RuntimeEndpoint, rg.OpenAI or another "
        f"radixgen.backends.Backend, got {type(backend).__name__}"
    )


def set_default_backend(backend: Any) -> Backend:
    """Makes `backend` the one programs use when `run()` gets no `backend=`; returns the
    wrapped backend (an Engine is wrapped once here, so its chat template is derived once)."""
    wrapped = as_backend(backend)
    DEFAULT_CONTEXT.set(wrapped)
    return wrapped


def get_default_backend() -> Backend | None:
    return DEFAULT_CONTEXT.get()


def resolve_backend(backend: Any) -> Backend:
    """The backend a run uses: the explicit one, else the default.

    Raises:
        NoBackendError: neither is set.
    """
    if backend is not None:
        return as_backend(backend)
    default = DEFAULT_CONTEXT.get()
    if default is None:
        raise NoBackendError(
            "no backend: pass backend=... to run()/run_batch(), or call "
            "rg.set_default_backend(rg.Engine(...) or rg.RuntimeEndpoint(url)) first"
        )
    return default
