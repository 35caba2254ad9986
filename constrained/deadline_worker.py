"""`DeadlineWorker`: jobs in a separate, memory-limited process, each with a deadline.

Benchmarks and reports use it where one compile may take minutes or tens of GiB (outlines-core
at a 128k vocabulary, or on schemas whose regex determinises badly): a job past its deadline, or
one that dies, kills the process, which restarts for the next job.
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from collections.abc import Callable
from typing import Any

DEFAULT_MEMORY_LIMIT_BYTES = 8 * 1024**3


def _worker_main(connection, setup: Callable[[], Any], handle, memory_limit_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    start = time.perf_counter()
    state = setup()
    connection.send(time.perf_counter() - start)
    while (job := connection.recv()) is not None:
        connection.send(handle(state, job))


class DeadlineWorker:
    """Runs `handle(setup(), job)` in a worker process (spawned: no inherited threads).

    Args:
        setup: a picklable callable building the worker's state (e.g. a `GrammarBackend`).
        handle: a picklable callable (state, job) -> result.
        memory_limit_bytes: the worker's address-space limit.

    Attributes:
        setup_s: seconds the first `setup()` took, once started.
    """

    def __init__(
        self,
        setup: Callable[[], Any],
        handle: Callable[[Any, Any], Any],
        *,
        memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
    ) -> None:
        self._setup, self._handle, self._memory_limit_bytes = setup, handle, memory_limit_bytes
        self.setup_s: float | None = None
        self._process = None

    def run(self, job: Any, *, deadline_s: float) -> tuple[bool, Any]:
        """(True, result), or (False, None) when the job missed `deadline_s` or its process died."""
        if self._process is None:
            self._start()
        self._connection.send(job)
        if self._connection.poll(deadline_s):
            try:
                return True, self._connection.recv()
            except EOFError:  # the worker died (e.g. at its memory limit)
                pass
        self.stop()
        return False, None

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join()
            self._process = None

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        arguments = (child, self._setup, self._handle, self._memory_limit_bytes)
        self._process = context.Process(target=_worker_main, args=arguments, daemon=True)
        self._process.start()
        setup_s = self._connection.recv()
        if self.setup_s is None:
            self.setup_s = setup_s
