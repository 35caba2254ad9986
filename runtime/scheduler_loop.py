"""`SchedulerLoop`: the one loop that drives a `Scheduler`, for the Engine and the server alike.

    while the transport is open:
        for message in transport.receive(block=not scheduler.has_work()):
            handle(message)            # GenerateReq, BatchGenerateReq, AbortReq, control requests
        if scheduler.has_work():
            outputs = scheduler.step()  # at most one forward
            transport.deliver(outputs)  # returns the rids whose receiver is gone: aborted
        elif a whole blocking receive brought nothing:
            scheduler.check_integrity_when_idle()

The loop blocks for messages only when idle, so a busy scheduler never waits on its inbox.
The idle KV integrity check (O(pool size)) waits for a whole quiet poll interval, so it never
delays a request's last output nor a request that follows it closely.
What differs between the in-process Engine and the server is only the `SchedulerTransport`:
an in-process queue with per-request result channels (`runtime/engine_loop.py`), or ZeroMQ
sockets to the tokenizer manager and the detokenizer (`runtime/server/scheduler_process.py`).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod

from radixgen.runtime.io_struct import (
    AbortReq,
    BatchGenerateReq,
    CheckIntegrityReq,
    FlushCacheReq,
    GetStatsReq,
    LoadLoRAAdapterReq,
    ReqOutput,
    UnloadLoRAAdapterReq,
)
from radixgen.runtime.request_schema import GenerateReq
from radixgen.runtime.scheduler import Scheduler

logger = logging.getLogger(__name__)


class SchedulerTransport(ABC):
    """Where a `SchedulerLoop` gets its messages and sends its outputs and replies."""

    @abstractmethod
    def is_open(self) -> bool:
        """False once the loop must stop (shut down, or the parent process is gone)."""

    @abstractmethod
    def receive(self, *, block: bool) -> list[object]:
        """Every waiting message; with `block`, waits a short while for the first one."""

    def on_request(self, request: GenerateReq) -> None:  # noqa: B027 - optional hook
        """Called before the scheduler sees `request` (e.g. to announce it downstream)."""

    def on_abort(self, message: AbortReq) -> None:  # noqa: B027 - optional hook
        """Called after the scheduler aborted `message.rid`."""

    @abstractmethod
    def deliver(self, outputs: list[ReqOutput]) -> list[str]:
        """Ships one step's outputs; returns the rids nobody receives any more (to abort)."""

    @abstractmethod
    def reply(self, message: object, value: object) -> None:
        """Answers a control request (`value` may be an exception to raise at the caller)."""

    def after_empty_step(self) -> None:  # noqa: B027 - optional hook
        """Called when a step produced no output (e.g. a constraint still compiling)."""

    @abstractmethod
    def fail(self, error: BaseException) -> None:
        """The loop died: every waiter gets `error` instead of hanging."""


class SchedulerLoop:
    """Feeds `scheduler` from `transport` and ships its outputs back; one thread runs it."""

    def __init__(self, scheduler: Scheduler, transport: SchedulerTransport):
        self.scheduler = scheduler
        self.transport = transport

    def run(self) -> None:
        """Runs until the transport closes. An exception in a step is a bug or a device
        fault: every waiter gets it (`transport.fail`), then it propagates."""
        scheduler, transport = self.scheduler, self.transport
        counters = scheduler.counters
        try:
            while transport.is_open():
                idle = not scheduler.has_work()
                receiving = time.perf_counter()
                messages = transport.receive(block=idle)
                received = time.perf_counter()
                for message in messages:
                    self.handle(message)
                handled = time.perf_counter()
                # A blocking receive waits (idle) until its message arrives; a polling one is
                # intake, as is adding what arrived.
                if idle:
                    counters.idle_time_s += received - receiving
                    counters.intake_time_s += handled - received
                else:
                    counters.intake_time_s += handled - receiving
                if idle and not messages:  # a whole poll interval without work
                    scheduler.check_integrity_when_idle()
                elif scheduler.has_work():
                    start = time.perf_counter()
                    outputs = scheduler.step()
                    stepped = time.perf_counter()
                    counters.step_time_s += stepped - start
                    if outputs:
                        for rid in transport.deliver(outputs):
                            scheduler.abort_request(rid)  # its receiver is gone: free the KV
                        counters.deliver_time_s += time.perf_counter() - stepped
                    else:
                        transport.after_empty_step()
        except BaseException as error:
            logger.exception("the scheduler loop failed")
            transport.fail(error)
            raise

    def handle(self, message: object) -> None:
        scheduler = self.scheduler
        if isinstance(message, GenerateReq):
            self.transport.on_request(message)
            scheduler.add_request(message)
        elif isinstance(message, BatchGenerateReq):
            for request in message.requests:
                self.transport.on_request(request)
                scheduler.add_request(request)
        elif isinstance(message, AbortReq):
            scheduler.abort_request(message.rid)
            self.transport.on_abort(message)
        elif isinstance(message, FlushCacheReq):
            self.transport.reply(message, scheduler.flush_cache())
        elif isinstance(message, (LoadLoRAAdapterReq, UnloadLoRAAdapterReq)):
            self.transport.reply(message, scheduler.update_lora_adapter(message))
        elif isinstance(message, GetStatsReq):
            self.transport.reply(message, scheduler.get_stats())
        elif isinstance(message, CheckIntegrityReq):
            try:
                scheduler.check_integrity()
            except AssertionError as error:
                self.transport.reply(message, error)
            else:
                self.transport.reply(message, None)
        else:
            logger.error("scheduler: unexpected message %r", type(message).__name__)
