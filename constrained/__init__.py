"""radixgen.constrained: regex, JSON-schema, choice and grammar constraints as token masks."""

# Constrained decoding engine API (guide helper): compile, match, mask, jump-forward.
from radixgen.constrained.backend import GrammarBackend as GrammarBackend
from radixgen.constrained.bitmask import allocate_token_bitmask as allocate_token_bitmask
from radixgen.constrained.checker import ConstraintChecker as ConstraintChecker
from radixgen.constrained.checker import compile_constraint as compile_constraint
from radixgen.constrained.compile_cache import CompileTimeoutError as CompileTimeoutError
from radixgen.constrained.constraint_spec import ConstraintSpec as ConstraintSpec
from radixgen.constrained.constraint_spec import escape_regex_literal as escape_regex_literal
from radixgen.constrained.grammar import CompiledGrammar as CompiledGrammar
from radixgen.constrained.grammar_interface import (
    DEFAULT_GRAMMAR_BACKEND as DEFAULT_GRAMMAR_BACKEND,
)
from radixgen.constrained.grammar_interface import ConstraintGrammar as ConstraintGrammar
from radixgen.constrained.grammar_interface import ConstraintMatcher as ConstraintMatcher
from radixgen.constrained.json_schema import json_schema_to_regex as json_schema_to_regex
from radixgen.constrained.jump_forward import JumpForward as JumpForward
from radixgen.constrained.matcher import Matcher as Matcher
from radixgen.constrained.regex_index import RegexError as RegexError
from radixgen.constrained.regex_index import compile_regex as compile_regex
from radixgen.constrained.unsupported import UnsatisfiableSchemaError as UnsatisfiableSchemaError
from radixgen.constrained.unsupported import UnsupportedSchemaError as UnsupportedSchemaError
from radixgen.constrained.vocabulary import TokenVocabulary as TokenVocabulary
from radixgen.constrained.vocabulary import load_vocabulary as load_vocabulary
