"""OpenAI compatibility through a real `radixgen serve` (tiny, CPU) with the official openai
client: tool calling (`tool_choice` required, named, auto with its call forced open by
`logit_bias` on the trigger's tokens, none; streamed and whole; multi-turn with tool results:
every call returned parses and its arguments validate against the function's schema),
`logit_bias`, vLLM's and SGLang's constraint fields, OpenAI's ignored fields, unknown fields
refused, and `GET /v1/models/{id}`. The server is the suite's shared OpenAI server
(shared_servers.py)."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
from shared_servers import CHAT_TEMPLATE_MARKER

from radixgen.runtime.tokenizer import load_tokenizer

WEATHER = {
    "name": "get_weather",
    "description": "The weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
ADD = {
    "name": "add",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}
TOOLS = [{"type": "function", "function": WEATHER}, {"type": "function", "function": ADD}]
SCHEMAS = {f["name"]: f["parameters"] for f in (WEATHER, ADD)}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
# A conversation that already called a tool and got its result: the history the template
# renders in the Hermes format; the tiny model copies its <tool_call> once nudged.
HISTORY = [
    *QUESTION,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    {"role": "user", "content": "And in Rome?"},
]
GREEDY = {"temperature": 0.0, "max_tokens": 48}


@pytest.fixture(scope="module")
def server(openai_server):
    return openai_server


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key, max_retries=0)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers=server.headers, timeout=30)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return load_tokenizer(tiny_model_path)


@pytest.fixture(scope="module")
def trigger_bias(tokenizer) -> dict[str, int]:
    """A logit_bias that favours the tokens of `<tool_call>` (the model picks their order)."""
    token_ids = tokenizer.encode("<tool_call>", add_special_tokens=False)
    return {str(token_id): 10 for token_id in token_ids}


def assert_valid_calls(tool_calls, *, names=tuple(SCHEMAS)) -> list[str]:
    assert tool_calls, "no tool call"
    for call in tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return [call.function.name for call in tool_calls]


def streamed(oai, **request) -> tuple[str, list[dict], str]:
    """(content, tool calls accumulated from the deltas by index, finish_reason)."""
    content, calls, finish_reason = "", {}, None
    for chunk in oai.chat.completions.create(model="tiny", stream=True, **request):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or ():
            call = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
        finish_reason = choice.finish_reason or finish_reason
    return content, [calls[index] for index in sorted(calls)], finish_reason


def test_required_returns_valid_calls_whole_and_streamed(oai):
    request = {"messages": QUESTION, "tools": TOOLS, "tool_choice": "required", **GREEDY}
    response = oai.chat.completions.create(model="tiny", **request)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert_valid_calls(choice.message.tool_calls)
    content, calls, finish_reason = streamed(oai, **request)
    assert finish_reason == "tool_calls" and content == ""
    whole = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert [(c["name"], c["arguments"]) for c in calls] == whole  # greedy: the same calls


def test_named_function_and_parallel_calls_off(oai):
    named = {"type": "function", "function": {"name": "add"}}
    for sample in range(3):
        response = oai.chat.completions.create(
            model="tiny", messages=QUESTION, tools=TOOLS, tool_choice=named,
            temperature=1.0, seed=sample, max_tokens=32,
        )  # fmt: skip
        assert assert_valid_calls(response.choices[0].message.tool_calls) == ["add"]
    response = oai.chat.completions.create(
        model="tiny", messages=QUESTION, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=1.0, seed=5, max_tokens=64,
    )  # fmt: skip
    assert len(response.choices[0].message.tool_calls) == 1


def test_auto_call_opened_by_logit_bias_is_constrained_to_the_schema(oai, trigger_bias):
    request = {"messages": HISTORY, "tools": TOOLS, "logit_bias": trigger_bias, **GREEDY}
    message = oai.chat.completions.create(model="tiny", **request).choices[0].message
    assert_valid_calls(message.tool_calls)
    content, calls, _ = streamed(oai, **request)
    assert "<tool_call>" not in content  # the call's text went out as a call, not content
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls
    ]


def test_auto_without_a_call_and_none_return_content(oai):
    for tool_choice in ("auto", "none"):
        response = oai.chat.completions.create(
            model="tiny", messages=QUESTION, tools=TOOLS, tool_choice=tool_choice, **GREEDY
        )
        choice = response.choices[0]
        assert choice.message.tool_calls is None and choice.message.content
        assert choice.finish_reason in ("stop", "length")
    content, calls, _ = streamed(oai, messages=QUESTION, tools=TOOLS, **GREEDY)
    assert calls == [] and content == choice.message.content


def test_tool_results_are_rendered_into_the_prompt(oai):
    plain = oai.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=1)
    with_tools = oai.chat.completions.create(
        model="tiny", messages=QUESTION, tools=TOOLS, max_tokens=1
    )
    multi_turn = oai.chat.completions.create(
        model="tiny", messages=HISTORY, tools=TOOLS, tool_choice="required", **GREEDY
    )
    # The tools' definitions, then the earlier call and its result, are in the prompt.
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 50
    assert multi_turn.usage.prompt_tokens > with_tools.usage.prompt_tokens + 20
    assert_valid_calls(multi_turn.choices[0].message.tool_calls)


@pytest.mark.parametrize(
    "body, param, message",
    [
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice", "not among the tools"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]},
         "tools", "parameters"),
        ({"tools": TOOLS, "tool_choice": "required", "regex": "a+"}, "tool_choice", "regex"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
          "function": {"name": "f", "arguments": "{not json"}}]}]}, "messages", "JSON"),
        ({"logit_bias": {"32000": 1}}, "logit_bias", "[0, 32000)"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "100"),
        ({"logit_bias": {"x": 1}}, "logit_bias", "token ids"),
    ],
)  # fmt: skip
def test_bad_tool_requests_are_400s_naming_the_field(server, body, param, message):
    body = {"messages": QUESTION, "max_tokens": 4, **body}
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"], error


def test_logit_bias_forces_and_bans_tokens(oai, tokenizer):
    [forced] = tokenizer.encode(" yes", add_special_tokens=False)
    response = oai.completions.create(
        model="tiny", prompt="def f(x):", max_tokens=6, temperature=1.0, seed=0,
        logit_bias={str(forced): 100},
    )  # fmt: skip
    assert response.choices[0].text == " yes" * 6
    plain = oai.completions.create(model="tiny", prompt="def f(x):", max_tokens=4, temperature=0)
    first = tokenizer.encode(plain.choices[0].text, add_special_tokens=False)[0]
    banned = oai.completions.create(
        model="tiny", prompt="def f(x):", max_tokens=4, temperature=0,
        logit_bias={str(first): -100},
    )  # fmt: skip
    assert tokenizer.encode(banned.choices[0].text, add_special_tokens=False)[0] != first


def chat_text(oai, **request) -> str:
    response = oai.chat.completions.create(model="tiny", messages=QUESTION, **request)
    return response.choices[0].message.content


def test_vllm_and_sglang_constraint_fields_constrain_the_output(oai):
    pet = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}},
           "required": ["name"], "additionalProperties": False}  # fmt: skip
    budget = {"max_tokens": 32, "temperature": 1.0, "seed": 3}
    for extra in ({"guided_json": pet}, {"structured_outputs": {"json": pet}},
                  {"json_schema": json.dumps(pet)}):  # fmt: skip
        jsonschema.validate(json.loads(chat_text(oai, extra_body=extra, **budget)), pet)
    for extra in ({"guided_regex": "[0-9]{3}-[a-z]{2}"}, {"structured_outputs": {"regex":
                  "[0-9]{3}-[a-z]{2}"}}, {"regex": "[0-9]{3}-[a-z]{2}"}):  # fmt: skip
        assert re.fullmatch("[0-9]{3}-[a-z]{2}", chat_text(oai, extra_body=extra, **budget))
    for extra in ({"guided_choice": ["red", "blue"]}, {"structured_outputs": {"choice":
                  ["red", "blue"]}}):  # fmt: skip
        assert chat_text(oai, extra_body=extra, **budget) in ("red", "blue")
    grammar = 'root ::= ("yes" | "no") "!"'
    for extra in ({"guided_grammar": grammar}, {"ebnf": grammar},
                  {"structured_outputs": {"grammar": grammar}}):  # fmt: skip
        assert chat_text(oai, extra_body=extra, **budget) in ("yes!", "no!")
    # Any JSON object (no budget: a cut one is still an object's start).
    json_object = {"structured_outputs": {"json_object": True}}
    assert chat_text(oai, extra_body=json_object, **budget).startswith("{")


def test_openai_fields_are_accepted_and_ignored(oai):
    text = chat_text(
        oai, max_tokens=4, temperature=0, store=False, metadata={"team": "a"},
        service_tier="auto", reasoning_effort="low", modalities=["text"], user="u1",
        prediction={"type": "content", "content": "x"}, prompt_cache_key="k",
        safety_identifier="s", verbosity="low", stream_options=None,
        extra_body={"guided_decoding_backend": "xgrammar", "separate_reasoning": False,
                    "chat_template_kwargs": {"enable_thinking": False}},
    )  # fmt: skip
    assert text == chat_text(oai, max_tokens=4, temperature=0)


@pytest.mark.parametrize(
    "path, body, param, message",
    [
        ("/v1/chat/completions", {"guided_jsn": {}}, "guided_jsn", "unknown field"),
        ("/v1/completions", {"prompt": "x", "tools": []}, "tools", "unknown field"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "foo": 1}]},
         "messages", "unknown field"),
        ("/v1/chat/completions", {"guided_regex": "a", "guided_choice": ["a"]},
         "guided_choice", "at most one of"),
        ("/v1/chat/completions", {"regex": "a", "response_format": {"type": "json_object"}},
         "response_format", "at most one of"),
        ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "modalities", "text"),
        ("/v1/chat/completions", {"use_beam_search": True}, "use_beam_search", "not supported"),
        ("/v1/completions", {"prompt": "x", "echo": True}, "echo", "not supported"),
    ],
)  # fmt: skip
def test_unknown_and_unsupported_fields_are_400s_naming_them(server, path, body, param, message):
    if path.endswith("chat/completions"):
        body = {"messages": QUESTION, **body}
    response = post(server, path, {"max_tokens": 4, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"], error


def test_retrieve_model_and_legacy_functions(oai):
    card = oai.models.retrieve("tiny")
    assert card.id == "tiny" and card.object == "model"
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("gpt-4o")
    response = oai.chat.completions.create(
        model="tiny", messages=QUESTION, functions=[ADD], function_call={"name": "add"},
        max_tokens=32, temperature=0,
    )  # fmt: skip
    assert assert_valid_calls(response.choices[0].message.tool_calls) == ["add"]


def test_metrics_without_the_key_and_the_chat_template_file(server, oai):
    oai.completions.create(model="tiny", prompt="x", max_tokens=2)
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=30)  # no key: --metrics-no-auth
    assert metrics.status_code == 200
    for name in ("prompt_tokens_total", "generation_tokens_total", "e2e_request_latency_seconds"):
        assert f"radixgen:{name}" in metrics.text
    assert 'radixgen:prompt_tokens_total{model_name="tiny"}' in metrics.text
    assert httpx.get(f"{server.base_url}/v1/models", timeout=30).status_code == 401
    info = httpx.get(f"{server.base_url}/get_model_info", headers=server.headers, timeout=30)
    assert info.json()["chat_template"].startswith(CHAT_TEMPLATE_MARKER)
