"""What a request constrains its output to: a regex, a JSON schema or a list of choices."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

ConstraintKind = Literal["regex", "json_schema", "choices"]
_KINDS = ("regex", "json_schema", "choices")
# Characters with a meaning in Python or Rust regex syntax; both accept them backslash-escaped.
_REGEX_META_CHARS = frozenset("\\.+*?()|[]{}^$#&-~ ")


@dataclass(frozen=True)
class ConstraintSpec:
    """A constraint in canonical form, hashable for the compile cache.

    Attributes:
        kind: "regex", "json_schema" or "choices".
        spec: the regex; the schema as canonical JSON text (sorted keys, compact); or the
            choices as a tuple of strings.
    """

    kind: ConstraintKind
    spec: str | tuple[str, ...]

    def __post_init__(self) -> None:
        if self.kind == "ebnf":
            raise ValueError("kind='ebnf' is not supported: use regex, json_schema or choices")
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {self.kind!r}")
        if self.kind == "choices":
            if not isinstance(self.spec, tuple) or not self.spec:
                raise ValueError("choices must be a non-empty list of strings")
            if not all(isinstance(choice, str) for choice in self.spec):
                raise TypeError(f"choices must all be str, got {self.spec!r}")
        elif not isinstance(self.spec, str) or not self.spec:
            raise ValueError(f"{self.kind} must be a non-empty str, got {self.spec!r}")

    @classmethod
    def regex(cls, pattern: str) -> ConstraintSpec:
        return cls("regex", pattern)

    @classmethod
    def choices(cls, options: list[str] | tuple[str, ...]) -> ConstraintSpec:
        if isinstance(options, str) or not isinstance(options, (list, tuple)):
            raise TypeError(f"choices must be a list of str, got {type(options).__name__}")
        return cls("choices", tuple(options))

    @classmethod
    def json_schema(cls, schema: Any) -> ConstraintSpec:
        """From a dict, a JSON string, or a pydantic model class (its `model_json_schema()`)."""
        if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        elif isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise ValueError(f"json_schema is not valid JSON: {error}") from error
        if not isinstance(schema, (dict, bool)):
            raise TypeError(
                "json_schema must be a dict, a JSON string or a pydantic model class, "
                f"got {type(schema).__name__}"
            )
        return cls("json_schema", json.dumps(schema, sort_keys=True, separators=(",", ":")))

    @classmethod
    def from_sampling_params(
        cls, *, regex=None, json_schema=None, choices=None, ebnf=None
    ) -> ConstraintSpec | None:
        """The request's constraint from sampling parameters; None if it has none.

        Raises:
            ValueError: more than one constraint is given, or `ebnf` is given.
        """
        if ebnf is not None:
            raise ValueError(
                "ebnf constraints are not supported: use regex, json_schema or choices"
            )
        given = [name for name, value in [("regex", regex), ("json_schema", json_schema),
                                          ("choices", choices)] if value is not None]  # fmt: skip
        if len(given) > 1:
            raise ValueError(f"give at most one of regex, json_schema, choices; got {given}")
        if regex is not None:
            return cls.regex(regex)
        if json_schema is not None:
            return cls.json_schema(json_schema)
        if choices is not None:
            return cls.choices(choices)
        return None

    def to_regex(self) -> str:
        """The regex this constraint compiles to."""
        if self.kind == "regex":
            return self.spec
        if self.kind == "choices":
            return "(?:" + "|".join(escape_regex_literal(c) for c in self.spec) + ")"
        from radixgen.constrained.json_schema import json_schema_to_regex

        return json_schema_to_regex(json.loads(self.spec))

    def describe(self, limit: int = 80) -> str:
        text = f"{self.kind}={self.spec!r}"
        return text if len(text) <= limit else text[: limit - 3] + "..."


def escape_regex_literal(text: str) -> str:
    """A regex matching exactly `text`, valid in Python, Rust and interegular syntax."""
    pieces = []
    for char in text:
        if char in _REGEX_META_CHARS:
            pieces.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            pieces.append(f"\\x{ord(char):02x}")
        else:
            pieces.append(char)
    return "".join(pieces)
