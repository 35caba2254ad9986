"""`OpenAI`: the DSL on any OpenAI-compatible server, through the `openai` package.

A program with roles talks to `/v1/chat/completions`: each gen must sit in an assistant
message, which the server opens with the model's own template. A program without roles
uses `/v1/completions` on its text. `json_schema` goes through `response_format`; regex,
choices and the non-OpenAI sampling options go in the extra body, which only a radixgen
(or SGLang-compatible) server understands: elsewhere they raise UnsupportedFeatureError.
`rg.select` becomes a greedy choices-constrained gen, so it needs a radixgen server too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from radixgen.backends.base import (
    Backend,
    GenerateOutput,
    Prompt,
    SelectOutcome,
    StreamDelta,
)
from radixgen.chat_template import ChatTemplate, chatml_template
from radixgen.errors import BackendError, BackendUnreachableError, UnsupportedFeatureError
from radixgen.ir import ChoicesMethod
from radixgen.runtime.request_schema import GenerateReq, build_request

# SamplingParams fields outside OpenAI's API, by the extra-body name a radixgen server reads.
_EXTRA_BODY_FIELDS = {
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "min_new_tokens": "min_tokens",
    "ignore_eos": "ignore_eos",
    "stop_token_ids": "stop_token_ids",
    "regex": "regex",
    "choices": "choices",
}
# A choice of n characters takes at most n tokens; the slack covers the end-of-text token.
_CHOICE_TOKEN_SLACK = 4
_OPENAI_FIELDS = ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty")


class OpenAI(Backend):
    """An OpenAI-compatible server (OpenAI itself when `base_url` is None).

    Args:
        model: the model name the server expects.
        base_url: e.g. "http://127.0.0.1:30000/v1" for `radixgen serve`.
        api_key: sent as the bearer token (a placeholder is used for local servers).
        is_radixgen: whether the server takes radixgen's extra-body fields; None asks the
            server (`GET /get_model_info` next to the `/v1` root).
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        is_radixgen: bool | None = None,
    ):
        import openai

        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        if api_key is None and base_url is not None:
            api_key = "none"  # local servers without --api-key ignore it; the client needs one
        self.model = model
        self._openai = openai
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key)
        if is_radixgen is None:
            is_radixgen = _probe_radixgen(base_url, api_key)
        self.is_radixgen = is_radixgen

    def chat_template(self) -> ChatTemplate:
        # The server applies the model's real template to `messages`; this one only
        # renders s.text() for reading.
        return chatml_template()

    def generate(self, prompt: Prompt, request: GenerateReq) -> GenerateOutput:
        pieces: list[str] = []
        meta_info: dict[str, Any] = {}
        for delta in self._generate(prompt, request, stream=False):
            pieces.append(delta.text)
            meta_info = delta.meta_info or meta_info
        return GenerateOutput("".join(pieces), meta_info)

    def generate_stream(self, prompt: Prompt, request: GenerateReq) -> Iterator[StreamDelta]:
        return self._generate(prompt, request, stream=True)

    def prefill(self, text: str) -> dict[str, Any]:
        return {}  # OpenAI's API has no prefill-only call; servers cache prefixes themselves

    def select(self, prompt: Prompt, choices: list[str], method: ChoicesMethod) -> SelectOutcome:
        """A greedy choices-constrained gen: the OpenAI API returns no prompt logprobs, so
        `method` cannot be honoured; the scores are 1 for the pick and 0 elsewhere."""
        if not self.is_radixgen:
            raise UnsupportedFeatureError(
                "rg.select needs prompt logprobs or choices-constrained decoding, which "
                "this OpenAI server offers neither of; use a radixgen server, "
                "rg.RuntimeEndpoint or rg.Engine"
            )
        longest = max(len(choice) for choice in choices)
        options = {
            "choices": choices,
            "temperature": 0.0,
            "max_new_tokens": longest + _CHOICE_TOKEN_SLACK,
        }
        output = self.generate(prompt, build_request(options, text=prompt.text))
        if output.text not in choices:
            raise BackendError(f"the server answered {output.text!r}, not one of {choices}")
        index = choices.index(output.text)
        scores = [1.0 if i == index else 0.0 for i in range(len(choices))]
        meta_info = {
            **output.meta_info,
            "choices": list(choices),
            "choices_method": "constrained_greedy_decoding",
            "scores": scores,
        }
        return SelectOutcome(index=index, scores=scores, meta_info=meta_info)

    # ---- internals ----

    def _generate(
        self, prompt: Prompt, request: GenerateReq, *, stream: bool
    ) -> Iterator[StreamDelta]:
        uses_chat = bool(prompt.messages) or prompt.open_role is not None
        arguments = self._arguments(request, chat=uses_chat)
        if stream:
            arguments["stream"] = True
            arguments["stream_options"] = {"include_usage": True}
        try:
            if uses_chat:
                response = self.client.chat.completions.create(
                    messages=_chat_messages(prompt), **arguments
                )
            else:
                response = self.client.completions.create(prompt=prompt.text, **arguments)
            if not stream:
                yield _final_delta(response, chat=uses_chat)
                return
            finish_reason = None
            for chunk in response:
                if chunk.choices:
                    choice = chunk.choices[0]
                    text = (choice.delta.content if uses_chat else choice.text) or ""
                    finish_reason = choice.finish_reason or finish_reason
                    if text:
                        yield StreamDelta(text)
                if chunk.usage is not None:
                    yield StreamDelta("", _meta_info(chunk.usage, finish_reason))
        except self._openai.APIConnectionError as error:
            raise BackendUnreachableError(f"cannot reach the OpenAI server: {error}") from error
        except self._openai.APIStatusError as error:
            raise BackendError(f"the OpenAI server refused the request: {error}") from error

    def _arguments(self, request: GenerateReq, *, chat: bool) -> dict[str, Any]:
        # Only what differs from the defaults is sent: the server's own defaults apply to
        # the rest (and a plain OpenAI server never sees radixgen's extra fields unasked).
        params = request.sampling_params.non_default_fields()
        # A LoRA adapter is a model of its own on OpenAI-compatible servers (vLLM, radixgen).
        arguments: dict[str, Any] = {"model": request.lora_path or self.model}
        if "max_new_tokens" in params:
            arguments["max_tokens"] = params["max_new_tokens"]
        if "stop" in params:
            arguments["stop"] = list(params["stop"])
        for name in _OPENAI_FIELDS:
            if name in params:
                arguments[name] = params[name]
        if request.return_logprob:
            arguments["logprobs"] = True if chat else request.top_logprobs_num
            if chat and request.top_logprobs_num:
                arguments["top_logprobs"] = request.top_logprobs_num
        extra_body = {
            extra_name: params[name]
            for name, extra_name in _EXTRA_BODY_FIELDS.items()
            if name in params
        }
        json_schema = params.get("json_schema")
        if json_schema is not None:
            if chat:
                arguments["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": _loads(json_schema)},
                }
            else:
                extra_body["json_schema"] = json_schema
        if extra_body:
            if not self.is_radixgen:
                raise UnsupportedFeatureError(
                    f"{sorted(extra_body)} need a radixgen server (extra body); this "
                    "OpenAI server does not take them"
                )
            arguments["extra_body"] = extra_body
        return arguments


def _chat_messages(prompt: Prompt) -> list[dict[str, str]]:
    """The conversation to send; the gen must be the start of an assistant message."""
    if prompt.open_role != "assistant":
        raise UnsupportedFeatureError(
            "with the OpenAI backend, a gen in a chat program must be inside an assistant "
            "message: s += rg.assistant(rg.gen('name'))"
        )
    *finished, open_message = prompt.messages
    if open_message["content"]:
        raise UnsupportedFeatureError(
            "the OpenAI chat API cannot continue a partly written assistant message; put "
            "the gen first in the assistant message"
        )
    return finished


def _final_delta(response: Any, *, chat: bool) -> StreamDelta:
    choice = response.choices[0]
    text = (choice.message.content if chat else choice.text) or ""
    return StreamDelta(text, _meta_info(response.usage, choice.finish_reason))


def _meta_info(usage: Any, finish_reason: str | None) -> dict[str, Any]:
    details = getattr(usage, "prompt_tokens_details", None)
    return {
        "prompt_tokens": getattr(usage, "prompt_tokens", 0),
        "completion_tokens": getattr(usage, "completion_tokens", 0),
        "cached_tokens": getattr(details, "cached_tokens", 0) or 0,
        "finish_reason": finish_reason,
    }


def _loads(schema: str) -> Any:
    import json

    return json.loads(schema)


def _probe_radixgen(base_url: str | None, api_key: str | None) -> bool:
    """Whether `base_url` belongs to a radixgen server: its native /get_model_info (next to
    the /v1 root) answers with radixgen's fields."""
    if base_url is None:
        return False
    import httpx

    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{root}/get_model_info", headers=headers, timeout=10.0)
        info = response.json() if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return False
    return isinstance(info, dict) and "model_path" in info and "max_total_tokens" in info
