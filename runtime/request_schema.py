"""The one request schema: `SamplingParams`, `GenerateReq`, and `validate_request`.

Every front end builds a `GenerateReq` and validates it here: `rg.gen` (field by field, when
the program line runs), `Engine.generate` and the HTTP handlers (whole requests, then again
with the model's `ModelLimits` once the prompt is tokenized). The scheduler trusts a
validated request. Errors are `RequestFieldError`s naming the field and what it accepts.

This module imports no torch (nor anything of radixgen): the DSL imports it to build
requests without loading the runtime.

Bounds live in one table, `FIELD_BOUNDS`; a new numeric bound is one entry there. Size-like
fields have caps (`MAX_N`, `MAX_TOP_LOGPROBS`, `MAX_STOP_STRINGS`...) so that no front end
allocates per-sample or per-entry state before the request is known to be sane.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Greedy when the temperature is at or below this; dividing logits by ~0 would overflow.
GREEDY_TEMPERATURE_EPS = 1e-6
# Seeds are int64 on the device; sample i of a request draws with seed + i.
SEED_LIMIT = 2**63
MAX_N = 128  # parallel samples per prompt (OpenAI's limit for n)
MAX_TOP_LOGPROBS = 32  # top alternatives per position (OpenAI's 20, with headroom)
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_CACHE_SALT_CHARS = 256
MAX_PROMPTS_PER_REQUEST = 1024  # prompts in one HTTP batch request
MAX_LOGIT_BIAS_ENTRIES = 300  # OpenAI's limit (the field itself is not supported yet)
CONSTRAINT_FIELDS = ("regex", "json_schema", "choices")
# Deepest nesting of arrays and objects accepted in a request body or a JSON schema: deep
# enough for any real schema, far from Python's recursion limit in the code that walks it.
MAX_JSON_DEPTH = 128


class RequestFieldError(ValueError, TypeError):
    """A request field has a wrong type or value. Both a ValueError and a TypeError, so
    callers of either convention catch it; `field` names the field (HTTP `param`)."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True)
class Bound:
    """The accepted values of a numeric field: its kind and an interval (None: open end)."""

    kind: type  # int or float; bools are never accepted as either
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is excluded
    hint: str = ""  # appended to the range error, e.g. what to use instead

    def check(self, name: str, value: Any, display_name: str | None = None) -> None:
        """Raises RequestFieldError naming the field (as `display_name`, if given) unless
        `value` fits this bound."""
        shown = display_name or name
        kind_name = "an int" if self.kind is int else "a number"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RequestFieldError(name, f"{shown} must be {kind_name}, got {value!r}")
        if self.kind is int and not isinstance(value, int):
            raise RequestFieldError(name, f"{shown} must be an int, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise RequestFieldError(name, f"{shown} must be a finite number, got {value!r}")
        low, high = self.low, self.high
        too_low = low is not None and (value <= low if self.low_open else value < low)
        too_high = high is not None and value > high
        if not (too_low or too_high):
            return
        if (too_low and (high is None or self.low_open)) or (too_high and low is None):
            accepted = f"{'>' if self.low_open else '>='} {low}" if too_low else f"<= {high}"
        else:
            accepted = f"in {'(' if self.low_open else '['}{low}, {high}]"
        hint = f" ({self.hint})" if self.hint and too_low else ""
        raise RequestFieldError(name, f"{shown} must be {accepted}{hint}, got {value}")


FIELD_BOUNDS: dict[str, Bound] = {
    "max_new_tokens": Bound(int, low=0),
    "min_new_tokens": Bound(int, low=0),
    "temperature": Bound(float, low=0.0),
    "top_p": Bound(float, low=0, high=1.0, low_open=True, hint="use temperature=0 for greedy"),
    "top_k": Bound(int, low=-1),
    "min_p": Bound(float, low=0.0, high=1.0),
    "frequency_penalty": Bound(float, low=-2.0, high=2.0),
    "presence_penalty": Bound(float, low=-2.0, high=2.0),
    "repetition_penalty": Bound(float, low=0.0, high=2.0, low_open=True),
    "n": Bound(int, low=1, high=MAX_N),
    "seed": Bound(int, low=0, high=SEED_LIMIT - 1),
    "top_logprobs_num": Bound(int, low=0, high=MAX_TOP_LOGPROBS),
    "logprob_start_len": Bound(int, low=-1),
    "best_of": Bound(int, low=1, high=MAX_N),  # OpenAI's field (the handler maps it)
}
BOOL_FIELDS = ("ignore_eos", "skip_special_tokens", "return_logprob", "stream")


@dataclass
class SamplingParams:
    """How one request samples, with the field names SGLang users know.

    `temperature=0` means greedy. `top_k=-1` (or 0) disables top-k. `stop` holds strings
    that end generation when they appear in the output text (also across token
    boundaries); the returned text is trimmed before the stop string. `n` parallel samples
    share the prompt's KV; with a `seed`, sample i uses `seed + i`. `regex`, `json_schema`
    and `choices` constrain the output (at most one of them).
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

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return SAMPLING_FIELD_NAMES

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
        return dataclasses.asdict(self)

    def non_default_fields(self) -> dict[str, Any]:
        """The fields that differ from the defaults (what a client needs to send)."""
        return {
            name: value
            for name, value in self.to_dict().items()
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
        return self.regex is not None or self.json_schema is not None or self.choices is not None


SAMPLING_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(SamplingParams))
_SAMPLING_DEFAULTS = SamplingParams().to_dict()


@dataclass
class GenerateReq:
    """One prompt's generation request: the type every front end builds and the scheduler
    receives (in-process, or pickled over ZeroMQ).

    Args:
        text: the prompt as text; exactly one of `text` / `input_ids`.
        input_ids: the prompt as token ids (the front end fills it in when tokenizing).
        sampling_params: how to sample.
        return_logprob: return logprobs of output tokens (and of prompt tokens from
            `logprob_start_len` on).
        logprob_start_len: first prompt position whose logprob is returned; None (or -1, as
            in SGLang): no prompt logprobs. Position 0 has no logprob (reported as None).
        top_logprobs_num: how many top alternatives to return per position (0: none).
        stream: the client wants incremental outputs (the scheduler streams every step
            either way; this is for the front end).
        cache_salt: the radix cache namespace (vLLM's name): cached prefixes are shared only
            between requests with the same salt; None is the shared default namespace.
        rid: unique request id; None until the front end assigns one.
    """

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int = 0
    stream: bool = False
    cache_salt: str | None = None
    rid: str | None = None


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
    if "ebnf" in unknown:
        # SGLang users may expect EBNF grammars; say plainly that they are out of scope.
        raise RequestFieldError(
            "ebnf", "ebnf constraints are not supported: use regex, json_schema or choices"
        )
    if unknown:
        name = sorted(unknown)[0]
        raise RequestFieldError(
            name, f"unknown sampling parameter(s): {sorted(unknown)}; allowed: {sorted(allowed)}"
        )
    constraints = [name for name in CONSTRAINT_FIELDS if values.get(name) is not None]
    if len(constraints) > 1:
        raise RequestFieldError(
            constraints[1],
            f"at most one of regex, json_schema, choices may be set, got {constraints}",
        )
    normalised = dict(values)
    for name, value in values.items():
        if value is None and name not in _NOT_NULLABLE:
            continue
        if name in FIELD_BOUNDS:
            FIELD_BOUNDS[name].check(name, value, (display_names or {}).get(name))
        elif name in BOOL_FIELDS:
            if not isinstance(value, bool):
                raise RequestFieldError(name, f"{name} must be a bool, got {value!r}")
        elif name in _NORMALISERS:
            normalised[name] = _NORMALISERS[name](value)
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
    if request.rid is not None and (not isinstance(request.rid, str) or not request.rid):
        raise RequestFieldError("rid", f"rid must be a non-empty string, got {request.rid!r}")
    params = request.sampling_params
    if not isinstance(params, SamplingParams):
        raise RequestFieldError(
            "sampling_params",
            f"sampling_params must be a SamplingParams, got {type(params).__name__}",
        )
    options = {name: getattr(request, name) for name in REQUEST_OPTION_NAMES if name != "rid"}
    validate_fields(options)
    _check_cache_salt(request.cache_salt)
    for name, value in validate_fields(params.to_dict(), allowed=SAMPLING_FIELD_NAMES).items():
        setattr(params, name, value)
    _check_sampling_params(params)
    if request.logprob_start_len == -1:
        request.logprob_start_len = None  # SGLang's "output logprobs only"
    if limits is not None:
        _check_tokenized(request, limits)


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


def _check_tokenized(request: GenerateReq, limits: ModelLimits) -> None:
    ids = request.input_ids
    if not isinstance(ids, list) or not ids:
        raise RequestFieldError(
            "input_ids", "the prompt is empty: input_ids must be a non-empty list of token ids"
        )
    vocab_size = limits.vocab_size
    # type() is int: a bool is not a token id (JSON false must not read as token 0).
    if not all(type(i) is int and 0 <= i < vocab_size for i in ids):
        raise RequestFieldError("input_ids", f"input_ids must be ints in [0, {vocab_size})")
    params = request.sampling_params
    bad_stops = [i for i in params.stop_token_ids or [] if i >= vocab_size]
    if bad_stops:
        raise RequestFieldError(
            "stop_token_ids", f"stop_token_ids must be [0, {vocab_size}), got {bad_stops}"
        )
    prompt_len, context_length = len(ids), limits.context_length
    if prompt_len >= context_length:
        raise RequestFieldError(
            "input_ids",
            f"the prompt has {prompt_len} tokens, which does not fit in the context length "
            f"({context_length}) with room for one output token",
        )
    total = prompt_len + params.max_new_tokens
    if total > context_length:
        raise RequestFieldError(
            "max_new_tokens",
            f"prompt tokens ({prompt_len}) + max_new_tokens ({params.max_new_tokens}) = {total} "
            f"exceeds the context length ({context_length})",
        )
    if total > limits.kv_capacity:
        raise RequestFieldError(
            "max_new_tokens",
            f"prompt tokens ({prompt_len}) + max_new_tokens ({params.max_new_tokens}) = {total} "
            f"exceeds the KV cache capacity ({limits.kv_capacity} tokens)",
        )
    start = request.logprob_start_len
    if start is not None and start > prompt_len:
        raise RequestFieldError(
            "logprob_start_len",
            f"logprob_start_len must be an int in [0, {prompt_len}] or None, got {start!r}",
        )


def _check_cache_salt(cache_salt: Any) -> None:
    if cache_salt is None:
        return
    if not isinstance(cache_salt, str) or not 0 < len(cache_salt) <= MAX_CACHE_SALT_CHARS:
        shown = repr(cache_salt) if not isinstance(cache_salt, str) else f"{len(cache_salt)} chars"
        raise RequestFieldError(
            "cache_salt",
            f"cache_salt must be None or a non-empty string of at most {MAX_CACHE_SALT_CHARS} "
            f"chars, got {shown}",
        )


def _stop_list(value: Any) -> list[str]:
    stop = [value] if isinstance(value, str) else value
    if not isinstance(stop, (list, tuple)):
        raise RequestFieldError(
            "stop", f"stop must be a string or a list of strings, got {value!r}"
        )
    if len(stop) > MAX_STOP_STRINGS:
        raise RequestFieldError(
            "stop", f"stop holds at most {MAX_STOP_STRINGS} strings, got {len(stop)}"
        )
    if not all(isinstance(s, str) for s in stop):
        raise RequestFieldError(
            "stop", f"stop must be a string or a list of strings, got {value!r}"
        )
    if any(s == "" for s in stop):
        raise RequestFieldError("stop", "stop must not contain empty strings")
    longest = max((len(s) for s in stop), default=0)
    if longest > MAX_STOP_STRING_CHARS:
        raise RequestFieldError(
            "stop", f"each stop string has at most {MAX_STOP_STRING_CHARS} chars, got {longest}"
        )
    return list(stop)


def _stop_token_id_list(value: Any) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise RequestFieldError(
            "stop_token_ids", f"stop_token_ids must be a list of ints, got {value!r}"
        )
    if len(value) > MAX_STOP_TOKEN_IDS:
        raise RequestFieldError(
            "stop_token_ids",
            f"stop_token_ids holds at most {MAX_STOP_TOKEN_IDS} ids, got {len(value)}",
        )
    if not all(type(i) is int for i in value):
        raise RequestFieldError(
            "stop_token_ids", f"stop_token_ids must be a list of ints, got {value!r}"
        )
    negative = [i for i in value if i < 0]
    if negative:
        raise RequestFieldError("stop_token_ids", f"stop_token_ids must be >= 0, got {negative}")
    return list(value)


def _choice_list(value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(c, str) for c in value):
        raise RequestFieldError("choices", f"choices must be a list of strings, got {value!r}")
    if not value:
        raise RequestFieldError("choices", "choices must not be empty")
    return list(value)


def _regex(value: Any) -> str:
    if not isinstance(value, str):
        raise RequestFieldError("regex", f"regex must be a string, got {type(value).__name__}")
    return value


def json_depth(value: object) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), computed without recursion.

    Stops walking once the depth passes MAX_JSON_DEPTH (enough to refuse the value).
    """
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def json_schema_string(schema: Any) -> str:
    """A dict, a JSON string or a pydantic model class -> the canonical JSON string.

    Raises:
        RequestFieldError naming `json_schema`.
    """
    if isinstance(schema, type) and callable(getattr(schema, "model_json_schema", None)):
        schema = schema.model_json_schema()  # a pydantic v2 model class
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise RequestFieldError(
                "json_schema", f"json_schema is not valid JSON: {error}"
            ) from None
        except RecursionError:
            raise RequestFieldError("json_schema", "json_schema is nested too deeply") from None
        if not isinstance(schema, (dict, bool)):
            raise RequestFieldError("json_schema", "json_schema must be a JSON object")
    if not isinstance(schema, (dict, bool)):
        raise RequestFieldError(
            "json_schema",
            "json_schema must be a dict, a JSON string or a pydantic model class, "
            f"got {type(schema).__name__}",
        )
    if json_depth(schema) > MAX_JSON_DEPTH:
        raise RequestFieldError(
            "json_schema", f"json_schema nests deeper than {MAX_JSON_DEPTH} levels"
        )
    try:
        return json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError) as error:
        raise RequestFieldError("json_schema", f"json_schema is not JSON: {error}") from None
    except RecursionError:
        raise RequestFieldError("json_schema", "json_schema is nested too deeply") from None


_NORMALISERS = {
    "stop": _stop_list,
    "stop_token_ids": _stop_token_id_list,
    "choices": _choice_list,
    "regex": _regex,
    "json_schema": json_schema_string,
}
# Fields whose None is not "unset" but a wrong value.
_NOT_NULLABLE = frozenset(FIELD_BOUNDS) - {"seed", "logprob_start_len", "best_of"} | set(
    BOOL_FIELDS
)
