"""No request can kill, wedge or 500 the server ([2/14]); SIGTERM drains gracefully.

A real `radixgen serve` (tiny model, CPU) in a subprocess, driven by raw sockets and httpx.
One server serves the bad-input table; the drain test starts its own (it stops it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import httpx
import pytest
from server_checks import assert_healthy_and_whole

from radixgen.runtime.server.subprocess_launcher import ServerProcess

CONTEXT_LENGTH = 512
MAX_REQUEST_BYTES = 1_000_000
HEADER_READ_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def server(tiny_model_path):
    flags = [
        "--log-level", "info",
        "--context-length", str(CONTEXT_LENGTH),
        "--max-request-bytes", str(MAX_REQUEST_BYTES),
        "--header-read-timeout", str(HEADER_READ_TIMEOUT_S),
    ]  # fmt: skip
    with ServerProcess(flags) as running:
        yield running


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


def test_sigterm_drains_then_aborts_and_exits_zero(tiny_model_path):
    flags = ["--log-level", "info", "--context-length", "1024", "--shutdown-timeout", "2"]
    with ServerProcess(flags) as server:
        info = httpx.get(f"{server.base_url}/get_server_info", timeout=30).json()
        short = {"text": "short", "sampling_params": {"max_new_tokens": 4}}
        endless = {"max_new_tokens": 900, "ignore_eos": True, "temperature": 0}
        results: dict[str, object] = {}

        def run(name: str, body: dict) -> None:
            try:
                with httpx.stream(
                    "POST", f"{server.base_url}/generate", json=body, timeout=60
                ) as response:
                    results[name] = (response.status_code, list(response.iter_lines()))
            except httpx.TransportError as error:
                results[name] = error

        def in_flight() -> int:
            return httpx.get(f"{server.base_url}/get_server_info").json()["num_requests_in_flight"]

        def wait_until(condition) -> None:
            deadline = time.monotonic() + 30
            while not condition():
                assert time.monotonic() < deadline
                time.sleep(0.05)

        # Both endless requests in flight first, then the short one (in flight or already
        # done): SIGTERM never races a request that has not reached the server.
        threads = [
            threading.Thread(target=run, args=("long", {"text": "a", "sampling_params": endless})),
            threading.Thread(
                target=run,
                args=("stream", {"text": "b", "stream": True, "sampling_params": endless}),
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
        refused = httpx.post(f"{server.base_url}/generate", json=short, timeout=10)
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
        for pid in info["process_ids"].values():
            assert not _is_running(pid, wait_s=10), f"process {pid} survived"


def _is_running(pid: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(")")[-1].split()[0] == "Z":
                return False
        time.sleep(0.05)
    return True
