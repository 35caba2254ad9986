"""The engine's outputs do not depend on how it schedules them.

Greedy output equals transformers' greedy output; and greedy plus seeded sampling outputs
are identical with the radix cache on and off, with chunked prefill, under forced
preemption (a tiny KV pool), batched versus one by one, and under every policy. Each engine
leaks no KV slot once drained.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from radixgen.runtime.engine import Engine

NUM_NEW = 12
SYSTEM = "You are a careful assistant. Answer the question about Python code below.\n"
QUESTIONS = [
    "What does len() return?",
    "How do I open a file for reading?",
    "Explain list comprehensions briefly, with one example.",
    "What is a dict?",
    "Why use a with statement?",
    "def add(a, b): return a + b",
]
PROMPTS = [SYSTEM + q for q in QUESTIONS[:4]] + QUESTIONS[4:]
SAMPLING = [
    {"temperature": 0},
    {"temperature": 0.9, "top_p": 0.9, "seed": 7},
    {"temperature": 0},
    {"temperature": 1.2, "top_k": 50, "min_p": 0.01, "seed": 3},
    {"temperature": 0.8, "repetition_penalty": 1.3, "frequency_penalty": 0.5, "seed": 11},
    {"temperature": 0, "presence_penalty": 1.0},
]
for params in SAMPLING:
    params.update(max_new_tokens=NUM_NEW, ignore_eos=True)


def make_engine(path: str, **options) -> Engine:
    return Engine(model_path=path, dtype="float32", **options)


def generate_all(engine: Engine, one_by_one: bool = False) -> list[list[int]]:
    if one_by_one:
        outputs = [engine.generate(p, s) for p, s in zip(PROMPTS, SAMPLING, strict=True)]
    else:
        outputs = engine.generate(PROMPTS, SAMPLING)
    return [out["output_ids"] for out in outputs]


def assert_drained_without_leaks(engine: Engine) -> None:
    engine.check_integrity()
    stats = engine.get_stats()
    assert stats["kv_free_slots"] + stats["kv_cached_slots"] == stats["kv_total_slots"]
    assert engine.flush_cache()
    assert engine.get_stats()["kv_free_slots"] == stats["kv_total_slots"]


@pytest.fixture(scope="module")
def reference(tiny_model_path):
    engine = make_engine(tiny_model_path)
    outputs = generate_all(engine)
    yield engine, outputs
    engine.shutdown()


def test_greedy_matches_transformers(tiny_model_path, reference):
    engine, outputs = reference
    model = transformers.LlamaForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    model.eval()
    for row in (0, 2):  # the greedy rows without penalties
        ids = torch.tensor([engine.tokenizer.encode(PROMPTS[row])])
        with torch.no_grad():
            for _ in range(NUM_NEW):
                next_id = model(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
        assert outputs[row] == ids[0, -NUM_NEW:].tolist()


def test_one_by_one_equals_batched(reference):
    engine, outputs = reference
    assert generate_all(engine, one_by_one=True) == outputs
    stats = engine.get_stats()
    assert stats["num_cached_tokens"] > 0  # the second pass reused cached prompts
    assert_drained_without_leaks(engine)


@pytest.mark.parametrize(
    "options",
    [
        {"disable_radix_cache": True},
        {"chunked_prefill_size": 8, "schedule_policy": "dfs-weight"},
        {"max_total_tokens": 96, "schedule_policy": "fcfs", "max_prefill_tokens": 64},
        {"max_total_tokens": 80, "chunked_prefill_size": 16, "new_token_ratio": 0.1},
        {"enable_mixed_chunk": True, "chunked_prefill_size": 8, "max_prefill_tokens": 8},
        {"enable_overlap_schedule": True},
        {"enable_overlap_schedule": True, "max_total_tokens": 96, "max_prefill_tokens": 64},
        # The fused Triton sampling kernel (interpreted on CPU) draws what torch draws.
        {"sampling_backend": "triton", "enable_overlap_schedule": True},
    ],
    ids=[
        "no_radix_cache",
        "chunked_prefill",
        "preemption",
        "chunked_preemption",
        "mixed",
        "overlap",
        "overlap_preemption",
        "triton_sampler_overlap",
    ],
)
def test_scheduling_does_not_change_outputs(tiny_model_path, reference, options):
    _, expected = reference
    engine = make_engine(tiny_model_path, **options)
    try:
        assert generate_all(engine) == expected
        stats = engine.get_stats()
        if "max_total_tokens" in options:
            assert stats["num_retractions"] > 0  # preemption really happened
        if "enable_mixed_chunk" in options:
            assert stats["num_mixed_steps"] > 0
        if "disable_radix_cache" in options:
            assert stats["num_cached_tokens"] == 0
        assert_drained_without_leaks(engine)
    finally:
        engine.shutdown()


def test_overlap_with_early_stops_equals_plain_decoding(tiny_model_path, reference):
    """Requests that stop on a token id run one wasted row in the overlapped step after;
    outputs and KV accounting must not notice."""
    _, expected = reference
    # Stop each greedy request on its own 5th token: it finishes mid-batch, while others run.
    params = [dict(p) for p in SAMPLING]
    for p, output in zip(params, expected, strict=True):
        if p["temperature"] == 0:
            p["stop_token_ids"] = [output[4]]
    results = []
    for overlap in (False, True):
        engine = make_engine(tiny_model_path, enable_overlap_schedule=overlap)
        try:
            outputs = engine.generate(PROMPTS, params)
            results.append([(o["output_ids"], o["meta_info"]["finish_reason"]) for o in outputs])
            assert_drained_without_leaks(engine)
        finally:
            engine.shutdown()
    assert results[0] == results[1]
    assert any(reason["type"] == "stop" for _, reason in results[1])


def test_integrity_check_mid_run_under_overlap(tiny_model_path):
    """check_integrity() between overlapped steps processes the step in flight first."""
    from radixgen.runtime.request_schema import GenerateReq, SamplingParams
    from radixgen.runtime.scheduler import Scheduler
    from radixgen.runtime.server_args import ServerArgs

    args = ServerArgs(model_path=tiny_model_path, dtype="float32", enable_overlap_schedule=True)
    scheduler = Scheduler(args)
    params = SamplingParams.from_dict({"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
    scheduler.add_request(
        GenerateReq(rid="a", input_ids=list(range(10, 30)), sampling_params=params)
    )
    scheduler.step()  # prefill
    scheduler.step()  # first overlapped decode: launched, not processed
    assert scheduler.inflight is not None
    scheduler.check_integrity()
    outputs = []
    while scheduler.has_work():
        outputs += scheduler.step()
    assert sum(len(o.new_token_ids) for o in outputs) == 7  # 1 token came with the prefill
    scheduler.shutdown()


# ---- constrained requests under the overlapped schedule -----------------------------------------

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
NUMBER_LIST_EBNF = 'root ::= "[" item ("," item)* "]"\nitem ::= [0-9] | [1-9] [0-9]'
# One batch: constraints of every kind, greedy and seeded, finishing at different steps (a
# short regex completes early: a wasted overlapped row), beside an unconstrained request
# and a constrained one with a stop string.
CONSTRAINED = [
    ("Answer:", {"temperature": 0, "regex": r"(yes|no)-[0-9]{2,3}"}),
    ("Answer:", {"temperature": 1.0, "seed": 5, "regex": r"(yes|no)-[0-9]{2,3}"}),
    ("Person:", {"temperature": 0.9, "seed": 1, "json_schema": PERSON_SCHEMA}),
    # Cut by its budget: raw truncation (opted out), and steered to a complete match (12
    # tokens, just above the shortest match) under the budget-aware mask.
    (
        "Person:",
        {
            "temperature": 0,
            "json_schema": PERSON_SCHEMA,
            "max_new_tokens": 7,
            "constraint_budget": False,
        },
    ),
    (
        "Person:",
        {"temperature": 0.7, "seed": 3, "json_schema": PERSON_SCHEMA, "max_new_tokens": 12},
    ),
    ("Pick one:", {"temperature": 1.0, "seed": 2, "choices": ["red", "blue", "green"]}),
    ("Numbers:", {"temperature": 0.8, "seed": 3, "ebnf": NUMBER_LIST_EBNF}),
    ("Say:", {"temperature": 0.7, "seed": 4, "regex": "[a-z ]{1,30}", "stop": [" a"]}),
    (SYSTEM + "What is a dict?", {"temperature": 0.7, "seed": 9}),
]


def generate_constrained(tiny_model_path, **options) -> list[tuple[list[int], dict]]:
    with make_engine(tiny_model_path, **options) as engine:
        prompts = [prompt for prompt, _ in CONSTRAINED]
        params = [{"max_new_tokens": 24, **p} for _, p in CONSTRAINED]
        if options.get("grammar_backend") == "outlines":  # EBNF needs llguidance
            params = [p for p in params if "ebnf" not in p]
            prompts = [q for q, p in zip(prompts, CONSTRAINED, strict=True) if "ebnf" not in p[1]]
        outputs = engine.generate(prompts, params)
        assert_drained_without_leaks(engine)
    return [(o["output_ids"], o["meta_info"]["finish_reason"]) for o in outputs]


@pytest.mark.parametrize(
    "options",
    [{}, {"grammar_backend": "outlines"}, {"enable_jump_forward": False}],
    ids=["llguidance_jump_forward", "outlines", "no_jump_forward"],
)
def test_constrained_outputs_equal_with_overlap_on_and_off(tiny_model_path, options):
    """Masks are filled after the launched step's forward, from matchers advanced by the
    step processed meanwhile, and a jump-forward found then drops the launched step's sample
    and sends its run with the next one: outputs must equal the non-overlapped schedule's."""
    plain = generate_constrained(tiny_model_path, enable_overlap_schedule=False, **options)
    overlapped = generate_constrained(tiny_model_path, enable_overlap_schedule=True, **options)
    assert overlapped == plain
    assert any(reason["type"] == "stop" for _, reason in plain)  # constraints completed


def test_constrained_decode_steps_are_overlapped(tiny_model_path):
    """A constrained request decodes with a step in flight (its mask filled while the
    forward runs), also with jump-forward on llguidance (its plans only append); with
    outlines' jump-forward (plans may retract the sampled token) it does not overlap."""
    from radixgen.runtime.request_schema import GenerateReq, SamplingParams
    from radixgen.runtime.scheduler import Scheduler
    from radixgen.runtime.server_args import ServerArgs

    for grammar_backend, jump_forward in (("llguidance", True), ("outlines", True)):
        args = ServerArgs(
            model_path=tiny_model_path,
            dtype="float32",
            enable_overlap_schedule=True,
            enable_jump_forward=jump_forward,
            grammar_backend=grammar_backend,
        )
        scheduler = Scheduler(args)
        params = {"max_new_tokens": 16, "temperature": 0, "json_schema": PERSON_SCHEMA}
        request = GenerateReq(
            rid="a", input_ids=list(range(10, 30)), sampling_params=SamplingParams.from_dict(params)
        )
        scheduler.add_request(request)
        outputs, steps_in_flight = [], 0
        while scheduler.has_work():
            outputs += scheduler.step()
            steps_in_flight += scheduler.inflight is not None
        assert outputs[-1].finished
        assert (steps_in_flight > 0) is (grammar_backend == "llguidance")
        scheduler.check_integrity()
        scheduler.shutdown()


def test_a_compiling_constraint_does_not_stop_the_overlap(tiny_model_path, monkeypatch):
    """While a waiting request's constraint compiles (here: until the test says so), the
    running constrained request keeps decoding with a step in flight; a failed compile fails
    that request alone."""
    from concurrent.futures import Future

    from radixgen.runtime.request_schema import GenerateReq, SamplingParams
    from radixgen.runtime.scheduler import Scheduler
    from radixgen.runtime.server_args import ServerArgs

    args = ServerArgs(model_path=tiny_model_path, dtype="float32", enable_overlap_schedule=True)
    scheduler = Scheduler(args)
    params = {"max_new_tokens": 40, "temperature": 0, "regex": "[0-9]{30}"}
    scheduler.add_request(
        GenerateReq(rid="a", input_ids=[5, 6, 7], sampling_params=SamplingParams.from_dict(params))
    )
    while scheduler.inflight is None:
        scheduler.step()
    compile_future: Future = Future()  # fault injection: a compile that runs until we end it
    backend = scheduler.grammar._get_backend()
    monkeypatch.setattr(backend, "compile_async", lambda spec, timeout_s: compile_future)
    params = {"max_new_tokens": 4, "regex": "[a-z]+"}
    scheduler.add_request(
        GenerateReq(rid="b", input_ids=[8, 9], sampling_params=SamplingParams.from_dict(params))
    )
    decoder, resolved = scheduler.overlap_decoder, []
    real_resolve = decoder.resolve
    monkeypatch.setattr(
        decoder,
        "resolve",
        lambda running: resolved.append(decoder.inflight) or real_resolve(running),
    )
    for _ in range(3):
        assert scheduler.step() and scheduler.inflight is not None
    compile_future.set_exception(ValueError("no such grammar"))
    outputs = scheduler.step()
    assert scheduler.inflight is not None
    assert not any(resolved)  # no step in flight was processed without a launch after it
    failed = [o for o in outputs if o.rid == "b"]
    assert failed and failed[0].finished and "no such grammar" in failed[0].error
    while scheduler.has_work():
        outputs += scheduler.step()
    assert outputs[-1].rid == "a" and outputs[-1].finished
    scheduler.check_integrity()
    scheduler.shutdown()
