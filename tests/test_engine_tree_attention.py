"""Tree decode attention inside the engine: the grouping read from the radix cache, and greedy
outputs unchanged with it on and off (tiny model, Triton backend; CPU: the interpreter, on a
two-layer model of tiny's shape)."""

from __future__ import annotations

import random

import pytest
import torch

from radixgen.kernels.tree_decode_plan import SharedSegment, build_tree_decode_plan
from radixgen.runtime.attention import tree_grouping
from radixgen.runtime.attention.tree_grouping import shared_prefix_segments
from radixgen.runtime.engine import Engine
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.request_schema import GenerateReq, SamplingParams
from radixgen.runtime.scheduler import Scheduler
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.tiny_model import TINY_CONFIG, write_random_model

GREEDY = {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}  # one decode step

SYSTEM_LEN = 20  # the Triton interpreter is slow: short prompts, a lower sharing threshold


@pytest.fixture(autouse=True)
def share_short_prefixes(monkeypatch):
    monkeypatch.setattr(tree_grouping, "MIN_SHARED_TOKENS", SYSTEM_LEN)
    monkeypatch.setattr(tree_grouping, "MIN_SAVED_READ_FRACTION", 0.0)


@pytest.fixture(scope="module")
def two_layer_model_path(tmp_path_factory) -> str:
    """tiny's shape and tokenizer with two random layers: the interpreter runs each attention
    kernel once a layer (~1.4 s a layer on 2 cores), and two layers still reuse one tree plan."""
    folder = tmp_path_factory.mktemp("two-layer")
    write_random_model(folder, {**TINY_CONFIG, "num_hidden_layers": 2}, seed=0)
    return str(folder)


def forked_prompts(seed: int = 0) -> tuple[list[list[int]], list[str | None]]:
    """Two levels of sharing: a system prompt, two sub-groups of two adding 4 more tokens, then
    a short question; and the same system prompt under a cache salt (it must not share with the
    default namespace: that request shares nothing)."""
    rng = random.Random(seed)

    def tokens(n):
        return [rng.randrange(10, 30000) for _ in range(n)]

    system = tokens(SYSTEM_LEN)
    prompts, salts = [], []
    for _ in range(2):
        sub = tokens(4)
        prompts += [system + sub + tokens(rng.randint(1, 3)) for _ in range(2)]
        salts += [None] * 2
    prompts.append(system + tokens(3))
    salts.append("tenant-b")
    order = list(range(len(prompts)))
    rng.shuffle(order)
    return [prompts[i] for i in order], [salts[i] for i in order]


def run_engine(path: str, sampling_params=GREEDY, **options) -> tuple[list[dict], dict]:
    """The outputs of `forked_prompts()` (with the top 5 logprobs of each step) and the
    engine's stats."""
    # No warm-up: on the CPU its decode steps would run the Triton interpreter for ~10 s.
    engine = Engine(
        model_path=path, dtype="float32", max_total_tokens=2048, skip_warmup=True, **options
    )
    try:
        prompts, salts = forked_prompts()
        outputs = engine.generate(
            input_ids=prompts,
            sampling_params=sampling_params,
            cache_salt=salts,
            return_logprob=True,
            top_logprobs_num=5,
        )
        engine.check_integrity()
        return outputs, engine.get_stats()
    finally:
        engine.shutdown()


def output_ids(outputs: list[dict]) -> list[list[int]]:
    return [output["output_ids"] for output in outputs]


@pytest.fixture(scope="module")
def reference_run(two_layer_model_path) -> tuple[list[dict], dict]:
    """The torch reference backend's outputs (plain decode attention) and stats."""
    return run_engine(two_layer_model_path, attention_backend="torch")


def assert_same_as_reference(outputs: list[dict], reference: list[dict]) -> None:
    assert output_ids(outputs) == output_ids(reference)
    # A random model's greedy token mostly repeats its input (the residual stream dominates),
    # so the decode step's top logprobs, which attention moves, are compared too.
    for got, expected in zip(outputs, reference, strict=True):
        got_top = got["meta_info"]["output_top_logprobs"][-1]
        expected_top = expected["meta_info"]["output_top_logprobs"][-1]
        assert [token for _, token, *_ in got_top] == [token for _, token, *_ in expected_top]
        errors = [abs(a[0] - b[0]) for a, b in zip(got_top, expected_top, strict=True)]
        assert max(errors) < 1e-4, (got_top, expected_top)


def test_tree_attention_engine_outputs_equal_the_reference(two_layer_model_path, reference_run):
    """The Triton backend (interpreter on CPU) with tree attention on gives the greedy outputs
    of the torch reference backend (plain decode attention), and its logprobs."""
    with_tree, stats = run_engine(
        two_layer_model_path, attention_backend="triton", enable_tree_attention=True
    )
    reference, reference_stats = reference_run
    assert stats["num_tree_attention_steps"] == 1  # the decode step
    assert reference_stats["num_tree_attention_steps"] == 0
    assert_same_as_reference(with_tree, reference)


# Slow: two gloo ranks under the Triton interpreter, 26 s of a suite near 10 minutes on the
# 2-core machine (twelfth session); `make test-slow` runs it.
@pytest.mark.slow
def test_tree_attention_under_tensor_parallelism(two_layer_model_path, reference_run):
    """TP 2 (gloo) with tree attention (the default on CUDA): rank 0 groups the batch, its batch
    header carries the shared prefixes to the follower, each rank attends over two of the four
    KV heads; the outputs equal one process's plain decode."""
    with_tree, stats = run_engine(
        two_layer_model_path, attention_backend="triton", enable_tree_attention=True, tp_size=2
    )
    assert stats["num_tree_attention_steps"] == 1
    assert_same_as_reference(with_tree, reference_run[0])


@pytest.mark.slow
def test_greedy_outputs_unchanged_by_tree_attention(tiny_model_path):
    with_tree, stats = run_engine(
        tiny_model_path, attention_backend="triton", enable_tree_attention=True
    )
    without, plain_stats = run_engine(tiny_model_path, attention_backend="triton")
    assert stats["num_tree_attention_steps"] > 0
    assert plain_stats["num_tree_attention_steps"] == 0
    assert output_ids(with_tree) == output_ids(without)


def test_tree_attention_defaults_to_cuda_only(tiny_model_path):
    """None (the default) turns tree attention on for CUDA alone; the CPU runs it when asked."""
    common = dict(model_path=tiny_model_path, device="cpu", max_total_tokens=256)
    assert ServerArgs(model_path=tiny_model_path).enable_tree_attention is None
    default = ModelRunner(ServerArgs(**common, attention_backend="triton"))
    assert not default.tree_attention_enabled
    asked = ModelRunner(
        ServerArgs(**common, attention_backend="triton", enable_tree_attention=True)
    )
    assert asked.tree_attention_enabled
    torch_backend = ModelRunner(
        ServerArgs(**common, attention_backend="torch", enable_tree_attention=True)
    )
    assert not torch_backend.tree_attention_enabled  # the plain reference backend


def test_grouping_follows_the_radix_tree_and_namespaces(tiny_model_path):
    """After the prefills, the running batch's segments are the tree's shared nodes: rows of
    one namespace only, slots equal in every member's req_to_token row, multi-level."""
    args = ServerArgs(model_path=tiny_model_path, dtype="float32", max_total_tokens=2048)
    scheduler = Scheduler(args)
    prompts, salts = forked_prompts(seed=1)
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    for i, (prompt, salt) in enumerate(zip(prompts, salts, strict=True)):
        request = GenerateReq(rid=str(i), input_ids=prompt, sampling_params=params, cache_salt=salt)
        scheduler.add_request(request)
    running = []
    for _ in range(20):
        scheduler.step()
        running = scheduler.batches.running.reqs
        if len(running) == len(prompts):
            break
    assert len(running) == len(prompts)
    segments = shared_prefix_segments(running, min_shared_tokens=SYSTEM_LEN)
    assert segments is not None
    req_to_token = scheduler.kv.req_to_token_pool.req_to_token
    levels = [0] * len(running)
    for segment in segments:
        assert len(segment.members) >= 2
        assert len({running[m].cache_namespace for m in segment.members}) == 1
        expected = req_to_token[segment.kv_row, segment.start : segment.end]
        for member in segment.members:
            row = running[member].req_pool_idx
            assert torch.equal(req_to_token[row, segment.start : segment.end], expected)
            levels[member] += 1
    assert max(levels) == 2  # system prompt, then the sub-group's prefix
    assert sorted(len(s.members) for s in segments) == [2, 2, 4]
    salted = [m for m, req in enumerate(running) if req.cache_namespace == "tenant-b"]
    assert salted and not any(salted[0] in s.members for s in segments)
    # Raising the bar above every shared prefix turns the tree path off.
    assert shared_prefix_segments(running, min_shared_tokens=1000) is None
    # So does sharing that saves less than the asked fraction of the plain kernel's reads.
    saved = sum((len(s.members) - 1) * (s.end - s.start) for s in segments)
    reads = sum(req.seqlen for req in running)
    for fraction, takes_tree in ((saved / reads - 0.01, True), (saved / reads + 0.01, False)):
        kept = shared_prefix_segments(
            running, min_shared_tokens=SYSTEM_LEN, min_saved_fraction=fraction
        )
        assert (kept == segments) if takes_tree else kept is None


@pytest.mark.gpu
@pytest.mark.parametrize("disable_cuda_graph", [False, True])
def test_greedy_outputs_unchanged_by_tree_attention_cuda(tiny_model_path, disable_cuda_graph):
    """CUDA, with and without CUDA graphs (overlap schedule on): 24 tokens, tree on and off."""
    options = dict(device="cuda", attention_backend="triton", disable_cuda_graph=disable_cuda_graph)
    params = {**GREEDY, "max_new_tokens": 24}
    with_tree, stats = run_engine(tiny_model_path, params, enable_tree_attention=True, **options)
    without, plain = run_engine(tiny_model_path, params, enable_tree_attention=False, **options)
    assert stats["num_tree_attention_steps"] > 0 and plain["num_tree_attention_steps"] == 0
    _, default = run_engine(tiny_model_path, params, **options)
    assert default["num_tree_attention_steps"] > 0  # on by default on CUDA
    # fp32 dots run as TF32 on the GPU and the two paths sum in another order: a near tie may
    # flip one sequence's greedy token; the others must be identical.
    same = sum(a == b for a, b in zip(output_ids(with_tree), output_ids(without), strict=True))
    assert same >= len(without) - 1, (with_tree, without)


def test_graph_plan_is_filled_in_place_and_refused_when_too_big(tiny_model_path):
    """The CUDA-graph side of the backend, on the CPU: a static plan of fixed capacity takes any
    grouping that fits (refilled only when the grouping changes) and refuses one that does not
    (the graph runner then replays the plain graph)."""
    runner = ModelRunner(
        ServerArgs(
            model_path=tiny_model_path,
            device="cpu",
            attention_backend="triton",
            enable_tree_attention=True,
            max_total_tokens=256,
            max_running_requests=8,
        )
    )
    backend = runner.attn_backend
    forward_batch = runner.build_forward_batch(
        mode=ForwardMode.DECODE,
        input_ids=[[5]] * 4,
        req_pool_indices=[0, 1, 2, 3],
        prefix_lens=[20] * 4,
        out_cache_loc=runner.slot_allocator.alloc(4),
    )
    metadata = backend.make_graph_tree_metadata(forward_batch)
    static = metadata.plan
    assert static.num_items == 0 and not static.packed.any()  # captured with no sharing

    fits = (SharedSegment(kv_row=1, start=0, end=12, members=(0, 1, 3)),)
    assert backend.fill_graph_tree_plan(metadata, fits)
    options = dict(
        batch_size=4,
        group_size=2,
        num_kv_heads=4,
        device=torch.device("cpu"),
        members_per_item=static.members_per_item,
        max_items=static.max_items,
        max_entries=static.max_entries,
    )
    assert torch.equal(static.packed, build_tree_decode_plan(fits, **options).packed)
    static.packed.zero_()
    assert backend.fill_graph_tree_plan(metadata, fits)  # unchanged grouping: not rebuilt
    assert not static.packed.any()

    # One shared segment per position: more items than the capacity, whatever the chunking.
    too_many = tuple(SharedSegment(0, p, p + 1, (0, 1)) for p in range(static.max_items + 1))
    assert not backend.fill_graph_tree_plan(metadata, too_many)
