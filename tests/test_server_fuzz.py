"""Property-based fuzzing and a short soak of a real `radixgen serve` (tiny model, CPU).

Bodies come from the server's own request models (`model_json_schema()`, drawn by the small
schema-to-strategy below: hypothesis-jsonschema 0.23 does not run on current hypothesis) with
fields overwritten by extreme values; the only property is that
the server never answers 5xx and stays healthy with its KV pool whole. Both are bounded to a
few seconds so that they run in CI. The server is the suite's shared one for hostile requests
(shared_servers.py), whose small context bounds what a valid fuzzed request generates.
"""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_checks import assert_healthy_and_whole

from radixgen.runtime.request_schema import SAMPLING_FIELD_NAMES
from radixgen.runtime.server.native_api import GenerateBody
from radixgen.runtime.server.openai_protocol import ChatCompletionRequest, CompletionRequest

EXTREME_VALUES = st.sampled_from(
    [
        0, 1, -1, 2**31, 2**63 - 1, 2**63, 2**64, 2**70, -(2**63), -(2**70),
        0.0, -0.0, 1e-320, 1e308, float("inf"), float("-inf"),
        True, False, None, "", "\ud800", "x" * 5000, [], {}, [[False]], [1e309], {"a": None},
    ]
)  # fmt: skip


def from_schema(schema: dict, defs: dict | None = None) -> st.SearchStrategy:
    """Values valid for a pydantic-generated JSON schema (the keywords pydantic emits)."""
    defs = schema.get("$defs", {}) if defs is None else defs
    if "$ref" in schema:
        return st.deferred(lambda: from_schema(defs[schema["$ref"].split("/")[-1]], defs))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([from_schema(option, defs) for option in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        fields = {
            name: from_schema(sub, defs) for name, sub in properties.items() if name in required
        }
        optional = {
            name: from_schema(sub, defs) for name, sub in properties.items() if name not in required
        }
        if not properties:
            return st.dictionaries(st.text(max_size=5), st.integers(), max_size=3)
        return st.fixed_dictionaries(fields, optional=optional)
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), defs), max_size=3)
    simple = {
        "string": st.text(max_size=12),
        "integer": st.integers(-3, 40),
        "number": st.floats(-2, 50, allow_nan=False),
        "boolean": st.booleans(),
        "null": st.none(),
    }
    return simple.get(kind, st.one_of(st.integers(), st.text(max_size=5)))


# A small valid body per endpoint, into which the fuzzer writes extreme values.
VALID_BODIES = {
    "/generate": {"text": "def f(", "sampling_params": {"max_new_tokens": 4}},
    "/v1/completions": {"prompt": "def f(", "max_tokens": 4},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
}
MODELS = {
    "/generate": GenerateBody,
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
}


def body_strategy() -> st.SearchStrategy[tuple[str, dict]]:
    """Half: whole bodies drawn from each model's schema; half: a valid body with one or two
    fields (of the model, or of sampling_params) set to extreme values."""
    strategies = []
    for path, model in MODELS.items():
        schema = model.model_json_schema()
        strategies.append(st.tuples(st.just(path), from_schema(schema)))
        names = sorted(schema["properties"])
        if path == "/generate":
            names += [f"sampling_params.{name}" for name in sorted(SAMPLING_FIELD_NAMES)]
        overrides = st.dictionaries(
            st.sampled_from(names),
            st.one_of(EXTREME_VALUES, from_schema({})),
            min_size=1,
            max_size=2,
        )
        strategies.append(
            st.tuples(st.just(path), overrides.map(lambda o, p=path: _override(p, o)))
        )
    return st.one_of(strategies)


def _override(path: str, overrides: dict) -> dict:
    body = json.loads(json.dumps(VALID_BODIES[path]))
    for name, value in overrides.items():
        if name.startswith("sampling_params."):
            body["sampling_params"][name.split(".", 1)[1]] = value
        else:
            body[name] = value
    return body


@pytest.fixture(scope="module")
def server(hostile_server):
    return hostile_server


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def test_fuzzed_bodies_never_get_a_5xx(http):
    @settings(
        max_examples=80,
        deadline=None,
        derandomize=True,  # the same bodies on every run: CI stays deterministic
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(body_strategy())
    def check(path_and_body):
        path, body = path_and_body
        raw = json.dumps(body).encode("utf-8", "surrogatepass")
        response = http.post(path, content=raw, headers={"content-type": "application/json"})
        assert response.status_code < 500, (path, body, response.text)
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    check()
    assert_healthy_and_whole(http)


def test_soak_with_disconnecting_clients(server, http):
    """96 requests at concurrency 8 (a count, not a duration: the same soak on a busy machine);
    about a fifth of the clients leave mid-request."""
    statuses: list[int] = []
    rng = random.Random(0)
    remaining = [96]

    async def one_client(client: httpx.AsyncClient) -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            leaves = rng.random() < 0.2
            stream = rng.random() < 0.5
            body = {
                "text": "def soak_" + str(rng.randrange(1000)),
                "stream": stream,
                "sampling_params": {"max_new_tokens": rng.randrange(1, 32), "ignore_eos": True},
            }
            try:
                if stream:
                    async with client.stream("POST", "/generate", json=body) as response:
                        statuses.append(response.status_code)
                        async for _ in response.aiter_lines():
                            if leaves:
                                break  # closes the connection mid-stream
                else:
                    timeout = 0.05 if leaves else 60
                    response = await client.post("/generate", json=body, timeout=timeout)
                    statuses.append(response.status_code)
            except httpx.TimeoutException:
                pass  # the client that left

    async def soak() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            await asyncio.gather(*(one_client(client) for _ in range(8)))

    asyncio.run(soak())
    assert len(statuses) > 48  # the clients that stayed (and the streams that left) answered
    assert all(status < 500 for status in statuses), sorted(set(statuses))
    assert_healthy_and_whole(http)
