"""The native API: `POST /generate` (SGLang's shape), health, info, cache flush and metrics."""

from __future__ import annotations

import dataclasses
import importlib.metadata
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt

from radixgen.runtime.io_struct import LoadLoRAAdapterReq, UnloadLoRAAdapterReq
from radixgen.runtime.request_schema import (
    GenerateReq,
    RequestFieldError,
    SamplingParams,
    check_num_prompts,
    validate_request,
)
from radixgen.runtime.server.errors import RequestError, parse_json_body
from radixgen.runtime.server.streaming import (
    SampleResult,
    StreamEvent,
    collect,
    collect_all,
    merge_streams,
    run_while_connected,
    sse_response,
)
from radixgen.runtime.server.tokenizer_manager import TokenizerManager

router = APIRouter()


class GenerateBody(BaseModel):
    """Body of `POST /generate`. Unknown fields are refused, so a typo is a 400.

    Strict ints and bools: JSON `false` is not token 0 and `"yes"` is not `true`. The
    fields' values are checked by `validate_request` (request_schema.py), not here.
    """

    model_config = ConfigDict(extra="forbid")

    text: str | list[str] | None = None
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: StrictBool = False
    return_logprob: StrictBool = False
    logprob_start_len: StrictInt | None = None
    top_logprobs_num: StrictInt = 0
    rid: str | list[str] | None = None
    # Prefix cache namespace: one for all prompts, or a list, one per prompt.
    cache_salt: str | list[str | None] | None = None
    # LoRA adapter by name (None: the base model): one for all prompts, or one per prompt.
    lora_path: str | list[str | None] | None = None


class LoadLoRAAdapterBody(BaseModel):
    """Body of `POST /load_lora_adapter` (SGLang's fields)."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterBody(BaseModel):
    """Body of `POST /unload_lora_adapter`."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str


def per_prompt(name: str, value: Any, num_prompts: int) -> list:
    """One value for all prompts, or a list with one per prompt (400 naming `name` if the
    list's length is wrong)."""
    values = value if isinstance(value, list) else [value] * num_prompts
    if len(values) != num_prompts:
        raise RequestError(
            f"{name} has {len(values)} entries for {num_prompts} prompts", param=name
        )
    return values


def build_request(**fields: Any) -> GenerateReq:
    """A validated `GenerateReq` from a handler's fields (`sampling_params` a dict); a bad
    field becomes a 400 naming it. Runs before anything is allocated per sample."""
    try:
        fields["sampling_params"] = SamplingParams.from_dict(fields.get("sampling_params"))
        request = GenerateReq(**fields)
        validate_request(request)
    except RequestFieldError as error:
        raise RequestError(str(error), param=error.field) from None
    return request


def count_prompts(num_prompts: int) -> None:
    """400 unless a batch holds an accepted number of prompts (before tokenizing them)."""
    try:
        check_num_prompts(num_prompts)
    except RequestFieldError as error:
        raise RequestError(str(error), param=error.field) from None


async def _to_requests(
    manager: TokenizerManager, body: GenerateBody
) -> tuple[list[GenerateReq], bool]:
    """Returns the prompts of the request and whether it was a batch (a list)."""
    if (body.text is None) == (body.input_ids is None):
        raise RequestError("give exactly one of 'text' and 'input_ids'", param="text")
    if body.text is not None:
        is_batch = isinstance(body.text, list)
        texts = body.text if is_batch else [body.text]
        count_prompts(len(texts))
        prompts = [await manager.encode_async(text, param="text") for text in texts]
    else:
        is_batch = bool(body.input_ids) and isinstance(body.input_ids[0], list)
        prompts = body.input_ids if is_batch else [body.input_ids]
        count_prompts(len(prompts))
    params = body.sampling_params
    if isinstance(params, list):
        if len(params) != len(prompts):
            raise RequestError(
                f"sampling_params has {len(params)} entries for {len(prompts)} prompts",
                param="sampling_params",
            )
    else:
        params = [params] * len(prompts)
    rids = body.rid if isinstance(body.rid, list) else [body.rid] * len(prompts)
    if body.rid is not None and (len(rids) != len(prompts) or len(set(rids)) != len(rids)):
        raise RequestError("rid must give one distinct id per prompt", param="rid")
    salts = per_prompt("cache_salt", body.cache_salt, len(prompts))
    adapters = per_prompt("lora_path", body.lora_path, len(prompts))
    for adapter in adapters:
        manager.check_lora_path(adapter)
    requests = [
        build_request(
            input_ids=list(prompt),
            sampling_params=prompt_params,
            rid=rid,
            return_logprob=body.return_logprob,
            logprob_start_len=body.logprob_start_len,
            top_logprobs_num=body.top_logprobs_num,
            stream=body.stream,
            cache_salt=salt,
            lora_path=adapter,
        )
        for prompt, prompt_params, rid, salt, adapter in zip(
            prompts, params, rids, salts, adapters, strict=True
        )
    ]
    return requests, is_batch


def _sample_json(sample: SampleResult, return_logprob: bool) -> dict:
    meta_info: dict[str, Any] = {
        "id": sample.rid,
        "prompt_tokens": sample.prompt_tokens,
        "completion_tokens": sample.completion_tokens,
        "cached_tokens": sample.cached_tokens,
        "finish_reason": sample.finish_reason,
    }
    if return_logprob:
        meta_info["input_token_logprobs"] = sample.input_token_logprobs
        meta_info["input_top_logprobs"] = sample.input_top_logprobs
        meta_info["output_token_logprobs"] = sample.output_token_logprobs
        meta_info["output_top_logprobs"] = sample.output_top_logprobs
    return {"text": sample.text, "output_ids": sample.output_ids, "meta_info": meta_info}


@router.post("/generate")
async def generate(request: Request):
    manager: TokenizerManager = request.app.state.tokenizer_manager
    body = await parse_json_body(request, GenerateBody)
    inputs, is_batch = await _to_requests(manager, body)
    num_samples = [item.sampling_params.n for item in inputs]
    if body.stream:
        # Cumulative text per sample, as SGLang streams it: the last chunk is the answer.
        samples: dict[tuple[int, int], SampleResult] = {}

        def to_payloads(item: tuple[int, StreamEvent]):
            prompt_index, event = item
            key = (prompt_index, event.output.index)
            sample = samples.setdefault(key, SampleResult())
            sample.add(event)
            chunk = _sample_json(sample, body.return_logprob)
            chunk["index"] = sum(num_samples[:prompt_index]) + event.output.index
            yield chunk

        return await sse_response(request, merge_streams(manager, inputs), to_payloads)
    if len(inputs) == 1:
        results = [await run_while_connected(request, collect(manager, inputs[0]))]
    else:
        results = await run_while_connected(request, collect_all(manager, inputs))
    flat = [_sample_json(sample, body.return_logprob) for group in results for sample in group]
    return flat if is_batch or len(flat) > 1 else flat[0]


@router.get("/health")
async def health(request: Request):
    manager: TokenizerManager = request.app.state.tokenizer_manager
    refusal = manager.refusal()
    if refusal is not None:
        raise RequestError(refusal, status_code=503)
    return {"status": "ok"}


@router.get("/health_generate")
async def health_generate(request: Request):
    """Healthy only if the model produces a token now."""
    manager: TokenizerManager = request.app.state.tokenizer_manager
    probe = GenerateReq(
        input_ids=manager.encode("ping")[-1:] or [0],
        sampling_params=SamplingParams(max_new_tokens=1, temperature=0.0),
    )
    validate_request(probe)  # what every route's request gets before the manager admits it
    samples = await run_while_connected(request, collect(manager, probe))
    return {"status": "ok", "completion_tokens": samples[0].completion_tokens}


@router.get("/get_model_info")
async def get_model_info(request: Request):
    manager: TokenizerManager = request.app.state.tokenizer_manager
    info = dataclasses.asdict(manager.model_info)
    info["tokenizer_path"] = manager.server_args.tokenizer_path or manager.server_args.model_path
    info["is_generation"] = True
    # For DSL clients (rg.RuntimeEndpoint): they render roles with the model's own template
    # without loading a tokenizer.
    info["chat_template"] = getattr(manager.tokenizer, "chat_template", None)
    info["bos_token"] = getattr(manager.tokenizer, "bos_token", None)
    info["eos_token"] = getattr(manager.tokenizer, "eos_token", None)
    return info


@router.get("/get_server_info")
async def get_server_info(request: Request):
    """Server options, model, scheduler counters and KV accounting (for leak checks)."""
    manager: TokenizerManager = request.app.state.tokenizer_manager
    stats = await manager.get_stats()
    server_args = dataclasses.asdict(manager.server_args)
    server_args["api_key"] = None if server_args["api_key"] is None else "<set>"
    return {
        "version": importlib.metadata.version("radixgen"),  # not radixgen: layers look down
        "server_args": server_args,
        "model_info": dataclasses.asdict(manager.model_info),
        "scheduler": dataclasses.asdict(stats),
        "kv_usage": stats.kv_usage,
        "cache_hit_rate": stats.cache_hit_rate,
        "cache_stats": {
            "matched_tokens": stats.num_cached_tokens,
            "lookup_tokens": stats.num_prompt_tokens,
        },
        "num_requests_in_flight": manager.num_requests_in_flight,
        "num_sequences_in_flight": manager.num_samples_in_flight,
        "process_ids": request.app.state.process_ids,
    }


@router.post("/flush_cache")
async def flush_cache(request: Request):
    manager: TokenizerManager = request.app.state.tokenizer_manager
    result = await manager.flush_cache()
    if not result.success:
        raise RequestError(
            f"the cache was not flushed: {result.message or 'requests are in flight'}"
        )
    return {"success": True, "message": result.message}


@router.post("/load_lora_adapter")
async def load_lora_adapter(request: Request):
    """Loads a PEFT adapter folder under a name, usable by the next request."""
    manager: TokenizerManager = request.app.state.tokenizer_manager
    body = await parse_json_body(request, LoadLoRAAdapterBody)
    result = await manager.update_lora_adapter(LoadLoRAAdapterReq(body.lora_name, body.lora_path))
    if not result.success:
        raise RequestError(result.message, param="lora_path")
    return {"success": True, "loaded_adapters": result.loaded_adapters}


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(request: Request):
    """Unloads an adapter (400 while requests use it, 404 if it is not loaded)."""
    manager: TokenizerManager = request.app.state.tokenizer_manager
    body = await parse_json_body(request, UnloadLoRAAdapterBody)
    manager.check_lora_path(body.lora_name, param="lora_name")
    result = await manager.update_lora_adapter(UnloadLoRAAdapterReq(body.lora_name))
    if not result.success:
        raise RequestError(result.message, param="lora_name")
    return {"success": True, "loaded_adapters": result.loaded_adapters}


@router.get("/metrics")
async def metrics(request: Request):
    manager: TokenizerManager = request.app.state.tokenizer_manager
    manager.metrics.observe_scheduler(await manager.get_stats())
    return Response(manager.metrics.render(), media_type=CONTENT_TYPE_LATEST)
