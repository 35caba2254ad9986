"""Compiles constraints off the scheduler's critical path, with an LRU cache and timeouts.

outlines-core builds its index with the GIL released, so a thread pool lets the scheduler keep
stepping other requests while a large schema compiles. Requests for the same constraint share one
compilation (the cache holds futures). A per-request timeout fails only that request's future;
the compilation itself runs on and still fills the cache.
"""

from __future__ import annotations

import hashlib
import heapq
import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any


class CompileTimeoutError(TimeoutError):
    """A constraint did not compile within the request's timeout."""


class CompileCache:
    """LRU of compilation futures keyed by a hashable key, compiled on a thread pool.

    Args:
        compile_fn: key -> compiled object (runs on a worker thread).
        max_entries: in-memory entries kept (least recently used evicted).
        max_workers: concurrent compilations.
    """

    def __init__(
        self, compile_fn: Callable[[Hashable], Any], *, max_entries: int = 128, max_workers: int = 2
    ) -> None:
        if max_entries <= 0 or max_workers <= 0:
            raise ValueError(f"max_entries={max_entries}, max_workers={max_workers} must be > 0")
        self._compile_fn = compile_fn
        self._max_entries = max_entries
        self._futures: OrderedDict[Hashable, Future] = OrderedDict()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="grammar-compile")
        self._deadlines = _DeadlineWatcher()

    def submit(self, key: Hashable, timeout_s: float | None = None) -> Future:
        """A future of the compiled `key`: cached, shared with concurrent requests.

        Args:
            timeout_s: if set, the returned future fails with `CompileTimeoutError` after this
                many seconds; other requests and the cache are unaffected.
        """
        with self._lock:
            shared = self._futures.get(key)
            is_new = shared is None
            if is_new:
                shared = self._executor.submit(self._compile_fn, key)
                self._futures[key] = shared
                while len(self._futures) > self._max_entries:
                    self._futures.popitem(last=False)
            else:
                self._futures.move_to_end(key)
        if is_new:  # outside the lock: the callback runs at once if the compile already failed
            shared.add_done_callback(lambda done, key=key: self._forget_if_failed(key, done))
        if shared.done():
            return shared
        # A per-request future: cancelling or timing it out never touches the shared compile.
        return _request_future(shared, timeout_s, key, self._deadlines)

    def run_in_background(self, fn: Callable[[], Any]) -> Future:
        """Runs `fn` on the compile pool (e.g. optional work after a compile)."""
        return self._executor.submit(fn)

    def _forget_if_failed(self, key: Hashable, future: Future) -> None:
        # Failures are not cached: a later request may succeed (e.g. after a transient error).
        if future.exception() is not None:
            with self._lock:
                if self._futures.get(key) is future:
                    del self._futures[key]

    def __len__(self) -> int:
        return len(self._futures)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class _DeadlineWatcher:
    """One daemon thread that fails request futures whose deadline passed (not a thread per
    request: a burst of requests waiting on one big schema stays cheap)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Future, str]] = []
        self._condition = threading.Condition()
        self._sequence = 0
        self._thread: threading.Thread | None = None

    def add(self, future: Future, timeout_s: float, message: str) -> None:
        with self._condition:
            self._sequence += 1
            deadline = time.monotonic() + timeout_s
            heapq.heappush(self._heap, (deadline, self._sequence, future, message))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="grammar-compile-deadlines", daemon=True
                )
                self._thread.start()
            self._condition.notify()

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._heap:
                    self._condition.wait()
                deadline, _, future, message = self._heap[0]
                wait_s = deadline - time.monotonic()
                if wait_s > 0:
                    self._condition.wait(wait_s)
                    continue
                heapq.heappop(self._heap)
            if not future.done():
                _settle(future, error=CompileTimeoutError(message))


def _request_future(
    shared: Future, timeout_s: float | None, key: Hashable, watcher: _DeadlineWatcher
) -> Future:
    """A future mirroring `shared` that fails with CompileTimeoutError after `timeout_s`."""
    request_future: Future = Future()
    if timeout_s is not None:
        describe = getattr(key, "describe", None)  # ConstraintSpec keys say what they are
        what = describe() if describe is not None else str(key)[:120]
        message = (
            f"the constraint {what} did not compile within {timeout_s:g} s "
            "(--constrained-compile-timeout-s): simplify it or raise that limit"
        )
        watcher.add(request_future, timeout_s, message)

    def mirror(done: Future) -> None:
        if done.cancelled():
            request_future.cancel()
            return
        error = done.exception()
        _settle(request_future, error=error, result=None if error else done.result())

    shared.add_done_callback(mirror)
    return request_future


def _settle(future: Future, *, error: BaseException | None = None, result: Any = None) -> None:
    if future.cancelled():  # the request gave up waiting
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except Exception:  # already settled by the other of timer and completion
        pass


class DiskCache:
    """Pickled compiled artefacts in a directory, named by a hash of their key."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, key: Hashable) -> Path:
        return self.directory / (hashlib.sha256(repr(key).encode()).hexdigest()[:32] + ".pkl")

    def load(self, key: Hashable) -> Any | None:
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            stored_key, value = pickle.loads(path.read_bytes())
        except Exception:  # a truncated or stale file is a miss, not an error
            return None
        return value if stored_key == key else None

    def store(self, key: Hashable, value: Any) -> None:
        path = self._path(key)
        temporary = path.with_suffix(f".{threading.get_ident()}.tmp")
        temporary.write_bytes(pickle.dumps((key, value)))
        temporary.replace(path)  # atomic: concurrent readers see the old file or the new one
