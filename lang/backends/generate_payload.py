"""Request fields shared by the native backends (in-process Engine and `/generate`)."""

from __future__ import annotations

from typing import Any

from radixgen.errors import BackendError
from radixgen.gen_params import GenParams


def request_options(params: GenParams) -> dict[str, Any]:
    """`sampling_params` plus the logprob request options of one generation."""
    options: dict[str, Any] = {"sampling_params": params.sampling_dict()}
    if params.return_logprob:
        options["return_logprob"] = True
        options["top_logprobs_num"] = params.top_logprobs_num or 0
    return options


def text_delta(previous_text: str, text: str) -> tuple[str, str]:
    """The new part of a streamed chunk and the text so far.

    Native streams send the cumulative text (SGLang's shape); detokenized text only grows,
    so the delta is the suffix past what was already seen.
    """
    if not text.startswith(previous_text):
        raise BackendError("a streamed chunk does not extend the text received so far")
    return text[len(previous_text) :], text
