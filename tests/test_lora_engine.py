"""Multi-LoRA through the Engine on the `tiny` model: requests choose adapters (one per prompt of
a batch, mixed with the base model), more adapters than pool slots, the radix cache namespace
(prompt, adapter), run-time load/unload, and refusals naming the adapter."""

from __future__ import annotations

import pytest
import torch
import transformers
from lora_fixtures import save_random_adapter

from radixgen.runtime.engine import Engine

GREEDY = {"temperature": 0, "ignore_eos": True, "max_new_tokens": 6}
PROMPT = list(range(400, 440))  # token ids no other test of this module uses


@pytest.fixture(scope="module")
def adapters(tiny_model_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-lora")
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    # Strong random adapters (std 0.1 on A and B): greedy outputs differ from the base model's.
    return {
        name: str(save_random_adapter(base, root / name, kind, seed=seed))
        for name, kind, seed in [("a", "all", 1), ("b", "qv", 2), ("c", "all", 3)]
    }


@pytest.fixture(scope="module")
def engine(tiny_model_path, adapters):
    engine = Engine(
        model_path=tiny_model_path,
        dtype="float32",
        max_total_tokens=2048,
        lora_paths=[f"a={adapters['a']}", f"b={adapters['b']}"],
        max_loras_per_batch=2,
        lora_target_modules=["all"],
    )
    yield engine
    engine.shutdown()


def _ids(result):
    return [r["output_ids"] for r in result]


def test_batch_mixes_adapters_and_equals_single_requests(engine):
    prompts = [PROMPT[:12], PROMPT[:12], PROMPT[5:20], PROMPT[:12]]
    chosen = ["a", None, "b", "b"]
    batch = engine.generate(input_ids=prompts, sampling_params=GREEDY, lora_path=chosen)
    singles = [
        engine.generate(input_ids=p, sampling_params=GREEDY, lora_path=name)["output_ids"]
        for p, name in zip(prompts, chosen, strict=True)
    ]
    assert _ids(batch) == singles
    # The same prompt under adapter a, the base model and adapter b: three different outputs.
    assert len({tuple(singles[0]), tuple(singles[1]), tuple(singles[3])}) == 3
    engine.check_integrity()


def test_cache_namespace_is_prompt_and_adapter(engine):
    params = {**GREEDY, "max_new_tokens": 2}
    prompt = list(range(450, 490))  # cached in no namespace yet

    def cached(name):
        result = engine.generate(input_ids=prompt, sampling_params=params, lora_path=name)
        return result["meta_info"]["cached_tokens"]

    # First time under each adapter (and the base model): the prefix is computed; then hits.
    assert [cached("a"), cached("b"), cached(None)] == [0, 0, 0]
    assert [cached("a"), cached("b"), cached(None)] == [len(prompt) - 1] * 3
    engine.check_integrity()


def test_more_adapters_than_slots_wait_for_a_slot(engine, adapters):
    assert engine.load_lora_adapter("c", adapters["c"]) == ["a", "b", "c"]
    prompts = [PROMPT[i : i + 8] for i in range(6)]
    chosen = ["a", "b", "c", "c", "b", "a"]  # three adapters, two slots
    batch = engine.generate(input_ids=prompts, sampling_params=GREEDY, lora_path=chosen)
    for prompt, name, result in zip(prompts, chosen, batch, strict=True):
        single = engine.generate(input_ids=prompt, sampling_params=GREEDY, lora_path=name)
        assert result["output_ids"] == single["output_ids"]
    assert engine.unload_lora_adapter("c") == ["a", "b"]
    engine.check_integrity()


def test_unknown_adapters_and_bad_loads_are_refused(engine, adapters, tmp_path):
    with pytest.raises(ValueError, match="'nope' is not loaded"):
        engine.generate(input_ids=PROMPT[:4], sampling_params=GREEDY, lora_path="nope")
    with pytest.raises(ValueError, match="lora_path has 1 entries for 2 prompts"):
        engine.generate(input_ids=[PROMPT[:4]] * 2, sampling_params=GREEDY, lora_path=["a"])
    with pytest.raises(ValueError, match="already loaded"):
        engine.load_lora_adapter("a", adapters["a"])
    with pytest.raises(ValueError, match="no adapter_config.json"):
        engine.load_lora_adapter("d", str(tmp_path))
    with pytest.raises(ValueError, match="'d' is not loaded"):
        engine.unload_lora_adapter("d")
    # Nothing changed: the adapters still serve.
    assert engine.generate(input_ids=PROMPT[:4], sampling_params=GREEDY, lora_path="a")
    engine.check_integrity()


@pytest.mark.parametrize(
    "algorithm, draft, as_decode_rows",
    [
        ("STANDALONE", "tiny-itself", False),
        ("EAGLE", "tiny-eagle", True),
        # CUDA: the default rule, decode rows replayed in the decode graphs with their slots.
        pytest.param("EAGLE", "tiny-eagle", None, marks=pytest.mark.gpu),
    ],
)
def test_speculative_decoding_keeps_each_adapters_outputs(
    engine, tiny_model_path, adapters, algorithm, draft, as_decode_rows
):
    """Verify forwards run under each request's adapter (drafts come from the base draft
    model or head): greedy outputs equal plain decoding's, verified as an extend batch or as
    decode rows (None: as the decoder chooses)."""
    prompts = [PROMPT[:12], PROMPT[:12], PROMPT[5:20]]
    chosen = ["a", None, "b"]
    params = dict(GREEDY, max_new_tokens=16)
    expected = _ids(engine.generate(input_ids=prompts, sampling_params=params, lora_path=chosen))
    with Engine(
        model_path=tiny_model_path,
        dtype="float32",
        max_total_tokens=2048,
        lora_paths=[f"a={adapters['a']}", f"b={adapters['b']}"],
        lora_target_modules=["all"],
        speculative_algorithm=algorithm,
        speculative_draft_model_path=tiny_model_path if draft == "tiny-itself" else draft,
        speculative_num_steps=3,
        speculative_min_accept_length=0,  # verify every step, however few drafts pass
    ) as speculative:
        speculative._scheduler.speculative.verify_as_decode_rows = as_decode_rows
        outputs = speculative.generate(input_ids=prompts, sampling_params=params, lora_path=chosen)
        stats = speculative.get_stats()
        speculative.check_integrity()
    assert _ids(outputs) == expected
    assert stats["num_spec_verify_steps"] > 0


def test_lora_off_refuses_adapter_requests(tiny_model_path):
    with Engine(model_path=tiny_model_path, dtype="float32", max_total_tokens=256) as engine:
        with pytest.raises(ValueError, match="LoRA is off"):
            engine.generate(input_ids=PROMPT[:4], sampling_params=GREEDY, lora_path="a")


def test_dsl_gen_lora_path_and_program_default(engine):
    import radixgen as rg

    @rg.function
    def two_steps(s):
        s += "def add(a, b):"
        s += rg.gen("default", max_tokens=4, ignore_eos=True)  # the run's adapter
        s += rg.gen("override", max_tokens=4, ignore_eos=True, lora_path="b")

    state = two_steps.run(temperature=0.0, lora_path="a", backend=engine)
    greedy = {"temperature": 0, "ignore_eos": True, "max_new_tokens": 4}
    first = engine.generate("def add(a, b):", greedy, lora_path="a")
    assert state["default"] == first["text"]
    second = engine.generate("def add(a, b):" + first["text"], greedy, lora_path="b")
    assert state["override"] == second["text"]
    with pytest.raises(ValueError, match="lora_path must be a non-empty string"):
        rg.gen("x", lora_path="")

    @rg.function
    def picks(s):
        s += "Answer:" + rg.select("x", choices=["yes", "no"])

    with pytest.raises(NotImplementedError, match="rg.gen\\(choices"):
        picks.run(lora_path="a", backend=engine)


def test_warm_up_runs_the_lora_kernels_then_leaves_no_slot_in_use(tiny_model_path, adapters):
    from radixgen.runtime.scheduler import Scheduler
    from radixgen.runtime.server_args import ServerArgs
    from radixgen.runtime.warmup import WarmupPlan, warm_up

    scheduler = Scheduler(
        ServerArgs(model_path=tiny_model_path, dtype="float32", lora_paths=[f"a={adapters['a']}"])
    )
    plan = WarmupPlan(prompt_lens=(8, 40), sampler_paths=False, constrained=False)
    report = warm_up(scheduler, plan)
    # first (8 tokens) and the 40-token extend, then both again under adapter a
    assert report.num_requests == 2 + 2
    pool = scheduler.runner.lora_manager.pool
    assert pool.in_use == {} and pool.slot_of == {"a": 0}  # loaded, idle, evictable
    scheduler.check_integrity()
    scheduler.shutdown()
