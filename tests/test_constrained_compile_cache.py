"""Compile cache (LRU, shared futures, disk), per-request timeouts, specs and the logits mask."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from radixgen.constrained import (
    CompileTimeoutError,
    ConstraintSpec,
    GrammarBackend,
    RegexError,
    allocate_token_bitmask,
)
from radixgen.constrained.compile_cache import CompileCache
from radixgen.kernels.vocab_mask import apply_token_bitmask_

TOKENIZER_PATH = Path(__file__).parent.parent / "runtime" / "tiny_assets" / "tokenizer.json"


@pytest.fixture(scope="module", params=["llguidance", "outlines"])
def backend(request):
    backend = GrammarBackend(str(TOKENIZER_PATH), cache_size=2, grammar_backend=request.param)
    yield backend
    backend.shutdown()


def test_same_spec_compiles_once_and_lru_evicts(backend):
    first = backend.compile(ConstraintSpec.regex("[0-9]{3}"))
    assert backend.compile(ConstraintSpec.regex("[0-9]{3}")) is first  # cache hit
    backend.compile(ConstraintSpec.regex("x"))
    backend.compile(ConstraintSpec.regex("y"))  # cache_size=2: "[0-9]{3}" is evicted
    assert backend.compile(ConstraintSpec.regex("[0-9]{3}")) is not first


def test_invalid_constraint_fails_its_own_future_only(backend):
    bad = backend.compile_async(ConstraintSpec.regex("(unclosed"))
    good = backend.compile_async(ConstraintSpec.regex("fine"))
    with pytest.raises(RegexError, match="unclosed"):
        bad.result(timeout=30)
    assert good.result(timeout=30).new_matcher() is not None


def test_timeout_fails_that_request_alone():
    release = threading.Event()

    def slow_compile(key):
        if key == "slow":
            release.wait(10)
        return f"compiled {key}"

    cache = CompileCache(slow_compile, max_workers=2)
    try:
        slow = cache.submit("slow", timeout_s=0.05)
        fast = cache.submit("fast", timeout_s=5)
        assert fast.result(timeout=5) == "compiled fast"
        with pytest.raises(CompileTimeoutError, match="did not compile within 0.05 s"):
            slow.result(timeout=5)
        release.set()
        # the compilation itself finished and is cached for later requests
        assert cache.submit("slow").result(timeout=5) == "compiled slow"
    finally:
        release.set()
        cache.shutdown()


def test_concurrent_requests_share_one_compilation():
    calls = []

    def counting_compile(key):
        calls.append(key)
        time.sleep(0.05)
        return object()

    cache = CompileCache(counting_compile)
    try:
        futures = [cache.submit("k") for _ in range(5)]
        results = {id(f.result(timeout=5)) for f in futures}
        assert calls == ["k"] and len(results) == 1
    finally:
        cache.shutdown()


def test_failures_are_not_cached():
    attempts = []

    def flaky_compile(key):
        attempts.append(key)
        if len(attempts) == 1:
            raise ValueError("transient")
        return "ok"

    cache = CompileCache(flaky_compile)
    try:
        with pytest.raises(ValueError, match="transient"):
            cache.submit("k").result(timeout=5)
        time.sleep(0.05)  # let the failure callback forget the entry
        assert cache.submit("k").result(timeout=5) == "ok"
    finally:
        cache.shutdown()


def test_disk_cache_reuses_compiled_index(tmp_path):
    spec = ConstraintSpec.regex(r"\{\"a\": [0-9]+\}")
    options = dict(cache_dir=tmp_path, jump_forward=False, grammar_backend="outlines")
    first = GrammarBackend(str(TOKENIZER_PATH), **options)
    grammar = first.compile(spec)
    first.shutdown()
    assert len(list(tmp_path.glob("*.pkl"))) == 1
    second = GrammarBackend(str(TOKENIZER_PATH), **options)
    reloaded = second.compile(spec)
    second.shutdown()
    state = reloaded.automaton.initial_state
    assert state == grammar.automaton.initial_state
    assert torch.equal(reloaded.token_mask(state), grammar.token_mask(state))


def test_constraint_specs_from_sampling_params():
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    from_model = ConstraintSpec.from_sampling_params(json_schema=Person)
    from_text = ConstraintSpec.from_sampling_params(
        json_schema=json.dumps(Person.model_json_schema())
    )
    assert from_model == from_text and from_model.kind == "json_schema"
    assert ConstraintSpec.from_sampling_params() is None
    assert ConstraintSpec.from_sampling_params(choices=["a", "b"]).spec == ("a", "b")
    assert ConstraintSpec.from_sampling_params(ebnf="root ::= 'a'").kind == "ebnf"
    assert ConstraintSpec.from_sampling_params(lark='start: "a"').kind == "lark"
    assert ConstraintSpec.from_sampling_params(json_object=True) == ConstraintSpec.json_object()
    with pytest.raises(ValueError, match="at most one"):
        ConstraintSpec.from_sampling_params(ebnf="root ::= 'a'", json_object=True)
    with pytest.raises(TypeError, match="json_object must be a bool"):
        ConstraintSpec.from_sampling_params(json_object="yes")
    with pytest.raises(ValueError, match="ebnf must be a non-empty str"):
        ConstraintSpec.ebnf("")
    with pytest.raises(ValueError, match="at most one"):
        ConstraintSpec.from_sampling_params(regex="a", choices=["a"])
    with pytest.raises(ValueError, match="json_schema is not valid JSON"):
        ConstraintSpec.json_schema("{not json")
    with pytest.raises(TypeError, match="choices"):
        ConstraintSpec.choices("abc")
    with pytest.raises(ValueError, match="choices must be a non-empty"):
        ConstraintSpec.choices([])


def test_apply_token_bitmask_matches_a_per_token_reference():
    generator = torch.Generator().manual_seed(0)
    vocab_size = 100  # not a multiple of 32: the last word is partly padding
    logits = torch.randn(4, vocab_size, generator=generator)
    bitmask = allocate_token_bitmask(4, vocab_size)
    bitmask.copy_(torch.randint(-(2**31), 2**31 - 1, bitmask.shape, generator=generator))
    rows = torch.tensor([0, 2])
    expected = logits.clone()
    for row in rows.tolist():
        for token in range(vocab_size):
            if not (int(bitmask[row, token // 32]) >> (token % 32)) & 1:
                expected[row, token] = float("-inf")
    masked = logits.clone()
    apply_token_bitmask_(masked, bitmask, rows)
    assert torch.equal(masked, expected)  # rows 1 and 3 untouched
    everything = logits.clone()
    apply_token_bitmask_(everything, bitmask)
    assert torch.isinf(everything[1]).any() and torch.equal(everything[0], expected[0])


def test_apply_token_bitmask_names_bad_arguments():
    logits = torch.zeros(2, 64)
    with pytest.raises(TypeError, match="bitmask"):
        apply_token_bitmask_(logits, torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="rows"):
        apply_token_bitmask_(logits, torch.zeros(3, 2, dtype=torch.int32))
    with pytest.raises(TypeError, match="rows"):
        apply_token_bitmask_(logits, allocate_token_bitmask(2, 64), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="vocab_size"):
        allocate_token_bitmask(1, 0)


def test_cancelling_one_request_leaves_the_shared_compile_running():
    release = threading.Event()

    def slow_compile(key):
        release.wait(10)
        return f"compiled {key}"

    cache = CompileCache(slow_compile, max_workers=1)
    try:
        abandoned, waiting = cache.submit("k"), cache.submit("k")
        assert abandoned is not waiting
        assert abandoned.cancel()
        release.set()
        assert waiting.result(timeout=5) == "compiled k"
    finally:
        release.set()
        cache.shutdown()


def test_many_waiting_requests_time_out_without_a_thread_each():
    release = threading.Event()
    cache = CompileCache(lambda key: release.wait(10), max_workers=1)
    try:
        threads_before = threading.active_count()
        futures = [cache.submit("big schema", timeout_s=0.01 * (i % 10 + 1)) for i in range(50)]
        assert threading.active_count() <= threads_before + 2  # a worker and one watcher
        for future in futures:
            with pytest.raises(CompileTimeoutError):
                future.result(timeout=5)
    finally:
        release.set()
        cache.shutdown()
