"""Finds the constant text a batch of programs starts with, so run_batch can cache it once.

Each program is dry-run against a `PrefixTracer` that renders appended text and roles
exactly like a real state, and stops the program at its first step whose text is not
known in advance (a gen, a select, a read, a fork). The common prefix of those texts
over the batch is prefilled once before the batch starts.

The dry run executes the program's Python up to its first gen: side effects there (a
print, a tool call) happen twice. Pass `warm_prefix=False` to run_batch to avoid that.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from radixgen.chat_template import ChatTemplate
from radixgen.ir import RoleBegin, RoleEnd, Text, flatten, role_block, to_expr
from radixgen.transcript import Transcript


class _PrefixEnd(Exception):
    """Stops a dry run at its first non-constant step. Raising is the only way to leave
    user code at an arbitrary point; it never escapes `trace_prefix`."""


class PrefixTracer:
    """Stands in for a ProgramState during a dry run."""

    def __init__(self, template: Callable[[], ChatTemplate]):
        self.transcript = Transcript()
        self._template = template

    def __iadd__(self, expr: Any) -> PrefixTracer:
        for step in flatten(to_expr(expr)):
            if isinstance(step, Text):
                self.transcript.add_text(step.text)
            elif isinstance(step, RoleBegin):
                self.transcript.begin_role(step.role, self._template())
            elif isinstance(step, RoleEnd):
                self.transcript.end_role(step.role, self._template())
            else:
                raise _PrefixEnd
        return self

    def system(self) -> AbstractContextManager[PrefixTracer]:
        return role_block(self, "system")

    def user(self) -> AbstractContextManager[PrefixTracer]:
        return role_block(self, "user")

    def assistant(self) -> AbstractContextManager[PrefixTracer]:
        return role_block(self, "assistant")

    def __getattr__(self, name: str) -> Any:
        raise _PrefixEnd  # any other use of the state (fork, text, ...) needs real values

    def __getitem__(self, name: str) -> Any:
        raise _PrefixEnd

    def __setitem__(self, name: str, value: Any) -> None:
        raise _PrefixEnd

    def __contains__(self, name: str) -> bool:
        raise _PrefixEnd


def trace_prefix(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    template: Callable[[], ChatTemplate],
) -> str:
    """The text `func(state, *args, **kwargs)` appends before its first non-constant step."""
    tracer = PrefixTracer(template)
    try:
        func(tracer, *args, **kwargs)
    except _PrefixEnd:
        pass
    except Exception:  # the real run reports it; the prefix traced so far still holds
        pass
    return tracer.transcript.text


def common_prefix(texts: list[str]) -> str:
    return os.path.commonprefix(texts) if texts else ""
