"""`SamplingParams`: how one request samples, with the field names SGLang users know.

Validation happens once, at the boundary (`from_dict` / `validate`), and every error names
the offending field. The scheduler and sampler trust a validated instance.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

# Greedy when the temperature is at or below this; dividing logits by ~0 would overflow.
GREEDY_TEMPERATURE_EPS = 1e-6


@dataclass
class SamplingParams:
    """Per-request sampling options.

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
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    @classmethod
    def from_dict(cls, params: dict[str, Any] | SamplingParams | None) -> SamplingParams:
        """Builds and validates SamplingParams from a dict (None: the defaults).

        Raises:
            TypeError: `params` is not a dict, or holds an unknown field.
            ValueError: a field has an invalid value (the message names it).
        """
        if params is None:
            params = {}
        if isinstance(params, SamplingParams):
            params = params.to_dict()
        if not isinstance(params, dict):
            raise TypeError(f"sampling_params must be a dict, got {type(params).__name__}")
        unknown = set(params) - cls.field_names()
        if "ebnf" in unknown:
            # SGLang users may expect EBNF grammars; say plainly that they are out of scope.
            raise ValueError(
                "ebnf constraints are not supported: use regex, json_schema or choices"
            )
        if unknown:
            raise TypeError(
                f"unknown sampling parameter(s): {sorted(unknown)}; "
                f"allowed: {sorted(cls.field_names())}"
            )
        sampling_params = cls(**params)
        sampling_params.validate()
        return sampling_params

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= GREEDY_TEMPERATURE_EPS

    @property
    def stop_strings(self) -> list[str]:
        """`stop` as a list (validate() has normalised it already)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def has_constraint(self) -> bool:
        return self.regex is not None or self.json_schema is not None or self.choices is not None

    def validate(self, vocab_size: int | None = None) -> None:
        """Checks every field; normalises `stop` to a list and `json_schema` to a JSON string.

        Raises:
            ValueError / TypeError naming the field.
        """
        _check_int("max_new_tokens", self.max_new_tokens, minimum=0)
        _check_int("min_new_tokens", self.min_new_tokens, minimum=0)
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens ({self.min_new_tokens}) must be <= max_new_tokens "
                f"({self.max_new_tokens})"
            )
        _check_float("temperature", self.temperature, low=0.0)
        _check_float("top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        _check_int("top_k", self.top_k, minimum=-1)
        _check_float("min_p", self.min_p, low=0.0, high=1.0)
        _check_float("frequency_penalty", self.frequency_penalty, low=-2.0, high=2.0)
        _check_float("presence_penalty", self.presence_penalty, low=-2.0, high=2.0)
        _check_float(
            "repetition_penalty", self.repetition_penalty, low=0.0, high=2.0, low_open=True
        )
        _check_int("n", self.n, minimum=1)
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=0)
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        self._validate_stop()
        self._validate_stop_token_ids(vocab_size)
        self._validate_constraint()

    def _validate_stop(self) -> None:
        stop = self.stop
        if stop is None:
            return
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise TypeError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if any(s == "" for s in stop):
            raise ValueError("stop must not contain empty strings")
        self.stop = list(stop)

    def _validate_stop_token_ids(self, vocab_size: int | None) -> None:
        ids = self.stop_token_ids
        if ids is None:
            return
        if not isinstance(ids, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise TypeError(f"stop_token_ids must be a list of ints, got {ids!r}")
        upper = vocab_size if vocab_size is not None else float("inf")
        bad = [i for i in ids if not 0 <= i < upper]
        if bad:
            bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise ValueError(f"stop_token_ids must be {bound}, got {bad}")
        self.stop_token_ids = list(ids)

    def _validate_constraint(self) -> None:
        given = [
            name for name in ("regex", "json_schema", "choices") if getattr(self, name) is not None
        ]
        if len(given) > 1:
            raise ValueError(f"at most one of regex, json_schema, choices may be set, got {given}")
        if self.regex is not None and not isinstance(self.regex, str):
            raise TypeError(f"regex must be a string, got {type(self.regex).__name__}")
        if self.json_schema is not None:
            self.json_schema = _normalise_json_schema(self.json_schema)
        if self.choices is not None:
            choices = self.choices
            if not isinstance(choices, (list, tuple)) or not all(
                isinstance(c, str) for c in choices
            ):
                raise TypeError(f"choices must be a list of strings, got {choices!r}")
            if not choices:
                raise ValueError("choices must not be empty")
            self.choices = list(choices)


def _normalise_json_schema(schema: Any) -> str:
    """A dict, a JSON string or a pydantic model class -> a JSON string (hashable, picklable)."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    if isinstance(schema, dict):
        return json.dumps(schema, sort_keys=True)
    if isinstance(schema, str):
        try:
            parsed = json.loads(schema)
        except json.JSONDecodeError as error:
            raise ValueError(f"json_schema is not valid JSON: {error}") from None
        if not isinstance(parsed, (dict, bool)):
            raise ValueError("json_schema must be a JSON object")
        return schema
    raise TypeError(
        f"json_schema must be a dict, a JSON string or a pydantic model, got {type(schema).__name__}"
    )


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if value != value:  # NaN compares unequal to itself
        raise ValueError(f"{name} must not be NaN")
    if low is not None and (value <= low if low_open else value < low):
        bound = f"> {low}" if low_open else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")
