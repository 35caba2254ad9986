"""The tool-call parsers (hermes, llama3 JSON, mistral) on written outputs, their structural
tags against the constraint's own reading, and the streamed split into content and calls."""

from __future__ import annotations

import json

import pytest

from radixgen.constrained.structural_tag import StructuralTag
from radixgen.runtime.request_schema import tool_definitions
from radixgen.runtime.server.openai_protocol import ChatCompletionRequest
from radixgen.runtime.server.openai_tools import ToolCallStream, plan_tools
from radixgen.runtime.server.tool_parsers import ParsedToolCall, tool_call_parser
from radixgen.runtime.server_args import ToolCallParserName

FUNCTIONS = tool_definitions(
    [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
)  # fmt: skip
PARIS = ParsedToolCall("get_weather", '{"city": "Paris"}')
ROME = ParsedToolCall("get_weather", '{"city": "Rome"}')


@pytest.mark.parametrize(
    "parser, text, content, calls",
    [
        ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
         '</tool_call><tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}'
         "</tool_call>", "Sure.\n", [PARIS, ROME]),
        ("qwen25", "<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"ci', None, []),
        ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
         '{"name": "get_weather", "parameters": {"city": "Rome"}}', "", [PARIS, ROME]),
        ("llama3", 'The answer is {"name": 1}', None, []),
        ("mistral", 'ok [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
         "ok ", [PARIS]),
        ("mistral", "[TOOL_CALLS][{", None, []),
    ],
)  # fmt: skip
def test_parsers_split_content_and_calls(parser, text, content, calls):
    parsed = tool_call_parser(parser).parse(text)
    assert parsed.tool_calls == calls
    assert parsed.content == (text if content is None else content)


def test_unknown_parser_names_the_accepted_ones():
    with pytest.raises(ValueError, match="llama3_json"):
        tool_call_parser("xml")
    assert set(ToolCallParserName.__args__) <= {"hermes", "qwen25", "llama3", "llama3_json",
                                                 "mistral"}  # fmt: skip


@pytest.mark.parametrize("parser", ["hermes", "llama3", "mistral"])
def test_each_structural_tag_compiles_and_its_tags_parse_back(parser):
    tag = tool_call_parser(parser).structural_tag(FUNCTIONS)
    compiled = StructuralTag.from_json(json.dumps(tag))
    [structure] = compiled.structures
    # The text a constrained call writes: begin, a body of the schema (compact JSON), end.
    text = structure.begin + '{"city":"Paris"}' + structure.end
    assert tool_call_parser(parser).parse(text).tool_calls == [PARIS]


def auto_stream(parser: str) -> ToolCallStream:
    body = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=[
        {"type": "function", "function": FUNCTIONS[0]}])  # fmt: skip
    return ToolCallStream(plan_tools(body, tool_call_parser(parser)))


def test_stream_holds_back_a_possible_trigger_and_sends_each_call_once_complete():
    stream = auto_stream("hermes")
    pieces = ["Let me", " check <", "tool", "_call>\n", '{"name": "get_weather", "arguments": ',
              '{"city": "Paris"}}\n</tool_call>', " then <b> and", ""]  # fmt: skip
    sent = [stream.feed(piece) for piece in pieces]
    assert [content for content, _ in sent[:3]] == ["Let me", " check ", ""]
    assert [calls for _, calls in sent] == [[], [], [], [], [], [PARIS], [], []]
    assert stream.finish() == (" then <b> and", [])
    plain = auto_stream("hermes")
    assert plain.feed("a <b") == ("a <b", []) and plain.feed("<") == ("", [])
    assert plain.finish() == ("<", [])
