"""What a request constrains its output to: a regex, a JSON schema, any JSON object, a list of
choices, a context-free grammar (GBNF-style EBNF or Lark), or SGLang's structural tag (free text
with schema-constrained tagged bodies); grammars and structural tags need llguidance."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

ConstraintKind = Literal[
    "regex", "json_schema", "json_object", "choices", "ebnf", "lark", "structural_tag"
]
_KINDS: tuple[str, ...] = ConstraintKind.__args__
# `json_object` constrains to any JSON object; its spec is this schema, for display and caching.
JSON_OBJECT_SCHEMA = '{"type":"object"}'
# Characters with a meaning in Python or Rust regex syntax; both accept them backslash-escaped.
_REGEX_META_CHARS = frozenset("\\.+*?()|[]{}^$#&-~ ")


@dataclass(frozen=True)
class SchemaTranslation:
    """How a JSON-schema constraint is translated (`json_schema_to_regex`'s options).

    The engine uses the defaults; the JSON-Schema-Test-Suite reports set JSON Schema's own
    semantics (undeclared properties allowed; `format` an annotation outside its format files).

    Attributes:
        allow_undeclared_properties: objects that declare properties but say nothing of others
            also take undeclared ones (JSON Schema's default; the engine writes none).
        assert_formats: enforce the `format`s radixgen knows (False: every `format` is an
            annotation, as JSON Schema 2019-09+ reads it by default).
    """

    allow_undeclared_properties: bool = False
    assert_formats: bool = True

    def as_options(self) -> dict[str, bool]:
        return asdict(self)


@dataclass(frozen=True)
class ConstraintSpec:
    """A constraint in canonical form, hashable for the compile cache.

    Attributes:
        kind: "regex", "json_schema", "json_object", "choices", "ebnf", "lark" or
            "structural_tag".
        spec: the regex; the schema as compact JSON text (in its key order); the
            choices as a tuple of strings; the grammar text (ebnf, lark); for json_object,
            `JSON_OBJECT_SCHEMA`; for structural_tag, compact JSON
            `{"structures": [...], "triggers": [...]}`.
        translation: for json_schema, how it is translated (the engine's defaults otherwise).
    """

    kind: ConstraintKind
    spec: str | tuple[str, ...]
    translation: SchemaTranslation = field(default_factory=SchemaTranslation)

    def __post_init__(self) -> None:
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
    def ebnf(cls, grammar: str) -> ConstraintSpec:
        """A GBNF-style grammar (llama.cpp / SGLang syntax, start rule `root`)."""
        return cls("ebnf", grammar)

    @classmethod
    def lark(cls, grammar: str) -> ConstraintSpec:
        """A Lark grammar in llguidance's dialect (start rule `start`)."""
        return cls("lark", grammar)

    @classmethod
    def structural_tag(cls, tag: Any) -> ConstraintSpec:
        """SGLang's structural tag, from a dict or its JSON text: `structures` (each with
        `begin`, `schema`, `end`) and `triggers`; a `"type": "structural_tag"` key is allowed.

        Raises:
            ValueError: naming the malformed part (a begin that starts with no trigger, ...).
        """
        from radixgen.constrained.structural_tag import StructuralTag

        if isinstance(tag, str):
            try:
                tag = json.loads(tag)
            except json.JSONDecodeError as error:
                raise ValueError(f"structural_tag is not valid JSON: {error}") from error
        if not isinstance(tag, dict):
            raise TypeError(f"structural_tag must be a dict or a JSON string, got {tag!r}")
        unknown = set(tag) - {"type", "structures", "triggers"}
        if unknown or tag.get("type", "structural_tag") != "structural_tag":
            raise ValueError(
                "structural_tag takes type ('structural_tag'), structures and triggers; got "
                f"{sorted(tag)}"
            )
        canonical = {"structures": tag.get("structures"), "triggers": tag.get("triggers")}
        text = json.dumps(canonical, separators=(",", ":"))
        StructuralTag.from_json(text)  # raises ValueError naming the malformed part
        return cls("structural_tag", text)

    @classmethod
    def json_object(cls) -> ConstraintSpec:
        """Any JSON object: OpenAI's `response_format: {"type": "json_object"}`."""
        return cls("json_object", JSON_OBJECT_SCHEMA)

    @classmethod
    def json_schema(
        cls, schema: Any, translation: SchemaTranslation | None = None
    ) -> ConstraintSpec:
        """From a dict, a JSON string, or a pydantic model class (its `model_json_schema()`);
        `translation`: the translator's options (None: the engine's defaults)."""
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
        # Key order is kept: declared `properties` order is the order of the output's keys.
        compact = json.dumps(schema, separators=(",", ":"))
        return cls("json_schema", compact, translation or SchemaTranslation())

    @classmethod
    def from_sampling_params(
        cls,
        *,
        regex=None,
        json_schema=None,
        choices=None,
        ebnf=None,
        lark=None,
        json_object=False,
        structural_tag=None,
    ) -> ConstraintSpec | None:
        """The request's constraint from sampling parameters; None if it has none.

        Args:
            json_object: True for any JSON object (`response_format` json_object).

        Raises:
            ValueError: more than one constraint is given, or one is malformed.
        """
        if json_object not in (True, False):
            raise TypeError(f"json_object must be a bool, got {json_object!r}")
        builders = [
            ("regex", regex, cls.regex),
            ("json_schema", json_schema, cls.json_schema),
            ("json_object", json_object or None, lambda _: cls.json_object()),
            ("choices", choices, cls.choices),
            ("ebnf", ebnf, cls.ebnf),
            ("lark", lark, cls.lark),
            ("structural_tag", structural_tag, cls.structural_tag),
        ]
        given = [(name, value, build) for name, value, build in builders if value is not None]
        if len(given) > 1:
            raise ValueError(
                "give at most one of regex, json_schema, json_object, choices, ebnf, lark, "
                "structural_tag; "
                f"got {[name for name, _, _ in given]}"
            )
        if not given:
            return None
        _, value, build = given[0]
        return build(value)

    def to_regex(self) -> str:
        """The regex this constraint compiles to.

        Raises:
            ValueError: an ebnf or lark grammar, which no regex expresses.
        """
        if self.kind == "regex":
            return self.spec
        if self.kind == "choices":
            return "(?:" + "|".join(escape_regex_literal(c) for c in self.spec) + ")"
        if self.kind in ("ebnf", "lark", "structural_tag"):
            raise ValueError(f"a {self.kind} grammar has no regex form")
        from radixgen.constrained.json_schema import json_schema_to_regex

        return json_schema_to_regex(json.loads(self.spec), **self.translation.as_options())

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
