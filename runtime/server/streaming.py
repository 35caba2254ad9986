"""Consuming `TokenizerManager.generate()` streams, shared by the native and OpenAI routes:
accumulate samples, merge the streams of a batch, watch for a vanished client, and speak SSE.

Every path out of a stream (finished, error, cancelled because the client left) closes the
generator, whose `finally` aborts the request in the scheduler and frees its KV.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from radixgen.runtime.request_schema import GenerateReq
from radixgen.runtime.server.errors import RequestError, error_body
from radixgen.runtime.server.tokenizer_manager import StreamEvent, TokenizerManager

T = TypeVar("T")
logger = logging.getLogger(__name__)

SSE_DONE = "data: [DONE]\n\n"


@dataclass
class SampleResult:
    """Everything one sample produced so far (the sum of its `StreamEvent`s)."""

    rid: str = ""
    index: int = 0
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)
    input_token_logprobs: list | None = None
    input_top_logprobs: list | None = None

    def add(self, event: StreamEvent) -> None:
        output = event.output
        self.rid, self.index = output.rid, output.index
        self.text += event.text_delta
        self.output_ids.extend(output.new_token_ids)
        self.finished = output.finished
        self.finish_reason = output.finish_reason
        self.prompt_tokens = output.prompt_tokens
        self.completion_tokens = output.completion_tokens
        self.cached_tokens = output.cached_tokens
        if output.output_token_logprobs:
            self.output_token_logprobs.extend(output.output_token_logprobs)
        if output.output_top_logprobs:
            self.output_top_logprobs.extend(output.output_top_logprobs)
        if output.input_token_logprobs is not None:
            self.input_token_logprobs = list(output.input_token_logprobs)
        if output.input_top_logprobs is not None:
            self.input_top_logprobs = list(output.input_top_logprobs)


async def collect(manager: TokenizerManager, request: GenerateReq) -> list[SampleResult]:
    """Runs one prompt to completion; returns its `n` samples in index order."""
    # Filled as outputs arrive: nothing is allocated per sample before the manager admitted
    # the request (and checked `n` against its cap).
    samples: dict[int, SampleResult] = {}
    async with aclosing(manager.generate(request)) as events:
        async for event in events:
            index = event.output.index
            samples.setdefault(index, SampleResult(index=index)).add(event)
    return [samples[index] for index in sorted(samples)]


async def collect_all(
    manager: TokenizerManager, requests: list[GenerateReq]
) -> list[list[SampleResult]]:
    """Runs the prompts of a batch concurrently; the first failure aborts the others."""
    tasks = [asyncio.ensure_future(collect(manager, request)) for request in requests]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        await _cancel_and_wait(tasks)


async def merge_streams(
    manager: TokenizerManager, requests: list[GenerateReq]
) -> AsyncIterator[tuple[int, StreamEvent]]:
    """Yields (prompt index, event) from every prompt of a batch as the events arrive."""
    if len(requests) == 1:
        async with aclosing(manager.generate(requests[0])) as events:
            async for event in events:
                yield 0, event
        return
    queue: asyncio.Queue = asyncio.Queue()
    stream_done = object()

    async def pump(prompt_index: int, request: GenerateReq) -> None:
        try:
            async with aclosing(manager.generate(request)) as events:
                async for event in events:
                    queue.put_nowait((prompt_index, event))
            queue.put_nowait((prompt_index, stream_done))
        except Exception as error:  # handed to the consumer, which must not wait forever
            queue.put_nowait((prompt_index, error))

    tasks = [asyncio.ensure_future(pump(i, request)) for i, request in enumerate(requests)]
    try:
        unfinished = len(tasks)
        while unfinished:
            prompt_index, item = await queue.get()
            if item is stream_done:
                unfinished -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield prompt_index, item
    finally:
        await _cancel_and_wait(tasks)


async def _cancel_and_wait(tasks: list[asyncio.Future]) -> None:
    # Cancelled tasks run their generators' `finally`, which aborts unfinished requests.
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def run_while_connected(request: Request, work: Awaitable[T]) -> T:
    """Awaits `work`, cancelling it (and so aborting its requests) if the client leaves.

    Raises:
        RequestError(499): the client disconnected first.
    """
    task = asyncio.ensure_future(work)
    # One waiter on the connection instead of polling `request.is_disconnected()`: each poll
    # cost ~0.1 ms of event loop (a cancel scope), 4 times a second per waiting request.
    disconnected = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, disconnected}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise RequestError("the client disconnected", status_code=499)
    finally:
        await _cancel_and_wait([t for t in (task, disconnected) if not t.done()])


async def _wait_for_disconnect(request: Request) -> None:
    """Returns once the client has gone (the request body was already read: the next ASGI
    message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def sse_event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def sse_response(
    request: Request,
    events: AsyncIterator[T],
    to_payloads: Callable[[T], Iterable[dict]],
    final_payloads: Callable[[], Iterable[dict]] = lambda: (),
) -> StreamingResponse:
    """Streams `events` as server-sent events, ending with `data: [DONE]`.

    The first event is awaited before the response starts, so a request that fails at once
    (bad constraint, overload) still gets a proper 4xx/5xx status instead of a 200 stream.
    Later failures arrive as a final `data: {"error": ...}` event.
    """
    try:
        first = await run_while_connected(request, anext(events))
    except BaseException:
        await events.aclose()
        raise

    async def body() -> AsyncIterator[str]:
        try:
            for payload in to_payloads(first):
                yield sse_event(payload)
            async for item in events:
                for payload in to_payloads(item):
                    yield sse_event(payload)
            for payload in final_payloads():
                yield sse_event(payload)
        except RequestError as error:
            yield sse_event(error_body(error.message, error.status_code, error.param, error.code))
        except Exception as error:  # a bug: still end the stream properly, and log it
            logger.exception("stream failed")
            yield sse_event(error_body(f"internal error: {error!r}", 500))
        finally:
            # Runs on a client disconnect too (Starlette cancels this generator).
            await events.aclose()
        yield SSE_DONE

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
