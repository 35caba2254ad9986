"""`ProgramState` (the `s` of a program) and `ForkGroup` (what `s.fork(n)` returns)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager
from typing import Any

from radixgen.errors import RoleNestingError, UnknownVariableError
from radixgen.executor import ProgramExecutor, SetVariable
from radixgen.ir import Primitive, RoleBegin, RoleEnd, flatten, role_block, to_expr


class RunScope:
    """One program run: every executor of it (the root state and its forks), so the run
    can wait for all of them and close them, and whether the program function is done.

    In a `stream=True` run, reads from any thread but the program's (the caller's) wait
    for the whole program first, so `state["answer"]` never races a program that has not
    appended the gen yet. Reads from the program's own thread wait only for queued steps.
    """

    def __init__(self, *, background: bool = False) -> None:
        self._background = background
        self._executors: list[ProgramExecutor] = []
        self._lock = threading.Lock()
        self._program_thread: int | None = None
        self._done = threading.Event()

    def enter_program(self) -> None:
        """Marks the calling thread as the one running the program function."""
        self._program_thread = threading.get_ident()

    def wait_if_outside(self) -> None:
        if self._background and threading.get_ident() != self._program_thread:
            self._done.wait()

    def add(self, executor: ProgramExecutor) -> None:
        with self._lock:
            self._executors.append(executor)

    def sync_all(self) -> None:
        """Waits for every state of the run (forks too); raises the first step error."""
        with self._lock:
            executors = list(self._executors)
        for executor in executors:
            executor.sync()

    def finish(self, program_error: BaseException | None = None) -> None:
        """Waits for queued steps everywhere, then closes every state of the run; stream
        readers then see `program_error` (an exception the program function raised)."""
        with self._lock:
            executors = list(self._executors)
        for executor in executors:
            executor.wait_idle()
        for executor in executors:
            executor.close(program_error)
        self._done.set()


class ProgramState:
    """The state of a running program: its text, variables and messages.

    Append with `s += "text"`, `s += rg.gen("name")`, ...; read with `s["name"]`,
    `s.text()`, `s.messages()`, `s.get_meta_info("name")`. Reads wait for the queued steps
    and raise the error of a failed one. After `run_batch`, a failed program's state
    holds the exception in `error`.
    """

    def __init__(self, executor: ProgramExecutor, scope: RunScope, open_role: str | None = None):
        self._executor = executor
        self._scope = scope
        self._open_role = open_role  # tracked as steps are queued, to reject nesting early
        self.error: BaseException | None = None

    # ---- appending ----

    def __iadd__(self, expr: Any) -> ProgramState:
        steps = flatten(to_expr(expr))
        self._open_role = _role_after(steps, self._open_role)
        for step in steps:
            self._executor.submit(step)
        return self

    def __setitem__(self, name: str, value: Any) -> None:
        if not isinstance(name, str):
            raise TypeError(f"variable names are strings, got {name!r}")
        self._executor.submit(SetVariable(name, value))

    def system(self) -> AbstractContextManager[ProgramState]:
        """`with s.system(): ...` wraps what the body appends in a system message."""
        return role_block(self, "system")

    def user(self) -> AbstractContextManager[ProgramState]:
        """`with s.user(): ...` wraps what the body appends in a user message."""
        return role_block(self, "user")

    def assistant(self) -> AbstractContextManager[ProgramState]:
        """`with s.assistant(): ...` wraps what the body appends in an assistant message."""
        return role_block(self, "assistant")

    # ---- reading ----

    def sync(self) -> None:
        """Waits for every queued step (and, outside the program, for the program to
        finish); raises the error of a failed step."""
        self._scope.wait_if_outside()
        self._executor.sync()

    def __getitem__(self, name: str) -> Any:
        self.sync()
        if name not in self._executor.variables:
            raise UnknownVariableError(name, list(self._executor.variables))
        return self._executor.variables[name]

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self._executor.variables

    def variables(self) -> dict[str, Any]:
        """A copy of every variable set so far."""
        self.sync()
        return dict(self._executor.variables)

    def get_meta_info(self, name: str) -> dict[str, Any]:
        """Meta info of the gen/select that set `name`: prompt_tokens, completion_tokens,
        cached_tokens, finish_reason (plus logprobs, or select scores)."""
        self.sync()
        if name not in self._executor.meta_infos:
            raise UnknownVariableError(name, list(self._executor.meta_infos))
        return self._executor.meta_infos[name]

    def text(self) -> str:
        """The whole text so far, roles rendered by the chat template."""
        self.sync()
        return self._executor.transcript.text

    def messages(self) -> list[dict[str, str]]:
        """The chat messages so far, OpenAI style (an open message is included)."""
        self.sync()
        return self._executor.transcript.messages_with_open()

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Yields the text as it is produced (run with stream=True for token deltas); with
        `var_name`, only that variable's chunks, ending when it is complete."""
        yield from self._executor.text_stream.iter_text(var_name)
        self._check_streamed(var_name)

    async def text_async_iter(self, var_name: str | None = None) -> AsyncIterator[str]:
        """`text_iter` as an async iterator (`async for chunk in s.text_async_iter()`)."""
        async for chunk in self._executor.text_stream.aiter_text(var_name):
            yield chunk
        self._check_streamed(var_name)

    def _check_streamed(self, var_name: str | None) -> None:
        if var_name is not None and var_name not in self._executor.variables:
            raise UnknownVariableError(var_name, list(self._executor.variables))

    # ---- forking ----

    def fork(self, num_forks: int = 1) -> ForkGroup:
        """`num_forks` child states that continue from this text.

        Waits for this state's queued steps, prefills the shared text once (so the
        runtime caches its KV), then returns the children; their steps run concurrently.
        """
        if type(num_forks) is not int or num_forks < 1:
            raise ValueError(f"num_forks must be an int >= 1, got {num_forks!r}")
        self.sync()
        parent = self._executor
        prefill_meta_info = (
            parent.backend.prefill(parent.transcript.text) if parent.transcript.text else {}
        )
        children = []
        for _ in range(num_forks):
            executor = ProgramExecutor(
                parent.backend,
                parent.defaults,
                stream=parent.stream,
                transcript=parent.transcript.copy(),
                variables=parent.variables,
                meta_infos=parent.meta_infos,
            )
            self._scope.add(executor)
            children.append(ProgramState(executor, self._scope, self._open_role))
        return ForkGroup(self, children, prefill_meta_info)

    def __repr__(self) -> str:
        status = f"error={self.error!r}" if self.error else "ok"
        return f"ProgramState({status})"


class ForkGroup:
    """The children of `s.fork(n)`: index or iterate them, `forks += expr` appends to
    each, `forks["name"]` lists a variable across them, `join()` gathers into the parent."""

    def __init__(
        self,
        parent: ProgramState,
        children: list[ProgramState],
        prefill_meta_info: dict[str, Any],
    ):
        self.parent = parent
        self.children = children
        self.prefill_meta_info = prefill_meta_info  # of the one shared-prefix prefill
        self._names_at_fork = set(parent._executor.variables)

    def __len__(self) -> int:
        return len(self.children)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.children)

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, str):
            return [child[key] for child in self.children]
        return self.children[key]

    def __setitem__(self, index: int, child: ProgramState) -> None:
        # `forks[i] += expr` appends in place, then assigns the same child back
        if child is not self.children[index]:
            raise TypeError("a fork group's children cannot be replaced")

    def __iadd__(self, expr: Any) -> ForkGroup:
        for child in self.children:
            child += expr
        return self

    def join(self) -> list[ProgramState]:
        """Waits for every child; each variable a child set after the fork becomes a
        list (one entry per child, None where unset) in the parent. Returns the children."""
        for child in self.children:
            child.sync()
        names: list[str] = []
        for child in self.children:
            for name in child._executor.variables:
                if name not in names and _set_after_fork(name, child, self._names_at_fork):
                    names.append(name)
        for name in names:
            values = [child._executor.variables.get(name) for child in self.children]
            metas = [child._executor.meta_infos.get(name) for child in self.children]
            self.parent._executor.submit(SetVariable(name, values, metas))
        return self.children


def _set_after_fork(name: str, child: ProgramState, names_at_fork: set[str]) -> bool:
    return name not in names_at_fork or name in child._executor.assigned_names


def _role_after(steps: list[Primitive], open_role: str | None) -> str | None:
    """The open role after `steps`; raises before anything is queued if roles nest."""
    for step in steps:
        if isinstance(step, RoleBegin):
            if open_role is not None:
                raise RoleNestingError(
                    f"cannot open a {step.role!r} message inside the open {open_role!r} "
                    f"one: roles do not nest; close it first (rg.{open_role}_end(), or "
                    f"leave the `with s.{open_role}():` block)"
                )
            open_role = step.role
        elif isinstance(step, RoleEnd):
            if open_role != step.role:
                raise RoleNestingError(
                    f"cannot close {step.role!r}: the open role is {open_role!r}"
                )
            open_role = None
    return open_role
