"""The expressions a program appends to its state: text, gen, select and role markers.

`rg.gen(...)`, `rg.select(...)`, `rg.user(...)` only *describe* a step; nothing runs until
the expression is appended to a program state (`s += ...`). Expressions concatenate with
`+` (`"Q: " + rg.gen("a")`), and `flatten()` turns any of them into the flat list of
primitive steps the executor runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from radixgen.errors import ExpressionOutsideProgramError

Role = Literal["system", "user", "assistant"]
ROLES: tuple[str, ...] = Role.__args__


class ChoicesMethod(str, Enum):
    """How `rg.select` scores its choices from their prompt logprobs."""

    TOKEN_LENGTH_NORMALIZED = "token_length_normalized"  # mean logprob of the choice tokens
    GREEDY_TOKEN_SELECTION = "greedy_token_selection"  # greedy walk over the choices' tokens
    UNCONDITIONAL_LIKELIHOOD_NORMALIZED = "unconditional_likelihood_normalized"  # minus prior


class Expr:
    """Base of every DSL expression. Concatenates with `+`; is never a string itself."""

    def __add__(self, other: Any) -> Sequence:
        return Sequence((self, to_expr(other)))

    def __radd__(self, other: Any) -> Sequence:
        return Sequence((to_expr(other), self))

    def _misuse(self) -> ExpressionOutsideProgramError:
        return ExpressionOutsideProgramError(
            f"{self!r} is a program step, not a value: append it to a program state inside "
            "an @rg.function (`s += rg.gen('name')`) and read the result with s['name']"
        )

    def __str__(self) -> str:
        raise self._misuse()

    def __format__(self, format_spec: str) -> str:
        raise self._misuse()  # f"{rg.gen('x')}" would silently embed nothing useful

    def __bool__(self) -> bool:
        raise self._misuse()


@dataclass(frozen=True, repr=False)
class Text(Expr):
    text: str

    def __repr__(self) -> str:
        return f"Text({self.text!r})"


@dataclass(frozen=True, repr=False)
class Gen(Expr):
    """Generate text; store it under `name` (None: append only)."""

    name: str | None
    # The options rg.gen was given (validated, normalised): SamplingParams fields and
    # request options of radixgen.runtime.request_schema; unset ones come from the run.
    options: dict[str, Any] = field(hash=False)
    # rg.gen(tools=...): the output is a tool call's JSON, stored parsed.
    parses_tool_call: bool = False

    def __repr__(self) -> str:
        return f"rg.gen({self.name!r})"


@dataclass(frozen=True, repr=False)
class Select(Expr):
    """Append the most likely of `choices` (scored from prompt logprobs, no sampling)."""

    name: str | None
    choices: tuple[str, ...]
    method: ChoicesMethod

    def __repr__(self) -> str:
        return f"rg.select({self.name!r}, choices={list(self.choices)!r})"


@dataclass(frozen=True, repr=False)
class RoleBegin(Expr):
    role: str

    def __repr__(self) -> str:
        return f"rg.{self.role}_begin()"


@dataclass(frozen=True, repr=False)
class RoleEnd(Expr):
    role: str

    def __repr__(self) -> str:
        return f"rg.{self.role}_end()"


@dataclass(frozen=True, repr=False)
class Sequence(Expr):
    items: tuple[Expr, ...]

    def __repr__(self) -> str:
        return " + ".join(repr(item) for item in self.items)


Primitive = Text | Gen | Select | RoleBegin | RoleEnd


def to_expr(value: Any) -> Expr:
    """A str or an expression -> an expression.

    Raises:
        TypeError: anything else (convert numbers etc. with str() first).
    """
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    raise TypeError(
        f"can only append str or radixgen expressions to a program state, got "
        f"{type(value).__name__}; convert it with str() first"
    )


def flatten(expr: Expr) -> list[Primitive]:
    """The primitive steps of `expr`, in order (adjacent texts merged)."""
    steps: list[Primitive] = []
    pending = [expr]
    while pending:
        item = pending.pop()
        if isinstance(item, Sequence):
            pending.extend(reversed(item.items))
        elif isinstance(item, Text) and steps and isinstance(steps[-1], Text):
            steps[-1] = Text(steps[-1].text + item.text)
        else:
            steps.append(item)
    return [step for step in steps if not (isinstance(step, Text) and step.text == "")]


def role_expr(role: str, body: Any = None) -> Expr:
    """`rg.user(body)`: the body wrapped in the role's begin and end markers."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    if body is None:
        return Sequence((RoleBegin(role), RoleEnd(role)))
    return Sequence((RoleBegin(role), to_expr(body), RoleEnd(role)))


def check_choices_method(method: Any) -> ChoicesMethod:
    try:
        return ChoicesMethod(method)
    except ValueError:
        allowed = [m.value for m in ChoicesMethod]
        raise ValueError(f"choices_method must be one of {allowed}, got {method!r}") from None


@contextmanager
def role_block(target: Any, role: str) -> Iterator[Any]:
    """`with s.user():` - appends the role's begin marker to `target` (a program state),
    then its end marker after the body. When the body raises, the end is not appended and
    the error propagates unchanged."""
    target += RoleBegin(role)
    yield target
    target += RoleEnd(role)
