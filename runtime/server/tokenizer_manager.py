"""The front end's core, in the HTTP process: tokenizes, admits, sends requests to the scheduler
and hands each request's outputs back to the handler awaiting them.

One asyncio task reads the detokenizer's per-step `[StepOutputs, text deltas]` messages (and
the scheduler's control replies) and routes each output row to its request's `RequestInbox`
by rid. A handler iterates `generate()`; leaving the iteration early (client gone, error)
aborts the request, which frees its KV in the scheduler.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator

import zmq
import zmq.asyncio

from radixgen.runtime.io_struct import (
    AbortReq,
    FlushCacheOutput,
    FlushCacheReq,
    GetStatsReq,
    LoadLoRAAdapterReq,
    LoRAAdapterOutput,
    ReqOutput,
    SchedulerStats,
    UnloadLoRAAdapterReq,
)
from radixgen.runtime.request_schema import (
    GenerateReq,
    ModelLimits,
    RequestFieldError,
    check_model_limits,
)
from radixgen.runtime.server.errors import RequestError
from radixgen.runtime.server.ipc import IpcPaths, bind_pull, connect_push
from radixgen.runtime.server.messages import (
    ServedModelInfo,
    StepOutputs,
    WarmupDone,
    load_frame,
)
from radixgen.runtime.server.metrics import ServerMetrics
from radixgen.runtime.server.request_inbox import RequestInbox, StreamEvent
from radixgen.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)

# A stats or flush reply slower than this means the scheduler is wedged: answer 503.
CONTROL_REPLY_TIMEOUT_S = 30.0
# How the scheduler's rejection for a full queue begins (`Scheduler.add_request`).
SCHEDULER_QUEUE_FULL_PREFIX = "the queue is full"


class TokenizerManager:
    """Tokenizes and admits requests, and streams their outputs back.

    Args:
        server_args: the server's options (queue limit, model name).
        model_info: what the scheduler reported once the model was loaded.
        ipc_paths: socket addresses of this server instance.
        tokenizer: a HF tokenizer (the same files the detokenizer loaded).
        metrics: the server's Prometheus metrics.
    """

    def __init__(
        self,
        server_args: ServerArgs,
        model_info: ServedModelInfo,
        ipc_paths: IpcPaths,
        tokenizer,
        metrics: ServerMetrics,
    ):
        self.server_args = server_args
        self.model_info = model_info
        self.tokenizer = tokenizer
        self.metrics = metrics
        # Sends never block (unbounded queue), so a plain socket is safe inside the event
        # loop and usable from `finally` blocks that must not await.
        self._sync_context = zmq.Context()
        self._to_scheduler = connect_push(self._sync_context, ipc_paths.scheduler_input)
        self._async_context = zmq.asyncio.Context()
        self._from_workers = bind_pull(self._async_context, ipc_paths.tokenizer_input)
        self._states: dict[str, RequestInbox] = {}
        self._stats_waiters: deque[asyncio.Future] = deque()
        self._flush_waiters: deque[asyncio.Future] = deque()
        self._lora_waiters: deque[asyncio.Future] = deque()
        # The adapter names requests may use (the scheduler's list after each load/unload).
        self.lora_adapters: list[str] = sorted(server_args.lora_adapter_paths)
        self._rid_prefix = f"{os.getpid():x}-{uuid.uuid4().hex[:8]}"
        self._rid_counter = itertools.count()
        self._receive_task: asyncio.Task | None = None
        self.failure: str | None = None  # set once a child process died: refuse new work
        self.draining = False  # set on SIGTERM: refuse new work, let running requests finish
        # Until the scheduler's `WarmupDone`: refuse new work (503), /health included.
        self.warming_up = True
        # Sequences (requests times their `n`) running or waiting, beyond which new requests
        # get 503: a full batch plus the queue limit.
        self.max_samples_in_flight = (
            model_info.max_running_requests + server_args.max_queued_requests
        )
        self.num_samples_in_flight = 0
        self.max_token_bytes = max_token_bytes(tokenizer)
        self.limits = ModelLimits(
            vocab_size=model_info.vocab_size,
            context_length=model_info.context_length,
            kv_capacity=model_info.max_total_tokens,
        )

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Starts reading outputs; call from inside the running event loop."""
        self._receive_task = asyncio.get_running_loop().create_task(self._receive_loop())

    async def stop(self) -> None:
        if self._receive_task is not None:
            self._receive_task.cancel()
        self._to_scheduler.close()
        self._from_workers.close()

    def fail_all(self, message: str) -> None:
        """A child died: every waiting handler gets a 503 and new requests are refused."""
        self.failure = message
        self.abort_all(message, status_code=503)
        for waiter in (*self._stats_waiters, *self._flush_waiters, *self._lora_waiters):
            if not waiter.done():
                waiter.set_exception(RequestError(message, status_code=503))

    def start_draining(self) -> None:
        """Shutdown began: new requests get 503; those in flight run on."""
        self.draining = True

    def abort_all(self, message: str, *, status_code: int) -> None:
        """Ends every request in flight with `RequestError(message, status_code)`.

        Each handler's generator then aborts its request in the scheduler (freeing its KV).
        """
        for inbox in self._states.values():
            inbox.put_error(RequestError(message, status_code=status_code))

    def refusal(self) -> str | None:
        """Why new requests are refused now (503), or None."""
        if self.failure is not None:
            return self.failure
        if self.draining:
            return "the server is shutting down"
        if self.warming_up:
            return "the server is warming up"
        return None

    @property
    def num_requests_in_flight(self) -> int:
        return len(self._states)

    # ---- tokenization ----------------------------------------------------------------------

    def encode(self, text: str, *, param: str = "prompt") -> list[int]:
        """Token ids of `text`; blocking (a long text takes a while): see `encode_async`.

        Raises:
            RequestError(400): the text is not encodable (a lone UTF-16 surrogate), or so long
                that it cannot fit the context whatever its tokens.
        """
        num_bytes = _utf8_length(text, param)
        # Every token covers at most `max_token_bytes` bytes, so a text of more bytes than
        # that many tokens' worth is over-long without tokenizing it.
        min_tokens = -(-num_bytes // self.max_token_bytes)
        if min_tokens >= self.model_info.context_length:
            raise RequestError(
                f"{param} has {num_bytes} bytes, at least {min_tokens} tokens; the model's "
                f"context length is {self.model_info.context_length}",
                param=param,
            )
        return list(self.tokenizer.encode(text))

    async def encode_async(self, text: str, *, param: str = "prompt") -> list[int]:
        """`encode` on a worker thread, so a long prompt never stalls the event loop."""
        return await asyncio.to_thread(self.encode, text, param=param)

    async def apply_chat_template_async(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        template_kwargs: dict | None = None,
    ) -> list[int]:
        """`apply_chat_template` on a worker thread (templating and tokenizing are blocking)."""
        return await asyncio.to_thread(self.apply_chat_template, messages, tools, template_kwargs)

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        template_kwargs: dict | None = None,
    ) -> list[int]:
        """The prompt ids of `messages` through the model's template, which renders `tools`
        (OpenAI tool objects) in the model's own format. `template_kwargs`: the template's
        variables (`add_generation_prompt`, default true; `continue_final_message`...)."""
        for position, message in enumerate(messages):
            _utf8_length(message["content"], f"messages[{position}].content")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise RequestError("this model's tokenizer has no chat template", param="messages")
        options = {"add_generation_prompt": True, **(template_kwargs or {})}
        if options.get("continue_final_message"):
            options["add_generation_prompt"] = False  # the last message stays open instead
        try:
            prompt = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, **options
            )
        except Exception as error:  # the template raises on roles or content it rejects
            raise RequestError(f"chat template failed: {error}", param="messages") from None
        # The template writes the special tokens (BOS...) itself.
        return list(self.tokenizer.encode(prompt, add_special_tokens=False))

    def decode_token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    # ---- generation ------------------------------------------------------------------------

    def _admit(self, request: GenerateReq) -> str:
        """Checks a tokenized request against the model (400 naming the field) and admits it
        under the in-flight limit (503); returns its rid. Its fields were validated when the
        route built it (`native_api.build_request`): only the model's limits are left."""
        refusal = self.refusal()
        if refusal is not None:
            raise RequestError(refusal, status_code=503)
        try:
            check_model_limits(request, self.limits)
        except RequestFieldError as error:
            raise RequestError(str(error), param=error.field) from None
        num_samples = request.sampling_params.n
        if num_samples > self.max_samples_in_flight:
            raise RequestError(
                f"n={num_samples} exceeds what this server holds at once "
                f"({self.max_samples_in_flight} sequences)",
                param="n",
            )
        if self.num_samples_in_flight + num_samples > self.max_samples_in_flight:
            self.metrics.requests.labels(outcome="rejected").inc()
            raise RequestError(
                f"the server is at capacity ({self.num_samples_in_flight} sequences in "
                f"flight, limit {self.max_samples_in_flight}); retry later",
                status_code=503,
            )
        rid = request.rid or f"{self._rid_prefix}-{next(self._rid_counter)}"
        if rid in self._states:
            raise RequestError(f"request id {rid!r} is already in use", param="rid")
        return rid

    async def generate(self, request: GenerateReq) -> AsyncIterator[StreamEvent]:
        """Submits one tokenized prompt and yields its outputs until all `n` samples finish.

        Raises:
            RequestError: 400 for bad input (also a constraint the scheduler rejected),
                503 when the server is at capacity or a child process died.
        """
        rid = self._admit(request)
        inbox = RequestInbox()
        self._states[rid] = inbox
        unfinished_samples = request.sampling_params.n
        self.num_samples_in_flight += unfinished_samples
        # The scheduler gets the request without its text (it needs only the ids).
        self._to_scheduler.send_pyobj(dataclasses.replace(request, rid=rid, text=None))
        try:
            while unfinished_samples > 0:
                try:
                    events = await inbox.take()  # the steps since the last take, merged
                except RequestError:
                    unfinished_samples = 0  # the scheduler is gone; nothing to abort
                    raise
                for event in events:
                    output = event.output
                    if output.error is not None:
                        unfinished_samples = 0  # the scheduler dropped the request itself
                        self.metrics.requests.labels(outcome="rejected").inc()
                        raise _rejection_error(output.error)
                    if output.finished:
                        unfinished_samples -= 1
                        if unfinished_samples == 0:
                            self.metrics.requests.labels(outcome="finished").inc()
                    self._observe(inbox, output)
                    yield event
        finally:
            del self._states[rid]
            self.num_samples_in_flight -= request.sampling_params.n
            if unfinished_samples > 0:
                # The consumer left early (client disconnect, cancelled task): free the KV.
                self._to_scheduler.send_pyobj(AbortReq(rid=rid))
                self.metrics.requests.labels(outcome="aborted").inc()

    def _observe(self, state: RequestInbox, output: ReqOutput) -> None:
        now = time.perf_counter()
        if output.new_token_ids and state.first_token_s is None:
            state.first_token_s = now
            self.metrics.time_to_first_token_s.observe(now - state.created_s)
        self.metrics.generation_tokens.inc(len(output.new_token_ids))
        if not output.finished:
            return
        if output.index == 0:
            self.metrics.prompt_tokens.inc(output.prompt_tokens)
            self.metrics.cached_tokens.inc(output.cached_tokens)
        self.metrics.e2e_latency_s.observe(now - state.created_s)
        if state.first_token_s is not None and output.completion_tokens > 1:
            decode_s = now - state.first_token_s
            self.metrics.time_per_output_token_s.observe(decode_s / (output.completion_tokens - 1))

    # ---- control ---------------------------------------------------------------------------

    async def get_stats(self) -> SchedulerStats:
        return await self._control(GetStatsReq(), self._stats_waiters)

    async def flush_cache(self) -> FlushCacheOutput:
        return await self._control(FlushCacheReq(), self._flush_waiters)

    async def update_lora_adapter(
        self, message: LoadLoRAAdapterReq | UnloadLoRAAdapterReq
    ) -> LoRAAdapterOutput:
        return await self._control(message, self._lora_waiters)

    def check_lora_path(self, lora_path: str | None, param: str = "lora_path") -> None:
        """404 naming the adapter unless it is loaded (None: the base model)."""
        if lora_path is not None and lora_path not in self.lora_adapters:
            raise RequestError(
                f"LoRA adapter {lora_path!r} is not loaded (loaded: {self.lora_adapters})",
                status_code=404,
                param=param,
            )

    async def _control(self, message: object, waiters: deque[asyncio.Future]):
        if self.failure is not None:  # (a drain still answers stats: leak checks need them)
            raise RequestError(self.failure, status_code=503)
        future = asyncio.get_running_loop().create_future()
        waiters.append(future)
        self._to_scheduler.send_pyobj(message)
        try:
            return await asyncio.wait_for(future, CONTROL_REPLY_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise RequestError("the scheduler did not answer in time", status_code=503) from None

    # ---- output routing --------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        while True:
            try:
                frames = await self._from_workers.recv_multipart()
                if len(frames) == 2:  # the detokenizer's [StepOutputs, text deltas]
                    self._route_outputs(load_frame(frames[0]), load_frame(frames[1]))
                else:  # the scheduler's control replies
                    self._dispatch(load_frame(frames[0]))
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad message must not silence every later output
                logger.exception("dropped a message from the scheduler or detokenizer")

    def _route_outputs(self, step: StepOutputs, text_deltas: list[str]) -> None:
        states = self._states
        for row, rid in enumerate(step.rids):
            inbox = states.get(rid)
            if inbox is not None:  # None: aborted while this output was on its way
                inbox.put_row(step, row, text_deltas[row])

    def _dispatch(self, message: object) -> None:
        if isinstance(message, WarmupDone):
            self.warming_up = False
            logger.info(
                "warm-up done (%d requests, %.2f s): ready",
                message.num_requests,
                message.duration_s,
            )
        elif isinstance(message, SchedulerStats):
            _resolve_oldest(self._stats_waiters, message)
        elif isinstance(message, FlushCacheOutput):
            _resolve_oldest(self._flush_waiters, message)
        elif isinstance(message, LoRAAdapterOutput):
            self.lora_adapters = list(message.loaded_adapters)
            _resolve_oldest(self._lora_waiters, message)
        else:
            logger.error("unexpected message %r", type(message).__name__)


def _utf8_length(text: str, param: str) -> int:
    """The UTF-8 byte length of `text` (one encode: texts may be megabytes).

    Raises:
        RequestError(400): `text` holds a lone UTF-16 surrogate (not valid UTF-8).
    """
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as error:
        raise RequestError(
            f"{param} is not valid Unicode: a lone surrogate {text[error.start]!r} at "
            f"character {error.start}",
            param=param.split(".")[0].split("[")[0],
        ) from None


def max_token_bytes(tokenizer) -> int:
    """The most UTF-8 bytes any one token decodes to (at least 1)."""
    vocab = tokenizer.get_vocab()
    longest = max((len(token) for token in vocab), default=1)
    # Byte-level BPE vocab strings use one character per byte; other tokenizers' pieces are
    # at most 4 UTF-8 bytes a character.
    return max(1, 4 * longest)


def _rejection_error(message: str) -> RequestError:
    # The scheduler's queue can fill before the front end's limit when KV, not the batch
    # size, bounds the running requests; that is overload (503), not bad input (400).
    if message.startswith(SCHEDULER_QUEUE_FULL_PREFIX):
        return RequestError(message, status_code=503)
    return RequestError(message)


def _resolve_oldest(waiters: deque[asyncio.Future], reply: object) -> None:
    # Replies come back in request order; waiters that timed out are skipped.
    while waiters:
        waiter = waiters.popleft()
        if not waiter.done():
            waiter.set_result(reply)
            return
