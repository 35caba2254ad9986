"""Tool-call formats: how a model writes a function call, parsed out of its output text.

One parser per format, chosen by `--tool-call-parser` (SGLang's and vLLM's names are aliases):

    hermes (qwen25)         <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>
    llama3 (llama3_json)    {"name": "f", "parameters": {...}}    (`;`-separated, optional
                            <|python_tag|> first)
    mistral                 [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]

Each parser also writes the `structural_tag` that constrains a call under `tool_choice=auto`:
free text until the parser's trigger, then one of the functions' `begin` text, its arguments
under the function's JSON schema, and its `end`. So a call the model starts always parses.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # JSON text of an object, as OpenAI returns it


@dataclass(frozen=True)
class ParsedOutput:
    content: str  # the text outside the calls
    tool_calls: list[ParsedToolCall]


class ToolCallParser(ABC):
    """Finds and parses the calls of one format; `trigger` is the text a call starts with, and
    a call can only be complete once a character of `closing_chars` has been written."""

    trigger: str
    closing_chars: str

    def call_start(self, text: str) -> int | None:
        """Where the first call starts in `text`, or None (the text is plain content)."""
        index = text.find(self.trigger)
        return None if index < 0 else index

    def content_end(self, text: str) -> int:
        """How much of `text` (no call started in it) is surely content: a streamed text
        holds back a tail that may still become the start of a call."""
        for length in range(min(len(self.trigger) - 1, len(text)), 0, -1):
            if self.trigger.startswith(text[-length:]):
                return len(text) - length
        return len(text)

    @abstractmethod
    def parse(self, text: str) -> ParsedOutput:
        """The calls in a whole output and the content around them. A call that does not parse
        (the budget cut it, or the model wrote it unconstrained) stays content."""

    @abstractmethod
    def structural_tag(self, functions: list[dict[str, Any]]) -> dict[str, Any]:
        """The structural tag whose tagged bodies are calls of `functions` (tool_definitions)."""


def _call_of(value: Any, arguments_key: str) -> ParsedToolCall | None:
    """A {"name", arguments_key} object -> the call (None if it is not one)."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, value.get("arguments", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _prefix(name: str, arguments_key: str) -> str:
    return f'{{"name": {json.dumps(name)}, "{arguments_key}": '


class HermesParser(ToolCallParser):
    """Hermes / Qwen 2.5: each call in its own `<tool_call>...</tool_call>` block."""

    trigger = "<tool_call>"
    end = "</tool_call>"
    closing_chars = ">"
    _block = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

    def parse(self, text: str) -> ParsedOutput:
        calls, pieces, position = [], [], 0
        for match in self._block.finditer(text):
            try:
                call = _call_of(json.loads(match.group(1)), "arguments")
            except json.JSONDecodeError:
                call = None
            if call is None:
                continue
            calls.append(call)
            pieces.append(text[position : match.start()])
            position = match.end()
        pieces.append(text[position:])
        return ParsedOutput("".join(pieces), calls)

    def structural_tag(self, functions: list[dict[str, Any]]) -> dict[str, Any]:
        structures = [
            {
                "begin": f"{self.trigger}\n{_prefix(f['name'], 'arguments')}",
                "schema": f["parameters"],
                "end": f"}}\n{self.end}",
            }
            for f in functions
        ]
        return {"type": "structural_tag", "structures": structures, "triggers": [self.trigger]}


class Llama3JsonParser(ToolCallParser):
    """Llama 3.x JSON calls: the whole output is `{"name", "parameters"}` objects separated
    by `;` (after an optional `<|python_tag|>`); any other output is content."""

    trigger = '{"name": '
    python_tag = "<|python_tag|>"
    closing_chars = "}"

    def call_start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith(self.python_tag) or stripped.startswith(self.trigger):
            return len(text) - len(stripped)
        return None

    def content_end(self, text: str) -> int:
        stripped = text.lstrip()
        # Only the very start of an output can open a call.
        if any(p.startswith(stripped) for p in (self.trigger, self.python_tag)):
            return 0
        return len(text)

    def parse(self, text: str) -> ParsedOutput:
        start = self.call_start(text)
        if start is None:
            return ParsedOutput(text, [])
        body = text[start:].removeprefix(self.python_tag).strip()
        decoder, calls, position = json.JSONDecoder(), [], 0
        while position < len(body):
            try:
                value, position = decoder.raw_decode(body, position)
            except json.JSONDecodeError:
                return ParsedOutput(text, [])
            call = _call_of(value, "parameters")
            if call is None:
                return ParsedOutput(text, [])
            calls.append(call)
            rest = body[position:].lstrip()
            position = len(body) - len(rest.removeprefix(";").lstrip())
        return ParsedOutput(text[:start], calls)

    def structural_tag(self, functions: list[dict[str, Any]]) -> dict[str, Any]:
        structures = [
            {"begin": _prefix(f["name"], "parameters"), "schema": f["parameters"], "end": "}"}
            for f in functions
        ]
        return {"type": "structural_tag", "structures": structures, "triggers": [self.trigger]}


class MistralParser(ToolCallParser):
    """Mistral: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}` objects."""

    trigger = "[TOOL_CALLS]"
    closing_chars = "]"

    def parse(self, text: str) -> ParsedOutput:
        start = self.call_start(text)
        if start is None:
            return ParsedOutput(text, [])
        body = text[start + len(self.trigger) :].strip()
        try:
            value, end = json.JSONDecoder().raw_decode(body)
        except json.JSONDecodeError:
            return ParsedOutput(text, [])
        values = value if isinstance(value, list) else [value]
        calls = [_call_of(item, "arguments") for item in values]
        if not calls or None in calls:
            return ParsedOutput(text, [])
        return ParsedOutput(text[:start] + body[end:].strip(), calls)

    def structural_tag(self, functions: list[dict[str, Any]]) -> dict[str, Any]:
        structures = [
            {
                "begin": f"{self.trigger}[{_prefix(f['name'], 'arguments')}",
                "schema": f["parameters"],
                "end": "}]",
            }
            for f in functions
        ]
        return {"type": "structural_tag", "structures": structures, "triggers": [self.trigger]}


# Canonical names, then SGLang's and vLLM's spellings of the same formats.
TOOL_CALL_PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesParser,
    "llama3": Llama3JsonParser,
    "mistral": MistralParser,
}
TOOL_CALL_PARSER_ALIASES = {"qwen25": "hermes", "qwen": "hermes", "llama3_json": "llama3"}


def tool_call_parser(name: str) -> ToolCallParser:
    """The parser called `name` (a canonical name or an alias).

    Raises:
        ValueError: naming the accepted names.
    """
    canonical = TOOL_CALL_PARSER_ALIASES.get(name, name)
    if canonical not in TOOL_CALL_PARSERS:
        accepted = sorted([*TOOL_CALL_PARSERS, *TOOL_CALL_PARSER_ALIASES])
        raise ValueError(f"tool_call_parser must be one of {accepted}, got {name!r}")
    return TOOL_CALL_PARSERS[canonical]()
