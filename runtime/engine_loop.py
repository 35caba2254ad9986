"""The in-process transport of the Engine: a `SchedulerLoop` on a background thread.

Callers (any thread, or an asyncio loop) submit requests and receive that request's
`ReqOutput`s through a `ResultChannel`. Every scheduler call happens on the loop thread, so
the scheduler itself needs no locks. If the loop fails, every waiting caller gets the error
instead of hanging.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from typing import Any

from radixgen.runtime.io_struct import AbortReq, BatchGenerateReq, ReqOutput
from radixgen.runtime.request_schema import GenerateReq
from radixgen.runtime.scheduler import Scheduler
from radixgen.runtime.scheduler_loop import SchedulerLoop, SchedulerTransport

# How long the idle loop sleeps waiting for work before checking for shutdown.
IDLE_POLL_S = 0.05
# Wait after a step that produced nothing (a constraint still compiling on a worker thread).
IDLE_STEP_WAIT_S = 0.001


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


class InProcessTransport(SchedulerTransport):
    """A queue in, result channels (and futures for control replies) out."""

    def __init__(self):
        self._inbox: queue.Queue = queue.Queue()
        self._channels: dict[str, ResultChannel] = {}
        self._unfinished_samples: dict[str, int] = {}  # rid -> samples not finished yet
        self._replies: dict[int, concurrent.futures.Future] = {}  # id(message) -> its future
        self._stopping = threading.Event()
        self.error: BaseException | None = None

    # ---- caller side (any thread) --------------------------------------------------------

    def submit(self, requests: list[GenerateReq], channels: list[ResultChannel]) -> None:
        """Queues validated requests as one message; each request's outputs go to its channel."""
        self.check_alive()
        for request, channel in zip(requests, channels, strict=True):
            # Registered before the loop can see the request (dict writes are atomic).
            self._unfinished_samples[request.rid] = request.sampling_params.n
            self._channels[request.rid] = channel
        self._inbox.put(requests[0] if len(requests) == 1 else BatchGenerateReq(list(requests)))
        if self.error is not None:  # the loop failed meanwhile, maybe after failing channels
            for channel in channels:
                channel.put(RuntimeError(f"the engine's scheduler failed: {self.error!r}"))

    def abort(self, rid: str) -> None:
        self._inbox.put(AbortReq(rid))

    def request(self, message: object) -> Any:
        """Sends a control request and waits for the loop's reply (raised if an error)."""
        self.check_alive()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._replies[id(message)] = future
        self._inbox.put(message)
        if self.error is not None and not future.done():  # the loop failed meanwhile
            future.set_exception(RuntimeError(f"the engine's scheduler failed: {self.error!r}"))
        return future.result()

    def close(self) -> None:
        self._stopping.set()
        self._inbox.put(None)  # wakes a blocked receive()

    def check_alive(self) -> None:
        if self.error is not None:
            raise RuntimeError("the engine's scheduler failed") from self.error
        if self._stopping.is_set():
            raise RuntimeError("the engine was shut down")

    # ---- loop side (the scheduler thread) --------------------------------------------------

    def is_open(self) -> bool:
        return not self._stopping.is_set()

    def receive(self, *, block: bool) -> list[object]:
        try:
            first = self._inbox.get(timeout=IDLE_POLL_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return []
        messages = [first]
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                return [m for m in messages if m is not None]

    def after_empty_step(self) -> None:
        # Without this wait the loop spun on has_work() (~600 empty steps during one ~20 ms
        # schema compile on the CPU machine), holding the GIL the compile thread needs.
        time.sleep(IDLE_STEP_WAIT_S)

    def deliver(self, outputs: list[ReqOutput]) -> list[str]:
        gone = []
        for output in outputs:
            channel = self._channels.get(output.rid)
            if channel is None:
                continue
            if not channel.put(output):
                gone.append(output.rid)
            if output.finished:
                self._unfinished_samples[output.rid] -= 1
                if self._unfinished_samples[output.rid] <= 0:  # every sample is done
                    del self._channels[output.rid], self._unfinished_samples[output.rid]
        return gone

    def reply(self, message: object, value: object) -> None:
        future = self._replies.pop(id(message))
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)

    def fail(self, error: BaseException) -> None:
        self.error = error
        failure = RuntimeError(f"the engine's scheduler failed: {error!r}")
        for channel in self._channels.values():
            channel.put(failure)
        self._channels.clear()
        for future in self._replies.values():
            if not future.done():
                future.set_exception(failure)
        self._replies.clear()
        # Requests queued but never seen: registered above, so already failed; drop them.
        while True:
            try:
                self._inbox.get_nowait()
            except queue.Empty:
                return


class SchedulerThread:
    """The Engine's `SchedulerLoop`, on a daemon thread, with its in-process transport."""

    def __init__(self, scheduler: Scheduler):
        self.transport = InProcessTransport()
        self._loop = SchedulerLoop(scheduler, self.transport)
        self._thread = threading.Thread(target=self._run, name="radixgen-scheduler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._loop.run()
        except BaseException:  # logged and handed to every waiter by the loop
            pass

    def shutdown(self) -> None:
        self.transport.close()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def is_stopped(self) -> bool:
        return not self._thread.is_alive()

    def release_scheduler(self) -> None:
        """Drops the stopped loop's scheduler (and with it the model and its memory)."""
        self._loop = None
