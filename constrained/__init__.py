"""radixgen.constrained: regex, JSON-schema and choice constraints as token automata."""

# Constrained decoding engine API (guide helper): compile, match, mask, jump-forward.
from radixgen.constrained.backend import GrammarBackend
from radixgen.constrained.bitmask import allocate_token_bitmask, apply_token_bitmask_
from radixgen.constrained.compile_cache import CompileTimeoutError
from radixgen.constrained.constraint_spec import ConstraintSpec, escape_regex_literal
from radixgen.constrained.grammar import CompiledGrammar
from radixgen.constrained.jump_forward import JumpForward
from radixgen.constrained.matcher import Matcher
from radixgen.constrained.regex_index import RegexError, compile_regex
from radixgen.constrained.vocabulary import TokenVocabulary, load_vocabulary
