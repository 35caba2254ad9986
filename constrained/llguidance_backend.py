"""The "llguidance" grammar backend: masks computed lazily from a token trie.

llguidance keeps the vocabulary as a byte trie and, at each step, walks it through the
grammar's lexer (derivative-based regex DFAs built on demand) and Earley parser, so compiling
a constraint does no vocabulary-sized work: a realistic JSON schema compiles in about a
millisecond at a 128k vocabulary (docs/benchmarks.md), where outlines-core takes seconds.

What is compiled (the language is radixgen's own, whichever backend runs it):
- regex and choices: the same regex the outlines backend indexes;
- json_schema: `json_schema_to_regex`'s regex, or, for recursive schemas the flat regex can
  only cut at a depth, a Lark grammar whose terminals are that translator's regexes
  (`schema_lark`);
- json_object: a Lark grammar for any JSON object, any depth, with the translator's terminals;
- ebnf (GBNF, as SGLang takes it) and lark: the user's grammar, through llguidance's own
  GBNF-to-Lark conversion and Lark front end.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import llguidance

from radixgen.constrained.completion_budget import ByteDistanceTable, ByteSpelling
from radixgen.constrained.constraint_spec import ConstraintSpec
from radixgen.constrained.grammar_interface import (
    ConstraintGrammar,
    ConstraintMatcher,
    check_bitmask_row,
)
from radixgen.constrained.jump_forward import JumpForward
from radixgen.constrained.regex_index import RegexError, validate_regex
from radixgen.constrained.schema_lark import json_object_lark, json_schema_lark
from radixgen.constrained.structural_tag import StructuralTag, structural_tag_lark
from radixgen.constrained.vocabulary import TokenVocabulary

# llguidance marks special tokens by a leading 0xFF byte, which UTF-8 text never contains.
_SPECIAL_PREFIX = b"\xff"
# Grammar-size limits: radixgen's flat regexes may reach 2M characters (json_schema.py), past
# llguidance's default lexer fuel of 1M; mask-time limits keep their defaults.
_PARSER_LIMITS = dict(initial_lexer_fuel=20_000_000, max_grammar_size=4_000_000)


class LLGuidanceCompiler:
    """Compiles constraints to `LLGuidanceGrammar`s for one vocabulary.

    Args:
        vocab: the tokenizer's byte vocabulary (token ids, EOS ids, logits width).
        tokenizer: the tokenizer `vocab` came from (a `tokenizers.Tokenizer` or a transformers
            tokenizer); llguidance encodes forced text with it, so forced positions allow the
            tokenizer's own tokens. None: a greedy longest-match encoder over `vocab`.
        constraint_budget: builds a byte-automaton completion bound for regular constraints
            (regex, choices, non-recursive JSON schemas), for budget-aware masks.
    """

    def __init__(
        self,
        vocab: TokenVocabulary,
        tokenizer: Any = None,
        *,
        mask_threads: int | None = None,
        constraint_budget: bool = False,
    ) -> None:
        self.vocab = vocab
        self._constraint_budget = constraint_budget
        self._limits = llguidance.LLParserLimits(**_PARSER_LIMITS)
        # Fills a batch's masks in parallel Rust threads with the GIL released.
        self._executor = llguidance.LLExecutor(num_threads=mask_threads)
        self._encode = _encoder(vocab, tokenizer)
        wrapper = llguidance.TokenizerWrapper(_TokenizerAdapter(vocab, self._encode))
        self.lltokenizer = llguidance.LLTokenizer(
            wrapper, n_vocab=vocab.vocab_size, eos_token=list(vocab.eos_token_ids)
        )

    def compile(self, spec: ConstraintSpec) -> LLGuidanceGrammar:
        """Raises: `RegexError`/`ValueError` for an invalid constraint, `UnsupportedSchemaError`
        for a JSON schema radixgen cannot enforce exactly."""
        grammar, pattern = llguidance_grammar_and_regex(spec)
        matcher = llguidance.LLMatcher(self.lltokenizer, grammar, log_level=0, limits=self._limits)
        if matcher.is_error() and spec.kind == "json_schema":
            # Not expected: the flat regex is the reference, so a Lark grammar llguidance
            # refuses (a limit, a writer bug) must not refuse a schema the translator accepts.
            flat = llguidance.LLMatcher.grammar_from_regex(spec.to_regex())
            if flat != grammar:
                grammar = flat
                matcher = llguidance.LLMatcher(
                    self.lltokenizer, grammar, log_level=0, limits=self._limits
                )
        error_type = RegexError if spec.kind in ("regex", "choices") else ValueError
        if matcher.is_error():
            raise error_type(f"{spec.describe()} is invalid: {matcher.get_error()}")
        build_table = None
        if self._constraint_budget and pattern is None:
            pattern = _budget_regex(spec)
        if self._constraint_budget and pattern is not None:
            # ~0.1-0.2 s of Python at 128k: built in the background, and only once a request
            # with a budget asks for it, so that requests without one never compete with it
            # for the GIL (it slowed the scheduler thread's steps by tens of milliseconds).
            build_table = functools.partial(self._table_builder.submit, self._build_table, pattern)
        compiled = LLGuidanceGrammar(matcher, self.vocab, spec.describe(), build_table)
        if not compiled.can_start():
            raise error_type(f"{spec.describe()}: no token sequence of this vocabulary matches it")
        return compiled

    @functools.cached_property
    def _table_builder(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(1, thread_name_prefix="budget-table")

    def _build_table(self, pattern: str) -> ByteDistanceTable:
        # On the table thread, the byte spelling too (once, on the first table).
        return ByteDistanceTable(pattern, self.vocab, self._encode, self._byte_spelling)

    def shutdown(self) -> None:
        if "_table_builder" in self.__dict__:  # created on the first budgeted compile
            self._table_builder.shutdown(wait=False, cancel_futures=True)

    @functools.cached_property
    def _byte_spelling(self) -> ByteSpelling:
        # On the first budgeted compile (a worker thread), not when the engine starts.
        return ByteSpelling.of(self.vocab)

    def fill_bitmasks(self, matchers: list[tuple[LLGuidanceMatcher, int]], bitmask) -> None:
        """Writes each matcher's next-step mask into its row of `bitmask`, in parallel.

        Args:
            matchers: (matcher, row) pairs, rows distinct.
            bitmask: int32 contiguous CPU tensor [batch, ceil(vocab_size / 32)].
        """
        num_words = (self.vocab.vocab_size + 31) // 32
        rows = [row for _, row in matchers]
        if rows:  # the lowest and highest rows stand for all (one check, not one a row)
            check_bitmask_row(bitmask, min(rows), num_words)
            check_bitmask_row(bitmask, max(rows), num_words)
        if bitmask.device.type != "cpu" or not bitmask.is_contiguous():
            raise ValueError("bitmask must be a contiguous CPU tensor (llguidance writes into it)")
        pairs = [(matcher._matcher, row) for matcher, row in matchers]
        self._executor.unsafe_compute_mask_ptr(
            pairs, bitmask.data_ptr(), num_words * 4, bitmask.shape[0]
        )
        for matcher, row in matchers:
            if matcher._token_budget is not None:  # rows without a budget: nothing to AND
                matcher.restrict_to_budget(bitmask, row)


def llguidance_grammar(spec: ConstraintSpec) -> str:
    """The llguidance grammar (its JSON text) that enforces `spec`."""
    return llguidance_grammar_and_regex(spec)[0]


def llguidance_grammar_and_regex(spec: ConstraintSpec) -> tuple[str, str | None]:
    """The llguidance grammar that enforces `spec`, and the regex it was built from (None for
    grammars that are not one regex: Lark, EBNF, json_object, recursive schemas)."""
    if spec.kind in ("regex", "choices"):
        pattern = spec.to_regex()
        validate_regex(pattern)  # one regex dialect for both backends
        return llguidance.LLMatcher.grammar_from_regex(pattern), pattern
    if spec.kind == "json_schema":
        lark = json_schema_lark(json.loads(spec.spec), **spec.translation.as_options())
        if lark is not None:
            return llguidance.LLMatcher.grammar_from_lark(lark), None
        pattern = spec.to_regex()
        return llguidance.LLMatcher.grammar_from_regex(pattern), pattern
    if spec.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_lark(json_object_lark()), None
    if spec.kind == "ebnf":
        try:
            return llguidance.grammar_from("gbnf", spec.spec), None
        except ValueError as error:
            raise ValueError(f"ebnf grammar is invalid: {error}") from error
    if spec.kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(spec.spec), None
    if spec.kind == "structural_tag":
        lark = structural_tag_lark(StructuralTag.from_json(spec.spec))
        return llguidance.LLMatcher.grammar_from_lark(lark), None
    raise ValueError(f"the llguidance backend cannot compile kind={spec.kind!r}")


def _budget_regex(spec: ConstraintSpec) -> str | None:
    """The flat regex of a schema that llguidance enforces as a Lark grammar, for the token
    budget's distance table only; None where the two could differ (any `$ref`: recursion).

    Where the flat regex caps any-value nesting the Lark grammar does not, the table tracks a
    subset: near the budget it steers into that subset (still valid); off it, no bound.
    """
    if spec.kind != "json_schema" or "$ref" in spec.spec:
        return None
    try:
        return spec.to_regex()
    except ValueError:  # UnsupportedSchemaError is one
        return None


class LLGuidanceGrammar(ConstraintGrammar):
    """A compiled llguidance grammar: a pristine `LLMatcher` that each request copies, and
    the completion bound of its regex (None: not regular, or the budget is disabled).

    Args:
        build_table: starts building the completion bound in the background and returns its
            future; called once, by the first `budget_table_ready` or `wait_for_budget_table`
            (a request with a budget), never for grammars only budget-free requests use.
    """

    def __init__(
        self,
        pristine: llguidance.LLMatcher,
        vocab: TokenVocabulary,
        source: str,
        build_table: Callable[[], Future] | None = None,
    ):
        self._pristine = pristine
        self.vocab = vocab
        self.source = source
        self._build_table = build_table
        self._table_future: Future | None = None  # Future[ByteDistanceTable] once started
        self._table: ByteDistanceTable | None = None  # its result, once read
        self._table_lock = threading.Lock()  # the grammar is shared by requests (and threads)
        self.num_words = (vocab.vocab_size + 31) // 32

    @property
    def completion_table(self) -> ByteDistanceTable | None:
        """The budget's byte-distance table once built (None: none, not asked for yet, or
        still building)."""
        if self._table is None:
            future = self._table_future
            if future is None or not future.done() or future.exception() is not None:
                return None
            # Kept: read twice per constrained row per step, and each Future call takes its
            # condition's lock (~2,000 of a 64-row json-array step's ~6,300 Python calls).
            self._table = future.result()
        return self._table

    def _table_started(self) -> Future | None:
        """The table's future, its build started on the first call (None: no table)."""
        with self._table_lock:
            if self._table_future is None and self._build_table is not None:
                self._table_future = self._build_table()
            return self._table_future

    def budget_table_ready(self) -> bool:
        future = self._table_started()
        return future is None or future.done()

    def wait_for_budget_table(self) -> None:
        if self._build_table is None:  # none will be built (asked per row per step: no lock)
            return
        future = self._table_started()
        if future is not None:
            future.exception()  # waits; a failed build means no table

    @property
    def vocab_size(self) -> int:
        return self.vocab.vocab_size

    def new_matcher(self) -> LLGuidanceMatcher:
        # deep_copy shares the compiled lexer and grammar; only the parse state is new.
        return LLGuidanceMatcher(self, self._pristine.deep_copy())

    def can_start(self) -> bool:
        """Whether any token (or EOS, for an empty match) is allowed at the start."""
        mask = self._pristine.deep_copy().compute_bitmask()
        return any(mask)


class LLGuidanceMatcher(ConstraintMatcher):
    """One request's `LLMatcher`, behind the engine's matcher interface."""

    jump_forward_may_retract = False  # llguidance's forced tokens never re-tokenise the past

    def __init__(self, grammar: LLGuidanceGrammar, matcher: llguidance.LLMatcher) -> None:
        self.grammar = grammar
        self._matcher = matcher
        self._output_ids: list[int] = []
        self._eos_ids = frozenset(grammar.vocab.eos_token_ids)
        self._vocab_size = grammar.vocab.vocab_size
        self._eos_accepted = False
        self._token_budget: int | None = None  # tokens left, this step's included
        # _byte_states[i]: the byte-automaton state after i output tokens (None: unknown);
        # empty until the grammar's table exists, then replayed from the output once, and
        # `_byte_table` that table (kept here: read per row per step).
        self._byte_states: list[int | None] = []
        self._byte_table: ByteDistanceTable | None = None

    @property
    def output_ids(self) -> tuple[int, ...]:
        return tuple(self._output_ids)

    def fill_bitmask(self, bitmask, row: int) -> None:
        check_bitmask_row(bitmask, row, self.grammar.num_words)
        if bitmask.device.type != "cpu" or not bitmask.is_contiguous():
            raise ValueError("bitmask must be a contiguous CPU tensor (llguidance writes into it)")
        target = bitmask[row]  # [num_words] int32, written in place by Rust
        self._matcher.unsafe_compute_mask_ptr(target.data_ptr(), self.grammar.num_words * 4)
        self.restrict_to_budget(bitmask, row)

    def _table(self, *, wait: bool = False) -> ByteDistanceTable | None:
        """The grammar's table with `_byte_states` caught up with the output (None: none, or
        still building and `wait` is False)."""
        if self._byte_table is not None:
            return self._byte_table
        table = self.grammar.completion_table
        if table is None and wait:
            self.grammar.wait_for_budget_table()
            table = self.grammar.completion_table
        if table is not None:
            self._byte_states = [table.initial_state]
            for token_id in self._output_ids:
                raw = self.grammar.vocab.token_bytes.get(token_id, b"")
                self._byte_states.append(table.step(self._byte_states[-1], raw))
            self._byte_table = table
        return table

    def restrict_to_budget(self, bitmask, row: int) -> None:
        """ANDs the budget's restriction into `bitmask[row]` (after llguidance wrote it)."""
        if self._token_budget is None:
            return
        table = self._byte_table  # per budgeted row per step: the kept table first
        if table is None:
            table = self._table()  # the hook waits for it before a budgeted request starts
            if table is None:
                return
        restriction = table.budget_mask(self._byte_states[-1], self._token_budget)
        if restriction is None:
            return
        restricted = bitmask[row] & restriction  # [num_words] int32
        # Both describe one regex, so a spelling path is always in llguidance's mask; should
        # they ever disagree, the plain mask beats an empty row (which would sample garbage).
        if bool(restricted.any()):
            bitmask[row] = restricted

    def set_token_budget(self, remaining: int | None) -> None:
        table = self._byte_table
        if remaining is not None and table is not None and remaining > table.max_reach:
            remaining = None  # no state's bound reaches it: the mask is never restricted
        self._token_budget = remaining

    def min_completion_tokens(self) -> int | None:
        table = self._table(wait=True)
        return None if table is None else table.min_tokens(self._byte_states[-1])

    def min_completion_tokens_after(self, plan: JumpForward) -> int | None:
        table = self._table(wait=True)
        keep = len(self._output_ids) - plan.retract_tokens
        if table is None or not 0 <= keep <= len(self._output_ids):
            return None
        appended = self.grammar.vocab.decode(list(plan.append_ids))
        return table.min_tokens(table.step(self._byte_states[keep], appended))

    def accept_token(self, token_id: int) -> bool:
        if self._eos_accepted or not 0 <= token_id < self._vocab_size:
            return False
        if token_id in self._eos_ids:  # ends the output; llguidance need not see it
            self._eos_accepted = self._matcher.is_accepting()
            return self._eos_accepted
        # try_consume_tokens refuses without entering llguidance's sticky error state.
        if self._matcher.try_consume_tokens([token_id]) != 1:
            return False
        self._append(token_id)
        return True

    def _append(self, token_id: int) -> None:
        self._output_ids.append(token_id)
        table = self._byte_table
        if table is not None:  # a few bytes per token: no vocabulary-sized work
            raw = self.grammar.vocab.token_bytes.get(token_id, b"")
            self._byte_states.append(table.step(self._byte_states[-1], raw))

    def is_accepting(self) -> bool:
        return not self._eos_accepted and self._matcher.is_accepting()

    def is_terminated(self) -> bool:
        return self._eos_accepted or self._matcher.is_stopped()

    def find_jump_forward(self) -> JumpForward | None:
        """The tokens llguidance finds forced here (it encodes the forced bytes with the
        tokenizer and keeps only tokens no later text can merge with), or None."""
        if self._eos_accepted or self._matcher.is_stopped():  # `is_terminated()`, inline
            return None
        forced = self._matcher.compute_ff_tokens()
        if not forced:
            return None
        text = self.grammar.vocab.decode(forced).decode("utf-8", errors="replace")
        return JumpForward(retract_tokens=0, append_ids=tuple(forced), appended_text=text)

    def apply_jump_forward(self, plan: JumpForward) -> None:
        keep = len(self._output_ids) - plan.retract_tokens
        if plan.retract_tokens < 0 or keep < 0:
            raise ValueError(f"plan.retract_tokens={plan.retract_tokens} is out of range")
        if plan.retract_tokens:
            trial = self._matcher.deep_copy()  # validate before changing anything
            if not trial.rollback(plan.retract_tokens):
                raise ValueError(f"cannot retract {plan.retract_tokens} tokens")
        else:  # llguidance's own plans: no copy (once per jump), undone on a refusal
            trial = self._matcher
        consumed = trial.try_consume_tokens(list(plan.append_ids))
        if consumed != len(plan.append_ids):
            if trial is self._matcher and consumed:
                trial.rollback(consumed)
            raise ValueError(f"plan.append_ids {plan.append_ids} are not allowed here")
        self._matcher = trial
        del self._output_ids[keep:]
        if self._byte_table is not None:
            del self._byte_states[keep + 1 :]
        for token_id in plan.append_ids:
            self._append(token_id)


class _TokenizerAdapter:
    """What `llguidance.TokenizerWrapper` reads: every id's bytes and an encode callable."""

    def __init__(self, vocab: TokenVocabulary, encode) -> None:
        regular = vocab.token_bytes
        self.eos_token_id = vocab.eos_token_ids[0] if vocab.eos_token_ids else None
        self.bos_token_id = None
        # [vocab_size] bytes; ids without text (EOS, chat markers, padding) are specials
        self.tokens = [
            regular.get(i, _SPECIAL_PREFIX + f"<special_{i}>".encode())
            for i in range(vocab.vocab_size)
        ]
        self.special_token_ids = [i for i in range(vocab.vocab_size) if i not in regular]
        self._encode = encode

    def __call__(self, text: bytes) -> list[int]:
        return self._encode(text)


def _encoder(vocab: TokenVocabulary, tokenizer: Any):
    """bytes -> token ids with `tokenizer` (no special tokens), or greedy over `vocab`; short
    texts memoised (`MemoEncoder`)."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return MemoEncoder(
            lambda text: tokenizer.encode(text.decode(), add_special_tokens=False).ids
        )
    if tokenizer is not None and hasattr(tokenizer, "encode"):
        return MemoEncoder(
            lambda text: list(tokenizer.encode(text.decode(), add_special_tokens=False))
        )
    return GreedyEncoder(vocab)


class MemoEncoder:
    """An encoder that remembers its answers for short texts.

    llguidance calls the encoder from `compute_ff_tokens` for the forced bytes of every
    jump-forward probe: with jump-forward on, once per constrained row per decode step, and
    mostly for the same few separators (`,`, `":`, `"}`). Through a transformers tokenizer a
    call costs ~35 µs of Python: ~1.2 ms of a 64-row step on the CPU dev machine
    (docs/benchmarks.md); a hit costs one dict lookup. Encoding is a pure function of the text,
    so answers are identical.
    Bounded: texts over `max_text_bytes` are not kept, and at most `max_entries` are.
    """

    def __init__(self, encode, *, max_text_bytes: int = 64, max_entries: int = 4096) -> None:
        self._encode = encode
        self._max_text_bytes = max_text_bytes
        self._max_entries = max_entries
        self._known: dict[bytes, tuple[int, ...]] = {}  # a GIL-atomic get/set: thread-safe

    def __call__(self, text: bytes) -> list[int]:
        known = self._known.get(text)
        if known is not None:
            return list(known)
        ids = list(self._encode(text))
        if len(text) <= self._max_text_bytes and len(self._known) < self._max_entries:
            self._known[text] = tuple(ids)
        return ids


class GreedyEncoder:
    """Longest-match tokenisation over a byte vocabulary (for vocabularies without a
    tokenizer, and for checking texts: any tokenisation spells the same bytes)."""

    def __init__(self, vocab: TokenVocabulary) -> None:
        self._id_by_bytes: dict[bytes, int] = {}
        for token_id, raw in sorted(vocab.token_bytes.items(), reverse=True):
            self._id_by_bytes[raw] = token_id  # the lowest id wins for duplicate spellings
        self._longest = max((len(raw) for raw in self._id_by_bytes), default=1)

    def __call__(self, text: bytes) -> list[int]:
        """Token ids spelling `text`; ValueError if some byte has no token."""
        ids, start = [], 0
        while start < len(text):
            for end in range(min(len(text), start + self._longest), start, -1):
                token_id = self._id_by_bytes.get(text[start:end])
                if token_id is not None:
                    ids.append(token_id)
                    start = end
                    break
            else:
                raise ValueError(f"byte {text[start]:#04x} has no token in this vocabulary")
        return ids
