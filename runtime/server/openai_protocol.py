"""Pydantic models of the OpenAI-compatible API (requests, responses and stream chunks).

Requests declare every field of OpenAI's current request schemas, plus the extras users of
SGLang (`top_k`, `regex`, `json_schema`, `ebnf`...) and vLLM (`guided_json`,
`structured_outputs`...) send through the official client's `extra_body`; any other field is
a 400 naming it (`extra="forbid"`). Ints and bools are strict (JSON `true` is not 1, `"yes"` is
not `true`); values are checked by `validate_request`. Fields radixgen has no use for are
accepted and ignored (`IGNORED_FIELDS`, listed in docs/server.md); features it cannot serve
are refused by name when set (`UNSUPPORTED_FIELDS`).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt


def _now_s() -> int:
    return int(time.time())


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# Accepted so that clients never break, with no effect on the output.
IGNORED_FIELDS = (
    "user", "store", "metadata", "service_tier", "reasoning_effort", "prediction",
    "prompt_cache_key", "safety_identifier", "verbosity", "web_search_options",
    "guided_decoding_backend", "guided_whitespace_pattern", "request_id", "priority",
    "spaces_between_special_tokens", "add_special_tokens",
)  # fmt: skip
# Declared so that a request using them gets a 400 saying so, not an unknown-field error.
UNSUPPORTED_FIELDS = (
    "best_of", "echo", "suffix", "audio", "include_stop_str_in_output", "use_beam_search",
    "prompt_logprobs", "return_tokens_as_token_ids", "bad_words", "allowed_token_ids",
    "truncate_prompt_tokens",
)  # fmt: skip


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
    include_obfuscation: StrictBool | None = None  # ignored: no obfuscation padding is sent


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
    parent: str | None = None  # a LoRA adapter's base model (vLLM's field)
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


class StructuredOutputs(_Request):
    """vLLM's `structured_outputs` (its newer name for the `guided_*` fields)."""

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: StrictBool | None = None
    structural_tag: str | dict[str, Any] | None = None
    whitespace_pattern: str | None = None  # ignored, as guided_whitespace_pattern
    disable_any_whitespace: StrictBool | None = None  # ignored: radixgen's JSON is compact
    disable_fallback: StrictBool | None = None  # ignored: there is no fallback backend
    disable_additional_properties: StrictBool | None = None  # ignored


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # type structural_tag (SGLang's): checked by the request schema's `structural_tag`.
    structures: Any = None
    triggers: Any = None


class SamplingExtras(_Request):
    """Sampling fields shared by both endpoints: OpenAI's plus SGLang's and vLLM's extras."""

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
    logit_bias: dict[str, float] | None = None  # token id -> bias in [-100, 100]
    # SGLang and vLLM extras (extra_body).
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
    # vLLM's constraint names (mapped onto the ones above).
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None  # EBNF, read as `ebnf`
    structured_outputs: StructuredOutputs | None = None
    # Accepted and ignored (IGNORED_FIELDS); refused when set (UNSUPPORTED_FIELDS).
    user: str | None = None
    store: StrictBool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    request_id: str | None = None
    priority: StrictInt | None = None
    spaces_between_special_tokens: StrictBool | None = None
    add_special_tokens: StrictBool | None = None
    best_of: StrictInt | None = None
    include_stop_str_in_output: StrictBool | None = None
    use_beam_search: StrictBool | None = None
    prompt_logprobs: StrictInt | None = None
    return_tokens_as_token_ids: StrictBool | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[StrictInt] | None = None
    truncate_prompt_tokens: StrictInt | None = None


# ---------------------------------------------------------------------------------------------
# /v1/completions


class CompletionRequest(SamplingExtras):
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    # Top alternatives per token (OpenAI allows 0..5 here; 20 as for chat); None: no logprobs.
    logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    echo: StrictBool | None = None
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
    type: str  # only "text" is served; other parts are refused by the handler
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None
    refusal: str | None = None


class FunctionCall(_Request):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Request):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall
    index: StrictInt | None = None  # what a client that merged stream deltas echoes back


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ChatContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls (content may be null)
    tool_call_id: str | None = None  # a tool result's call
    # What a client echoes back of an earlier response's message: ignored.
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: Any = None
    function_call: FunctionCall | None = None  # the deprecated form of tool_calls
    reasoning_content: str | None = None


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
    # OpenAI's deprecated forms of tools / tool_choice (answered with tool_calls).
    functions: list[dict[str, Any]] | None = None
    function_call: Literal["none", "auto"] | NamedFunction | None = None
    modalities: list[Literal["text", "audio"]] | None = None  # only text is served
    audio: Any = None  # audio output parameters: refused (UNSUPPORTED_FIELDS)
    reasoning_effort: str | None = None
    prediction: Any = None
    verbosity: str | None = None
    web_search_options: Any = None
    # vLLM's and SGLang's chat extras.
    chat_template_kwargs: dict[str, Any] | None = None  # passed to the template
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    separate_reasoning: StrictBool | None = None  # ignored: no reasoning parser
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


class MessageToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunctionCall


class ResponseToolCall(MessageToolCall):
    """A call in a stream chunk: its position among the choice's calls."""

    index: int


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[MessageToolCall] | None = None


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
