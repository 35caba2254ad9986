"""The checks of single request fields: numeric bounds (`FIELD_BOUNDS`), caps on size-like
fields, and the normalisers of list and string fields. `request_schema.validate_fields` and
`validate_request` apply them; add a bound here (one `FIELD_BOUNDS` entry) and every front end
(`rg.gen`, `Engine.generate`, the HTTP handlers) enforces it. Torch-free, like the schema.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
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
MAX_LORA_NAME_CHARS = 256
MAX_PROMPTS_PER_REQUEST = 1024  # prompts in one HTTP batch request
MAX_LOGIT_BIAS_ENTRIES = 300  # OpenAI's limit: token id -> bias entries per request
MAX_ABS_LOGIT_BIAS = 100.0  # OpenAI's range: -100 (ban) to 100 (force)
CONSTRAINT_FIELDS = (
    "regex", "json_schema", "choices", "ebnf", "lark", "json_object", "structural_tag"
)  # fmt: skip
MAX_TAG_STRUCTURES = 64  # structures (and triggers) of one structural_tag
MAX_TAG_TEXT_CHARS = 1024  # each begin, end and trigger


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
BOOL_FIELDS = (
    "ignore_eos",
    "skip_special_tokens",
    "return_logprob",
    "stream",
    "json_object",
    "constraint_budget",
)


def list_of(name: str, value: Any, is_item, kind: str, max_items: int) -> list:
    """`value` as a list of at most `max_items` items that pass `is_item` (length first:
    nothing is scanned per item beyond the cap)."""
    if not isinstance(value, (list, tuple)):
        raise RequestFieldError(name, f"{name} must be {kind}, got {value!r}")
    if len(value) > max_items:
        raise RequestFieldError(name, f"{name} holds at most {max_items} items, got {len(value)}")
    if not all(is_item(item) for item in value):
        raise RequestFieldError(name, f"{name} must be {kind}, got {value!r}")
    return list(value)


def _stop_list(value: Any) -> list[str]:
    kind = "a string or a list of strings"
    stop = list_of(
        "stop", [value] if isinstance(value, str) else value, _is_str, kind, MAX_STOP_STRINGS
    )
    if any(s == "" for s in stop):
        raise RequestFieldError("stop", "stop must not contain empty strings")
    longest = max((len(s) for s in stop), default=0)
    if longest > MAX_STOP_STRING_CHARS:
        raise RequestFieldError(
            "stop", f"each stop string has at most {MAX_STOP_STRING_CHARS} chars, got {longest}"
        )
    return stop


def _stop_token_id_list(value: Any) -> list[int]:
    # type() is int: a bool is not a token id.
    ids = list_of(
        "stop_token_ids", value, lambda i: type(i) is int, "a list of ints", MAX_STOP_TOKEN_IDS
    )
    negative = [i for i in ids if i < 0]
    if negative:
        raise RequestFieldError("stop_token_ids", f"stop_token_ids must be >= 0, got {negative}")
    return ids


def _choice_list(value: Any) -> list[str]:
    # No cap of its own: the compiled constraint's size is bounded where it compiles.
    uncapped = len(value) if isinstance(value, (list, tuple)) else 0  # `choices: 1` is a 400
    choices = list_of("choices", value, _is_str, "a list of strings", uncapped)
    if not choices:
        raise RequestFieldError("choices", "choices must not be empty")
    return choices


def _string(name: str, *, max_chars: int | None = None, allow_empty: bool = False):
    """A check that the field is a string (non-empty unless allowed, at most `max_chars`)."""

    def check(value: Any) -> str:
        fits = isinstance(value, str) and (allow_empty or value)
        if not fits or (max_chars is not None and len(value) > max_chars):
            kind = "a string" if allow_empty else "a non-empty string"
            bound = f" of at most {max_chars} chars" if max_chars else ""
            shown = f"{len(value)} chars" if isinstance(value, str) and value else repr(value)
            raise RequestFieldError(name, f"{name} must be {kind}{bound}, got {shown}")
        return value

    return check


def _logit_bias_map(value: Any) -> dict[int, float]:
    """OpenAI's `logit_bias` (token id, or its decimal string as JSON keys are, -> bias in
    [-100, 100]) as {int: float}; the ids' vocabulary bound is checked once tokenized."""
    name = "logit_bias"
    if not isinstance(value, dict):
        raise RequestFieldError(
            name, f"logit_bias must be an object of token id -> bias, got {value!r:.80}"
        )
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise RequestFieldError(
            name, f"logit_bias holds at most {MAX_LOGIT_BIAS_ENTRIES} entries, got {len(value)}"
        )
    biases = {}
    for key, bias in value.items():
        token_id = key if type(key) is int else int(key) if _is_decimal(key) else None
        if token_id is None or token_id < 0:
            raise RequestFieldError(
                name, f"logit_bias keys must be token ids (ints >= 0), got {key!r:.40}"
            )
        Bound(float, low=-MAX_ABS_LOGIT_BIAS, high=MAX_ABS_LOGIT_BIAS).check(
            name, bias, f"logit_bias[{key!r:.40}]"
        )
        biases[token_id] = float(bias)
    return biases


def _is_decimal(key: Any) -> bool:
    return isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 18


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


# Deepest nesting of arrays and objects accepted in a request body or a JSON schema: deep
# enough for any real schema, far from Python's recursion limit in the code that walks it.
MAX_JSON_DEPTH = 128


_JSON_SCALARS = frozenset((str, int, float, bool, type(None)))


def json_depth(value: object) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), computed without recursion.

    Stops walking once the depth passes MAX_JSON_DEPTH (enough to refuse the value). An array
    or object of scalars only (a prompt's token ids) is checked in one C-level pass over its
    items' types, not an item at a time (2,176 token ids: 386 -> 56 us a request,
    `scripts/bench_request_parse.py`; docs/benchmarks.md).
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
        if not _JSON_SCALARS.issuperset(map(type, children)):
            stack.extend(
                (child, depth + 1) for child in children if isinstance(child, (dict, list))
            )
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
        # Key order kept: a schema's declared property order is the output's key order.
        return json.dumps(schema)
    except (TypeError, ValueError) as error:
        raise RequestFieldError("json_schema", f"json_schema is not JSON: {error}") from None
    except RecursionError:
        raise RequestFieldError("json_schema", "json_schema is nested too deeply") from None


def structural_tag_string(value: Any) -> str:
    """SGLang's structural tag (a dict or its JSON text) -> canonical JSON text
    `{"structures": [{"begin", "schema", "end"}...], "triggers": [...]}`.

    Checks the shape here (types, keys, sizes); the constrained layer checks what the grammar
    needs (every `begin` starts with a trigger; triggers do not contain each other).

    Raises:
        RequestFieldError naming `structural_tag` (the message names the part).
    """
    name = "structural_tag"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError) as error:
            raise RequestFieldError(name, f"structural_tag is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise RequestFieldError(name, f"structural_tag must be a JSON object, got {value!r:.80}")
    check_keys(value, {"type", "structures", "triggers"}, {"structures", "triggers"}, name)
    if value.get("type", name) != name:
        raise RequestFieldError(name, f"structural_tag.type must be 'structural_tag', got "
                                f"{value['type']!r:.80}")  # fmt: skip
    structures = _tag_list(value["structures"], "structures", dict, "objects")
    canonical = []
    for index, structure in enumerate(structures):
        where = f"structural_tag.structures[{index}]"
        check_keys(structure, {"begin", "schema", "end"}, {"begin", "schema", "end"}, where)
        schema = structure["schema"]
        if not isinstance(schema, (dict, bool)) or json_depth(schema) > MAX_JSON_DEPTH:
            raise RequestFieldError(
                name, f"{where}.schema must be a JSON schema object nested at most "
                f"{MAX_JSON_DEPTH} levels, got {type(schema).__name__}"
            )  # fmt: skip
        begin = _tag_text(structure["begin"], f"{where}.begin", allow_empty=False)
        end = _tag_text(structure["end"], f"{where}.end", allow_empty=True)
        canonical.append({"begin": begin, "schema": schema, "end": end})
    triggers = _tag_list(value["triggers"], "triggers", str, "strings")
    for index, trigger in enumerate(triggers):
        _tag_text(trigger, f"structural_tag.triggers[{index}]", allow_empty=False)
    return json.dumps({"structures": canonical, "triggers": triggers})


def check_keys(
    value: dict, allowed: set[str], required: set[str], where: str, field: str = "structural_tag"
) -> None:
    unknown, missing = set(value) - allowed, required - set(value)
    if unknown or missing:
        raise RequestFieldError(
            field,
            f"{where} takes {sorted(allowed)}; unknown: {sorted(unknown)}, missing: "
            f"{sorted(missing)}",
        )


def _tag_list(value: Any, key: str, item_type: type, kind: str) -> list:
    if not isinstance(value, list) or not value or len(value) > MAX_TAG_STRUCTURES:
        raise RequestFieldError(
            "structural_tag",
            f"structural_tag.{key} must be a list of 1 to {MAX_TAG_STRUCTURES} {kind}, "
            f"got {value!r:.80}",
        )
    if not all(isinstance(item, item_type) for item in value):
        raise RequestFieldError("structural_tag", f"structural_tag.{key} must hold {kind} only")
    return value


def _tag_text(value: Any, where: str, *, allow_empty: bool) -> str:
    if not isinstance(value, str) or not (allow_empty or value) or len(value) > MAX_TAG_TEXT_CHARS:
        raise RequestFieldError(
            "structural_tag",
            f"{where} must be a {'' if allow_empty else 'non-empty '}string of at most "
            f"{MAX_TAG_TEXT_CHARS} chars, got {value!r:.80}",
        )
    return value


NORMALISERS = {
    "stop": _stop_list,
    "stop_token_ids": _stop_token_id_list,
    "choices": _choice_list,
    "regex": _string("regex", allow_empty=True),
    "json_schema": json_schema_string,
    "ebnf": _string("ebnf"),
    "lark": _string("lark"),
    "structural_tag": structural_tag_string,
    "logit_bias": _logit_bias_map,
    "cache_salt": _string("cache_salt", max_chars=MAX_CACHE_SALT_CHARS),
    "lora_path": _string("lora_path", max_chars=MAX_LORA_NAME_CHARS),
    "rid": _string("rid"),
}
# Fields whose None is not "unset" but a wrong value.
NOT_NULLABLE = frozenset(FIELD_BOUNDS) - {"seed", "logprob_start_len", "best_of"} | set(BOOL_FIELDS)
