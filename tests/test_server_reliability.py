"""No request can kill, wedge or 500 the server ([2/14]).

A real `radixgen serve` (tiny model, CPU) in a subprocess, driven by raw sockets and httpx: the
suite's shared server for hostile requests (shared_servers.py). SIGTERM's graceful drain is
test_server_api's last test (it stops its server).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from server_checks import assert_healthy_and_whole
from shared_servers import HEADER_READ_TIMEOUT_S, MAX_REQUEST_BYTES


@pytest.fixture(scope="module")
def server(hostile_server):
    return hostile_server


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def post_raw(http, path: str, body: str) -> httpx.Response:
    # Raw bytes: httpx's json= cannot encode lone surrogates, which the tests need to send.
    return http.post(path, content=body.encode(), headers={"content-type": "application/json"})


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


NOT_300 = '{"not": ' * 300 + "{}" + "}" * 300  # a schema string nested 300 levels
NOT_120 = '{"not": ' * 120 + "{}" + "}" * 120  # under the limit: compiled or refused, never a 5xx
SURROGATE = '"\\ud800abc"'  # a JSON escape of a lone UTF-16 surrogate
BAD_INPUTS = [
    # (path, raw JSON body, status, param or None)
    ("/generate", f'{{"text": "hi", "sampling_params": {{"x": {nested(600)}}}}}', 400, None),
    ("/generate", '{"text": "hi", "sampling_params": ' + nested(100_000) + "}", 400, None),
    ("/generate", f'{{"text": {SURROGATE}}}', 400, "text"),
    ("/v1/completions", f'{{"prompt": {SURROGATE}, "max_tokens": 2}}', 400, "prompt"),
    (
        "/v1/chat/completions",
        f'{{"messages": [{{"role": "user", "content": {SURROGATE}}}], "max_tokens": 2}}',
        400,
        "messages",
    ),
    ("/v1/completions", '{"model": "gpt-4", "prompt": "hi", "max_tokens": 2}', 404, "model"),
    (
        "/v1/chat/completions",
        '{"model": "nope", "messages": [{"role": "user", "content": "x"}]}',
        404,
        "model",
    ),
    ("/generate", '{"input_ids": [[false]]}', 400, "input_ids"),
    ("/generate", '{"input_ids": [true, 5]}', 400, "input_ids"),
    ("/v1/completions", '{"prompt": [false], "max_tokens": 2}', 400, "prompt"),
    ("/generate", '{"text": "hi", "stream": "yes"}', 400, "stream"),
    ("/v1/completions", '{"prompt": "hi", "stream": "yes", "max_tokens": 2}', 400, "stream"),
    # Seeds past int64 (counting sample i's seed + i) killed the scheduler.
    (
        "/generate",
        '{"text": "hi", "sampling_params": {"max_new_tokens": 2, "seed": 9223372036854775808}}',
        400,
        "seed",
    ),
    (
        "/generate",
        '{"text": "hi", "sampling_params": {"seed": 9223372036854775807, "n": 2}}',
        400,
        "seed",
    ),
    ("/v1/completions", f'{{"prompt": "hi", "max_tokens": 2, "seed": {2**70}}}', 400, "seed"),
    # A huge n blocked the event loop building n results.
    (
        "/v1/completions",
        '{"model": "tiny", "prompt": "hi", "max_tokens": 2, "n": 10000000}',
        400,
        "n",
    ),
    (
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": "x"}], "temperature": 1e309}',
        400,
        "temperature",
    ),
    (
        "/generate",
        '{"text": "hi", "sampling_params": {"temperature": Infinity}}',
        400,
        "temperature",
    ),
    ("/generate", '{"text": "hi", "sampling_params": {"top_p": 0}}', 400, "top_p"),
    # A schema nested past the limit, given as a string (the body itself is shallow).
    (
        "/generate",
        json.dumps({"text": "hi", "sampling_params": {"json_schema": NOT_300}}),
        400,
        "json_schema",
    ),
    # Megabytes of text whose byte length alone proves it cannot fit the context.
    ("/generate", json.dumps({"text": "x" * 900_000}), 400, "text"),
]


@pytest.mark.parametrize("path, body, status, param", BAD_INPUTS)
def test_bad_input_is_a_4xx_in_openai_shape(http, path, body, status, param):
    response = post_raw(http, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    assert "Traceback" not in error["message"] and "object at 0x" not in error["message"]
    if status == 404:
        assert error["code"] == "model_not_found"
    assert_healthy_and_whole(http)


def test_a_deep_schema_under_the_limit_is_compiled_or_refused_never_a_5xx(http):
    body = {"text": "hi", "sampling_params": {"json_schema": NOT_120, "max_new_tokens": 4}}
    response = http.post("/generate", json=body)
    assert response.status_code in (200, 400), response.text
    assert_healthy_and_whole(http)


def test_served_model_name_and_omitted_model_are_accepted(http):
    served = http.get("/v1/models").json()["data"][0]["id"]
    for extra in ({}, {"model": served}):
        body = {"prompt": "hi", "max_tokens": 2, **extra}
        assert http.post("/v1/completions", json=body).status_code == 200


def test_body_over_the_limit_is_413_declared_or_chunked(http):
    big = json.dumps({"text": "x" * (MAX_REQUEST_BYTES + 10)})
    response = post_raw(http, "/generate", big)  # with a Content-Length header
    assert response.status_code == 413
    assert "--max-request-bytes" in response.json()["error"]["message"]

    def chunks():  # no Content-Length: counted as it arrives
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536].encode()

    response = http.post("/generate", content=chunks())
    assert response.status_code == 413
    assert_healthy_and_whole(http)


def test_long_text_is_refused_without_stalling_the_event_loop(server, http):
    # A 900 kB prompt is refused by its byte length; /health answers meanwhile.
    body = json.dumps({"text": "y " * 450_000})
    timings: list[float] = []

    def probe() -> None:
        for _ in range(10):
            start = time.monotonic()
            assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
            timings.append(time.monotonic() - start)

    prober = threading.Thread(target=probe)
    prober.start()
    for _ in range(3):
        assert post_raw(http, "/generate", body).status_code == 400
    prober.join()
    assert max(timings) < 5.0


def test_partial_headers_are_closed_after_the_header_timeout(server):
    host, port = server.base_url.removeprefix("http://").split(":")
    sockets = []
    for _ in range(4):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        sockets.append(sock)
    time.sleep(HEADER_READ_TIMEOUT_S + 1.5)
    for sock in sockets:
        sock.settimeout(5)
        try:
            assert sock.recv(1024) == b""  # closed by the server
        except ConnectionResetError:
            pass
        sock.close()
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


def test_client_leaving_mid_body_is_not_an_error(server):
    host, port = server.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    head = "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    sock.sendall((head + "Content-Length: 1000\r\n\r\n" + '{"text": "hi').encode())
    time.sleep(0.2)
    sock.close()
    time.sleep(0.5)
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    assert "Traceback" not in server.log()
    assert " ERROR " not in server.log()
