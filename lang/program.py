"""`@rg.function` and `Program`: run a prompt program once, streaming, or over a batch."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Literal

from radixgen.backends.base import Backend
from radixgen.context import resolve_backend
from radixgen.executor import ProgramExecutor
from radixgen.prefix_trace import common_prefix, trace_prefix
from radixgen.runtime.request_schema import validate_fields
from radixgen.state import ProgramState, RunScope

logger = logging.getLogger(__name__)

# run_batch's "auto" thread count: programs mostly wait on the backend, so many threads
# keep the runtime's batch full; the cap bounds memory for huge batches.
_AUTO_THREADS_MIN = 32
_AUTO_THREADS_PER_CPU = 4
_AUTO_THREADS_MAX = 256


# Keyword options of run()/run_batch(); a program parameter with one of these names could
# never be passed, so @rg.function refuses it.
_SAMPLING_OPTIONS = frozenset(
    {
        "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
        "presence_penalty", "stop", "ignore_eos", "seed", "lora_path",
    }
)  # fmt: skip
_RUN_OPTIONS = _SAMPLING_OPTIONS | {
    "backend", "stream", "num_threads", "progress_bar", "warm_prefix"
}  # fmt: skip


def _sampling_defaults(**values: Any) -> dict[str, Any]:
    """The run's sampling defaults that were given (None: unset), checked field by field."""
    return validate_fields({name: value for name, value in values.items() if value is not None})


@dataclass(frozen=True)
class Arguments:
    """A program's arguments, bound and checked against its signature."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Program:
    """A prompt program: `def prog(s, **args)` made runnable by `@rg.function`."""

    def __init__(self, func: Callable[..., Any], bound_arguments: dict[str, Any] | None = None):
        if not callable(func):
            raise TypeError(f"@rg.function needs a function, got {type(func).__name__}")
        parameters = list(inspect.signature(func).parameters)
        if not parameters:
            raise TypeError(
                f"program {func.__name__!r} must take the state as its first argument: "
                f"def {func.__name__}(s, ...)"
            )
        shadowed = sorted(set(parameters[1:]) & _RUN_OPTIONS)
        if shadowed:
            raise TypeError(
                f"program {func.__name__!r} has parameter(s) {shadowed} that run() takes as "
                "its own options; rename them"
            )
        self.func = func
        self.bound_arguments = dict(bound_arguments or {})
        functools.update_wrapper(self, func)

    def bind(self, **arguments: Any) -> Program:
        """A copy of the program with some arguments fixed."""
        self._bind_arguments((), {**self.bound_arguments, **arguments}, partial=True)
        return Program(self.func, {**self.bound_arguments, **arguments})

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)

    def run(
        self,
        *args: Any,
        backend: Any = None,
        stream: bool = False,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        frequency_penalty: float | None = None,
        presence_penalty: float | None = None,
        stop: str | list[str] | None = None,
        ignore_eos: bool | None = None,
        seed: int | None = None,
        lora_path: str | None = None,
        **kwargs: Any,
    ) -> ProgramState:
        """Runs the program with `kwargs` (and `args`) as its arguments.

        The sampling options (and `lora_path`, the LoRA adapter) are defaults for every gen
        that does not set its own. With
        `stream=True` the program runs in a background thread and this returns at once:
        iterate `state.text_iter()`; otherwise it returns when everything has run.

        Raises:
            NoBackendError: no `backend` and no default backend.
            TypeError: the arguments do not match the program's signature.
            Any error a step or the program raised (non-streaming runs).
        """
        defaults = _sampling_defaults(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            stop=stop,
            ignore_eos=ignore_eos,
            seed=seed,
            lora_path=lora_path,
        )
        arguments = self._bind_arguments(args, {**self.bound_arguments, **kwargs})
        state, scope = self._new_state(resolve_backend(backend), defaults, stream=stream)
        if stream:
            threading.Thread(
                target=self._execute_recorded, args=(state, scope, arguments), daemon=True
            ).start()
            return state
        scope.enter_program()
        try:
            self.func(state, *arguments.args, **arguments.kwargs)
            scope.sync_all()
        finally:
            scope.finish()
        return state

    def run_batch(
        self,
        batch_arguments: list[dict[str, Any]],
        *,
        backend: Any = None,
        num_threads: int | Literal["auto"] = "auto",
        progress_bar: bool = True,
        warm_prefix: bool = True,
        **sampling_defaults: Any,
    ) -> list[ProgramState]:
        """Runs the program once per argument dict, concurrently; returns the states in
        input order. A failing program does not stop the others: its state's `error`
        holds the exception.

        With `warm_prefix`, the text every program starts with is found by a dry run of
        each (see `prefix_trace`) and prefilled once before the batch, so every program
        finds it in the runtime's cache. `sampling_defaults` are `run()`'s sampling options.

        Raises:
            TypeError / ValueError: bad `batch_arguments`, `num_threads` or option.
        """
        if not isinstance(batch_arguments, (list, tuple)) or not all(
            isinstance(a, dict) for a in batch_arguments
        ):
            raise TypeError("batch_arguments must be a list of dicts (one per program run)")
        if not batch_arguments:
            return []
        max_workers = _thread_count(num_threads, len(batch_arguments))
        unknown = sorted(set(sampling_defaults) - _SAMPLING_OPTIONS)
        if unknown:
            raise TypeError(
                f"run_batch got unknown option(s) {unknown}; program arguments go in "
                f"batch_arguments, sampling options are {sorted(_SAMPLING_OPTIONS)}"
            )
        defaults = _sampling_defaults(**sampling_defaults)
        resolved = resolve_backend(backend)
        bound = [self._bind_arguments((), {**self.bound_arguments, **a}) for a in batch_arguments]
        if warm_prefix and len(bound) > 1:
            self._warm_common_prefix(resolved, bound)
        runs = [self._new_state(resolved, defaults, stream=False) for _ in bound]
        from tqdm.auto import tqdm

        with (
            ThreadPoolExecutor(max_workers=max_workers) as pool,
            tqdm(total=len(bound), disable=not progress_bar, desc=self.__name__) as bar,
        ):
            futures = [
                pool.submit(self._execute_recorded, state, scope, arguments)
                for (state, scope), arguments in zip(runs, bound, strict=True)
            ]
            for _ in as_completed(futures):
                bar.update(1)
        return [state for state, _ in runs]

    # ---- internals ----

    def _new_state(
        self, backend: Backend, defaults: dict[str, Any], *, stream: bool
    ) -> tuple[ProgramState, RunScope]:
        scope = RunScope(background=stream)
        executor = ProgramExecutor(backend, defaults, stream=stream)
        scope.add(executor)
        return ProgramState(executor, scope), scope

    def _execute_recorded(self, state: ProgramState, scope: RunScope, arguments: Arguments) -> None:
        """Runs the program; an error is recorded on the state instead of raised."""
        scope.enter_program()
        try:
            self.func(state, *arguments.args, **arguments.kwargs)
            scope.sync_all()
        except Exception as error:
            state.error = error
            logger.debug("program %s failed: %r", self.__name__, error)
        scope.finish(state.error)

    def _warm_common_prefix(self, backend: Backend, bound: list[Arguments]) -> None:
        prefixes = [trace_prefix(self.func, a.args, a.kwargs, backend.chat_template) for a in bound]
        prefix = common_prefix(prefixes)
        if prefix:
            meta_info = backend.prefill(prefix)
            logger.info(
                "run_batch: prefilled a %d-token common prefix", meta_info.get("prompt_tokens", 0)
            )

    def _bind_arguments(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], *, partial: bool = False
    ) -> Arguments:
        """The program's arguments (after the state); a TypeError names a missing or
        unknown one."""
        signature = inspect.signature(self.func)
        binder = signature.bind_partial if partial else signature.bind
        try:
            bound = binder(None, *args, **kwargs)  # None stands for the state
        except TypeError as error:
            raise TypeError(f"program {self.__name__!r}: {error}") from None
        return Arguments(bound.args[1:], bound.kwargs)

    def __repr__(self) -> str:
        return f"<radixgen program {self.__name__}>"


def function(func: Callable[..., Any]) -> Program:
    """Decorator: `@rg.function def prog(s, question): s += ...` makes a `Program`."""
    return Program(func)


def _thread_count(num_threads: int | str, batch_size: int) -> int:
    if num_threads == "auto":
        auto = max(_AUTO_THREADS_MIN, _AUTO_THREADS_PER_CPU * (os.cpu_count() or 1))
        return max(1, min(batch_size, auto, _AUTO_THREADS_MAX))
    if type(num_threads) is not int or num_threads < 1:
        raise ValueError(f"num_threads must be 'auto' or an int >= 1, got {num_threads!r}")
    return num_threads
