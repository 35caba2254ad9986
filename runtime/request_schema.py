"""The one request schema: `SamplingParams`, `GenerateReq`, and `validate_request`.

Every front end builds a `GenerateReq` and validates it here: `rg.gen` (field by field, when
the program line runs), `Engine.generate` and the HTTP handlers (whole requests, then again
with the model's `ModelLimits` once the prompt is tokenized). The scheduler trusts a
validated request. Errors are `RequestFieldError`s naming the field and what it accepts.

It imports no torch (nor anything of radixgen but `request_fields.py`, the checks of single
fields): the DSL imports it without loading the runtime. Numeric bounds live in one table,
`FIELD_BOUNDS` (a new bound is one entry), other fields' checks in `NORMALISERS`; size-like
fields have caps (`MAX_N`, `MAX_STOP_STRINGS`...) so no front end allocates per-sample or
per-entry state before the request is known sane.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from radixgen.runtime.request_fields import (
    BOOL_FIELDS,
    CONSTRAINT_FIELDS,
    FIELD_BOUNDS,
    GREEDY_TEMPERATURE_EPS,
    MAX_CACHE_SALT_CHARS,
    MAX_JSON_DEPTH,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_N,
    MAX_PROMPTS_PER_REQUEST,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOP_LOGPROBS,
    NORMALISERS,
    NOT_NULLABLE,
    SEED_LIMIT,
    Bound,
    RequestFieldError,
    json_depth,
    json_schema_string,
)
from radixgen.runtime.tool_schema import tool_call_schema, tool_definitions

# The schema's public names, with the field checks it re-exports from request_fields.py.
__all__ = [
    "FIELD_BOUNDS",
    "GREEDY_TEMPERATURE_EPS",
    "MAX_CACHE_SALT_CHARS",
    "MAX_JSON_DEPTH",
    "MAX_LOGIT_BIAS_ENTRIES",
    "MAX_N",
    "MAX_PROMPTS_PER_REQUEST",
    "MAX_STOP_STRING_CHARS",
    "MAX_STOP_STRINGS",
    "MAX_STOP_TOKEN_IDS",
    "MAX_TOP_LOGPROBS",
    "SEED_LIMIT",
    "Bound",
    "GenerateReq",
    "ModelLimits",
    "RequestFieldError",
    "SamplingParams",
    "build_request",
    "check_num_prompts",
    "json_depth",
    "json_schema_string",
    "tool_call_schema",
    "tool_definitions",
    "validate_fields",
    "validate_request",
]


@dataclass
class SamplingParams:
    """How one request samples, with the field names SGLang users know.

    `temperature=0` means greedy. `top_k=-1` (or 0) disables top-k. `stop` holds strings
    that end generation when they appear in the output text (also across token
    boundaries); the returned text is trimmed before the stop string. `n` parallel samples
    share the prompt's KV; with a `seed`, sample i uses `seed + i`. `regex`, `json_schema`,
    `choices`, `ebnf` (GBNF-style, as SGLang takes it), `lark` (a Lark grammar),
    `json_object` (any JSON object) and `structural_tag` (SGLang's: free text whose tagged
    bodies match schemas) constrain the output (at most one of them).
    `logit_bias` (token id -> bias, OpenAI's) is added to the logits before the constraint
    mask, penalties and temperature. `constraint_budget` (default on) keeps a constrained output that runs out of
    `max_new_tokens` or context a complete match; False truncates it raw.
    """

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    n: int = 1
    seed: int | None = None
    regex: str | None = None
    json_schema: str | dict | None = None
    choices: list[str] | None = None
    ebnf: str | None = None
    lark: str | None = None
    json_object: bool = False
    structural_tag: str | dict | None = None
    constraint_budget: bool = True
    # OpenAI's: token id -> bias in [-100, 100], added to the logits before sampling.
    logit_bias: dict[int, float] | None = None

    @classmethod
    def from_dict(cls, params: Mapping[str, Any] | SamplingParams | None) -> SamplingParams:
        """Builds and validates SamplingParams from a dict (None: the defaults).

        Raises:
            RequestFieldError: `params` is not a dict, holds an unknown field, or a field
                has a bad type or value (the message names it).
        """
        if params is None:
            params = {}
        if isinstance(params, SamplingParams):
            params = params.to_dict()
        if not isinstance(params, Mapping):
            raise RequestFieldError(
                "sampling_params", f"sampling_params must be a dict, got {type(params).__name__}"
            )
        sampling_params = cls(**validate_fields(params, allowed=SAMPLING_FIELD_NAMES))
        _check_sampling_params(sampling_params)
        return sampling_params

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict of copies (lists and dicts are not shared with self)."""
        return dataclasses.asdict(self)

    def field_values(self) -> dict[str, Any]:
        """The fields as a dict of the values themselves, for reading: `dataclasses.asdict`
        deep-copies each list and dict, 0.14 ms a request (0.14 s of a 1,024-prompt
        `Engine.generate` whose validation reads every field; CPU, twelfth session)."""
        return {name: getattr(self, name) for name in _SAMPLING_FIELD_ORDER}

    def non_default_fields(self) -> dict[str, Any]:
        """The fields that differ from the defaults (what a client needs to send)."""
        return {
            name: value
            for name, value in self.field_values().items()
            if value != _SAMPLING_DEFAULTS[name]
        }

    @property
    def stop_strings(self) -> list[str]:
        """`stop` as a list (validation has normalised it already)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def has_constraint(self) -> bool:
        return self.json_object or any(
            getattr(self, name) is not None for name in CONSTRAINT_FIELDS if name != "json_object"
        )


_SAMPLING_FIELD_ORDER = tuple(f.name for f in dataclasses.fields(SamplingParams))
SAMPLING_FIELD_NAMES = frozenset(_SAMPLING_FIELD_ORDER)
_SAMPLING_DEFAULTS = SamplingParams().to_dict()


@dataclass
class GenerateReq:
    """One prompt's generation request: the type every front end builds and the scheduler
    receives (in-process, or pickled over ZeroMQ). Exactly one of `text` / `input_ids` is
    given; the front end fills `input_ids` in when it tokenizes, and `rid` when it submits."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    # Logprobs of output tokens, and of prompt tokens from `logprob_start_len` on (None, or
    # SGLang's -1: none; position 0 has no logprob), with `top_logprobs_num` alternatives.
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int = 0
    stream: bool = False  # for the front end: the scheduler streams every step either way
    # The radix cache namespace (vLLM's name): prefixes are shared only within one salt.
    cache_salt: str | None = None
    # The LoRA adapter (by its loaded name; SGLang's field name) or None: the base model.
    # Its KV is cached apart: the radix namespace is (cache_salt, lora_path).
    lora_path: str | None = None
    rid: str | None = None  # unique request id


# The GenerateReq fields besides the prompt and sampling_params: request options.
REQUEST_OPTION_NAMES = frozenset(
    f.name
    for f in dataclasses.fields(GenerateReq)
    if f.name not in ("text", "input_ids", "sampling_params")
)


@dataclass(frozen=True)
class ModelLimits:
    """What bounds a tokenized request: the model's vocabulary and context, the KV pool."""

    vocab_size: int
    context_length: int
    kv_capacity: int


def validate_fields(
    values: Mapping[str, Any],
    *,
    allowed: frozenset[str] | None = None,
    display_names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Checks each given field on its own and returns them normalised (`stop`,
    `stop_token_ids` and `choices` as lists, `json_schema` as a canonical JSON string).

    `rg.gen` calls this on the arguments it was given; `validate_request` on every field.

    Args:
        values: field name -> value; names are SamplingParams fields or request options.
        allowed: the accepted names (default: all of them).
        display_names: how messages name a field the caller spells differently (rg.gen's
            `max_tokens` is `max_new_tokens`).
    Raises:
        RequestFieldError naming the first bad field.
    """
    allowed = SAMPLING_FIELD_NAMES | REQUEST_OPTION_NAMES if allowed is None else allowed
    unknown = set(values) - allowed
    if unknown:
        name = sorted(unknown)[0]
        raise RequestFieldError(
            name, f"unknown sampling parameter(s): {sorted(unknown)}; allowed: {sorted(allowed)}"
        )
    constraints = [name for name in CONSTRAINT_FIELDS if values.get(name) not in (None, False)]
    if len(constraints) > 1:
        raise RequestFieldError(
            constraints[1],
            f"at most one of {', '.join(CONSTRAINT_FIELDS)} may be set, got {constraints}",
        )
    normalised = dict(values)
    for name, value in values.items():
        if value is None and name not in NOT_NULLABLE:
            continue
        if name in FIELD_BOUNDS:
            FIELD_BOUNDS[name].check(name, value, (display_names or {}).get(name))
        elif name in BOOL_FIELDS:
            if not isinstance(value, bool):
                raise RequestFieldError(name, f"{name} must be a bool, got {value!r}")
        elif name in NORMALISERS:
            normalised[name] = NORMALISERS[name](value)
    return normalised


def validate_request(request: GenerateReq, limits: ModelLimits | None = None) -> None:
    """The one validation of a request; normalises it in place (lists, canonical schema).

    Without `limits` (before tokenization: the DSL, the HTTP handler) it checks what the
    request alone determines. With `limits` the prompt must be tokenized (`input_ids`), and
    the bounds that need the model follow: token ids in the vocabulary, prompt plus
    `max_new_tokens` within the context and the KV pool, `logprob_start_len` within the
    prompt.

    Raises:
        RequestFieldError naming the field and what it accepts.
    """
    if not isinstance(request, GenerateReq):
        raise RequestFieldError("request", f"expected a GenerateReq, got {type(request).__name__}")
    if request.text is None and request.input_ids is None:
        raise RequestFieldError("text", "give exactly one of text (prompt) and input_ids")
    if request.text is not None and not isinstance(request.text, str):
        raise RequestFieldError("text", f"the prompt must be a string, got {request.text!r}")
    params = request.sampling_params
    if not isinstance(params, SamplingParams):
        raise RequestFieldError(
            "sampling_params",
            f"sampling_params must be a SamplingParams, got {type(params).__name__}",
        )
    validate_fields({name: getattr(request, name) for name in REQUEST_OPTION_NAMES})
    for name, value in validate_fields(params.field_values(), allowed=SAMPLING_FIELD_NAMES).items():
        setattr(params, name, value)
    _check_sampling_params(params)
    if request.logprob_start_len == -1:
        request.logprob_start_len = None  # SGLang's "output logprobs only"
    if limits is not None:
        check_model_limits(request, limits)


def build_request(
    options: Mapping[str, Any], *, text: str | None = None, input_ids: list[int] | None = None
) -> GenerateReq:
    """A validated `GenerateReq` from flat options: SamplingParams fields and request
    options side by side (as `rg.gen` takes them).

    Raises:
        RequestFieldError naming the field.
    """
    sampling = {name: value for name, value in options.items() if name not in REQUEST_OPTION_NAMES}
    request_options = {
        name: value for name, value in options.items() if name in REQUEST_OPTION_NAMES
    }
    request = GenerateReq(
        text=text,
        input_ids=input_ids,
        sampling_params=SamplingParams.from_dict(sampling),
        **request_options,
    )
    validate_request(request)
    return request


def check_num_prompts(num_prompts: int) -> None:
    """Raises RequestFieldError unless a batch request holds 1..MAX_PROMPTS_PER_REQUEST
    prompts; call it before tokenizing or allocating anything per prompt."""
    if not 1 <= num_prompts <= MAX_PROMPTS_PER_REQUEST:
        raise RequestFieldError(
            "prompt",
            f"a request holds 1 to {MAX_PROMPTS_PER_REQUEST} prompts, got {num_prompts}",
        )


# ---- field checks ------------------------------------------------------------------------


def _check_sampling_params(params: SamplingParams) -> None:
    """The checks across fields (each field was checked alone already)."""
    if params.min_new_tokens > params.max_new_tokens:
        raise RequestFieldError(
            "min_new_tokens",
            f"min_new_tokens ({params.min_new_tokens}) must be <= max_new_tokens "
            f"({params.max_new_tokens})",
        )
    if params.seed is not None and params.seed + params.n - 1 >= SEED_LIMIT:
        raise RequestFieldError(
            "seed",
            f"seed + n - 1 must be < 2**63 (sample i uses seed + i), got seed={params.seed}, "
            f"n={params.n}",
        )


def check_model_limits(request: GenerateReq, limits: ModelLimits) -> None:
    """The model-dependent half of `validate_request(request, limits)`, for a request whose
    fields `validate_request(request)` already checked (the server validates each request
    once when it builds it, then this once it is tokenized).

    Raises:
        RequestFieldError naming the field and what it accepts.
    """
    ids = request.input_ids
    if not isinstance(ids, list) or not ids:
        raise RequestFieldError(
            "input_ids", "the prompt is empty: input_ids must be a non-empty list of token ids"
        )
    vocab_size = limits.vocab_size
    # Exact type int: a bool is not a token id (JSON false must not read as token 0). The
    # type set, min and max run in C, not a Python loop per token.
    if set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) >= vocab_size:
        raise RequestFieldError("input_ids", f"input_ids must be ints in [0, {vocab_size})")
    params = request.sampling_params
    for name, token_ids in [
        ("stop_token_ids", params.stop_token_ids),
        ("logit_bias", params.logit_bias),
    ]:
        out_of_vocab = sorted(i for i in token_ids or () if i >= vocab_size)
        if out_of_vocab:
            raise RequestFieldError(
                name, f"{name} must be [0, {vocab_size}), got {out_of_vocab[:8]}"
            )
    prompt_len, context_length = len(ids), limits.context_length
    if prompt_len >= context_length:
        raise RequestFieldError(
            "input_ids",
            f"the prompt has {prompt_len} tokens, which does not fit in the context length "
            f"({context_length}) with room for one output token",
        )
    total = prompt_len + params.max_new_tokens
    for bound, what in [
        (context_length, "context length"),
        (limits.kv_capacity, "KV cache capacity"),
    ]:
        if total > bound:
            raise RequestFieldError(
                "max_new_tokens",
                f"prompt tokens ({prompt_len}) + max_new_tokens ({params.max_new_tokens}) = "
                f"{total} exceeds the {what} ({bound})",
            )
    start = request.logprob_start_len
    if start is not None and start > prompt_len:
        raise RequestFieldError(
            "logprob_start_len",
            f"logprob_start_len must be an int in [0, {prompt_len}] or None, got {start!r}",
        )
