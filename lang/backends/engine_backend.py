"""`EngineBackend`: the DSL on an in-process `rg.Engine` (or any object with its API).

Duck-typed on purpose: the wrapped object needs `generate(prompt=, sampling_params=,
return_logprob=, logprob_start_len=, top_logprobs_num=, stream=)` returning SGLang-shaped
dicts (an iterator of cumulative-text dicts when streaming), and a HF `tokenizer` whose
`apply_chat_template` gives the role format. The lang layer never imports the runtime.

The Engine runs its scheduler on a background thread, so concurrent calls from the
executor's worker threads batch together.
"""

from __future__ import annotations

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
from radixgen.chat_template import ChatTemplate, chatml_template, derive_chat_template
from radixgen.errors import BackendError
from radixgen.ir import ChoicesMethod
from radixgen.runtime.request_schema import GenerateReq


class EngineBackend(Backend):
    def __init__(self, engine: Any):
        if not callable(getattr(engine, "generate", None)):
            raise TypeError(f"engine must have a generate() method, got {type(engine).__name__}")
        self.engine = engine
        self._chat_template: ChatTemplate | None = None
        self._template_lock = threading.Lock()

    def chat_template(self) -> ChatTemplate:
        with self._template_lock:
            if self._chat_template is None:
                self._chat_template = _template_of(getattr(self.engine, "tokenizer", None))
            return self._chat_template

    def generate(self, prompt: Prompt, request: GenerateReq) -> GenerateOutput:
        result = self._call(prompt=request.text, **request_options(request))
        return GenerateOutput(text=result["text"], meta_info=dict(result["meta_info"]))

    def generate_stream(self, prompt: Prompt, request: GenerateReq) -> Iterator[StreamDelta]:
        chunks = self._call(prompt=request.text, stream=True, **request_options(request))
        previous_text = ""
        try:
            for chunk in chunks:
                delta, previous_text = text_delta(previous_text, chunk["text"])
                finished = chunk["meta_info"].get("finish_reason") is not None
                yield StreamDelta(delta, dict(chunk["meta_info"]) if finished else None)
        except ValueError as error:
            raise BackendError(f"the engine rejected the request: {error}") from error
        finally:
            chunks.close()  # a reader that stops early aborts the request (frees its KV)

    def prefill(self, text: str) -> dict[str, Any]:
        result = self._call(prompt=text, sampling_params={"max_new_tokens": 0})
        return dict(result["meta_info"])

    def prompt_logprobs(self, texts: list[str], logprob_start_len: int) -> list[list[TokenLogprob]]:
        results = self._call(
            prompt=texts,
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=logprob_start_len,
        )
        return [
            [(lp, tid) for lp, tid, *_ in result["meta_info"]["input_token_logprobs"]]
            for result in results
        ]

    def select(self, prompt: Prompt, choices: list[str], method: ChoicesMethod) -> SelectOutcome:
        return select_by_prompt_logprobs(self, prompt.text, choices, method)

    def _call(self, **arguments: Any) -> Any:
        """engine.generate; its ValueError (a rejected request) becomes a BackendError."""
        try:
            return self.engine.generate(**arguments)
        except ValueError as error:
            raise BackendError(f"the engine rejected the request: {error}") from error


def _template_of(tokenizer: Any) -> ChatTemplate:
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return chatml_template()

    def render(messages: list[dict[str, str]]) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False)

    return derive_chat_template(render, bos_token=getattr(tokenizer, "bos_token", None))
