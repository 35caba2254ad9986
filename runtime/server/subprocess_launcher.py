"""Run `radixgen serve` in a child process and wait until it is healthy (tests, benchmarks).

with ServerProcess(["--model-path", "tiny"]) as server:
    httpx.post(f"{server.base_url}/generate", json={...})
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class ServerProcess:
    """A server in a subprocess, logging to a temporary file.

    Args:
        server_flags: `radixgen serve` flags (without --host/--port, which are chosen here).
        entry: the interpreter arguments before the flags (another command, e.g.
            `("-m", "radixgen.runtime.cli", "router")`, takes --host/--port too).
        api_key: sent by `headers` (and passed as --api-key) when given.
        startup_timeout_s: how long `start` waits for /health.
        env: extra environment variables for the server.
    """

    def __init__(
        self,
        server_flags: Sequence[str] = (),
        *,
        api_key: str | None = None,
        startup_timeout_s: float = 120.0,
        env: dict[str, str] | None = None,
        entry: Sequence[str] = ("-m", "radixgen.runtime.server"),
    ):
        self.host = "127.0.0.1"
        self.port = find_free_port(self.host)
        self.base_url = f"http://{self.host}:{self.port}"
        self.api_key = api_key
        self.startup_timeout_s = startup_timeout_s
        self.command = [
            sys.executable,
            *entry,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *server_flags,
        ]
        if api_key is not None:
            self.command += ["--api-key", api_key]
        self.env = {**os.environ, **(env or {})}
        self.log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as self
            prefix="radixgen-server-", suffix=".log", delete=False
        )
        self.process: subprocess.Popen | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def start(self) -> ServerProcess:
        """Starts the server and waits for /health.

        Raises:
            RuntimeError: the server exited or did not become healthy in time (with its log).
        """
        import httpx

        self.process = subprocess.Popen(
            self.command, stdout=self.log_file, stderr=subprocess.STDOUT, env=self.env
        )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the server exited with code {self.process.returncode}:\n{self.log()}"
                )
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"the server was not healthy after {self.startup_timeout_s}s:\n{self.log()}"
        )

    def log(self) -> str:
        with open(self.log_file.name, errors="replace") as log:
            return log.read()

    def wait(self, timeout_s: float) -> int:
        """Waits for the server to exit; returns its exit code."""
        assert self.process is not None
        return self.process.wait(timeout_s)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in time; returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def close(self) -> None:
        self.stop()
        self.log_file.close()
        os.unlink(self.log_file.name)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()
