"""The server never hangs on a dead child: it fails requests in flight and exits non-zero."""

from __future__ import annotations

import os
import signal
import threading

import httpx
import pytest

from radixgen.runtime.server.subprocess_launcher import ServerProcess


def test_scheduler_crash_fails_requests_and_exits_nonzero(default_server):
    server = default_server  # shared: after this test kills it, its next user starts another
    info = httpx.get(f"{server.base_url}/get_server_info", timeout=30).json()
    body = {
        "text": "in flight when the scheduler dies",
        "stream": True,
        "sampling_params": {"max_new_tokens": 200, "ignore_eos": True, "temperature": 0},
    }
    first_chunk = threading.Event()
    lines: list[str] = []

    def stream_until_the_end() -> None:
        try:
            with httpx.stream("POST", f"{server.base_url}/generate", json=body) as response:
                for line in response.iter_lines():
                    lines.append(line)
                    first_chunk.set()
        except httpx.TransportError:
            pass  # the shutdown closed the connection: also not a hang
        first_chunk.set()

    in_flight = threading.Thread(target=stream_until_the_end)
    in_flight.start()
    assert first_chunk.wait(timeout=30)
    os.kill(info["process_ids"]["scheduler"], signal.SIGKILL)

    assert server.wait(timeout_s=30) == 1
    in_flight.join(timeout=30)
    assert not in_flight.is_alive()
    assert "the scheduler process died (exit code -9)" in server.log()
    with pytest.raises(ProcessLookupError):
        os.kill(info["process_ids"]["detokenizer"], 0)
    # The stream in flight ended with an error event, not with silence.
    errors = [line for line in lines if '"error"' in line]
    assert errors and '"code": 503' in errors[0]


def test_bad_model_path_exits_nonzero_with_a_clear_log(tmp_path):
    server = ServerProcess(["--model-path", str(tmp_path / "missing"), "--log-level", "warning"])
    with pytest.raises(RuntimeError, match="exited with code 1") as failure:
        server.start()
    assert "missing" in str(failure.value)
    server.close()
