"""Pydantic models of the OpenAI-compatible API (requests, responses and stream chunks).

Only the fields radixgen honours are declared, with strict ints and bools (JSON `true` is not
1, `"yes"` is not `true`); their values are checked by `validate_request`. Unknown fields sent
by clients are ignored, except features we cannot serve (tools, logit_bias, echo...), which the handlers reject with
a 400 naming the field. Beyond OpenAI's fields, requests accept SGLang's extras
(`top_k`, `min_p`, `repetition_penalty`, `regex`, `json_schema`, `choices`...), which the
official client sends through `extra_body`.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt


def _now_s() -> int:
    return int(time.time())


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


# ---------------------------------------------------------------------------------------------
# Shared pieces


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None  # the HTTP status, or OpenAI's string code where it has one


class ErrorResponse(BaseModel):
    error: ErrorDetail


class StreamOptions(_Request):
    include_usage: StrictBool = False


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now_s)
    owned_by: str = "radixgen"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class JsonSchemaFormat(_Request):
    name: str = "response"
    description: str | None = None
    # `schema` shadows a BaseModel attribute, hence the alias.
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # type structural_tag (SGLang's): checked by the request schema's `structural_tag`.
    structures: Any = None
    triggers: Any = None


class SamplingExtras(_Request):
    """Sampling fields shared by both endpoints: OpenAI's plus SGLang's extras."""

    model: str | None = None
    n: StrictInt = 1
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    stop: str | list[str] | None = None
    seed: StrictInt | None = None
    presence_penalty: StrictFloat = 0.0
    frequency_penalty: StrictFloat = 0.0
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None  # token id -> bias in [-100, 100]
    # Unsupported OpenAI features, declared so the handlers can reject them by name.
    best_of: StrictInt | None = None
    # SGLang extras (extra_body).
    top_k: StrictInt = -1
    min_p: StrictFloat = 0.0
    repetition_penalty: StrictFloat = 1.0
    min_tokens: StrictInt = 0
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    stop_token_ids: list[StrictInt] | None = None
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    choices: list[str] | None = None
    ebnf: str | None = None  # SGLang's GBNF-style grammar (start rule `root`)
    lark: str | None = None  # a Lark grammar (start rule `start`)
    structural_tag: str | dict[str, Any] | None = None  # SGLang's, as in sampling_params
    constraint_budget: StrictBool = True  # False: a constrained output is truncated raw
    response_format: ResponseFormat | None = None
    cache_salt: str | None = None  # prefix cache namespace (vLLM's extra)


# ---------------------------------------------------------------------------------------------
# /v1/completions


class CompletionRequest(SamplingExtras):
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    # Top alternatives per token (OpenAI allows 0..5 here; 20 as for chat); None: no logprobs.
    logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    echo: StrictBool = False
    suffix: str | None = None


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now_s)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


# Stream chunks of /v1/completions have the same shape as the response.
CompletionStreamResponse = CompletionResponse


# ---------------------------------------------------------------------------------------------
# /v1/chat/completions


class ChatContentPart(_Request):
    type: str
    text: str | None = None


class FunctionCall(_Request):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Request):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ChatContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls (content may be null)
    tool_call_id: str | None = None  # a tool result's call


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(SamplingExtras):
    messages: list[ChatMessage] = Field(min_length=1)
    # OpenAI function objects, checked by request_schema.tool_definitions.
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class ResponseFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ResponseToolCall(BaseModel):
    index: int | None = None  # stream chunks only
    id: str | None = None
    type: Literal["function"] | None = None
    function: ResponseFunctionCall


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ResponseToolCall] | None = None


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now_s)
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ResponseToolCall] | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now_s)
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
