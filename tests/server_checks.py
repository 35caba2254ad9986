"""Checks shared by the tests that drive a real `radixgen serve`."""

from __future__ import annotations

import time


def assert_healthy_and_whole(http, timeout_s: float = 20.0) -> None:
    """`/health` is 200, and once the server is idle and flushed every KV slot is free."""
    assert http.get("/health").status_code == 200
    deadline = time.monotonic() + timeout_s
    while True:
        info = http.get("/get_server_info").json()
        if info["num_requests_in_flight"] == 0 and info["scheduler"]["num_running_reqs"] == 0:
            break
        assert time.monotonic() < deadline, info
        time.sleep(0.05)
    assert http.post("/flush_cache").status_code == 200
    scheduler = http.get("/get_server_info").json()["scheduler"]
    assert scheduler["kv_free_slots"] == scheduler["kv_total_slots"]
