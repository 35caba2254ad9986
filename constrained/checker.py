"""`compile_constraint`: the public checker shared by tests, benchmarks and users.

checker = compile_constraint(json_schema=schema, tokenizer="tiny")
checker.fullmatch('{"name":"Ada"}')   # True iff the engine could produce exactly this text

The checker compiles the constraint exactly as the engine does (same `GrammarBackend`, same
backend, same vocabulary) and runs a text through a fresh matcher of that grammar, so it answers
for the automaton or grammar that masks the model's tokens, not for a separate regex.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

from radixgen.constrained.backend import GrammarBackend
from radixgen.constrained.constraint_spec import ConstraintSpec, SchemaTranslation
from radixgen.constrained.grammar_interface import (
    DEFAULT_GRAMMAR_BACKEND,
    ConstraintGrammar,
    check_grammar_backend_name,
)
from radixgen.constrained.llguidance_backend import GreedyEncoder
from radixgen.constrained.vocabulary import TokenVocabulary

BYTE_VOCABULARY_EOS_ID = 256


def byte_vocabulary() -> TokenVocabulary:
    """256 single-byte tokens (ids 0..255) and EOS (id 256): the checker's default vocabulary,
    under which every text can be spelled."""
    token_bytes = {byte: bytes([byte]) for byte in range(256)}
    return TokenVocabulary(token_bytes, (BYTE_VOCABULARY_EOS_ID,), 257, "byte_level")


class ConstraintChecker:
    """A compiled constraint that answers whether a text is a complete match.

    Attributes:
        grammar: the compiled grammar the engine would use (its `new_matcher()` masks tokens).
        backend_name: "llguidance" or "outlines".
    """

    def __init__(self, grammar: ConstraintGrammar, backend_name: str) -> None:
        self.grammar = grammar
        self.backend_name = backend_name

    @functools.cached_property
    def _encode(self) -> GreedyEncoder:
        return GreedyEncoder(self.grammar.vocab)  # a dict over the vocabulary: built on first use

    def fullmatch(self, text: str) -> bool:
        """Whether the engine's matcher accepts exactly `text` and then allows EOS.

        Both backends check bytes, not a particular tokenisation, so the text is spelled with
        the vocabulary's longest-match tokens.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        try:
            token_ids = self._encode(text.encode())
        except ValueError:  # a byte no token spells: the engine cannot produce this text
            return False
        matcher = self.grammar.new_matcher()
        return all(matcher.accept_token(token_id) for token_id in token_ids) and (
            matcher.is_accepting()
        )


def compile_constraint(
    *,
    json_schema: Any = None,
    regex: str | None = None,
    ebnf: str | None = None,
    lark: str | None = None,
    choices: list[str] | None = None,
    json_object: bool = False,
    structural_tag: Any = None,
    tokenizer: Any = None,
    backend: str | None = None,
    schema_translation: SchemaTranslation | None = None,
) -> ConstraintChecker:
    """Compiles one constraint the way the engine does and returns its checker.

    Args:
        json_schema, regex, ebnf, lark, choices, json_object, structural_tag: the constraint
            (exactly one).
        tokenizer: "tiny" (the built-in model's tokenizer), a tokenizer folder or tokenizer.json
            path, a tokenizer object, or None for a vocabulary of the 256 single bytes.
        backend: "llguidance" or "outlines"; None: the default (`DEFAULT_GRAMMAR_BACKEND`).
        schema_translation: for json_schema, the translator's options (None: the engine's).

    Raises:
        UnsupportedSchemaError: the schema uses what radixgen cannot enforce exactly.
        RegexError / ValueError: an invalid constraint, or none or several given.
    """
    backend_name = check_grammar_backend_name(
        DEFAULT_GRAMMAR_BACKEND if backend is None else backend, "backend"
    )
    spec = ConstraintSpec.from_sampling_params(
        regex=regex,
        json_schema=json_schema,
        choices=choices,
        ebnf=ebnf,
        lark=lark,
        json_object=json_object,
        structural_tag=structural_tag,
    )
    if spec is None:
        raise ValueError(
            "give one of json_schema, regex, ebnf, lark, choices, json_object, structural_tag"
        )
    if schema_translation is not None:
        if spec.kind != "json_schema":
            raise ValueError("schema_translation applies to json_schema only")
        spec = ConstraintSpec.json_schema(json_schema, schema_translation)
    if tokenizer is None or isinstance(tokenizer, (str, Path)):
        grammar_backend = _backend_for_path(tokenizer, backend_name)  # loaded once per path
        return ConstraintChecker(grammar_backend.compile(spec), backend_name)
    grammar_backend = GrammarBackend(tokenizer, grammar_backend=backend_name, jump_forward=False)
    try:
        return ConstraintChecker(grammar_backend.compile(spec), backend_name)
    finally:
        grammar_backend.shutdown()


def tiny_tokenizer_path() -> Path:
    """The tokenizer.json of the built-in `tiny` model (a data file of the runtime package)."""
    return Path(str(resources.files("radixgen.runtime.tiny_assets") / "tokenizer.json"))


@functools.lru_cache(maxsize=8)
def _backend_for_path(tokenizer: str | Path | None, backend_name: str) -> GrammarBackend:
    """One backend per (tokenizer path, backend): loading a vocabulary takes 0.1-1 s, a
    compile milliseconds. Its compile cache then also serves repeated constraints."""
    if tokenizer is None:
        vocabulary_source = byte_vocabulary()
    elif tokenizer == "tiny":
        vocabulary_source = tiny_tokenizer_path()
    else:
        vocabulary_source = tokenizer
    return GrammarBackend(vocabulary_source, grammar_backend=backend_name, jump_forward=False)
