"""In-batch prefix sharing: requests submitted together that share a prompt prefix compute
it once, and a prompt is in the radix cache right after its prefill."""

from __future__ import annotations

import random

import pytest

from radixgen.radix_cache.memory_pool import ReqToTokenPool, SlotAllocator
from radixgen.radix_cache.radix_cache import RadixCache
from radixgen.runtime.batch_builder import InBatchPrefixIndex
from radixgen.runtime.engine import Engine
from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.req import Req
from radixgen.runtime.request_schema import GenerateReq, SamplingParams
from radixgen.runtime.scheduler import Scheduler
from radixgen.runtime.server_args import ServerArgs

GROUPS, PER_GROUP, SYSTEM_LEN, QUESTION_LEN = 4, 4, 128, 8
GREEDY = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}


def shared_prefix_prompts() -> list[list[int]]:
    rng = random.Random(0)
    prompts = []
    for _ in range(GROUPS):
        system = [rng.randrange(10, 30000) for _ in range(SYSTEM_LEN)]
        prompts += [
            system + [rng.randrange(10, 30000) for _ in range(QUESTION_LEN)]
            for _ in range(PER_GROUP)
        ]
    rng.shuffle(prompts)  # groups interleaved, as a server receives them
    return prompts


def run_all_at_once(path: str, **options) -> tuple[list[list[int]], dict]:
    engine = Engine(model_path=path, dtype="float32", max_total_tokens=4096, **options)
    try:
        outputs = engine.generate(input_ids=shared_prefix_prompts(), sampling_params=GREEDY)
        engine.check_integrity()
        return [o["output_ids"] for o in outputs], engine.get_stats()
    finally:
        engine.shutdown()


def test_shared_prompt_is_computed_once_per_group(tiny_model_path):
    outputs, stats = run_all_at_once(tiny_model_path)
    ideal = GROUPS * SYSTEM_LEN + GROUPS * PER_GROUP * QUESTION_LEN
    # Random questions may share a first token by chance: a little less is fine.
    assert ideal - GROUPS * PER_GROUP <= stats["num_computed_prefill_tokens"] <= ideal
    assert stats["cache_hit_rate"] >= 1 - ideal / stats["num_prompt_tokens"] - 0.01

    # Without deferral every request of the one batch computes its whole prompt; the
    # outputs do not depend on the schedule.
    plain_outputs, plain = run_all_at_once(tiny_model_path, in_batch_prefix_min_tokens=0)
    assert plain["num_computed_prefill_tokens"] > 3 * stats["num_computed_prefill_tokens"]
    assert plain_outputs == outputs


def test_prompt_is_cached_right_after_its_prefill(tiny_model_path):
    args = ServerArgs(model_path=tiny_model_path, dtype="float32", max_total_tokens=512)
    scheduler = Scheduler(args)
    prompt = list(range(40, 90))
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    scheduler.add_request(GenerateReq(rid="first", input_ids=prompt, sampling_params=params))
    scheduler.step()  # the prefill; the request now decodes
    assert scheduler.kv.tree.total_size() == len(prompt)
    # A request arriving now reuses the prompt although the first has not finished.
    scheduler.add_request(GenerateReq(rid="second", input_ids=prompt + [7], sampling_params=params))
    outputs = []
    while scheduler.has_work():
        outputs += scheduler.step()
    second = [o for o in outputs if o.rid == "second" and o.finished][0]
    assert second.cached_tokens == len(prompt)
    scheduler.check_integrity()


def make_req(ids: list[int], arrival_s: float = 0.0, namespace: str | None = None) -> Req:
    return Req(
        rid="r",
        index=0,
        origin_input_ids=ids,
        sampling_params=SamplingParams(max_new_tokens=4),
        sampling_seed=0,
        eos_token_ids=frozenset(),
        arrival_time_s=arrival_s,
        cache_namespace=namespace,
    )


@pytest.fixture
def kv() -> KVCacheManager:
    allocator = SlotAllocator(512)
    tree = RadixCache(allocator)
    for cached in (list(range(100, 110)), list(range(200, 210))):
        tree.insert(cached, allocator.alloc(len(cached)))
    return KVCacheManager(ReqToTokenPool(8, 256), allocator, tree)


def admitted(kv: KVCacheManager, ids: list[int], namespace: str | None = None) -> Req:
    req = make_req(ids, namespace=namespace)
    assert kv.admit(req)
    req.extend_input_len = req.seqlen - req.kv_committed_len
    return req


def test_deferral_needs_the_same_cached_prefix_and_enough_new_tokens(kv):
    shared = list(range(1000, 1040))
    leader = admitted(kv, list(range(100, 110)) + shared + [1])
    index = InBatchPrefixIndex(kv, min_tokens=32, max_wait_s=5.0, now_s=1.0)
    index.add_admitted(leader)
    assert index.should_defer(make_req(list(range(100, 110)) + shared + [2]))
    # The same uncached tokens after another cached prefix: nothing to gain.
    assert not index.should_defer(make_req(list(range(200, 210)) + shared + [2]))
    # Fewer than 32 shared uncached tokens.
    assert not index.should_defer(make_req(list(range(100, 110)) + shared[:20] + [9] * 20))
    # Only 31 tokens past the cached prefix could come from the cache (the last token is
    # always computed).
    assert not index.should_defer(make_req(list(range(100, 110)) + shared[:32]))
    kv.release(leader)


def test_overdue_request_is_deferred_at_most_once(kv):
    leader = admitted(kv, list(range(1000, 1100)))
    late = make_req(list(range(1000, 1050)), arrival_s=0.0)
    index = InBatchPrefixIndex(kv, min_tokens=32, max_wait_s=5.0, now_s=10.0)
    index.add_admitted(leader)
    assert index.should_defer(late)  # overdue, but never deferred: once more
    assert not index.should_defer(late)
    fresh = make_req(list(range(1000, 1050)), arrival_s=9.0)
    assert index.should_defer(fresh) and index.should_defer(fresh)  # within the bound
    assert not InBatchPrefixIndex(kv, min_tokens=0, max_wait_s=5.0, now_s=10.0).enabled
    kv.release(leader)


def test_deferral_groups_only_requests_of_one_cache_namespace(kv):
    shared = list(range(1000, 1040))
    leader = admitted(kv, shared + [1], namespace="tenant-a")
    index = InBatchPrefixIndex(kv, min_tokens=32, max_wait_s=5.0, now_s=1.0)
    index.add_admitted(leader)
    assert index.should_defer(make_req(shared + [2], namespace="tenant-a"))
    # The same tokens in another namespace (or the default one) would not be reused.
    assert not index.should_defer(make_req(shared + [2], namespace="tenant-b"))
    assert not index.should_defer(make_req(shared + [2]))
    kv.release(leader)
    kv.check_integrity([])
