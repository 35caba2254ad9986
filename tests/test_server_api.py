"""A real `radixgen serve` (tiny model, CPU) in a subprocess, driven by httpx and the openai
client: native and OpenAI endpoints, streaming, bad input, auth, disconnects, a burst, and
SIGTERM's graceful drain.

One server serves the whole module (start-up dominates the runtime); the last test stops it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time

import httpx
import jsonschema
import openai
import pytest

from radixgen.runtime.server.subprocess_launcher import ServerProcess
from tests.structural_tag_checks import COUNTER_TAG, check_tagged_text

API_KEY = "test-secret-key"
CONTEXT_LENGTH = 1024
# At most MAX_RUNNING + MAX_QUEUED sequences in flight; more get 503.
MAX_RUNNING = 64
MAX_QUEUED = 200
# Requests this long are still running when the test disconnects them (seconds on CPU).
LONG_GENERATION = 1000
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_model_path):  # built once, before the server needs it
    flags = [
        "--log-level", "warning",
        "--context-length", str(CONTEXT_LENGTH),
        "--max-running-requests", str(MAX_RUNNING),
        "--max-queued-requests", str(MAX_QUEUED),
        "--shutdown-timeout", "2",  # the drain test's window
    ]  # fmt: skip
    with ServerProcess(flags, api_key=API_KEY) as running:
        yield running


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, headers=server.headers, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)


def generate(http, **body) -> dict | list:
    response = http.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def sse_payloads(response: httpx.Response) -> list[str]:
    return [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]


def server_info(http) -> dict:
    response = http.get("/get_server_info")
    assert response.status_code == 200, response.text
    return response.json()


def wait_until_idle(http, timeout_s: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        info = server_info(http)
        scheduler = info["scheduler"]
        idle = scheduler["num_running_reqs"] == 0 and scheduler["num_queued_reqs"] == 0
        if idle and info["num_requests_in_flight"] == 0:
            return info
        assert time.monotonic() < deadline, f"server not idle: {info}"
        time.sleep(0.05)


def assert_no_leaked_kv(http) -> None:
    """Once idle and flushed, every KV slot is free again."""
    wait_until_idle(http)
    assert http.post("/flush_cache").status_code == 200
    scheduler = server_info(http)["scheduler"]
    assert scheduler["kv_used_slots"] == 0
    assert scheduler["kv_cached_slots"] == 0
    assert scheduler["kv_free_slots"] == scheduler["kv_total_slots"]


# ---- native API ------------------------------------------------------------------------------


def test_generate_single_batch_and_input_ids(http):
    params = {"max_new_tokens": 6, **GREEDY}
    single = generate(http, text="The capital of France is", sampling_params=params)
    assert isinstance(single["text"], str) and single["text"]
    assert len(single["output_ids"]) == 6
    meta = single["meta_info"]
    assert meta["prompt_tokens"] > 0 and meta["completion_tokens"] == 6
    assert meta["finish_reason"]["type"] == "length"

    batch = generate(http, text=["The capital of France is", "Once upon"], sampling_params=params)
    assert isinstance(batch, list) and len(batch) == 2
    assert batch[0]["output_ids"] == single["output_ids"]  # greedy is deterministic

    by_ids = generate(http, input_ids=[5, 6, 7, 8], sampling_params=params)
    assert by_ids["meta_info"]["prompt_tokens"] == 4


def test_second_identical_prompt_hits_the_cache(http):
    prompt = "A fairly long shared prefix that the radix cache keeps " * 3
    generate(http, text=prompt, sampling_params={"max_new_tokens": 2, **GREEDY})
    again = generate(http, text=prompt, sampling_params={"max_new_tokens": 2, **GREEDY})
    assert again["meta_info"]["cached_tokens"] >= again["meta_info"]["prompt_tokens"] - 1


def test_generate_stream_is_sse_ending_in_done(http):
    params = {"max_new_tokens": 8, **GREEDY}
    expected = generate(http, text="Hello there", sampling_params=params)
    with http.stream(
        "POST", "/generate", json={"text": "Hello there", "sampling_params": params, "stream": True}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    assert len(chunks) >= 2  # streamed, not one blob
    completion_tokens = [chunk["meta_info"]["completion_tokens"] for chunk in chunks]
    assert completion_tokens == sorted(completion_tokens)
    assert chunks[-1]["text"] == expected["text"]
    assert chunks[-1]["output_ids"] == expected["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_generate_logprobs(http):
    result = generate(
        http,
        text="Logprobs please",
        sampling_params={"max_new_tokens": 4, **GREEDY},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=3,
    )
    meta = result["meta_info"]
    output_logprobs = meta["output_token_logprobs"]
    assert [token_id for _, token_id in output_logprobs] == result["output_ids"]
    assert all(logprob <= 0.0 for logprob, _ in output_logprobs)
    assert all(len(top) == 3 for top in meta["output_top_logprobs"])
    # Greedy picks the most likely token: it heads its own top list.
    assert [top[0][1] for top in meta["output_top_logprobs"]] == result["output_ids"]
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]


def test_info_metrics_and_flush(http):
    model_info = http.get("/get_model_info").json()
    assert model_info["context_length"] == CONTEXT_LENGTH
    assert "{%" in model_info["chat_template"]  # clients render chat prompts with it
    info = server_info(http)
    assert 0.0 <= info["kv_usage"] <= 1.0 and 0.0 <= info["cache_hit_rate"] <= 1.0
    assert info["server_args"]["api_key"] == "<set>"  # never echoed back
    # One finished request of its own, so the counters exist when this test runs alone.
    step_time_before = info["scheduler"]["step_time_s"]
    http.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    scheduler = server_info(http)["scheduler"]  # the loop's own time: steps, then shipping
    assert scheduler["step_time_s"] > step_time_before and scheduler["deliver_time_s"] > 0
    metrics = http.get("/metrics")
    assert metrics.status_code == 200
    text = metrics.text
    for name in (
        'radixgen:num_requests_total{model_name="tiny",outcome="finished"}',
        'radixgen:generation_tokens_total{model_name="tiny"}',
        'radixgen:num_running_reqs{model_name="tiny"}',
        'radixgen:num_queue_reqs{model_name="tiny"}',
        'radixgen:token_usage{model_name="tiny"}',
        'radixgen:cache_hit_rate{model_name="tiny"}',
        "radixgen:time_to_first_token_seconds_bucket",
        "radixgen:inter_token_latency_seconds_bucket",
    ):
        assert name in text
    assert http.post("/flush_cache").json()["success"] is True
    assert http.get("/health_generate").status_code == 200


# ---- OpenAI API ------------------------------------------------------------------------------


def test_openai_models_and_chat(oai):
    models = oai.models.list()
    assert [model.id for model in models.data] == ["tiny"]
    messages = [{"role": "user", "content": "Say something."}]
    chat = oai.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.completion_tokens == 5 and chat.usage.prompt_tokens > 0


def test_openai_chat_stream_matches_and_reports_usage(oai):
    request = dict(
        model="tiny",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_completion_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    expected = oai.chat.completions.create(**request).choices[0].message.content
    stream = oai.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == expected
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_openai_completions_n_seed_logprobs(oai):
    request = dict(model="tiny", prompt="Once upon a time", max_tokens=5, n=2, seed=7, logprobs=2)
    first = oai.completions.create(**request, extra_body={"ignore_eos": True})
    assert [choice.index for choice in first.choices] == [0, 1]
    for choice in first.choices:
        assert len(choice.logprobs.tokens) == 5
        assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
    assert first.usage.completion_tokens == 10
    again = oai.completions.create(**request, extra_body={"ignore_eos": True})
    assert [c.text for c in again.choices] == [c.text for c in first.choices]  # seeded


def test_openai_completions_stream_and_stop(oai):
    full = (
        oai.completions.create(
            model="tiny",
            prompt="Tell me",
            max_tokens=12,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        .choices[0]
        .text
    )
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    expected = full[: full.find(stop)]
    stream = oai.completions.create(
        model="tiny",
        prompt="Tell me",
        max_tokens=12,
        temperature=0,
        stop=[stop],
        stream=True,
        extra_body={"ignore_eos": True},  # as above: the same tokens up to the stop string
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_openai_json_schema_response_format(oai):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
        "additionalProperties": False,
    }
    chat = oai.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Give me a JSON object."}],
        max_tokens=120,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
    )
    content = chat.choices[0].message.content
    jsonschema.validate(json.loads(content), schema)


def test_extra_body_regex_and_choices_constrain_the_output(oai):
    messages = [{"role": "user", "content": "A number?"}]
    digits = oai.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, extra_body={"regex": "[0-9]{3}"}
    )
    assert re.fullmatch("[0-9]{3}", digits.choices[0].message.content)
    choice = oai.completions.create(
        model="tiny", prompt="Answer:", max_tokens=10, extra_body={"choices": ["yes", "no"]}
    )
    assert choice.choices[0].text in ("yes", "no")


YES_NO_EBNF = 'root ::= ("yes" | "no") " because " [a-z]+'


def test_ebnf_and_lark_through_generate_and_the_openai_extra_body(http, oai):
    # SGLang's GBNF-style EBNF on /generate; a Lark grammar and EBNF through extra_body.
    out = generate(
        http, text="Is it?", sampling_params={**GREEDY, "max_new_tokens": 12, "ebnf": YES_NO_EBNF}
    )
    assert re.fullmatch("(yes|no) because [a-z]+", out["text"]), out["text"]
    lark = oai.completions.create(
        model="tiny",
        prompt="Code:",
        max_tokens=10,
        extra_body={"lark": 'start: "x" /[0-9]{3}/'},
    )
    assert re.fullmatch("x[0-9]{3}", lark.choices[0].text)
    chat = oai.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Is it?"}],
        max_tokens=12,
        temperature=0,
        extra_body={"ebnf": YES_NO_EBNF, "ignore_eos": True},
    )
    assert re.fullmatch("(yes|no) because [a-z]+", chat.choices[0].message.content)


def test_structural_tag_through_generate_and_openai_response_format(http, oai):
    samples = generate(
        http, text="def main():", sampling_params={"max_new_tokens": 32, "temperature": 1.0,
                                                   "seed": 5, "n": 2, "structural_tag": COUNTER_TAG},
    )  # fmt: skip
    tagged = 0
    for sample in samples:
        by_length = sample["meta_info"]["finish_reason"]["type"] == "length"
        tagged += len(check_tagged_text(sample["text"], COUNTER_TAG, finished_by_length=by_length))
    chat = oai.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Count the calls."}],
        max_tokens=32,
        temperature=1.0,
        seed=7,
        n=2,
        response_format=COUNTER_TAG,
    )
    for choice in chat.choices:
        by_length = choice.finish_reason == "length"
        tagged += len(check_tagged_text(choice.message.content, COUNTER_TAG, finished_by_length=by_length))  # fmt: skip
    assert tagged > 0  # tags opened and every body validated


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/generate", {"text": "x", "sampling_params": {"structural_tag": {"triggers": ["e"]}}},
         r"missing: \['structures'\]"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
         "response_format": {"type": "structural_tag", "structures": [{"begin": "e", "end": ";"}], "triggers": ["e"]}},
         r"structures\[0\] takes"),
        ("/v1/completions", {"prompt": "x", "structural_tag": {**COUNTER_TAG, "triggers": [""]}},
         r"triggers\[0\] must be a non-empty string"),
        ("/v1/completions", {"prompt": "x", "response_format": COUNTER_TAG, "regex": "a"},
         "at most one of"),
    ],
)  # fmt: skip
def test_bad_structural_tags_are_400s_naming_the_field(http, path, body, message):
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    # Two constraints: the error names the second as the client spelled it.
    assert error["param"] in ("structural_tag", "response_format"), error
    assert re.search(message, error["message"]), error
    # A begin that no trigger opens passes the shape check and fails at compile: still a 400.
    bad_begin = {**COUNTER_TAG, "triggers": ["x"]}
    response = http.post(
        "/generate", json={"text": "x", "sampling_params": {"structural_tag": bad_begin}}
    )
    assert response.status_code == 400 and "must start with one of the triggers" in response.text


def test_a_budget_below_the_shortest_match_is_a_400_unless_opted_out(http, oai):
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    response = http.post(
        "/generate",
        json={"text": "x", "sampling_params": {"max_new_tokens": 2, "json_schema": schema}},
    )
    assert response.status_code == 400, response.text
    assert re.search(r"max_new_tokens.*needs \d+ tokens", response.json()["error"]["message"])
    raw = oai.completions.create(
        model="tiny",
        prompt="x",
        max_tokens=2,
        extra_body={"json_schema": schema, "constraint_budget": False},
    )
    assert raw.choices[0].finish_reason == "length"


def test_json_object_response_format_is_json(oai):
    reply = oai.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "JSON please"}],
        max_tokens=200,
        temperature=0,
        response_format={"type": "json_object"},
    )
    choice = reply.choices[0]
    if choice.finish_reason == "stop":  # a complete object (length may cut it)
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        assert choice.message.content.lstrip().startswith("{")


# ---- bad input -------------------------------------------------------------------------------

LONG_PROMPT = [5] * (CONTEXT_LENGTH + 10)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate", '{"text": "unterminated'),
        ("/generate", {"input_ids": LONG_PROMPT}),
        ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": CONTEXT_LENGTH}}),
        ("/generate", {"text": "hi", "sampling_params": {"temperature": -1}}),
        ("/generate", {"text": "hi", "sampling_params": {"top_p": 1.5}}),
        ("/generate", {"text": "hi", "sampling_params": {"n": 0}}),
        ("/generate", {"text": "hi", "sampling_params": {"no_such_param": 1}}),
        ("/generate", {"text": "hi", "sampling_params": {"regex": "[a-z"}}),
        ("/generate", {"text": "hi", "sampling_params": {"json_schema": "{not json"}}),
        ("/generate", {"text": "hi", "sampling_params": {"regex": "a", "choices": ["a"]}}),
        ("/generate", {"text": "hi", "sampling_params": {"ebnf": "root ::= ("}}),
        ("/generate", {"text": "hi", "sampling_params": {"lark": 'start: ("a"'}}),
        ("/generate", {"text": "hi", "sampling_params": {"ebnf": "root ::= 'a'", "regex": "a"}}),
        ("/generate", {"text": "hi", "input_ids": [1]}),
        ("/generate", {"input_ids": [10**9]}),
        ("/generate", {"text": "hi", "typo_field": 1}),
        ("/v1/completions", {"prompt": LONG_PROMPT}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 10 * CONTEXT_LENGTH}),
        ("/v1/completions", {"prompt": "hi", "temperature": "hot"}),
        ("/v1/chat/completions", {"messages": []}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_p": 0}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": -1}),
        ("/v1/completions", {"prompt": "hi", "n": 10**6}),
        ("/v1/completions", {"prompt": "hi", "logprobs": 21}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": -1},
        ),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}),
        # Bounds of the one validation function (runtime/request_schema.py).
        ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "seed": 2**63}}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "seed": 2**70}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "n": 10**7}),
        ("/generate", {"input_ids": [[False]]}),
        ("/generate", {"text": "hi", "stream": "yes"}),
        ("/v1/completions", {"prompt": "hi", "stream": "yes"}),
        ("/generate", '{"text": "hi", "sampling_params": {"temperature": Infinity}}'),
        ("/v1/completions", '{"prompt": "hi", "temperature": 1e309}'),
        ("/generate", {"text": "hi", "sampling_params": {"top_p": 0}}),
        ("/generate", {"text": "hi", "sampling_params": {"stop": ["x"] * 65}}),
        ("/generate", {"text": ["hi"] * 1025}),
        ("/v1/completions", {"prompt": "hi", "best_of": 10**6}),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {str(i): 1 for i in range(301)}}),
        ("/generate", {"text": "hi", "return_logprob": True, "top_logprobs_num": 33}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
        ),
    ],
)
def test_bad_input_is_a_400_in_openai_error_format(http, path, body):
    if isinstance(body, str):
        response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert error["message"]
    assert http.get("/health").status_code == 200


def test_unsupported_schema_keyword_is_a_400_naming_keyword_and_path(http):
    # Our formats are strict subsets, so "not a date" cannot be written exactly: refused.
    schema = {"type": "object", "properties": {"x": {"type": "string", "not": {"format": "date"}}}}
    chat = {
        "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }
    native = {"text": "hi", "sampling_params": {"json_schema": schema}}
    for path, body in [("/v1/chat/completions", chat), ("/generate", native)]:
        response = http.post(path, json=body)
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert "'format'" in message and "#/properties/x/not" in message, message
    contradiction = {"type": "integer", "minimum": 10, "maximum": 1}
    response = http.post(
        "/generate", json={"text": "hi", "sampling_params": {"json_schema": contradiction}}
    )
    assert response.status_code == 400, response.text
    assert "no value satisfies" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        (
            "/generate",
            {"text": "hi", "sampling_params": {"seed": 2**63}},
            "seed",
            "seed must be in [0, 9223372036854775807]",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "n": 10**7},
            "n",
            "n must be in [1, 128], got 10000000",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_p": 0},
            "top_p",
            "top_p must be > 0 (use temperature=0 for greedy)",
        ),
    ],
)
def test_bound_errors_name_the_field_and_the_accepted_range(http, path, body, param, message):
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"], error


def test_bad_stream_request_fails_before_streaming(http):
    body = {"text": "hi", "stream": True, "sampling_params": {"regex": "(unclosed"}}
    assert http.post("/generate", json=body).status_code == 400


def test_cache_salt_shares_prefixes_only_within_one_salt(http, oai):
    text = "Tenants keep their prompts apart: a salt namespaces the radix cache. " * 3
    params = {"max_new_tokens": 3, **GREEDY}
    runs = [
        generate(http, text=text, sampling_params=params, **salt)
        for salt in ({"cache_salt": "a"}, {"cache_salt": "b"}, {}, {"cache_salt": "a"})
    ]
    cached = [run["meta_info"]["cached_tokens"] for run in runs]
    assert cached == [0, 0, 0, runs[0]["meta_info"]["prompt_tokens"] - 1]
    assert all(run["output_ids"] == runs[0]["output_ids"] for run in runs)
    batch = generate(http, text=[text, text], sampling_params=params, cache_salt=["b", "c"])
    assert [b["meta_info"]["cached_tokens"] for b in batch] == [cached[3], 0]

    def completion_cached(salt: str) -> int:
        completion = oai.completions.create(
            model="tiny", prompt=text + "!", max_tokens=2, extra_body={"cache_salt": salt}
        )
        return completion.usage.prompt_tokens_details.cached_tokens

    assert completion_cached("d") == 0 and completion_cached("e") == 0
    assert completion_cached("d") > 0
    messages = [{"role": "user", "content": text}]

    def chat_cached(salt: str) -> int:
        chat = oai.chat.completions.create(
            model="tiny", messages=messages, max_tokens=2, extra_body={"cache_salt": salt}
        )
        return chat.usage.prompt_tokens_details.cached_tokens

    assert chat_cached("f") == 0 and chat_cached("g") == 0 and chat_cached("f") > 0
    assert_no_leaked_kv(http)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate", {"text": "hi", "cache_salt": ""}),
        ("/generate", {"text": "hi", "cache_salt": "x" * 257}),
        ("/generate", {"text": "hi", "cache_salt": 7}),
        ("/generate", {"text": ["hi", "yo"], "cache_salt": ["a"]}),
        ("/generate", {"text": "hi", "stream": True, "cache_salt": ""}),
        ("/v1/completions", {"prompt": "hi", "cache_salt": ""}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "cache_salt": ""},
        ),
    ],
)
def test_bad_cache_salt_is_a_400_naming_it(http, path, body):
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "cache_salt"


def test_openai_client_raises_bad_request(oai):
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="tiny", prompt="hi", max_tokens=-3)


# ---- auth ------------------------------------------------------------------------------------


def test_api_key_is_required_except_on_health(server):
    base = server.base_url
    assert httpx.get(f"{base}/health").status_code == 200
    for method, path in [
        ("POST", "/generate"),
        ("GET", "/get_server_info"),
        ("GET", "/metrics"),
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
    ]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
            response = httpx.request(method, f"{base}{path}", headers=headers, json={})
            assert response.status_code == 401, (path, headers)
            assert response.json()["error"]["code"] == 401
    assert httpx.get(f"{base}/v1/models", headers={"X-API-Key": API_KEY}).status_code == 200
    wrong = openai.OpenAI(base_url=f"{base}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


# ---- disconnects and load --------------------------------------------------------------------


def test_disconnect_mid_stream_aborts_and_frees_kv(server, http):
    generated_before = server_info(http)["scheduler"]["num_generated_tokens"]
    body = {
        "text": "Write forever",
        "stream": True,
        "sampling_params": {"max_new_tokens": LONG_GENERATION, **GREEDY},
    }
    with http.stream("POST", "/generate", json=body) as response:
        seen = 0
        for line in response.iter_lines():
            seen += line.startswith("data: ")
            if seen == 2:
                break  # leaving the block closes the connection mid-stream
    info = wait_until_idle(http)
    generated = info["scheduler"]["num_generated_tokens"] - generated_before
    assert generated < LONG_GENERATION  # aborted early
    assert_no_leaked_kv(http)


def test_client_timeout_on_non_streaming_request_aborts_it(server, http):
    generated_before = server_info(http)["scheduler"]["num_generated_tokens"]
    body = {
        "text": "Write forever",
        "sampling_params": {"max_new_tokens": LONG_GENERATION, **GREEDY},
    }
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.base_url}/generate", json=body, headers=server.headers, timeout=0.3)
    info = wait_until_idle(http)
    assert info["scheduler"]["num_generated_tokens"] - generated_before < LONG_GENERATION
    assert_no_leaked_kv(http)


def concurrent_generate(server, num_requests: int, max_new_tokens: int) -> list[httpx.Response]:
    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=num_requests)
        async with httpx.AsyncClient(
            base_url=server.base_url, headers=server.headers, timeout=120, limits=limits
        ) as client:
            params = {"max_new_tokens": max_new_tokens, **GREEDY}
            requests = [
                client.post("/generate", json={"text": f"Request {i}", "sampling_params": params})
                for i in range(num_requests)
            ]
            return await asyncio.gather(*requests)

    return asyncio.run(burst())


def test_burst_of_200_concurrent_requests(server, http):
    responses = concurrent_generate(server, 200, max_new_tokens=4)
    assert [response.status_code for response in responses] == [200] * 200
    assert all(r.json()["meta_info"]["completion_tokens"] == 4 for r in responses)
    assert_no_leaked_kv(http)


def test_requests_beyond_the_queue_limit_get_503(server, http):
    limit, extra = MAX_RUNNING + MAX_QUEUED, 30

    async def overload() -> list[httpx.Response]:
        # Long generations keep the first `limit` requests in flight while the rest arrive;
        # once the extra ones are refused, the client hangs up on the others (aborting them).
        async with httpx.AsyncClient(
            base_url=server.base_url,
            headers=server.headers,
            timeout=120,
            limits=httpx.Limits(max_connections=limit + extra),
        ) as client:
            params = {"max_new_tokens": 200, **GREEDY}
            pending = {
                asyncio.ensure_future(
                    client.post("/generate", json={"text": f"Load {i}", "sampling_params": params})
                )
                for i in range(limit + extra)
            }
            refused = []
            while len(refused) < extra and pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    response = task.result()
                    assert response.status_code in (200, 503), response.text
                    refused += [response] if response.status_code == 503 else []
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            return refused

    refused = asyncio.run(overload())
    assert len(refused) >= extra
    assert refused[0].json()["error"]["type"] == "service_unavailable"
    assert_no_leaked_kv(http)


def test_sigterm_drains_then_aborts_and_exits_zero(server, http):
    # Last test of the module: it stops the module's server.
    process_ids = server_info(http)["process_ids"]
    short = {"text": "short", "sampling_params": {"max_new_tokens": 4}}
    endless = {"max_new_tokens": 900, "ignore_eos": True, "temperature": 0}
    results: dict[str, object] = {}

    def run(name: str, body: dict) -> None:
        try:
            with httpx.stream(
                "POST", f"{server.base_url}/generate", json=body, headers=server.headers, timeout=60
            ) as response:
                results[name] = (response.status_code, list(response.iter_lines()))
        except httpx.TransportError as error:
            results[name] = error

    def in_flight() -> int:
        return server_info(http)["num_requests_in_flight"]

    def wait_until(condition) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline
            time.sleep(0.05)

    # Both endless requests in flight first, then the short one (in flight or already done):
    # SIGTERM never races a request that has not reached the server.
    threads = [
        threading.Thread(target=run, args=("long", {"text": "a", "sampling_params": endless})),
        threading.Thread(
            target=run, args=("stream", {"text": "b", "stream": True, "sampling_params": endless})
        ),
    ]
    for thread in threads:
        thread.start()
    wait_until(lambda: in_flight() >= 2)
    threads.append(threading.Thread(target=run, args=("short", short)))
    threads[-1].start()
    wait_until(lambda: "short" in results or in_flight() >= 3)
    os.kill(server.process.pid, signal.SIGTERM)
    time.sleep(0.3)
    refused = httpx.post(
        f"{server.base_url}/generate", json=short, headers=server.headers, timeout=10
    )
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "service_unavailable"
    assert server.wait(timeout_s=30) == 0
    for thread in threads:
        thread.join(timeout=30)

    assert results["short"][0] == 200  # finished inside the drain window
    status, lines = results["long"]
    assert status == 503
    assert json.loads(lines[0])["error"]["code"] == 503
    status, lines = results["stream"]
    assert status == 200
    events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: ") :])["error"]["code"] == 503
    for pid in process_ids.values():
        assert not _is_running(pid, wait_s=10), f"process {pid} survived SIGTERM"


def _is_running(pid: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead, just not yet reaped
            if stat.read().split(")")[-1].split()[0] == "Z":
                return False
        time.sleep(0.05)
    return True
