"""The Scheduler interface the server drives, and the scheduling policies."""

from __future__ import annotations

import pytest
import torch

from radixgen.radix_cache.memory_pool import ReqToTokenPool, SlotAllocator
from radixgen.radix_cache.radix_cache import RadixCache
from radixgen.runtime.io_struct import TokenizedGenerateReq
from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.req import Req
from radixgen.runtime.sampling_params import SamplingParams
from radixgen.runtime.schedule_policy import SchedulePolicy
from radixgen.runtime.scheduler import Scheduler
from radixgen.runtime.server_args import ServerArgs


def make_req(rid: str, ids: list[int], arrival_s: float = 0.0) -> Req:
    return Req(
        rid=rid,
        index=0,
        origin_input_ids=ids,
        sampling_params=SamplingParams(),
        sampling_seed=0,
        eos_token_ids=frozenset(),
        arrival_time_s=arrival_s,
    )


@pytest.fixture
def kv():
    allocator = SlotAllocator(256)
    tree = RadixCache(allocator)
    hot = list(range(100, 140))
    tree.insert(hot, allocator.alloc(len(hot)))
    branch = hot[:10] + list(range(200, 220))
    tree.insert(branch, allocator.alloc(20)[: len(branch)].repeat(2)[: len(branch)])
    return KVCacheManager(ReqToTokenPool(8, 128), allocator, tree)


def test_lpm_puts_longest_cached_prefix_first_and_aging_overrides(kv):
    cold = make_req("cold", [1, 2, 3, 4], arrival_s=0.0)
    warm = make_req("warm", list(range(100, 110)) + [7, 8], arrival_s=1.0)
    hot = make_req("hot", list(range(100, 140)) + [9], arrival_s=2.0)
    policy = SchedulePolicy("lpm", max_wait_s=5.0, kv=kv)
    assert [r.rid for r in policy.order([cold, warm, hot], now_s=3.0)] == ["hot", "warm", "cold"]
    # Past the aging bound the cold request goes first, whatever its prefix.
    assert [r.rid for r in policy.order([cold, warm, hot], now_s=5.5)][0] == "cold"


def test_fcfs_keeps_arrival_order(kv):
    reqs = [make_req("a", [1, 2]), make_req("b", list(range(100, 140)) + [1])]
    assert SchedulePolicy("fcfs", 5.0, kv).order(reqs, now_s=0.0) == reqs


def test_dfs_weight_groups_requests_of_the_same_subtree(kv):
    branch = list(range(100, 110)) + list(range(200, 220))
    a1 = make_req("a1", list(range(100, 140)) + [1])
    b1 = make_req("b1", branch + [1])
    other = make_req("other", [5, 6, 7])
    a2 = make_req("a2", list(range(100, 140)) + [2])
    b2 = make_req("b2", branch + [2])
    b3 = make_req("b3", branch + [3])
    order = [
        r.rid for r in SchedulePolicy("dfs-weight", 5.0, kv).order([a1, b1, other, a2, b2, b3], 0.0)
    ]
    # Pre-order: requests at a node before its subtrees; the heavier subtree (three b
    # requests) before the lighter one; requests of one subtree stay together.
    assert order == ["other", "b1", "b2", "b3", "a1", "a2"]


@pytest.fixture(scope="module")
def scheduler(tiny_model_path):
    return Scheduler(
        ServerArgs(
            model_path=tiny_model_path, dtype="float32", max_total_tokens=512, max_queued_requests=4
        )
    )


def drain(scheduler: Scheduler) -> list:
    outputs = []
    while scheduler.has_work():
        outputs += scheduler.step()
    return outputs


def greedy(max_new_tokens: int = 4) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)


def test_outputs_stream_every_step_and_finish_once(scheduler):
    scheduler.add_request(TokenizedGenerateReq("s1", [5, 6, 7], greedy(4)))
    outputs = drain(scheduler)
    assert [len(o.new_token_ids) for o in outputs] == [1, 1, 1, 1]
    assert [o.finished for o in outputs] == [False, False, False, True]
    assert outputs[-1].completion_tokens == 4
    scheduler.check_integrity()


def test_bad_requests_get_error_outputs_not_exceptions(scheduler):
    scheduler.add_request(TokenizedGenerateReq("bad1", [], greedy()))
    scheduler.add_request(TokenizedGenerateReq("bad2", [1], greedy(10**5)))
    scheduler.add_request(TokenizedGenerateReq("bad3", [1], SamplingParams(top_p=7.0)))
    outputs = {o.rid: o for o in drain(scheduler)}
    assert "input_ids" in outputs["bad1"].error
    assert "max_new_tokens" in outputs["bad2"].error
    assert "top_p" in outputs["bad3"].error
    assert all(o.finished and o.finish_reason["type"] == "abort" for o in outputs.values())


def test_queue_limit_and_duplicate_ids(scheduler):
    for i in range(3):
        scheduler.add_request(TokenizedGenerateReq(f"q{i}", [3, 4, 5], greedy(2)))
    scheduler.add_request(TokenizedGenerateReq("q0", [3], greedy(2)))
    scheduler.add_request(TokenizedGenerateReq("q3", [3, 4], greedy(2)))
    scheduler.add_request(TokenizedGenerateReq("q-over", [3], greedy(2)))
    outputs = drain(scheduler)
    errors = {o.rid: o.error for o in outputs if o.error}
    assert "queue is full" in errors["q-over"]
    assert "duplicate request id" in errors["q0"]
    assert sum(o.finished and not o.error for o in outputs) == 4
    scheduler.check_integrity()


def test_abort_waiting_and_running_requests_frees_kv(scheduler):
    scheduler.add_request(TokenizedGenerateReq("run", list(range(10, 40)), greedy(50)))
    scheduler.step()  # prefill: now running
    scheduler.step()
    scheduler.add_request(TokenizedGenerateReq("wait", [1, 2, 3], greedy(5)))
    assert not scheduler.flush_cache()  # refused while busy
    scheduler.abort_request("run")
    scheduler.abort_request("wait")
    outputs = drain(scheduler)
    finished = {o.rid: o.finish_reason for o in outputs if o.finished}
    assert finished == {
        "run": {"type": "abort", "message": "aborted"},
        "wait": {"type": "abort", "message": "aborted"},
    }
    scheduler.check_integrity()
    stats = scheduler.get_stats()
    assert stats.num_running_reqs == stats.num_queued_reqs == 0
    assert stats.kv_free_slots + stats.kv_cached_slots == stats.kv_total_slots
    assert scheduler.flush_cache()
    assert scheduler.get_stats().kv_free_slots == stats.kv_total_slots


def test_integrity_check_detects_a_leak(scheduler):
    slots = scheduler.kv.slot_allocator.alloc(3)
    with pytest.raises(AssertionError, match="KV leak"):
        scheduler.check_integrity()
    scheduler.kv.slot_allocator.free(slots)
    scheduler.check_integrity()
    assert isinstance(slots, torch.Tensor)
