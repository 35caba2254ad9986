"""Jump-forward in the engine: a forced run is one multi-token row of the running batch's
next forward (no step of its own), with and without the overlapped schedule; outputs, KV
accounting and penalty counts do not depend on the schedule."""

from __future__ import annotations

import time

import pytest
import torch

from tests.test_engine_equivalence import (
    PERSON_SCHEMA,
    QUESTIONS,
    assert_drained_without_leaks,
    make_engine,
)

JUMP_PROMPTS = QUESTIONS[:4]
# One constraint, compiled before the first step (`make_jump_scheduler`), so one extend
# admits all four. Penalties count the jumped runs too (as a resumed request recounts).
JUMP_PARAMS = [
    {"max_new_tokens": 30, "temperature": 0.8, "seed": seed, "json_schema": PERSON_SCHEMA}
    for seed in range(2)
] + [
    {"max_new_tokens": 30, "temperature": 0, "json_schema": PERSON_SCHEMA},
    {"max_new_tokens": 30, "temperature": 0.9, "seed": 5, "json_schema": PERSON_SCHEMA,
     "frequency_penalty": 1.5, "repetition_penalty": 1.5},
]  # fmt: skip


def make_jump_scheduler(tiny_model_path, **options):
    from radixgen.runtime.request_schema import GenerateReq, SamplingParams
    from radixgen.runtime.scheduler import Scheduler
    from radixgen.runtime.server_args import ServerArgs

    args = ServerArgs(
        model_path=tiny_model_path, dtype="float32", enable_jump_forward=True, **options
    )
    scheduler = Scheduler(args)
    for i, (prompt, params) in enumerate(zip(JUMP_PROMPTS, JUMP_PARAMS, strict=True)):
        request = GenerateReq(
            rid=str(i),
            input_ids=scheduler.tokenizer.encode(prompt),
            sampling_params=SamplingParams.from_dict(params),
        )
        scheduler.add_request(request)
    # Compiled before the first step, so one extend admits all four.
    waiting = list(scheduler.batches.waiting)
    while not all(req.grammar_ready for req in waiting):
        for req in waiting:
            assert scheduler.grammar.poll(req) is None
        time.sleep(0.01)
    return scheduler


def assert_penalty_counts_follow_outputs(scheduler) -> None:
    """The running batch's penalty counts are its outputs' token counts (jumped runs
    included), plus the sample in flight of each row whose sample will be kept."""
    running, inflight = scheduler.batches.running, scheduler.inflight
    counts = running.sampling_info.output_counts
    if counts is None:  # freed with the last row that uses penalties
        assert not any(r.sampling_params.frequency_penalty for r in running.reqs)
        return
    for row, req in enumerate(running.reqs):
        if req.finished:
            continue  # a wasted row
        expected = torch.bincount(torch.tensor(req.output_ids), minlength=counts.shape[1])
        if inflight is not None and row not in inflight.stale_rows:
            expected[inflight.host_token_ids[row]] += 1
        assert torch.equal(counts[row], expected.to(counts.dtype)), req.rid


def test_jump_forward_runs_inside_the_decode_batch(tiny_model_path):
    """A jumped request's forced run is one multi-token row of the running batch's next
    forward: every forward samples every running request, so no step is spent on the run."""
    from radixgen.runtime.req import ReqStatus

    scheduler = make_jump_scheduler(tiny_model_path)
    steps_with_a_jumped_row = 0
    while scheduler.has_work():
        running = {r.rid for r in scheduler.batches.running.reqs}
        steps_with_a_jumped_row += any(
            r.status is ReqStatus.JUMPED for r in scheduler.batches.running.reqs
        )
        # Every running request (jumped or not) samples in each step: none waits a step
        # while another's forced run is computed.
        assert running <= {output.rid for output in scheduler.step()}
        if scheduler.batches.running.reqs:
            assert_penalty_counts_follow_outputs(scheduler)
    assert steps_with_a_jumped_row > 0
    assert scheduler.counters.jump_forward_tokens > 0
    scheduler.check_integrity()
    scheduler.shutdown()


def test_jump_forward_under_overlap_drops_stale_samples(tiny_model_path):
    """A jump found while a step is in flight makes that step's sample stale (dropped, and
    not counted by the penalties, and no mask is filled for it); the run goes into the next
    launched step."""
    scheduler = make_jump_scheduler(tiny_model_path, enable_overlap_schedule=True)
    num_stale = 0
    while scheduler.has_work():
        scheduler.step()
        if scheduler.inflight is not None:
            stale = scheduler.inflight.stale_rows
            num_stale += len(stale)
            assert_penalty_counts_follow_outputs(scheduler)
            masked = scheduler.batches.running.sampling_info.vocab_bitmask_rows
            masked = set() if masked is None else set(masked.tolist())
            assert not masked & stale  # a dropped sample needs no mask
    assert num_stale > 0
    scheduler.check_integrity()
    scheduler.shutdown()


@pytest.mark.parametrize(
    "options",
    [
        {"max_total_tokens": 44, "new_token_ratio": 0.05},
        {"enable_mixed_chunk": True, "chunked_prefill_size": 4, "max_prefill_tokens": 4},
        {"enable_overlap_schedule": True},
    ],
    ids=["preemption", "mixed", "overlap"],
)
def test_jump_forward_outputs_do_not_depend_on_the_schedule(tiny_model_path, options):
    """Jumped rows beside decode rows, inside mixed chunks, retracted then resumed, and
    found while a step was in flight (overlap: that step's sample is dropped, the run goes
    into the next launched step beside rows whose input ids only the device has)."""
    results = []
    for engine_options in ({}, options):
        with make_engine(tiny_model_path, enable_jump_forward=True, **engine_options) as engine:
            outputs = engine.generate(JUMP_PROMPTS, JUMP_PARAMS)
            stats = engine.get_stats()
            assert stats["num_jump_forward_tokens"] > 0
            if "max_total_tokens" in engine_options:
                assert stats["num_retractions"] > 0
            if "enable_mixed_chunk" in engine_options:
                assert stats["num_mixed_steps"] > 0
            assert_drained_without_leaks(engine)
        results.append([(o["output_ids"], o["meta_info"]["finish_reason"]) for o in outputs])
    assert results[1] == results[0]


def test_lone_forced_tokens_are_sampled_not_jumped(tiny_model_path):
    """A one-token forced run (the `,` between one-digit items) is left to the mask: jumping
    it would save no forward and would take the batch off its decode CUDA graph. Runs of two
    or more tokens (a key-heavy record's names) still jump."""
    import json

    from radixgen.runtime.bench.datasets import JSON_KEYS_SCHEMA, json_array_schema

    array = json_array_schema(6)
    for schema, jumps in ((array, False), (JSON_KEYS_SCHEMA, True)):
        with make_engine(tiny_model_path, enable_jump_forward=True) as engine:
            params = {"max_new_tokens": 120, "temperature": 0, "json_schema": schema}
            [output] = engine.generate([QUESTIONS[0]], [params])
            json.loads(output["text"])  # complete and valid either way
            assert (engine.get_stats()["num_jump_forward_tokens"] > 0) == jumps
            assert_drained_without_leaks(engine)
