"""Tool calling on /v1/chat/completions: what `tools` and `tool_choice` make of a request
(template tools, constraint) and of its output (content and `tool_calls`, streamed or whole).

    tool_choice  constraint on the output                       output read as
    none         none                                           content only
    auto         the parser's structural tag: free text, and    content + the parser's calls
                 every call the model starts under its schema   (llguidance backend)
    required     JSON: a list of {"name", "arguments"} calls    the list (one call unless
                 (schema: tool_call_schema of every tool)        parallel_tool_calls)
    named        JSON: that function's `parameters`             one call of that function

So every returned call parses and its arguments validate against the function's schema (unless
`constraint_budget` is off and `max_tokens` cut it; then the text stays content).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from radixgen.runtime.request_schema import RequestFieldError, tool_call_schema, tool_definitions
from radixgen.runtime.server.errors import RequestError
from radixgen.runtime.server.openai_protocol import (
    ChatCompletionRequest,
    NamedFunction,
    NamedToolChoice,
)
from radixgen.runtime.server.tool_parsers import ParsedOutput, ParsedToolCall, ToolCallParser

ToolMode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolPlan:
    """The tools of one chat request, validated, and how its output is constrained and read."""

    functions: list[dict[str, Any]]  # OpenAI function objects, `parameters` filled in
    mode: ToolMode
    parser: ToolCallParser
    parallel: bool  # parallel_tool_calls: more than one call per answer
    named: str | None = None  # the function of tool_choice {"type": "function", ...}

    def template_tools(self) -> list[dict[str, Any]] | None:
        """`tools` for the chat template (transformers' `apply_chat_template(tools=...)`)."""
        return [{"type": "function", "function": f} for f in self.functions] or None

    def constraint(self, *, structural_tags: bool) -> dict[str, Any]:
        """The sampling fields that constrain the output (see the module table).

        Args:
            structural_tags: the grammar backend takes structural tags (llguidance); without
                them `auto` leaves the output free (calls are parsed, not guaranteed).
        """
        if self.mode == "auto" and structural_tags:
            return {"structural_tag": self.parser.structural_tag(self.functions)}
        if self.mode == "required":
            calls = {"type": "array", "items": tool_call_schema(self.functions), "minItems": 1}
            if not self.parallel:
                calls["maxItems"] = 1
            return {"json_schema": calls}
        if self.mode == "named":
            function = next(f for f in self.functions if f["name"] == self.named)
            return {"json_schema": function["parameters"]}
        return {}

    def parse(self, text: str) -> ParsedOutput:
        """The content and calls of a whole output."""
        if self.mode == "none":
            return ParsedOutput(text, [])
        if self.mode == "auto":
            parsed = self.parser.parse(text)
            calls = parsed.tool_calls if self.parallel else parsed.tool_calls[:1]
            return ParsedOutput(parsed.content, calls)
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return ParsedOutput(text, [])  # cut raw by max_tokens (constraint_budget off)
        if self.mode == "named":
            return ParsedOutput("", [ParsedToolCall(self.named, json.dumps(value))])
        calls = [ParsedToolCall(c["name"], json.dumps(c["arguments"])) for c in value]
        return ParsedOutput("", calls)


def plan_tools(body: ChatCompletionRequest, parser: ToolCallParser) -> ToolPlan | None:
    """The request's ToolPlan (None without tools).

    Raises:
        RequestError(400) naming `tools` or `tool_choice`.
    """
    tools, choice, param = body.tools, body.tool_choice, "tools"
    if body.functions is not None or body.function_call is not None:
        # OpenAI's deprecated names: the same request, answered with tool_calls.
        if tools is not None or choice is not None:
            raise RequestError("give tools or functions, not both", param="functions")
        tools, choice, param = body.functions, body.function_call, "functions"
        if isinstance(choice, NamedFunction):
            choice = NamedToolChoice(function=choice)
    if not tools:
        if choice not in (None, "none"):
            raise RequestError("tool_choice needs tools", param="tool_choice")
        return None
    try:
        functions = tool_definitions(tools, param)
    except RequestFieldError as error:
        raise RequestError(str(error), param=param) from None
    parallel = body.parallel_tool_calls is not False
    if choice is None or isinstance(choice, str):
        mode = choice or "auto"
        return ToolPlan(functions, mode, parser, parallel)
    named = choice.function.name
    if named not in {f["name"] for f in functions}:
        raise RequestError(
            f"tool_choice names the function {named!r}, which is not among the tools "
            f"{[f['name'] for f in functions]}",
            param="tool_choice",
        )
    return ToolPlan(functions, "named", parser, parallel, named)


def template_messages(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The messages as chat templates take them: text content, assistant `tool_calls` with
    their arguments as objects (templates write them with `tojson`), tool results' ids."""
    messages = []
    for position, message in enumerate(body.messages):
        content = message.content
        if isinstance(content, list):
            if any(part.type != "text" for part in content):
                raise RequestError(
                    f"messages[{position}]: only text content parts are supported",
                    param="messages",
                )
            content = "".join(part.text or "" for part in content)
        rendered: dict[str, Any] = {"role": message.role, "content": content or ""}
        if message.name is not None:
            rendered["name"] = message.name
        if message.tool_call_id is not None:
            rendered["tool_call_id"] = message.tool_call_id
        if message.tool_calls:
            rendered["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _arguments_object(call.function.arguments, position),
                    },
                }
                for call in message.tool_calls
            ]
        messages.append(rendered)
    return messages


def _arguments_object(arguments: str, position: int) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        raise RequestError(
            f"messages[{position}].tool_calls: arguments must be JSON text, got {arguments!r:.80}",
            param="messages",
        ) from None


def tool_call_dicts(calls: list[ParsedToolCall], first_index: int = 0) -> list[dict[str, Any]]:
    """OpenAI's `tool_calls` entries (with stream `index`es from `first_index`)."""
    return [
        {
            "index": first_index + offset,
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for offset, call in enumerate(calls)
    ]


@dataclass
class ToolCallStream:
    """Splits one streamed choice into content deltas and whole calls.

    Content goes out as it comes until a call starts (a tail that may be the start of the
    parser's trigger waits for the next delta); from there the text is held and re-read, and
    each call goes out once it is complete. At the end, what held text is not a call is
    content. Only `auto` streams content: other modes hold everything until the end.
    """

    plan: ToolPlan
    text: str = ""
    content_sent: int = 0  # characters of `text` sent as content
    call_start: int | None = None
    calls_sent: int = 0
    sent: list[ParsedToolCall] = field(default_factory=list)

    def feed(self, delta: str) -> tuple[str, list[ParsedToolCall]]:
        """The content to send and the calls completed by `delta`."""
        self.text += delta
        mode, parser = self.plan.mode, self.plan.parser
        if mode == "none":
            return self._content_until(len(self.text)), []
        if mode != "auto":
            return "", []
        if self.call_start is None:
            self.call_start = parser.call_start(self.text)
            if self.call_start is None:
                return self._content_until(parser.content_end(self.text)), []
        content = self._content_until(self.call_start)
        if not any(char in delta for char in parser.closing_chars):
            return content, []  # no call can have closed: the held text is not re-read
        calls = self.plan.parse(self.text[self.call_start :]).tool_calls
        return content, self._new_calls(calls)

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        """What is left once the output ended: content, and the calls not yet sent."""
        if self.plan.mode in ("none", "auto") and self.call_start is None:
            return self._content_until(len(self.text)), []
        start = self.call_start or 0
        parsed = self.plan.parse(self.text[start:])
        content = self._content_until(start) + parsed.content
        self.content_sent = len(self.text)
        return content, self._new_calls(parsed.tool_calls)

    def _content_until(self, end: int) -> str:
        content = self.text[self.content_sent : end]
        self.content_sent = max(self.content_sent, end)
        return content

    def _new_calls(self, calls: list[ParsedToolCall]) -> list[ParsedToolCall]:
        new = calls[self.calls_sent :]
        self.calls_sent = max(self.calls_sent, len(calls))
        self.sent += new
        return new
