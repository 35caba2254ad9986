"""The OpenAI-compatible API: `/v1/models`, `/v1/completions`, `/v1/chat/completions`.

Requests become `GenerateReq`s (OpenAI names mapped to SamplingParams, `response_format`
mapped to a JSON-schema constraint); outputs are rendered by `openai_render`.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request

from radixgen.runtime.request_schema import (
    GenerateReq,
)
from radixgen.runtime.server.errors import RequestError, parse_json_body
from radixgen.runtime.server.native_api import build_request, count_prompts
from radixgen.runtime.server.openai_fields import (
    constraint_fields,
    given_constraints,
    reject_unsupported,
)
from radixgen.runtime.server.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    SamplingExtras,
)
from radixgen.runtime.server.openai_render import ChatRenderer, CompletionRenderer
from radixgen.runtime.server.openai_tools import plan_tools, template_messages
from radixgen.runtime.server.streaming import (
    collect,
    collect_all,
    merge_streams,
    run_while_connected,
    sse_response,
)
from radixgen.runtime.server.tokenizer_manager import TokenizerManager
from radixgen.runtime.server.tool_parsers import tool_call_parser

router = APIRouter(prefix="/v1")


def _to_input(
    manager: TokenizerManager,
    body: SamplingExtras,
    input_ids: list[int],
    *,
    max_tokens: int | None,
    top_logprobs_num: int | None,
    tool_constraint: dict[str, Any] | None = None,
    lora_path: str | None = None,
) -> GenerateReq:
    if max_tokens is None:
        # No limit given: whatever room the context leaves (at least 1, so a too-long
        # prompt still reaches the length check and gets its own message).
        max_tokens = max(1, manager.model_info.context_length - len(input_ids))
    params: dict[str, Any] = {
        "max_new_tokens": max_tokens,
        "min_new_tokens": body.min_tokens,
        "n": body.n,
        "stop": body.stop,
        "seed": body.seed,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "repetition_penalty": body.repetition_penalty,
        "ignore_eos": body.ignore_eos,
        "skip_special_tokens": body.skip_special_tokens,
        "stop_token_ids": body.stop_token_ids,
        "logit_bias": body.logit_bias,
        **constraint_fields(body),
    }
    if tool_constraint:
        given = given_constraints(params)
        if given:
            raise RequestError(
                f"tool_choice required or a named function constrains the output itself; it "
                f"cannot be combined with {given[0]}",
                param="tool_choice",
            )
        params.update(tool_constraint)
    if body.temperature is not None:
        params["temperature"] = body.temperature
    if body.top_p is not None:
        params["top_p"] = body.top_p
    return build_request(
        input_ids=input_ids,
        sampling_params=params,
        return_logprob=top_logprobs_num is not None,
        top_logprobs_num=top_logprobs_num or 0,
        stream=body.stream,
        cache_salt=body.cache_salt,
        lora_path=lora_path,
    )


def _served_name(manager: TokenizerManager) -> str:
    return manager.model_info.served_model_name


def _check_model(manager: TokenizerManager, model: str | None) -> str | None:
    """The LoRA adapter `model` names (None: the base model). An omitted model means the
    served one; "served:adapter" or a loaded adapter's name select that adapter; any other
    name is a 404, as OpenAI answers.
    """
    served = _served_name(manager)
    if model is None or model == served:
        return None
    adapter = model.removeprefix(served + ":")
    if adapter in manager.lora_adapters:
        return adapter
    raise RequestError(
        f"the model {model!r} does not exist; this server serves {served!r}"
        + (f" and the LoRA adapters {manager.lora_adapters}" if manager.lora_adapters else ""),
        status_code=404,
        param="model",
        code="model_not_found",
    )


@router.get("/models")
async def list_models(request: Request):
    """The base model, then one card per loaded LoRA adapter (its name is a model id)."""
    manager: TokenizerManager = request.app.state.tokenizer_manager
    cards = [_model_card(manager, None)]
    cards += [_model_card(manager, adapter) for adapter in manager.lora_adapters]
    return ModelList(data=cards).model_dump()


def _model_card(manager: TokenizerManager, adapter: str | None) -> ModelCard:
    return ModelCard(
        id=adapter or _served_name(manager),
        root=manager.model_info.model_path,
        parent=_served_name(manager) if adapter else None,
        max_model_len=manager.model_info.context_length,
    )


@router.get("/models/{model_id:path}")
async def retrieve_model(request: Request, model_id: str):
    """OpenAI's retrieve: the served model's card, or a 404 for any other name."""
    manager: TokenizerManager = request.app.state.tokenizer_manager
    return _model_card(manager, _check_model(manager, model_id)).model_dump()


async def _completion_prompts(manager: TokenizerManager, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [await manager.encode_async(prompt)]
    if not prompt:
        raise RequestError("the prompt is empty", param="prompt")
    if not isinstance(prompt[0], int):
        count_prompts(len(prompt))
    if isinstance(prompt[0], str):
        return [await manager.encode_async(text) for text in prompt]
    if isinstance(prompt[0], int):
        return [list(prompt)]
    return [list(ids) for ids in prompt]


@router.post("/completions")
async def completions(request: Request):
    manager: TokenizerManager = request.app.state.tokenizer_manager
    body = await parse_json_body(request, CompletionRequest)
    lora_path = _check_model(manager, body.model)
    reject_unsupported(body)
    inputs = [
        _to_input(
            manager,
            body,
            ids,
            max_tokens=body.max_tokens,
            top_logprobs_num=body.logprobs,
            lora_path=lora_path,
        )
        for ids in await _completion_prompts(manager, body.prompt)
    ]
    renderer = CompletionRenderer(
        response_id=f"cmpl-{uuid.uuid4().hex}",
        model=body.model or _served_name(manager),
        num_samples=body.n,
        decode_token=manager.decode_token,
    )
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await sse_response(
            request,
            merge_streams(manager, inputs),
            renderer.stream_chunks,
            lambda: renderer.usage_chunks(include_usage),
        )
    results = await run_while_connected(request, collect_all(manager, inputs))
    return renderer.response(results)


@router.post("/chat/completions")
async def chat_completions(request: Request):
    manager: TokenizerManager = request.app.state.tokenizer_manager
    body = await parse_json_body(request, ChatCompletionRequest)
    lora_path = _check_model(manager, body.model)
    reject_unsupported(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    server_args = manager.server_args
    tool_plan = plan_tools(body, tool_call_parser(server_args.tool_call_parser))
    tools = tool_plan.template_tools() if tool_plan else None
    input_ids = await manager.apply_chat_template_async(
        template_messages(body),
        tools,
        {
            **(body.chat_template_kwargs or {}),
            "add_generation_prompt": body.add_generation_prompt,
            "continue_final_message": body.continue_final_message,
        },
    )
    max_tokens = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    top_logprobs_num = (body.top_logprobs or 0) if body.logprobs else None
    tool_constraint = None
    if tool_plan is not None:
        structural_tags = server_args.grammar_backend == "llguidance"
        tool_constraint = tool_plan.constraint(structural_tags=structural_tags)
        if tool_plan.mode == "auto" and given_constraints(constraint_fields(body)):
            tool_constraint = None  # the client's own constraint wins; calls are still read
    generate_input = _to_input(
        manager,
        body,
        input_ids,
        max_tokens=max_tokens,
        top_logprobs_num=top_logprobs_num,
        tool_constraint=tool_constraint,
        lora_path=lora_path,
    )
    renderer = ChatRenderer(
        response_id=f"chatcmpl-{uuid.uuid4().hex}",
        model=body.model or _served_name(manager),
        decode_token=manager.decode_token,
        tool_plan=tool_plan,
    )
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await sse_response(
            request,
            merge_streams(manager, [generate_input]),
            renderer.stream_chunks,
            lambda: renderer.usage_chunks(include_usage),
        )
    samples = await run_while_connected(request, collect(manager, generate_input))
    return renderer.response(samples)
