"""The exceptions of the DSL; each names what went wrong and how to fix it."""

from __future__ import annotations


class ProgramError(Exception):
    """Base class of every error raised by the radixgen DSL."""


class ExpressionOutsideProgramError(ProgramError, TypeError):
    """An `rg.gen()`/`rg.select()`/role expression was used as a value instead of being
    appended to a program state (`s += rg.gen(...)` inside an `@rg.function`)."""


class UnknownVariableError(ProgramError, KeyError):
    """`s["name"]` or `s.get_meta_info("name")` for a name no gen/select/assignment set."""

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = known
        super().__init__(name)

    def __str__(self) -> str:
        known = ", ".join(repr(k) for k in self.known) or "none yet"
        return f"unknown variable {self.name!r}; variables set so far: {known}"


class RoleNestingError(ProgramError):
    """A role was opened inside another open role, or closed when it was not open."""


class NoBackendError(ProgramError):
    """A program ran with no `backend=` and no default backend set."""


class StateClosedError(ProgramError):
    """An expression was appended to a state whose program has already finished."""


class BackendError(ProgramError):
    """The backend rejected a request or answered something unusable."""


class BackendUnreachableError(BackendError, ConnectionError):
    """The backend's server could not be reached (wrong URL, not started, network)."""


class UnsupportedFeatureError(BackendError, NotImplementedError):
    """The backend cannot do what the program asked (e.g. regex on a plain OpenAI server)."""
