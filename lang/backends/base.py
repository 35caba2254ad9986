"""`Backend`: what the DSL needs from a model server, and the values that cross it.

A backend is called from the executor's worker threads, possibly from several at once
(forks, run_batch); implementations must be thread-safe. Every method is synchronous.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from radixgen.chat_template import ChatTemplate
from radixgen.ir import ChoicesMethod
from radixgen.runtime.request_schema import GenerateReq


@dataclass(frozen=True)
class Prompt:
    """A program's text at the point of a gen/select.

    `messages` is the conversation so far, with the open message last (its role is
    `open_role`); chat-only backends (OpenAI) send it instead of the rendered `text`.
    """

    text: str
    messages: list[dict[str, str]] = field(default_factory=list)
    open_role: str | None = None


@dataclass(frozen=True)
class GenerateOutput:
    """The generated text and its meta info (prompt_tokens, completion_tokens,
    cached_tokens, finish_reason, and logprobs when asked for)."""

    text: str
    meta_info: dict[str, Any]


@dataclass(frozen=True)
class StreamDelta:
    """New text of a streaming generation; `meta_info` is set on the last delta only."""

    text: str
    meta_info: dict[str, Any] | None = None


@dataclass(frozen=True)
class SelectOutcome:
    """The picked choice, the score of every choice (pick = argmax), and meta info."""

    index: int
    scores: list[Any]
    meta_info: dict[str, Any]


class Backend(ABC):
    """The interface the executor calls. `rg.Engine` objects are wrapped by
    `EngineBackend`; `RuntimeEndpoint` and `OpenAI` implement it over HTTP."""

    @abstractmethod
    def chat_template(self) -> ChatTemplate:
        """How roles are rendered into text (cached by the backend)."""

    @abstractmethod
    def generate(self, prompt: Prompt, request: GenerateReq) -> GenerateOutput:
        """Generates a completion of `prompt` (`request.text` is its text) as `request`
        (a validated request of radixgen.runtime.request_schema) says."""

    @abstractmethod
    def generate_stream(self, prompt: Prompt, request: GenerateReq) -> Iterator[StreamDelta]:
        """Generates a completion, yielding text deltas as they arrive."""

    @abstractmethod
    def prefill(self, text: str) -> dict[str, Any]:
        """Runs the prompt only (no new tokens) so the runtime caches its KV; returns
        the meta info (prompt_tokens, cached_tokens)."""

    @abstractmethod
    def select(self, prompt: Prompt, choices: list[str], method: ChoicesMethod) -> SelectOutcome:
        """Picks the choice that best continues `prompt`, without sampling."""

    def close(self) -> None:  # noqa: B027 - optional hook; most backends hold nothing
        """Releases connections (the backend stays usable only if it reopens them)."""
