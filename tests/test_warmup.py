"""Start-up warm-up (runtime/warmup.py): it runs real requests, then leaves no state behind;
the server refuses work with 503 "warming up" until the scheduler reports it done."""

import asyncio
import random

import httpx
import pytest
import zmq

from radixgen.runtime.scheduler import Scheduler
from radixgen.runtime.server.http_server import create_app
from radixgen.runtime.server.ipc import IpcPaths, connect_push
from radixgen.runtime.server.messages import ServedModelInfo, WarmupDone
from radixgen.runtime.server.metrics import ServerMetrics
from radixgen.runtime.server.tokenizer_manager import TokenizerManager
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.tokenizer import load_tokenizer
from radixgen.runtime.warmup import (
    CONSTRAINED_ROUNDS,
    SAMPLER_ROUNDS,
    WarmupPlan,
    warm_up,
    warmup_rounds,
)

PROMPT = [300 + i for i in range(12)]


def greedy_ids(scheduler: Scheduler) -> list[int]:
    from radixgen.runtime.request_schema import GenerateReq, SamplingParams

    request = GenerateReq(
        input_ids=PROMPT,
        sampling_params=SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True),
        rid="after-warmup",
    )
    scheduler.add_request(request)
    ids = []
    while scheduler.has_work():
        ids += [t for output in scheduler.step() for t in output.new_token_ids]
    return ids


def test_warm_up_runs_every_shape_then_leaves_no_state(tiny_model_path):
    server_args = ServerArgs(model_path=tiny_model_path, seed=3)
    scheduler = Scheduler(server_args)
    before = scheduler.get_stats()
    # The CUDA plan's rounds on the CPU (shorter prompts): extends of several lengths, a
    # round per sampler path, regex-constrained requests (the grammar backend and its masks).
    plan = WarmupPlan(prompt_lens=(8, 64, 200), sampler_paths=True, constrained=True)
    report = warm_up(scheduler, plan)
    # first (8), extends 64/200, a round per sampler and per constrained combination
    assert report.num_requests == 1 + 2 + len(SAMPLER_ROUNDS) + len(CONSTRAINED_ROUNDS)
    assert scheduler.get_stats() == before  # counters zeroed, every KV slot free
    assert scheduler.kv.free_size() == scheduler.kv.capacity
    assert scheduler.kv.tree.total_size() == 0
    assert scheduler.kv.tree.stats.num_lookup_tokens == 0
    assert not scheduler.reqs_by_rid and not scheduler.has_work()
    assert scheduler.batches.new_token_ratio == server_args.new_token_ratio
    # Warm-up requests carry seeds: unseeded user requests draw the same seeds as without it.
    assert scheduler.seed_rng.getstate() == random.Random(server_args.seed).getstate()
    scheduler.check_integrity()
    # The first request after warm-up computes its whole prompt (nothing cached) and decodes
    # as the model does.
    first = greedy_ids(scheduler)
    assert scheduler.get_stats().num_cached_tokens == 0
    assert len(first) == 6
    assert greedy_ids(scheduler) == first
    scheduler.shutdown()


def test_warm_up_refuses_a_busy_scheduler(tiny_model_path):
    from radixgen.runtime.request_schema import GenerateReq, SamplingParams

    scheduler = Scheduler(ServerArgs(model_path=tiny_model_path))
    scheduler.add_request(GenerateReq(input_ids=PROMPT, sampling_params=SamplingParams()))
    with pytest.raises(ValueError, match="idle"):
        warm_up(scheduler)
    scheduler.shutdown()


@pytest.mark.parametrize(
    "context_length,kv_capacity", [(64, 10_000), (4096, 300), (20, 30), (4096, 4), (4096, 1)]
)
def test_warmup_requests_fit_small_models(context_length, kv_capacity):
    rounds = warmup_rounds(
        WarmupPlan.for_device("cuda"),
        context_length=context_length,
        kv_capacity=kv_capacity,
        vocab_size=32000,
    )
    if kv_capacity < 2:  # not even one prompt token and one new token: nothing to run
        assert rounds == []
        return
    assert len(rounds[0]) == 1 and len(rounds[1]) >= 1

    def tokens(request) -> int:
        return len(request.input_ids) + request.sampling_params.max_new_tokens

    for requests in rounds:
        # A round fits the KV pool at once; each request fits half of it, and the context.
        assert sum(tokens(r) for r in requests) <= kv_capacity
        for request in requests:
            assert tokens(request) <= min(context_length, max(2, kv_capacity // 2))
            assert all(300 <= token < 32000 for token in request.input_ids)


def test_cuda_plan_has_a_prefix_free_round_for_the_hopper_extend_kernel():
    from radixgen.kernels.extend_attention_hopper import MIN_EXTEND_LEN

    rounds = warmup_rounds(
        WarmupPlan.for_device("cuda"), context_length=8192, kv_capacity=100_000, vocab_size=32000
    )
    fresh = [r for requests in rounds for r in requests if r.rid.startswith("warmup-fresh-")]
    assert [len(r.input_ids) for r in fresh] == [MIN_EXTEND_LEN]
    others = [r for requests in rounds for r in requests if r not in fresh]
    # No other warm-up prompt starts with its first token: the radix cache matches nothing,
    # so the round runs as one prefix-free extend of MIN_EXTEND_LEN tokens.
    assert all(r.input_ids[0] != fresh[0].input_ids[0] for r in others)


def test_an_engine_with_a_tiny_kv_pool_still_warms_up_and_starts(tiny_model_path):
    from radixgen.runtime.engine import Engine

    with Engine(model_path=tiny_model_path, max_total_tokens=4) as engine:
        assert engine.get_stats()["kv_free_slots"] == 4
        out = engine.generate(input_ids=[300], sampling_params={"max_new_tokens": 2})
        assert out["meta_info"]["completion_tokens"] >= 1


def test_health_is_503_warming_up_until_the_scheduler_reports_done(tiny_model_path):
    model_info = ServedModelInfo(
        model_path="tiny",
        served_model_name="tiny",
        context_length=256,
        vocab_size=32000,
        max_total_tokens=1024,
        max_running_requests=8,
    )
    ipc_paths = IpcPaths.create()
    manager = TokenizerManager(
        ServerArgs(), model_info, ipc_paths, load_tokenizer(tiny_model_path), ServerMetrics()
    )
    app = create_app(manager, api_key=None, process_ids={})
    context = zmq.Context()
    scheduler_side = connect_push(context, ipc_paths.tokenizer_input)

    async def scenario():
        manager.start()  # the app's lifespan does this inside uvicorn
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            health = await client.get("/health")
            assert health.status_code == 503
            assert "warming up" in health.json()["error"]["message"]
            refused = await client.post("/generate", json={"text": "hi"})
            assert refused.status_code == 503
            scheduler_side.send_pyobj(WarmupDone(num_requests=3, duration_s=0.5))
            for _ in range(200):
                if (await client.get("/health")).status_code == 200:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("/health never answered 200 after WarmupDone")

    try:
        asyncio.run(scenario())
    finally:
        scheduler_side.close()
        asyncio.run(manager.stop())
        ipc_paths.remove()


def compiled_kernel_variants() -> dict[str, int]:
    """Compiled variants of every Triton kernel in `radixgen.kernels`, by kernel name."""
    import importlib
    import pkgutil

    import triton

    import radixgen.kernels

    counts = {}
    for module_info in pkgutil.iter_modules(radixgen.kernels.__path__):
        module = importlib.import_module(f"radixgen.kernels.{module_info.name}")
        for name, value in vars(module).items():
            if isinstance(value, triton.runtime.jit.JITFunction):
                caches = getattr(value, "device_caches", None)
                if caches is None:
                    pytest.skip("this Triton keeps no per-device kernel cache")
                counts[f"{module_info.name}.{name}"] = sum(len(c[0]) for c in caches.values())
    return counts


@pytest.mark.gpu
def test_after_warm_up_common_requests_compile_no_kernel(tiny_model_path):
    import torch

    from radixgen.runtime.engine import Engine

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    with Engine(model_path=tiny_model_path) as engine:
        before = compiled_kernel_variants()
        assert sum(before.values()) > 0  # warm-up (and graph capture) compiled kernels
        prompts = [[300 + (7 * i + n) % 3000 for i in range(n)] for n in (5, 77, 700, 1500, 3000)]
        greedy = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
        sampled = {**greedy, "temperature": 0.8, "seed": 1}
        # The sampler takes one path per batch: one batch of each kind, as users send them.
        for params in (greedy, sampled, {**sampled, "top_p": 0.9, "top_k": 40}):
            engine.generate(input_ids=prompts, sampling_params=params)
        for params in (greedy, sampled):
            engine.generate(input_ids=prompts[:3], sampling_params={**params, "regex": "[a-z]+"})
        after = compiled_kernel_variants()
    late = {
        name: after[name] - before.get(name, 0)
        for name in after
        if after[name] > before.get(name, 0)
    }
    assert not late, f"compiled after warm-up (new variants per kernel): {late}"
