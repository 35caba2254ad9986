"""`SchedulerThread`: runs a `Scheduler` on a background thread for the in-process Engine.

Callers (any thread, or an asyncio loop) submit requests and receive that request's
`ReqOutput`s through a `ResultChannel`. Every scheduler call happens on the loop thread, so
the scheduler itself needs no locks. If a step raises, every waiting caller gets the error
instead of hanging.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from radixgen.runtime.io_struct import ReqOutput
from radixgen.runtime.request_schema import GenerateReq
from radixgen.runtime.scheduler import Scheduler

logger = logging.getLogger(__name__)

# How long the idle loop sleeps waiting for work before checking for shutdown.
IDLE_POLL_S = 0.05


class ResultChannel:
    """Delivers one request's outputs to a thread (`get`) or an asyncio loop (`aget`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop
        if loop is None:
            # SimpleQueue: the scheduler thread puts one output per request per step, and its
            # put is several times cheaper than Queue's (no task accounting, C implementation).
            self._queue: Any = queue.SimpleQueue()
        else:
            self._queue = asyncio.Queue()

    def put(self, item: ReqOutput | BaseException) -> bool:
        """Delivers `item`; False if the receiving event loop is gone (nobody listens)."""
        if self.loop is None:
            self._queue.put(item)
            return True
        try:
            self.loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the caller's event loop was closed
            return False
        return True

    def get(self) -> ReqOutput:
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    async def aget(self) -> ReqOutput:
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item


class SchedulerThread:
    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self._inbox: queue.Queue = queue.Queue()
        self._channels: dict[str, ResultChannel] = {}
        self._unfinished_samples: dict[str, int] = {}  # rid -> samples not finished yet
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="radixgen-scheduler", daemon=True)
        self._thread.start()

    def submit(self, request: GenerateReq, channel: ResultChannel) -> None:
        self._check_alive()
        self._inbox.put(("add", request, channel))

    def submit_many(self, items: list[tuple[GenerateReq, ResultChannel]]) -> None:
        """Submits several requests as one inbox item (one scheduler wake-up)."""
        self._check_alive()
        self._inbox.put(("add_many", items, None))

    def abort(self, rid: str) -> None:
        self._inbox.put(("abort", rid, None))

    def call(self, function: Callable[[Scheduler], Any]) -> Any:
        """Runs `function(scheduler)` on the loop thread and returns its result."""
        self._check_alive()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("call", function, future))
        return future.result()

    def shutdown(self) -> None:
        self._stopping.set()
        self._inbox.put(("wake", None, None))
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _check_alive(self) -> None:
        if self._error is not None:
            raise RuntimeError("the engine's scheduler failed") from self._error
        if self._stopping.is_set():
            raise RuntimeError("the engine was shut down")

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._drain_inbox(block=not self.scheduler.has_work())
                if self.scheduler.has_work():
                    self._dispatch(self.scheduler.step())
        except BaseException as error:  # deliver to every waiter: nobody may hang
            logger.exception("scheduler loop failed")
            self._error = error
            for channel in self._channels.values():
                channel.put(RuntimeError(f"the engine's scheduler failed: {error!r}"))
            self._channels.clear()
            self._fail_pending_calls(error)

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=IDLE_POLL_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, payload: Any, extra: Any) -> None:
        if kind == "add":
            self._add(payload, extra)
        elif kind == "add_many":
            for request, channel in payload:
                self._add(request, channel)
        elif kind == "abort":
            self.scheduler.abort_request(payload)
        elif kind == "call":
            try:
                extra.set_result(payload(self.scheduler))
            except Exception as error:
                extra.set_exception(error)

    def _add(self, request: GenerateReq, channel: ResultChannel) -> None:
        self._channels[request.rid] = channel
        n = request.sampling_params.n
        self._unfinished_samples[request.rid] = n if isinstance(n, int) and n > 0 else 1
        self.scheduler.add_request(request)

    def _dispatch(self, outputs: list[ReqOutput]) -> None:
        for output in outputs:
            channel = self._channels.get(output.rid)
            if channel is None:
                continue
            if not channel.put(output):
                self.scheduler.abort_request(output.rid)  # its caller is gone: free the KV
            if output.finished:
                self._unfinished_samples[output.rid] -= 1
                if self._unfinished_samples[output.rid] <= 0:  # every sample is done
                    del self._channels[output.rid], self._unfinished_samples[output.rid]

    def _fail_pending_calls(self, error: BaseException) -> None:
        while True:
            try:
                kind, payload, extra = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "call":
                extra.set_exception(RuntimeError(f"the engine's scheduler failed: {error!r}"))
            elif kind == "add":
                extra.put(RuntimeError(f"the engine's scheduler failed: {error!r}"))
            elif kind == "add_many":
                for _request, channel in payload:
                    channel.put(RuntimeError(f"the engine's scheduler failed: {error!r}"))
