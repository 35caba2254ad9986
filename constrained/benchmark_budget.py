"""What the token-budget tables cost to build, per backend, at the 128k benchmark tokenizer.

    python -m radixgen.constrained.benchmark_budget

Prints, for a few schemas, each backend's compile time without the table, the table's build
time, the shortest completion from the start in tokens, and this process's peak RSS (the
outlines table reads every (state, token) edge of the automaton). Results: docs/benchmarks.md.
"""

from __future__ import annotations

import json
import resource
import time

from radixgen.constrained.backend import GrammarBackend
from radixgen.constrained.build_benchmark_tokenizer import load_benchmark_tokenizer
from radixgen.constrained.completion_budget import (
    ByteDistanceTable,
    ByteSpelling,
    TokenDistanceTable,
)
from radixgen.constrained.constraint_spec import ConstraintSpec
from radixgen.constrained.llguidance_backend import _encoder

SCHEMAS = {
    "person (4 properties, maxLength 40)": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "kind": {"enum": ["a", "bb", "ccc"]},
        },
        "required": ["name", "age", "tags", "kind"],
    },
    "note (free string)": {
        "type": "object",
        "properties": {"note": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["note", "n"],
    },
}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    tokenizer = load_benchmark_tokenizer()
    llguidance = GrammarBackend(tokenizer, grammar_backend="llguidance")
    encode = _encoder(llguidance.vocab, tokenizer)
    started = time.perf_counter()
    spelling = ByteSpelling.of(llguidance.vocab)
    print(f"llguidance: ByteSpelling.of(vocab) {time.perf_counter() - started:.3f} s (once)")
    outlines = GrammarBackend(tokenizer, grammar_backend="outlines", jump_forward=False)
    for name, schema in SCHEMAS.items():
        spec = ConstraintSpec.json_schema(json.dumps(schema))
        started = time.perf_counter()
        table = ByteDistanceTable(spec.to_regex(), llguidance.vocab, encode, spelling)
        print(
            f"{name}: llguidance byte table {time.perf_counter() - started:.3f} s, "
            f"bound from the start {table.min_tokens(table.initial_state)} tokens"
        )
        started = time.perf_counter()
        grammar = outlines.compile(spec)
        compile_s = time.perf_counter() - started
        rss_before = peak_rss_mb()
        started = time.perf_counter()
        exact = TokenDistanceTable(grammar.automaton, grammar.vocab.eos_token_ids)
        print(
            f"{name}: outlines compile {compile_s:.2f} s, token table "
            f"{time.perf_counter() - started:.2f} s, exact from the start "
            f"{exact.min_tokens(grammar.automaton.initial_state)} tokens, peak RSS "
            f"{rss_before:.0f} -> {peak_rss_mb():.0f} MB"
        )
    llguidance.shutdown()
    outlines.shutdown()


if __name__ == "__main__":
    main()
