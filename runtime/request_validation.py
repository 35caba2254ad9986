"""`validate_request`: checks a `TokenizedGenerateReq` against the model and the KV pool.

Returns an error message instead of raising, so the scheduler can answer the one bad
request and keep serving the others. Front ends call it too, to raise early.
"""

from __future__ import annotations

from radixgen.runtime.io_struct import TokenizedGenerateReq
from radixgen.runtime.sampling_params import SamplingParams

MAX_CACHE_SALT_LEN = 256


def cache_salt_error(cache_salt: object) -> str | None:
    """None if `cache_salt` is None or a non-empty str of at most 256 chars, else why not."""
    if cache_salt is None:
        return None
    if not isinstance(cache_salt, str) or not 0 < len(cache_salt) <= MAX_CACHE_SALT_LEN:
        shown = repr(cache_salt) if not isinstance(cache_salt, str) else f"{len(cache_salt)} chars"
        return (
            f"cache_salt must be None or a non-empty string of at most {MAX_CACHE_SALT_LEN} "
            f"chars, got {shown}"
        )
    return None


def validate_request(
    request: TokenizedGenerateReq,
    *,
    vocab_size: int,
    context_length: int,
    kv_capacity: int,
    num_queued: int = 0,
    max_queued: int | None = None,
) -> str | None:
    """Returns None if `request` can run, else a message naming the bad field."""
    if not isinstance(request.rid, str) or not request.rid:
        return "rid must be a non-empty string"
    ids = request.input_ids
    if not isinstance(ids, list) or not ids:
        return "the prompt is empty: input_ids must be a non-empty list of token ids"
    if not all(isinstance(i, int) and 0 <= i < vocab_size for i in ids):
        return f"input_ids must be ints in [0, {vocab_size})"
    salt_error = cache_salt_error(request.cache_salt)
    if salt_error is not None:
        return salt_error
    params = request.sampling_params
    if not isinstance(params, SamplingParams):
        return f"sampling_params must be a SamplingParams, got {type(params).__name__}"
    try:
        params.validate(vocab_size)
    except (TypeError, ValueError) as error:
        return str(error)
    prompt_len = len(ids)
    if prompt_len >= context_length:
        return (
            f"the prompt has {prompt_len} tokens, which does not fit in the context length "
            f"({context_length}) with room for one output token"
        )
    total = prompt_len + params.max_new_tokens
    if total > context_length:
        return (
            f"prompt tokens ({prompt_len}) + max_new_tokens ({params.max_new_tokens}) = {total} "
            f"exceeds the context length ({context_length})"
        )
    if total > kv_capacity:
        return (
            f"prompt tokens ({prompt_len}) + max_new_tokens ({params.max_new_tokens}) = {total} "
            f"exceeds the KV cache capacity ({kv_capacity} tokens)"
        )
    start = request.logprob_start_len
    if start == -1:
        request.logprob_start_len = start = None  # SGLang's "output logprobs only"
    if start is not None and (
        not isinstance(start, int) or isinstance(start, bool) or not 0 <= start <= prompt_len
    ):
        return f"logprob_start_len must be an int in [0, {prompt_len}] or None, got {start!r}"
    num_top = request.top_logprobs_num
    if not isinstance(num_top, int) or isinstance(num_top, bool) or not 0 <= num_top <= vocab_size:
        return f"top_logprobs_num must be an int in [0, {vocab_size}], got {num_top!r}"
    if max_queued is not None and num_queued + params.n > max_queued:
        return (
            f"the queue is full ({num_queued} requests waiting, max_queued_requests={max_queued})"
        )
    return None
