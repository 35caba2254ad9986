"""`Engine`: the in-process runtime, `radixgen.Engine`.

    engine = radixgen.Engine(model_path="tiny")            # any ServerArgs field as keyword
    out = engine.generate("Hello", {"max_new_tokens": 16, "temperature": 0})
    out["text"], out["meta_info"]["cached_tokens"]

The scheduler runs on a background thread, so concurrent `generate` calls from several
threads batch together, and `async_generate` works from asyncio code.
"""

from __future__ import annotations

import dataclasses
import gc
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import torch

from radixgen.runtime.engine_loop import ResultChannel, SchedulerThread
from radixgen.runtime.io_struct import (
    CheckIntegrityReq,
    FlushCacheReq,
    GetStatsReq,
    LoadLoRAAdapterReq,
    ReqOutput,
    UnloadLoRAAdapterReq,
)
from radixgen.runtime.output_accumulator import OutputAccumulator
from radixgen.runtime.request_schema import (
    GenerateReq,
    ModelLimits,
    SamplingParams,
    validate_request,
)
from radixgen.runtime.server.child_process import freeze_startup_heap
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.warmup import warm_up


class Engine:
    """The offline / in-process engine.

    Args:
        model_path: an HF checkpoint folder, or "tiny" (the embedded default model).
        **server_args: any `ServerArgs` field, e.g. `dtype="float32"`,
            `disable_radix_cache=True`, `max_total_tokens=4096`, `chunked_prefill_size=512`.

    Raises:
        TypeError: an unknown option. ValueError: an invalid option value.
    """

    def __init__(self, model_path: str = "tiny", **server_args: Any):
        from radixgen.runtime.scheduler import Scheduler

        self.server_args = ServerArgs.from_kwargs(model_path=model_path, **server_args)
        if self.server_args.dp_size != 1:
            raise ValueError(
                "dp_size: the Engine is one replica; data parallelism is `radixgen serve "
                "--dp-size N` or `radixgen router`"
            )
        # tp_size > 1: rank 0 here, ranks 1.. in spawned processes (runtime/tp_worker.py).
        self._tensor_parallel = None
        if self.server_args.tp_size > 1:
            from radixgen.runtime.tp_worker import InProcessTensorParallel

            self._tensor_parallel = InProcessTensorParallel(self.server_args)
        runner = self._tensor_parallel.runner if self._tensor_parallel else None
        self._scheduler = Scheduler(self.server_args, model_runner=runner)
        if not self.server_args.skip_warmup:
            # Before the loop thread starts: kernels compile here, not in the first request.
            try:
                warm_up(self._scheduler)
            except BaseException:
                self._scheduler.shutdown()  # its constraint-compile threads
                raise
        self.tokenizer = self._scheduler.tokenizer
        self.model_config = self._scheduler.runner.model_config
        self.context_length = self._scheduler.context_length
        self.limits = ModelLimits(
            vocab_size=self.model_config.vocab_size,
            context_length=self.context_length,
            kv_capacity=self._scheduler.kv.capacity,
        )
        # The same SchedulerLoop as the server's, on a thread, with an in-process transport.
        self._scheduler_thread = SchedulerThread(self._scheduler)
        self._transport = self._scheduler_thread.transport
        # A full garbage collection scans every tracked object: with the model, tokenizer and
        # imported modules in the scan, each took ~300 ms of the scheduler thread (four in a
        # generated-shared-prefix run on the H200, thirteenth session). The server's processes
        # freeze their start-up heap the same way; `shutdown` unfreezes it.
        freeze_startup_heap()

    # ---- generation --------------------------------------------------------------------------

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | SamplingParams | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int = 0,
        stream: bool = False,
        cache_salt: str | list[str | None] | None = None,
        lora_path: str | list[str | None] | None = None,
    ) -> dict | list[dict] | Iterator[dict]:
        """Generates for one prompt (returns a dict) or a batch (returns a list of dicts).

        Args:
            prompt: text, or a list of texts. Exactly one of `prompt` / `input_ids`.
            sampling_params: a dict of SamplingParams fields (or a list, one per prompt).
            input_ids: token ids, or a list of them.
            return_logprob: return output logprobs (and prompt logprobs from
                `logprob_start_len` on, if given) in meta_info.
            logprob_start_len: first prompt position whose logprob is returned.
            top_logprobs_num: top alternatives per position.
            stream: return an iterator of partial results (single prompt, n=1 only);
                each has the text so far, plus "delta" (the new text).
            cache_salt: the prefix cache namespace (or a list, one per prompt): cached
                prefixes are reused only between requests with the same salt (e.g. one per
                tenant). None: the shared default namespace. A non-empty string of at most
                256 chars.
            lora_path: the LoRA adapter (a loaded name; None: the base model), or a list,
                one per prompt.
        Returns:
            {"text", "output_ids", "index", "meta_info"}; a list for a batch prompt or
            n > 1 (prompt-major: prompt 0's n samples first).
        Raises:
            ValueError / TypeError: bad arguments or sampling parameters (naming them);
            ValueError: the engine rejected a request (e.g. an invalid constraint).
        """
        requests, is_batch = self._make_requests(
            prompt,
            sampling_params,
            input_ids,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            cache_salt,
            stream,
            lora_path,
        )
        if stream:
            if is_batch or requests[0].sampling_params.n != 1:
                raise ValueError("stream=True takes a single prompt with n=1")
            return self._stream_sync(requests[0])
        channel, samples_by_rid = self._submit_batch(requests)
        try:
            self._collect_batch(channel, samples_by_rid)
        except BaseException:
            for request in requests:  # frees whatever is still running
                self._transport.abort(request.rid)
            raise
        results = [sample.result() for samples in samples_by_rid.values() for sample in samples]
        if not is_batch and len(results) == 1:
            return results[0]
        return results

    def async_generate(
        self,
        prompt: str | None = None,
        sampling_params: dict | SamplingParams | None = None,
        input_ids: list[int] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int = 0,
        stream: bool = False,
        cache_salt: str | None = None,
        lora_path: str | None = None,
    ):
        """Asynchronous `generate` for one prompt (`cache_salt`, `lora_path` as in `generate`).

        With `stream=False`, returns an awaitable of the result dict (a list if n > 1).
        With `stream=True`, returns an async iterator of partial results (n=1), each with
        the text so far and "delta"; `await` on it returns the iterator itself, so both
        `async for c in engine.async_generate(..., stream=True)` and SGLang's
        `async for c in await engine.async_generate(..., stream=True)` work.
        """
        requests, is_batch = self._make_requests(
            prompt,
            sampling_params,
            input_ids,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            cache_salt,
            stream,
            lora_path,
        )
        if is_batch:
            raise ValueError("async_generate takes a single prompt; call it once per prompt")
        request = requests[0]
        if stream:
            if request.sampling_params.n != 1:
                raise ValueError("stream=True needs n=1")
            return _AwaitableIterator(self._stream_async(request))
        return self._generate_async(request)

    async def _generate_async(self, request: GenerateReq) -> dict | list[dict]:
        import asyncio

        channel, samples = self._submit(request, asyncio.get_running_loop(), stream=False)
        try:
            await self._collect_async(channel, samples)
        except asyncio.CancelledError:
            self._transport.abort(request.rid)
            raise
        results = [sample.result() for sample in samples]
        return results[0] if len(results) == 1 else results

    async def _stream_async(self, request: GenerateReq) -> AsyncIterator[dict]:
        import asyncio

        channel, (sample,) = self._submit(request, asyncio.get_running_loop())
        try:
            while not sample.finished:
                output = await channel.aget()
                _raise_if_error(output)
                delta = sample.add(output)
                yield {**sample.result(), "delta": delta}
        finally:
            if not sample.finished:  # the consumer stopped early: free the request's KV
                self._transport.abort(request.rid)

    def _stream_sync(self, request: GenerateReq) -> Iterator[dict]:
        channel, (sample,) = self._submit(request, None)
        try:
            while not sample.finished:
                output = channel.get()
                _raise_if_error(output)
                delta = sample.add(output)
                yield {**sample.result(), "delta": delta}
        finally:
            if not sample.finished:
                self._transport.abort(request.rid)

    # ---- management -------------------------------------------------------------------------

    def flush_cache(self) -> bool:
        """Empties the prefix cache. False (nothing done) while requests are in flight."""
        return self._transport.request(FlushCacheReq()).success

    def load_lora_adapter(self, lora_name: str, lora_path: str) -> list[str]:
        """Loads the PEFT adapter folder `lora_path` under `lora_name` (usable at once).

        Returns:
            the loaded adapter names.
        Raises:
            ValueError: the adapter is refused (why is named), or LoRA is off.
        """
        return self._lora_reply(LoadLoRAAdapterReq(lora_name, lora_path))

    def unload_lora_adapter(self, lora_name: str) -> list[str]:
        """Unloads adapter `lora_name`.

        Returns:
            the adapter names still loaded.
        Raises:
            ValueError: not loaded, or requests still use it.
        """
        return self._lora_reply(UnloadLoRAAdapterReq(lora_name))

    def _lora_reply(self, message: LoadLoRAAdapterReq | UnloadLoRAAdapterReq) -> list[str]:
        reply = self._transport.request(message)
        if not reply.success:
            raise ValueError(reply.message)
        return reply.loaded_adapters

    def get_stats(self) -> dict[str, Any]:
        """Running/queued requests, KV usage, cache hit rate, token counters."""
        return dataclasses.asdict(self._transport.request(GetStatsReq()))

    def check_integrity(self) -> None:
        """Asserts no KV slot leaked (free + cached + in use == total)."""
        self._transport.request(CheckIntegrityReq())

    def abort(self, rid: str) -> None:
        self._transport.abort(rid)

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """Renders OpenAI-style messages with the model's chat template."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def shutdown(self) -> None:
        """Stops the scheduler thread and gives the device memory back (idempotent): the
        weights, KV pools and CUDA graphs go with the scheduler, so a second Engine in the same
        process gets the whole device. Later calls raise "the engine was shut down"."""
        if self._scheduler is None:
            return
        self._scheduler_thread.shutdown()
        self._scheduler.shutdown()
        if self._tensor_parallel is not None:
            self._tensor_parallel.shutdown()
            self._tensor_parallel = None
        if self._scheduler_thread.is_stopped():
            self._scheduler_thread.release_scheduler()
            self._scheduler = None
            # The scheduler's objects hold reference cycles and were frozen at start-up.
            gc.unfreeze()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    # ---- helpers -----------------------------------------------------------------------------

    def _make_requests(
        self,
        prompt,
        sampling_params,
        input_ids,
        return_logprob: bool,
        logprob_start_len: int | None,
        top_logprobs_num: int,
        cache_salt: str | list[str | None] | None,
        stream: bool,
        lora_path: str | list[str | None] | None = None,
    ) -> tuple[list[GenerateReq], bool]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of prompt or input_ids")
        if prompt is not None:
            is_batch = isinstance(prompt, list)
            prompts = prompt if is_batch else [prompt]
            if not prompts or not all(isinstance(p, str) for p in prompts):
                raise TypeError("prompt must be a string or a non-empty list of strings")
            token_lists = [self.tokenizer.encode(p) for p in prompts]
        else:
            is_batch = (
                isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
            )
            token_lists = input_ids if is_batch else [input_ids]
        if isinstance(sampling_params, list):
            if len(sampling_params) != len(token_lists):
                raise ValueError(
                    f"sampling_params has {len(sampling_params)} entries for "
                    f"{len(token_lists)} prompts"
                )
            params_list = [SamplingParams.from_dict(p) for p in sampling_params]
        else:
            params_list = [SamplingParams.from_dict(sampling_params)] * len(token_lists)
        salts = _per_prompt("cache_salt", cache_salt, len(token_lists))
        adapters = _per_prompt("lora_path", lora_path, len(token_lists))
        requests = []
        for ids, params, salt, adapter in zip(
            token_lists, params_list, salts, adapters, strict=True
        ):
            request = GenerateReq(
                input_ids=ids,
                sampling_params=params,
                return_logprob=return_logprob,
                logprob_start_len=logprob_start_len,
                top_logprobs_num=top_logprobs_num,
                cache_salt=salt,
                lora_path=adapter,
                stream=stream,
                rid=uuid.uuid4().hex,
            )
            validate_request(request, self.limits)
            requests.append(request)
        return requests, is_batch

    def _submit(
        self, request: GenerateReq, loop, stream: bool = True
    ) -> tuple[ResultChannel, list]:
        channel, samples = self._make_channel(request, loop, stream)
        self._transport.submit([request], [channel])
        return channel, samples

    def _submit_batch(
        self, requests: list[GenerateReq]
    ) -> tuple[ResultChannel, dict[str, list[OutputAccumulator]]]:
        """Submits all requests as one inbox item, so the scheduler sees the whole batch at
        once (its first extend batch is full, not whatever arrived first). Their outputs
        share one channel, read as they arrive: with a channel each, read one request after
        another, the outputs of the others piled up until the first finished and were folded
        in after the last step (262,144 outputs of generated-shared-prefix, ~0.4 s on the CPU
        machine). Returns the channel and each request's samples, in request order."""
        channel = ResultChannel()
        samples_by_rid = {
            request.rid: self._make_samples(request, stream=False) for request in requests
        }
        self._transport.submit(requests, [channel] * len(requests))
        return channel, samples_by_rid

    def _make_channel(self, request: GenerateReq, loop, stream: bool) -> tuple[ResultChannel, list]:
        return ResultChannel(loop), self._make_samples(request, stream)

    def _make_samples(self, request: GenerateReq, stream: bool) -> list[OutputAccumulator]:
        params = request.sampling_params
        return [
            OutputAccumulator(
                rid=request.rid,
                index=index,
                tokenizer=self.tokenizer,
                prompt_ids=request.input_ids,
                skip_special_tokens=params.skip_special_tokens,
                stop_strings=params.stop_strings,
                return_logprob=request.return_logprob,
                top_logprobs_num=request.top_logprobs_num,
                stream=stream,
            )
            for index in range(params.n)
        ]

    @staticmethod
    def _collect_batch(
        channel: ResultChannel, samples_by_rid: dict[str, list[OutputAccumulator]]
    ) -> None:
        unfinished = sum(len(samples) for samples in samples_by_rid.values())
        while unfinished:
            output = channel.get()
            _raise_if_error(output)
            sample = samples_by_rid[output.rid][output.index]
            sample.add(output)
            unfinished -= sample.finished

    @staticmethod
    async def _collect_async(channel: ResultChannel, samples: list[OutputAccumulator]) -> None:
        while not all(sample.finished for sample in samples):
            output = await channel.aget()
            _raise_if_error(output)
            samples[output.index].add(output)


def _raise_if_error(output: ReqOutput) -> None:
    if output.error is not None:
        raise ValueError(f"request rejected: {output.error}")


class _AwaitableIterator:
    """An async iterator that `await` returns unchanged (see `Engine.async_generate`)."""

    def __init__(self, iterator: AsyncIterator[dict]):
        self._iterator = iterator

    def __aiter__(self) -> AsyncIterator[dict]:
        return self._iterator

    def __await__(self):
        if False:  # pragma: no cover - makes this a generator that returns at once
            yield
        return self._iterator


def _per_prompt(name: str, value, num_prompts: int) -> list:
    """One value for every prompt, or a list with one per prompt.

    Raises:
        ValueError: a list of the wrong length, naming `name`.
    """
    if not isinstance(value, list):
        return [value] * num_prompts
    if len(value) != num_prompts:
        raise ValueError(f"{name} has {len(value)} entries for {num_prompts} prompts")
    return value
