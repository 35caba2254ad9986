"""The DSL against a real `radixgen serve` (tiny model, CPU) in a subprocess, through
`rg.RuntimeEndpoint` (native API) and `rg.OpenAI` (OpenAI-compatible API): results,
streaming order, prefix sharing via cached_tokens, select, constrained gens, errors. The server
is the suite's shared OpenAI server (shared_servers.py), with an API key."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import pydantic
import pytest

import radixgen as rg

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LONG_SYSTEM_PROMPT = "You are a careful assistant. " * 12


@pytest.fixture(scope="module")
def server(openai_server):
    return openai_server


@pytest.fixture(scope="module")
def endpoint(server):
    backend = rg.RuntimeEndpoint(server.base_url, api_key=server.api_key)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def openai_backend(server):
    return rg.OpenAI("tiny", base_url=f"{server.base_url}/v1", api_key=server.api_key)


def computed_prefill_tokens(endpoint) -> int:
    return endpoint.get_server_info()["scheduler"]["num_computed_prefill_tokens"]


@rg.function
def qa(s, question, answer_tokens=6):
    s += rg.system("You are terse.")
    s += rg.user(question)
    s += rg.assistant(rg.gen("answer", max_tokens=answer_tokens, ignore_eos=True))


def test_results_match_a_direct_generate(server, endpoint):
    state = qa.run(question="Hi?", temperature=0.0, backend=endpoint)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    prompt = state.text()[: -len(state["answer"] + "<|im_end|>\n")]
    assert prompt.endswith("<|im_start|>assistant\n")
    direct = httpx.post(
        f"{server.base_url}/generate",
        headers=server.headers,
        json={
            "text": prompt,
            "sampling_params": {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True},
        },
    ).json()
    assert state["answer"] == direct["text"]
    meta = state.get_meta_info("answer")
    assert meta["completion_tokens"] == 6 and meta["prompt_tokens"] > 10


def test_streaming_order_over_sse(endpoint):
    state = qa.run(
        question="Count.", answer_tokens=8, temperature=0.0, stream=True, backend=endpoint
    )
    answer_chunks = list(state.text_iter("answer"))
    assert len(answer_chunks) > 1
    assert "".join(answer_chunks) == state["answer"]
    assert "".join(state.text_iter()) == state.text()


def test_fork_shares_the_prefix_over_http(endpoint):
    @rg.function
    def branches(s):
        s += rg.system(LONG_SYSTEM_PROMPT)
        s += rg.user_begin() + "Ideas?" + rg.user_end()
        forks = s.fork(3)
        forks += rg.assistant(rg.gen("idea", max_tokens=4))
        forks.join()
        s["prefill"] = forks.prefill_meta_info

    endpoint.flush_cache()
    before = computed_prefill_tokens(endpoint)
    state = branches.run(temperature=0.0, backend=endpoint)
    prefix_len = state["prefill"]["prompt_tokens"]
    for meta in state.get_meta_info("idea"):
        assert meta["cached_tokens"] >= prefix_len - 1
    assert computed_prefill_tokens(endpoint) - before < 2 * prefix_len


def test_run_batch_over_http_reuses_the_warm_prefix(endpoint):
    endpoint.flush_cache()
    states = qa.bind(answer_tokens=3).run_batch(
        [{"question": q} for q in ("a?", "b?", "c?")], backend=endpoint, progress_bar=False
    )
    assert all(state.error is None for state in states)
    # system + "<|im_start|>user\n" is the common prefix; each program finds it cached
    for state in states:
        assert state.get_meta_info("answer")["cached_tokens"] >= 10


def test_select_and_constrained_gens_over_http(endpoint):
    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=12)
        population: int = pydantic.Field(ge=0, le=99_999_999)

    @rg.function
    def program(s):
        s += "Capital of France: " + rg.select("city", ["Paris", "Rome", "Oslo"])
        s += "\nZip: " + rg.gen("zip", regex=r"[0-9]{5}")
        s += "\nJSON: " + rg.gen("json", json_schema=City, max_tokens=64)

    state = program.run(temperature=0.0, backend=endpoint)
    scores = state.get_meta_info("city")["scores"]
    assert state["city"] == ["Paris", "Rome", "Oslo"][scores.index(max(scores))]
    assert re.fullmatch(r"[0-9]{5}", state["zip"])
    jsonschema.validate(json.loads(state["json"]), City.model_json_schema())


def test_wrong_api_key_is_reported(server):
    with pytest.raises(rg.BackendError, match="401"):
        rg.RuntimeEndpoint(server.base_url, api_key="wrong")


# ---- the OpenAI-compatible backend -----------------------------------------------------------


def test_openai_backend_chat_json_regex_and_select(openai_backend):
    assert openai_backend.is_radixgen

    class Pet(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=10)

    @rg.function
    def chat(s):
        s += rg.user("Name a pet as JSON.")
        s += rg.assistant(rg.gen("pet", json_schema=Pet, max_tokens=48))
        s += rg.user("A code?")
        s += rg.assistant(rg.gen("code", regex=r"[A-Z]{3}"))
        s += rg.user("Yes or no?")
        s += rg.assistant(rg.select("verdict", ["yes", "no"]))

    state = chat.run(temperature=0.0, backend=openai_backend)
    jsonschema.validate(json.loads(state["pet"]), Pet.model_json_schema())
    assert re.fullmatch(r"[A-Z]{3}", state["code"])
    assert state["verdict"] in ("yes", "no")
    assert state.get_meta_info("pet")["prompt_tokens"] > 0
    assert [m["role"] for m in state.messages()] == ["user", "assistant"] * 3


def test_openai_backend_completion_and_streaming(openai_backend):
    @rg.function
    def plain(s):
        s += "Once upon a time" + rg.gen("story", max_tokens=5, ignore_eos=True)

    state = plain.run(temperature=0.0, stream=True, backend=openai_backend)
    chunks = list(state.text_iter("story"))
    assert "".join(chunks) == state["story"] and state["story"]
    assert state.get_meta_info("story")["completion_tokens"] == 5


def test_openai_backend_reports_unsupported_features(server):
    plain_openai = rg.OpenAI(
        "tiny", base_url=f"{server.base_url}/v1", api_key=server.api_key, is_radixgen=False
    )

    @rg.function
    def uses_regex(s):
        s += rg.user("x") + rg.assistant(rg.gen("y", regex="[a-z]"))

    @rg.function
    def gen_in_user_role(s):
        s += rg.user(rg.gen("y"))

    with pytest.raises(rg.UnsupportedFeatureError, match="radixgen server"):
        uses_regex.run(backend=plain_openai)
    with pytest.raises(rg.UnsupportedFeatureError, match="assistant message"):
        gen_in_user_role.run(backend=plain_openai)


def test_quickstart_script_against_the_server(server):
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "quickstart.py"),
            "--url",
            server.base_url,
            "--api-key",
            server.api_key,
            "--max-new-tokens",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "select: ' + b'" in result.stdout  # the code model's plausible continuation
