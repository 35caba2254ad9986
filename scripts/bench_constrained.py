"""Benchmark: constraint compile time and per-token mask time for 32k and 128k vocabularies.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_constrained.py [--sizes 32000 128000]

The vocabularies are synthetic byte-level ones built locally: the 256 single bytes plus the most
frequent words, word prefixes, number and punctuation runs (with and without a leading space) of
the Python standard library's sources, the way BPE vocabularies look. Jump-forward is measured
separately on the tiny model's real tokenizer (model steps saved for a scripted model).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sysconfig
import time
from collections import Counter
from pathlib import Path

import numpy as np

from radixgen.constrained.backend import GrammarBackend
from radixgen.constrained.bitmask import allocate_token_bitmask
from radixgen.constrained.constraint_spec import ConstraintSpec
from radixgen.constrained.vocabulary import TokenVocabulary
from radixgen.kernels.vocab_mask import apply_token_bitmask_

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["street", "zip"],
        },
    },
    "required": ["name", "age", "address"],
}
CONSTRAINTS = {
    "regex phone": ConstraintSpec.regex(r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
    "regex sentence": ConstraintSpec.regex(r"[A-Z][a-z ,]{10,80}\."),
    "choices x20": ConstraintSpec.choices([f"option number {i}" for i in range(20)]),
    "schema number": ConstraintSpec.json_schema({"type": "number"}),
    "schema person": ConstraintSpec.json_schema(PERSON_SCHEMA),
}
_PIECE = re.compile(r" ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]{1,3}|\n[ ]*|[ ]+")


def synthetic_vocabulary(size: int) -> TokenVocabulary:
    """A byte-level vocabulary of `size` ids: id 0 is EOS, then bytes, then frequent pieces."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    counts: Counter[str] = Counter()
    for path in sorted(stdlib.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        for piece in _PIECE.findall(text):
            counts[piece] += 2
            for end in range(2, len(piece)):  # subword prefixes, as BPE keeps them
                counts[piece[:end]] += 1
        if len(counts) > 3 * size:
            break
    pieces = [bytes([b]) for b in range(256)]
    seen = set(pieces)
    for piece, _ in counts.most_common():
        raw = piece.encode()
        if raw not in seen:
            seen.add(raw)
            pieces.append(raw)
        if len(pieces) == size - 1:
            break
    if len(pieces) < size - 1:
        raise RuntimeError(f"the standard library gave only {len(pieces)} distinct pieces")
    token_bytes = {i + 1: raw for i, raw in enumerate(pieces)}
    return TokenVocabulary(token_bytes, (0,), size, "byte_level")


def random_walk(grammar, seed: int, max_steps: int = 300) -> list[int]:
    """Token ids of one output sampled uniformly among allowed tokens (EOS preferred at ends)."""
    generator = np.random.default_rng(seed)
    matcher = grammar.new_matcher()
    bitmask = allocate_token_bitmask(1, grammar.vocab_size)
    chosen: list[int] = []
    for _ in range(max_steps):
        matcher.fill_bitmask(bitmask, 0)
        allowed = np.flatnonzero(
            np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
        )
        if matcher.is_accepting() and generator.random() < 0.5:
            break
        regular = allowed[allowed != 0]
        if regular.size == 0:
            break
        token_id = int(generator.choice(regular))
        matcher.accept_token(token_id)
        chosen.append(token_id)
    return chosen


def time_masks(grammar, walks: list[list[int]]) -> tuple[list[float], list[float]]:
    """Seconds of fill_bitmask + accept_token per token, replaying each walk twice: returns the
    steps of the first pass that visit a state first (mask built), and all steps of the second
    pass (masks cached)."""
    bitmask = allocate_token_bitmask(8, grammar.vocab_size)
    first_visits, cached = [], []
    for replay in range(2):
        for token_ids in walks:
            matcher = grammar.new_matcher()
            for token_id in token_ids:
                is_new = matcher._states[-1] not in grammar._mask_by_state
                start = time.perf_counter()
                matcher.fill_bitmask(bitmask, 3)
                matcher.accept_token(token_id)
                seconds = time.perf_counter() - start
                if replay == 1:
                    cached.append(seconds)
                elif is_new:
                    first_visits.append(seconds)
    return first_visits, cached


def bench_vocabulary(size: int) -> None:
    start = time.perf_counter()
    vocab = synthetic_vocabulary(size)
    built_s = time.perf_counter() - start
    start = time.perf_counter()
    backend = GrammarBackend(vocab)
    backend_s = time.perf_counter() - start
    print(f"\n### vocabulary {size:,} (synthesised in {built_s:.1f} s; backend {backend_s:.2f} s)")
    print("| constraint | compile | char FSM | states visited | first visit of a state (Guide; mean, max) "
          "| numpy packing / state (mean, max) | fill_bitmask+accept_token, cached (median, p99) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, spec in CONSTRAINTS.items():
        start = time.perf_counter()
        grammar = backend.compile(spec)
        compile_s = time.perf_counter() - start
        grammar.boundary_tokenizer = object()  # the FSM build only checks it is set
        start = time.perf_counter()
        grammar.build_char_automaton()
        fsm_s = time.perf_counter() - start
        grammar.boundary_tokenizer = None
        walks = [random_walk(grammar, seed) for seed in range(5)]
        states = list(grammar._mask_by_state)
        grammar._mask_by_state.clear()
        numpy_seconds = []
        for state in states:  # the numpy packing path, once per state
            start = time.perf_counter()
            grammar._mask_from_index(state)
            numpy_seconds.append(time.perf_counter() - start)
        new_state_seconds, warm = time_masks(grammar, walks)
        warm_sorted = sorted(warm)
        p99 = warm_sorted[int(0.99 * (len(warm_sorted) - 1))]
        print(
            f"| {name} | {compile_s * 1e3:.0f} ms | {fsm_s * 1e3:.0f} ms | "
            f"{len(states)} | {statistics.mean(new_state_seconds) * 1e6:.0f} µs, "
            f"{max(new_state_seconds) * 1e3:.2f} ms | {statistics.mean(numpy_seconds) * 1e6:.0f} µs, "
            f"{max(numpy_seconds) * 1e3:.2f} ms | "
            f"{statistics.median(warm) * 1e6:.1f} µs, {p99 * 1e6:.1f} µs |"
        )
    backend.shutdown()
    apply_s = bench_apply(size)
    print(
        f"\n`apply_token_bitmask_` (torch, CPU), 16 rows x {size:,} logits: {apply_s * 1e3:.2f} ms"
    )


def bench_apply(size: int, batch: int = 16) -> float:
    import torch

    logits = torch.randn(batch, size)
    bitmask = allocate_token_bitmask(batch, size)
    rows = torch.arange(0, batch, 2)
    timings = []
    for _ in range(20):
        start = time.perf_counter()
        apply_token_bitmask_(logits, bitmask, rows)
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


def bench_jump_forward() -> None:
    """Model steps saved by jump-forward for a scripted model writing a target JSON document."""
    from tokenizers import Tokenizer

    path = Path(__file__).parent.parent / "runtime" / "tiny_assets" / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    backend = GrammarBackend(tokenizer)
    document = (
        '{"address":{"street":"1 Main St","zip":"75001"},"age":36,'
        '"email":"ada@example.com","name":"Ada","tags":["math","poetry"]}'
    )
    grammar = backend.compile(CONSTRAINTS["schema person"])
    grammar.build_char_automaton()
    target = tokenizer.encode(document).ids
    print("\n### jump-forward, tiny tokenizer, person schema")
    print("| mode | model steps | jump-forward extends | tokens appended | matcher time |")
    print("| --- | --- | --- | --- | --- |")
    for enabled in (False, True):
        matcher, steps, jumps, appended = grammar.new_matcher(), 0, 0, 0
        start = time.perf_counter()
        while not matcher.is_terminated():
            plan = matcher.find_jump_forward() if enabled else None
            if plan is not None:
                matcher.apply_jump_forward(plan)
                jumps, appended = jumps + 1, appended + len(plan.append_ids)
                continue
            position = len(matcher.output_ids)
            matcher.accept_token(target[position] if position < len(target) else 0)
            steps += 1
        elapsed = time.perf_counter() - start
        assert list(matcher.output_ids) == target
        label = "on" if enabled else "off"
        print(f"| {label} | {steps} | {jumps} | {appended} | {elapsed * 1e3:.1f} ms |")
    backend.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32000, 128000])
    args = parser.parse_args()
    for size in args.sizes:
        bench_vocabulary(size)
    bench_jump_forward()


if __name__ == "__main__":
    main()
