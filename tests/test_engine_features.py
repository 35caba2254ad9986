"""Engine features on the tiny model: prefix reuse across chat turns, n>1 sharing, stop
conditions, prompt logprobs, streaming and abort, and argument validation."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
import torch

import radixgen.runtime.scheduler as scheduler_module
from radixgen.runtime.engine import Engine

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    engine = Engine(model_path=tiny_model_path, dtype="float32", max_total_tokens=4096)
    yield engine
    engine.shutdown()


def test_second_chat_turn_hits_the_cache(engine):
    messages = [{"role": "user", "content": "Name three Python builtins, please."}]
    first_prompt = engine.apply_chat_template(messages)
    first = engine.generate(first_prompt, {**GREEDY, "max_new_tokens": 8})
    messages += [
        {"role": "assistant", "content": first["text"]},
        {"role": "user", "content": "And three more?"},
    ]
    second = engine.generate(engine.apply_chat_template(messages), {**GREEDY, "max_new_tokens": 4})
    assert second["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"]
    engine.check_integrity()


def test_parallel_samples_share_the_prompt(engine):
    prompt = "import os\nimport sys\n\ndef main(argv):\n    for path in argv:\n        print(path)"
    num_prompt = len(engine.tokenizer.encode(prompt))
    before = engine.get_stats()["num_computed_prefill_tokens"]
    samples = engine.generate(prompt, {"max_new_tokens": 6, "temperature": 1.0, "n": 4, "seed": 5})
    computed = engine.get_stats()["num_computed_prefill_tokens"] - before
    assert [s["index"] for s in samples] == [0, 1, 2, 3]
    # The prompt is computed once; each other sample recomputes only its last token.
    assert computed == num_prompt + 3
    assert [s["meta_info"]["cached_tokens"] for s in samples[1:]] == [num_prompt - 1] * 3
    # Seeds seed+i: the samples differ, and sample i equals a single request with seed 5+i.
    assert len({tuple(s["output_ids"]) for s in samples}) > 1
    single = engine.generate(prompt, {"max_new_tokens": 6, "temperature": 1.0, "seed": 7})
    assert single["output_ids"] == samples[2]["output_ids"]
    engine.check_integrity()


def test_a_batch_finishing_out_of_order_returns_in_request_order(engine):
    # One result channel serves the whole batch: outputs arrive interleaved and the later,
    # shorter requests finish first; each result must still be its own request's.
    prompts = ["def first(", "class Second:", "import third"]
    lengths = [12, 5, 1]
    params = [{**GREEDY, "max_new_tokens": n} for n in lengths]
    params[1] = {**params[1], "n": 2}
    results = engine.generate(prompts, params)
    assert [r["index"] for r in results] == [0, 0, 1, 0]
    assert [r["meta_info"]["completion_tokens"] for r in results] == [12, 5, 5, 1]
    singles = [results[0], results[1], results[3]]
    for prompt, n, result in zip(prompts, lengths, singles, strict=True):
        alone = engine.generate(prompt, {**GREEDY, "max_new_tokens": n})
        assert result["output_ids"] == alone["output_ids"]
    assert results[2]["output_ids"] == results[1]["output_ids"]  # greedy: both samples agree
    engine.check_integrity()


def test_cache_salt_shares_prefixes_only_within_one_salt(engine):
    prompt = list(range(300, 348))  # not used by other tests: nothing cached yet
    params = {**GREEDY, "max_new_tokens": 3}

    def cached(salt):
        out = engine.generate(input_ids=prompt, sampling_params=params, cache_salt=salt)
        return out["meta_info"]["cached_tokens"], out["output_ids"]

    first = cached("tenant-a")
    other_salt = cached("tenant-b")
    no_salt = cached(None)
    same_salt = cached("tenant-a")
    assert (first[0], other_salt[0], no_salt[0]) == (0, 0, 0)
    assert same_salt[0] == len(prompt) - 1  # the last token is always computed
    assert cached(None)[0] == len(prompt) - 1  # the default namespace is shared
    assert first[1] == other_salt[1] == no_salt[1] == same_salt[1]
    # One salt per prompt of a batch; n > 1 samples share their request's salt.
    batch = engine.generate(
        input_ids=[prompt, prompt],
        sampling_params=[params, {**params, "n": 2}],
        cache_salt=["tenant-b", "tenant-c"],
    )
    assert [b["meta_info"]["cached_tokens"] for b in batch] == [
        len(prompt) - 1,
        0,
        len(prompt) - 1,
    ]
    assert all(b["output_ids"] == first[1] for b in batch)
    engine.check_integrity()


@pytest.mark.parametrize("salt", ["", "x" * 257, 7, ["a", "b"]])
def test_bad_cache_salt_raises_naming_it(engine, salt):
    with pytest.raises((ValueError, TypeError), match="cache_salt"):
        engine.generate("hi", {"max_new_tokens": 1}, cache_salt=salt)
    engine.check_integrity()


async def _salted_async(engine, prompt):
    return await engine.async_generate(
        input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 2}, cache_salt="async"
    )


def test_async_generate_takes_a_cache_salt(engine):
    prompt = list(range(400, 440))
    first = asyncio.run(_salted_async(engine, prompt))
    second = asyncio.run(_salted_async(engine, prompt))
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] == len(prompt) - 1


def test_stop_string_and_stop_token(engine):
    prompt = "The quick brown fox"
    full = engine.generate(prompt, {**GREEDY, "max_new_tokens": 16})
    text, ids = full["text"], full["output_ids"]
    # A stop string that spans a token boundary, found inside the unconstrained text.
    stop = text[len(engine.tokenizer.decode(ids[:3])) - 2 :][:4]
    assert len(stop) == 4
    stopped = engine.generate(prompt, {**GREEDY, "max_new_tokens": 16, "stop": [stop]})
    assert stopped["text"] == text[: text.index(stop)]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert len(stopped["output_ids"]) < len(ids)

    by_id = engine.generate(prompt, {**GREEDY, "max_new_tokens": 16, "stop_token_ids": [ids[4]]})
    cut = ids.index(ids[4]) + 1
    assert by_id["output_ids"] == ids[:cut]
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[4]}

    eos = engine.model_config.eos_token_ids[0]
    length = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 5, "min_new_tokens": 5})
    assert length["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert eos not in length["output_ids"]


def test_prompt_logprobs_match_a_full_forward(engine, tiny_model_path):
    prefix = "Question: which is larger, 3 or 5? Answer:"
    choice = " five, because it is larger"
    engine.generate(prefix, {**GREEDY, "max_new_tokens": 1})  # warm the cache with the prefix
    prefix_ids = engine.tokenizer.encode(prefix)
    full_ids = prefix_ids + engine.tokenizer.encode(choice)
    out = engine.generate(
        input_ids=full_ids,
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=len(prefix_ids),
        top_logprobs_num=2,
    )
    meta = out["meta_info"]
    assert out["output_ids"] == [] and meta["finish_reason"]["type"] == "length"
    got = meta["input_token_logprobs"]
    assert [token for _, token in got] == full_ids[len(prefix_ids) :]
    # Reference: log_softmax of one plain forward over the whole sequence.
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([full_ids])).logits[0], dim=-1)
    expected = [logprobs[t - 1, full_ids[t]].item() for t in range(len(prefix_ids), len(full_ids))]
    assert [value for value, _ in got] == pytest.approx(expected, abs=1e-4)
    assert all(len(top) == 2 for top in meta["input_top_logprobs"])
    # The cached prefix was still reused up to the first logprob position.
    assert meta["cached_tokens"] == len(prefix_ids) - 1


def test_output_logprobs_and_first_position(engine):
    out = engine.generate(
        "abc", {**GREEDY, "max_new_tokens": 3}, return_logprob=True, logprob_start_len=0
    )
    meta = out["meta_info"]
    assert meta["input_token_logprobs"][0][0] is None  # position 0 has no context
    assert [token for _, token in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(value <= 0 for value, _ in meta["output_token_logprobs"])


def test_streaming_and_abort_free_the_kv(engine):
    prompt = "Streaming test prompt"
    full = engine.generate(prompt, {**GREEDY, "max_new_tokens": 10})
    chunks = list(engine.generate(prompt, {**GREEDY, "max_new_tokens": 10}, stream=True))
    assert "".join(chunk["delta"] for chunk in chunks) == full["text"]
    assert chunks[-1]["output_ids"] == full["output_ids"]

    async def consume_two():
        seen = 0
        stream = engine.async_generate(prompt, {**GREEDY, "max_new_tokens": 200}, stream=True)
        async for _chunk in stream:
            seen += 1
            if seen == 2:
                break
        await stream._iterator.aclose()  # the client goes away mid-stream
        result = await engine.async_generate(prompt, {**GREEDY, "max_new_tokens": 10})
        return result

    assert asyncio.run(consume_two())["output_ids"] == full["output_ids"]
    engine.check_integrity()
    stats = engine.get_stats()
    assert stats["num_running_reqs"] == 0 and stats["num_queued_reqs"] == 0


@pytest.mark.parametrize(
    "params, error, match",
    [
        ({"temprature": 0.5}, TypeError, "temprature"),
        ({"top_p": 0.0}, ValueError, r"top_p must be > 0 \(use temperature=0 for greedy\)"),
        ({"seed": 2**63}, ValueError, "seed must be in"),
        ({"seed": 2**63 - 2, "n": 4}, ValueError, r"seed \+ n - 1 must be < 2\*\*63"),
        ({"temperature": float("inf")}, ValueError, "temperature must be a finite number"),
        ({"n": 10**7}, ValueError, r"n must be in \[1, 128\]"),
        ({"stop": ["x"] * 65}, ValueError, "stop holds at most 64"),
        ({"top_k": -5}, ValueError, "top_k"),
        ({"max_new_tokens": -1}, ValueError, "max_new_tokens"),
        ({"min_new_tokens": 9, "max_new_tokens": 2}, ValueError, "min_new_tokens"),
        ({"n": 0}, ValueError, "n must be"),
        ({"stop": [3]}, TypeError, "stop"),
        ({"regex": "a", "choices": ["a"]}, ValueError, "at most one"),
        ({"json_schema": "{not json"}, ValueError, "json_schema"),
        ({"max_new_tokens": 10**6}, ValueError, "context length"),
        ({"ebnf": ""}, ValueError, "ebnf"),
        ({"ebnf": "root ::= 'a'", "regex": "a"}, ValueError, "at most one"),
        ({"stop_token_ids": [-1]}, ValueError, r"stop_token_ids must be >= 0, got \[-1\]"),
        ({"stop_token_ids": [10**9]}, ValueError, r"stop_token_ids must be \[0, 32000\)"),
    ],
)
def test_bad_sampling_params_raise_naming_the_field(engine, params, error, match):
    with pytest.raises(error, match=match):
        engine.generate("hi", params)


def test_bad_arguments_raise(engine):
    with pytest.raises(ValueError, match="exactly one of prompt or input_ids"):
        engine.generate()
    with pytest.raises(ValueError, match="input_ids"):
        engine.generate(input_ids=[10**9])
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.generate("")
    with pytest.raises(ValueError, match="logprob_start_len"):
        engine.generate("hi", return_logprob=True, logprob_start_len=99)
    with pytest.raises(ValueError, match=r"input_ids must be ints in \[0, 32000\)"):
        engine.generate(input_ids=[[False]])  # a bool is not token 0
    with pytest.raises(TypeError, match="stream must be a bool"):
        engine.generate("hi", stream="yes")
    with pytest.raises(ValueError, match=r"top_logprobs_num must be in \[0, 32\]"):
        engine.generate("hi", return_logprob=True, top_logprobs_num=33)
    with pytest.raises(TypeError, match="unknown server option"):
        Engine(model_path="tiny", not_an_option=1)
    engine.check_integrity()  # nothing was half-admitted


def test_constrained_outputs_follow_the_constraint(engine):
    import json
    import re

    import jsonschema

    pattern = r"(yes|no)-[0-9]{2,3}"
    for seed in range(3):
        params = {"max_new_tokens": 12, "temperature": 1.0, "seed": seed, "regex": pattern}
        out = engine.generate("Answer:", params)
        assert re.fullmatch(pattern, out["text"]), out["text"]
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "favourite_language": {"enum": ["python", "rust"]},
        },
        "required": ["name", "age", "favourite_language"],
        "additionalProperties": False,
    }
    outs = engine.generate(
        ["Person:", "Someone else:"],
        {"max_new_tokens": 64, "temperature": 1.0, "seed": 1, "json_schema": schema},
    )
    for out in outs:
        jsonschema.validate(json.loads(out["text"]), schema)
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
    choices = engine.generate(
        "Pick one:", {"max_new_tokens": 8, "temperature": 1.0, "n": 3, "choices": ["red", "blue"]}
    )
    assert {c["text"] for c in choices} <= {"red", "blue"}
    with pytest.raises(ValueError, match="invalid constraint"):
        engine.generate("x", {"max_new_tokens": 3, "regex": "("})
    engine.check_integrity()


def test_constrained_cache_dir_keeps_compiled_indexes(tiny_model_path, tmp_path):
    with Engine(
        model_path=tiny_model_path,
        dtype="float32",
        constrained_cache_dir=str(tmp_path),
        grammar_backend="outlines",  # the disk cache holds outlines' indexes
    ) as engine:
        out = engine.generate("Code:", {"max_new_tokens": 6, "temperature": 0, "regex": "[0-9]{3}"})
    assert len(out["text"]) == 3 and out["text"].isdigit()
    assert len(list(tmp_path.glob("*.pkl"))) == 1  # reused by the next server start


def test_concurrent_callers_batch_together(engine):
    from concurrent.futures import ThreadPoolExecutor

    prompts = [f"Concurrent prompt number {i}:" for i in range(6)]
    params = {**GREEDY, "max_new_tokens": 6}
    expected = [out["output_ids"] for out in engine.generate(prompts, params)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        threaded = list(pool.map(lambda p: engine.generate(p, params)["output_ids"], prompts))

    async def gather():
        results = await asyncio.gather(*(engine.async_generate(p, params) for p in prompts))
        return [r["output_ids"] for r in results]

    assert threaded == expected
    assert asyncio.run(gather()) == expected
    engine.check_integrity()


def test_jump_forward_appends_forced_text_when_enabled(tiny_model_path):
    import json

    import jsonschema

    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "favourite_language": {"enum": ["python", "rust"]},
        },
        "required": ["name", "favourite_language"],
        "additionalProperties": False,
    }
    engine = Engine(
        model_path=tiny_model_path, dtype="float32", max_total_tokens=4096, enable_jump_forward=True
    )
    try:
        # Forced text (keys, punctuation) is appended by jump-forward, not sampled, once the
        # constraint's character automaton (built in the background) is ready.
        for _attempt in range(40):
            out = engine.generate("Person:", {"max_new_tokens": 64, "temperature": 1.0, "seed": 2,
                                              "json_schema": schema})  # fmt: skip
            jsonschema.validate(json.loads(out["text"]), schema)
            if engine.get_stats()["num_jump_forward_tokens"] > 0:
                break
            time.sleep(0.25)
        assert engine.get_stats()["num_jump_forward_tokens"] > 0
        engine.check_integrity()
    finally:
        engine.shutdown()


def test_a_failing_step_reaches_every_waiter_instead_of_hanging(tiny_model_path, monkeypatch):
    # A device fault cannot be produced on demand: inject one into the real loop.
    engine = Engine(model_path=tiny_model_path, dtype="float32", max_total_tokens=512)

    def device_fault():
        raise RuntimeError("injected device fault")

    monkeypatch.setattr(engine._scheduler, "step", device_fault)
    with pytest.raises(RuntimeError, match="injected device fault"):
        engine.generate("hi", {**GREEDY, "max_new_tokens": 4})
    with pytest.raises(RuntimeError, match="the engine's scheduler failed"):
        engine.get_stats()
    with pytest.raises(RuntimeError, match="the engine's scheduler failed"):
        engine.generate("again", {**GREEDY, "max_new_tokens": 4})
    engine.shutdown()


def test_a_request_the_scheduler_cannot_admit_fails_alone(engine, monkeypatch):
    # Fault injection: building this request's scheduler state raises (as a bug would).
    # That request gets an error; the scheduler loop, and the requests beside it, go on.
    real = scheduler_module.make_stop_checker

    def failing_for_boom(req, tokenizer):
        if "BOOM" in (req.sampling_params.stop_strings or []):
            raise RuntimeError("injected fault")
        return real(req, tokenizer)

    monkeypatch.setattr(scheduler_module, "make_stop_checker", failing_for_boom)
    with pytest.raises(ValueError, match="could not admit this request.*injected fault"):
        engine.generate("def f(", {**GREEDY, "max_new_tokens": 4, "stop": ["BOOM"]})
    ok = engine.generate("def f(", {**GREEDY, "max_new_tokens": 4, "stop": ["zzz"]})
    assert ok["meta_info"]["completion_tokens"] == 4
    engine.check_integrity()


def test_outlines_backend_refuses_grammars_clearly(tiny_model_path):
    with Engine(model_path=tiny_model_path, dtype="float32", grammar_backend="outlines") as engine:
        with pytest.raises(ValueError, match="(?i)ebnf.*llguidance|llguidance.*ebnf"):
            engine.generate("x", {"max_new_tokens": 4, "ebnf": "root ::= 'a'"})
        out = engine.generate("x", {"max_new_tokens": 4, "temperature": 0, "regex": "[0-9]{2}"})
        assert re.fullmatch("[0-9]{2}", out["text"])


def test_shutdown_gives_the_model_back(tiny_model_path):
    """A closed Engine keeps no reference to its weights or KV pools (a second Engine in the
    same process gets the whole device), and later calls fail clearly."""
    import gc
    import weakref

    engine = Engine(model_path=tiny_model_path, dtype="float32", max_total_tokens=512)
    engine.generate(input_ids=[[300, 301, 302]], sampling_params={"max_new_tokens": 2})
    runner = weakref.ref(engine._scheduler.runner)
    # start-up froze the heap (full collections skip the model); shutdown must thaw it, or
    # the scheduler's reference cycles would never be collected
    assert gc.get_freeze_count() > 0
    engine.shutdown()
    engine.shutdown()  # idempotent
    gc.collect()
    assert runner() is None
    with pytest.raises(RuntimeError, match="shut down"):
        engine.generate(input_ids=[[300]], sampling_params={"max_new_tokens": 1})
