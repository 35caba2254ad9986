"""The server's per-step messages: `StepOutputs` (columnar, one pickle per step), the
detokenizer's handling of them, and `RequestInbox` merging the steps a busy handler missed."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from radixgen.runtime.io_struct import ReqOutput
from radixgen.runtime.server.detokenizer_process import DetokenizerManager
from radixgen.runtime.server.errors import RequestError
from radixgen.runtime.server.messages import (
    DetokenizeSpec,
    RequestChanges,
    StepOutputs,
    dump_frame,
    load_frame,
    merge_outputs,
)
from radixgen.runtime.server.request_inbox import RequestInbox

STOP = {"type": "stop", "matched": 2}


def outputs_of_a_step() -> list[ReqOutput]:
    return [
        ReqOutput("a", 0, [11], False, prompt_tokens=5, completion_tokens=1, cached_tokens=3),
        ReqOutput("b", 1, [], False, prompt_tokens=7),  # a jump-forward-free empty row
        ReqOutput(
            "a",
            1,
            [12, 13],
            True,
            finish_reason=STOP,
            prompt_tokens=5,
            completion_tokens=2,
            output_token_logprobs=[(-0.5, 12), (-0.25, 13)],
            input_token_logprobs=[(None, 4), (-1.0, 5)],
        ),  # fmt: skip
        ReqOutput(
            "c", 0, [], True, finish_reason={"type": "abort", "message": "bad"}, error="bad regex"
        ),  # fmt: skip
    ]


def test_step_outputs_round_trip_every_field():
    outputs = outputs_of_a_step()
    step = load_frame(dump_frame(StepOutputs.from_outputs(outputs)))
    assert len(step) == 4
    assert [step.output(row) for row in range(4)] == outputs
    assert step.token_ids.tolist() == [11, 12, 13]  # one array for the whole step
    assert sorted(step.rare_fields) == [2, 3]  # only finished / logprob rows carry extras


def test_a_step_travels_without_an_object_per_output():
    outputs = [ReqOutput(f"request-{i}", 0, [1000 + i], False) for i in range(512)]
    frame = dump_frame(StepOutputs.from_outputs(outputs))
    assert b"ReqOutput" in pickle.dumps(outputs) and b"ReqOutput" not in frame
    assert len(frame) < len(pickle.dumps(outputs, protocol=pickle.HIGHEST_PROTOCOL))


def test_merge_outputs_concatenates_tokens_and_logprobs():
    first = ReqOutput("a", 0, [1], False, completion_tokens=1, output_token_logprobs=[(-1.0, 1)],
                      input_token_logprobs=[(None, 7)])  # fmt: skip
    second = ReqOutput("a", 0, [2, 3], True, finish_reason=STOP, completion_tokens=3,
                       output_token_logprobs=[(-2.0, 2), (-3.0, 3)])  # fmt: skip
    merged = merge_outputs([first, second])
    assert merged.new_token_ids == [1, 2, 3] and merged.finished
    assert merged.finish_reason == STOP and merged.completion_tokens == 3
    assert merged.output_token_logprobs == [(-1.0, 1), (-2.0, 2), (-3.0, 3)]
    assert merged.input_token_logprobs == [(None, 7)]


def test_inbox_merges_missed_steps_per_sample_then_raises_a_later_error():
    async def scenario():
        inbox = RequestInbox()
        steps = [
            StepOutputs.from_outputs(
                [ReqOutput("r", 0, [5], False), ReqOutput("r", 1, [6], False)]
            ),
            StepOutputs.from_outputs([ReqOutput("r", 0, [7], False)]),
            StepOutputs.from_outputs([ReqOutput("r", 1, [8], True, finish_reason=STOP)]),
        ]
        inbox.put_row(steps[0], 0, "a")
        inbox.put_row(steps[0], 1, "b")
        inbox.put_row(steps[1], 0, "c")
        inbox.put_row(steps[2], 0, "d")
        events = await inbox.take()  # the handler was busy for three steps: one take
        assert [(e.output.index, e.output.new_token_ids, e.text_delta) for e in events] == [
            (0, [5, 7], "ac"),
            (1, [6, 8], "bd"),
        ]
        assert events[1].output.finished and events[1].output.finish_reason == STOP
        inbox.put_row(steps[1], 0, "e")
        inbox.put_error(RequestError("the server is shutting down", status_code=503))
        assert [e.text_delta for e in await inbox.take()] == ["e"]  # outputs first
        with pytest.raises(RequestError, match="shutting down"):
            await inbox.take()

    asyncio.run(scenario())


def test_detokenizer_manager_decodes_a_step_and_forgets_finished_and_aborted(tiny_model_path):
    from radixgen.runtime.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_path)
    manager = DetokenizerManager(tokenizer)
    ids = tokenizer.encode(" hello world", add_special_tokens=False)

    def spec(rid: str) -> DetokenizeSpec:
        return DetokenizeSpec(rid, 1, [], skip_special_tokens=True, stop_strings=[])

    manager.apply(RequestChanges(specs=[spec("done"), spec("aborted")]))
    first = StepOutputs.from_outputs(
        [ReqOutput("done", 0, ids[:1], False), ReqOutput("aborted", 0, ids[:1], False)]
    )
    second = StepOutputs.from_outputs([ReqOutput("done", 0, ids[1:], True, finish_reason=STOP)])
    deltas = manager.detokenize(first)
    manager.apply(RequestChanges(aborted_rids=["aborted"]))
    deltas += manager.detokenize(second)
    assert deltas[0] + deltas[2] == " hello world"
    assert not manager.specs and not manager.streams and not manager.unfinished_samples
