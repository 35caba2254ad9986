"""OpenAI's function tools as the request schema takes them: `tool_definitions` checks a
`tools` list once (the server's `tools`, `rg.gen(tools=...)`), and `tool_call_schema` is the
JSON schema of one call of them, which constrains a `required` or DSL tool call. Torch-free,
like the rest of the request schema."""

from __future__ import annotations

from typing import Any

from radixgen.runtime.request_fields import (
    MAX_JSON_DEPTH,
    RequestFieldError,
    check_keys,
    json_depth,
    list_of,
)

MAX_TOOLS = 128  # function definitions in one request
MAX_TOOL_NAME_CHARS = 64  # OpenAI's limit on a function name


def tool_definitions(value: Any, name: str = "tools") -> list[dict[str, Any]]:
    """OpenAI's `tools` (`[{"type": "function", "function": {"name", "description",
    "parameters", "strict"}}]`, or the bare function objects) -> the function objects, each
    with `parameters` (default: any object). Names are unique and OpenAI-shaped.

    Raises:
        RequestFieldError naming `name` (and the index of the bad tool).
    """
    items = list_of(name, value, lambda item: isinstance(item, dict), "a list of tools", MAX_TOOLS)
    if not items:
        raise RequestFieldError(name, f"{name} must not be empty")
    functions, seen = [], set()
    for index, tool in enumerate(items):
        where = f"{name}[{index}]"
        if "function" in tool:
            if tool.get("type", "function") != "function":
                raise RequestFieldError(
                    name, f"{where}.type must be 'function', got {tool.get('type')!r:.40}"
                )
            check_keys(tool, {"type", "function"}, {"function"}, where, name)
            tool, where = tool["function"], f"{where}.function"
            if not isinstance(tool, dict):
                raise RequestFieldError(name, f"{where} must be an object")
        check_keys(tool, {"name", "description", "parameters", "strict"}, {"name"}, where, name)
        function_name = tool["name"]
        if not (
            isinstance(function_name, str)
            and 0 < len(function_name) <= MAX_TOOL_NAME_CHARS
            and all(c.isascii() and (c.isalnum() or c in "_-.") for c in function_name)
        ):
            raise RequestFieldError(
                name,
                f"{where}.name must be 1-{MAX_TOOL_NAME_CHARS} characters of a-z, A-Z, 0-9, "
                f"'_', '-', '.', got {function_name!r:.80}",
            )
        if function_name in seen:
            raise RequestFieldError(name, f"{where}.name {function_name!r} is given twice")
        seen.add(function_name)
        parameters = tool.get("parameters")
        if parameters is None:
            parameters = {"type": "object"}
        if not isinstance(parameters, dict) or json_depth(parameters) > MAX_JSON_DEPTH:
            raise RequestFieldError(name, f"{where}.parameters must be a JSON schema object")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise RequestFieldError(name, f"{where}.description must be a string")
        functions.append({**tool, "parameters": parameters})
    return functions


def tool_call_schema(functions: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema of one call of any of `functions` (from `tool_definitions`):
    `{"name": <one of the names>, "arguments": <that function's parameters>}`."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": function["name"]},
                "arguments": function["parameters"],
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for function in functions
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}
