"""`RuntimeEndpoint`: the DSL against a `radixgen serve` server, over its native API.

Generation goes through `POST /generate` (SSE when streaming); `select` uses its prompt
logprobs; the role format is derived from the chat template the server reports in
`GET /get_model_info`, rendered here with Jinja so no tokenizer is loaded client-side.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

from radixgen.backends.base import (
    Backend,
    GenerateOutput,
    Prompt,
    SelectOutcome,
    StreamDelta,
)
from radixgen.backends.choice_scoring import TokenLogprob, select_by_prompt_logprobs
from radixgen.backends.generate_payload import request_options, text_delta
from radixgen.chat_template import ChatTemplate, derive_chat_template, jinja_renderer
from radixgen.errors import BackendError, BackendUnreachableError, UnsupportedFeatureError
from radixgen.ir import ChoicesMethod
from radixgen.runtime.request_schema import GenerateReq

DEFAULT_TIMEOUT_S = 600.0


class RuntimeEndpoint(Backend):
    """A `radixgen serve` server at `base_url` (e.g. "http://127.0.0.1:30000").

    Raises:
        BackendUnreachableError: nothing answers at `base_url` (checked at construction).
        BackendError: the server refused (e.g. a wrong `api_key`).
    """

    def __init__(
        self, base_url: str, api_key: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
    ):
        import httpx

        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._httpx = httpx
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)
        self._template_lock = threading.Lock()
        self._chat_template: ChatTemplate | None = None
        self.model_info: dict[str, Any] = self._request("GET", "/get_model_info")

    # ---- Backend ----

    def chat_template(self) -> ChatTemplate:
        with self._template_lock:
            if self._chat_template is None:
                template, special_tokens = _served_chat_template(self.model_info)
                if not template:
                    raise UnsupportedFeatureError(
                        f"the server at {self.base_url} reports no chat template, so roles "
                        "(rg.user/rg.assistant/...) cannot be rendered; use plain text"
                    )
                self._chat_template = derive_chat_template(
                    jinja_renderer(template, special_tokens), special_tokens["bos_token"]
                )
            return self._chat_template

    def generate(self, prompt: Prompt, request: GenerateReq) -> GenerateOutput:
        body = {"text": request.text, **request_options(request)}
        result = self._request("POST", "/generate", body)
        return GenerateOutput(text=result["text"], meta_info=result["meta_info"])

    def generate_stream(self, prompt: Prompt, request: GenerateReq) -> Iterator[StreamDelta]:
        body = {"text": request.text, "stream": True, **request_options(request)}
        previous_text = ""
        for event in self._stream_events("/generate", body):
            delta, previous_text = text_delta(previous_text, event["text"])
            finished = event["meta_info"].get("finish_reason") is not None
            yield StreamDelta(delta, event["meta_info"] if finished else None)

    def prefill(self, text: str) -> dict[str, Any]:
        body = {"text": text, "sampling_params": {"max_new_tokens": 0}}
        return self._request("POST", "/generate", body)["meta_info"]

    def prompt_logprobs(self, texts: list[str], logprob_start_len: int) -> list[list[TokenLogprob]]:
        body = {
            "text": texts,
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": logprob_start_len,
        }
        results = self._request("POST", "/generate", body)
        return [
            [(lp, tid) for lp, tid, *_ in result["meta_info"]["input_token_logprobs"]]
            for result in results
        ]

    def select(self, prompt: Prompt, choices: list[str], method: ChoicesMethod) -> SelectOutcome:
        return select_by_prompt_logprobs(self, prompt.text, choices, method)

    def close(self) -> None:
        self._client.close()

    # ---- server administration ----

    def flush_cache(self) -> None:
        """Drops the server's cached prefixes (only when it is idle)."""
        self._request("POST", "/flush_cache")

    def get_server_info(self) -> dict[str, Any]:
        return self._request("GET", "/get_server_info")

    # ---- HTTP ----

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = self._client.request(method, path, json=body)
        except self._httpx.TransportError as error:
            raise self._transport_error(error) from error
        if response.status_code >= 400:
            raise BackendError(self._error_message(response.status_code, response.text))
        return response.json() if response.content else {}

    def _stream_events(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The JSON payloads of an SSE response, up to `data: [DONE]`."""
        try:
            with self._client.stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    raise BackendError(
                        self._error_message(response.status_code, response.read().decode())
                    )
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if "error" in event:
                        raise BackendError(f"the server failed mid-stream: {event['error']}")
                    yield event
        except self._httpx.TransportError as error:
            raise self._transport_error(error) from error

    def _transport_error(self, error: Exception) -> BackendError:
        if isinstance(error, (self._httpx.ConnectError, self._httpx.ConnectTimeout)):
            return BackendUnreachableError(
                f"cannot reach the radixgen server at {self.base_url} ({error}); is "
                "`radixgen serve` running there?"
            )
        return BackendError(f"the connection to {self.base_url} failed: {error!r}")

    def _error_message(self, status_code: int, text: str) -> str:
        try:
            message = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = text[:500]
        hint = " (check api_key)" if status_code == 401 else ""
        return f"the server at {self.base_url} answered {status_code}{hint}: {message}"


def _served_chat_template(model_info: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The server's Jinja chat template and special tokens, from `/get_model_info`."""
    special_tokens = {
        "bos_token": _token_text(model_info.get("bos_token")),
        "eos_token": _token_text(model_info.get("eos_token")),
    }
    return _default_template(model_info.get("chat_template")), special_tokens


def _default_template(template: Any) -> str | None:
    """HF allows several named templates (a dict, or a list of {name, template}); the one
    named "default" is the chat one."""
    if isinstance(template, list):
        template = {entry.get("name"): entry.get("template") for entry in template}
    if isinstance(template, dict):
        return template.get("default")
    return template


def _token_text(token: Any) -> str | None:
    """A special token: a string, or an AddedToken-like dict holding it as "content"."""
    return token.get("content") if isinstance(token, dict) else token
