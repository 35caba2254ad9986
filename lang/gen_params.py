"""`GenParams`: the sampling options of one `rg.gen()`, and the run-level defaults.

Every field is optional: None means "not set here". A gen's own value wins over the
defaults given to `prog.run(...)`, which win over the backend's defaults. Values are
checked when `rg.gen()` is called, so a bad argument fails at the line that wrote it; the
runtime validates again at its own boundary.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

_FLOAT_RANGES: dict[str, tuple[float | None, float | None]] = {
    "temperature": (0.0, None),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
    "repetition_penalty": (0.0, 2.0),
}
_INT_MINIMUMS = {"max_new_tokens": 0, "min_new_tokens": 0, "top_k": -1, "seed": 0}
_BOOL_FIELDS = ("ignore_eos", "return_logprob")
# How errors name the fields that rg.gen spells differently (it follows OpenAI's names).
_DISPLAY_NAMES = {
    "max_new_tokens": "max_new_tokens (rg.gen's max_tokens)",
    "min_new_tokens": "min_new_tokens (rg.gen's min_tokens)",
}


@dataclass(frozen=True)
class GenParams:
    """Sampling options of one generation; field names follow the runtime's SamplingParams.

    `max_new_tokens` is what `rg.gen(max_tokens=...)` sets. `json_schema` is kept as a JSON
    string (a dict or a pydantic model class is converted by `rg.gen`).
    """

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    ignore_eos: bool | None = None
    seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None
    choices: tuple[str, ...] | None = None
    return_logprob: bool | None = None
    top_logprobs_num: int | None = None

    @classmethod
    def build(cls, **values: Any) -> GenParams:
        """Validates and normalises user-given values (None entries are skipped).

        Raises:
            TypeError / ValueError naming the argument.
        """
        given = {name: value for name, value in values.items() if value is not None}
        unknown = set(given) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown generation option(s): {sorted(unknown)}")
        for name, (low, high) in _FLOAT_RANGES.items():
            if name in given:
                _check_number(name, given[name], low, high)
        for name, minimum in _INT_MINIMUMS.items():
            if name in given:
                _check_int(name, given[name], minimum)
        if "top_logprobs_num" in given:
            _check_int("top_logprobs_num", given["top_logprobs_num"], 0)
        for name in _BOOL_FIELDS:
            if name in given and not isinstance(given[name], bool):
                raise TypeError(f"{name} must be a bool, got {given[name]!r}")
        if "stop" in given:
            given["stop"] = _string_tuple("stop", given["stop"], allow_single=True)
            if "" in given["stop"]:
                raise ValueError("stop must not contain empty strings")
        if "stop_token_ids" in given:
            ids = given["stop_token_ids"]
            if not isinstance(ids, (list, tuple)) or not all(type(i) is int for i in ids):
                raise TypeError(f"stop_token_ids must be a list of ints, got {ids!r}")
            given["stop_token_ids"] = tuple(ids)
        _check_constraints(given)
        return cls(**given)

    def merged_over(self, defaults: GenParams) -> GenParams:
        """These params, with every unset field taken from `defaults`."""
        values = {
            f.name: getattr(self, f.name)
            if getattr(self, f.name) is not None
            else getattr(defaults, f.name)
            for f in dataclasses.fields(self)
        }
        return GenParams(**values)

    def sampling_dict(self) -> dict[str, Any]:
        """The set fields that belong in the runtime's `sampling_params` (lists, not tuples)."""
        request_options = {"return_logprob", "top_logprobs_num"}
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or f.name in request_options:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @property
    def has_constraint(self) -> bool:
        return self.regex is not None or self.json_schema is not None or self.choices is not None


def json_schema_string(schema: Any) -> str:
    """A dict, a JSON string or a pydantic model class -> the schema as a JSON string.

    Raises:
        TypeError / ValueError naming `json_schema`.
    """
    if isinstance(schema, type) and callable(getattr(schema, "model_json_schema", None)):
        schema = schema.model_json_schema()  # a pydantic v2 model class
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise ValueError(f"json_schema is not valid JSON: {error}") from None
    if not isinstance(schema, dict):
        raise TypeError(
            "json_schema must be a dict, a JSON object string or a pydantic model class, "
            f"got {type(schema).__name__}"
        )
    return json.dumps(schema)


def _check_constraints(given: dict[str, Any]) -> None:
    constraints = [name for name in ("regex", "json_schema", "choices") if name in given]
    if len(constraints) > 1:
        raise ValueError(f"give at most one of regex, json_schema, choices; got {constraints}")
    if "regex" in given and not isinstance(given["regex"], str):
        raise TypeError(f"regex must be a string, got {type(given['regex']).__name__}")
    if "json_schema" in given:
        given["json_schema"] = json_schema_string(given["json_schema"])
    if "choices" in given:
        given["choices"] = _string_tuple("choices", given["choices"], allow_single=False)
        if not given["choices"]:
            raise ValueError("choices must hold at least one string")


def _string_tuple(name: str, value: Any, *, allow_single: bool) -> tuple[str, ...]:
    if allow_single and isinstance(value, str):
        return (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        kind = "a string or a list of strings" if allow_single else "a list of strings"
        raise TypeError(f"{name} must be {kind}, got {value!r}")
    return tuple(value)


def _check_number(name: str, value: Any, low: float | None, high: float | None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise TypeError(f"{name} must be a number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bound = (
            f">= {low}" if high is None else f"<= {high}" if low is None else f"in [{low}, {high}]"
        )
        raise ValueError(f"{name} must be {bound}, got {value}")


def _check_int(name: str, value: Any, minimum: int) -> None:
    name = _DISPLAY_NAMES.get(name, name)
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
