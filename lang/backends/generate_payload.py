"""Request fields shared by the native backends (in-process Engine and `/generate`)."""

from __future__ import annotations

from typing import Any

from radixgen.errors import BackendError
from radixgen.runtime.request_schema import GenerateReq


def request_options(request: GenerateReq) -> dict[str, Any]:
    """`sampling_params` (the fields that differ from the defaults) plus the LoRA adapter and
    logprob request options of one generation: the keyword arguments of `Engine.generate`, and the body of
    `POST /generate` besides the prompt."""
    options: dict[str, Any] = {"sampling_params": request.sampling_params.non_default_fields()}
    if request.lora_path is not None:
        options["lora_path"] = request.lora_path
    if request.return_logprob:
        options["return_logprob"] = True
        options["top_logprobs_num"] = request.top_logprobs_num
    return options


def text_delta(previous_text: str, text: str) -> tuple[str, str]:
    """The new part of a streamed chunk and the text so far.

    Native streams send the cumulative text (SGLang's shape); detokenized text only grows,
    so the delta is the suffix past what was already seen.
    """
    if not text.startswith(previous_text):
        raise BackendError("a streamed chunk does not extend the text received so far")
    return text[len(previous_text) :], text
