"""Process 3: turns the scheduler's token outputs into text deltas for the tokenizer manager.

Running it in its own process keeps `tokenizer.decode` off both the scheduler's loop (which
must keep the device busy) and the HTTP event loop. Per scheduler step it reads one
`[RequestChanges, StepOutputs]` message and sends one `[StepOutputs, text deltas]` message on,
the outputs frame forwarded as the bytes it came in (unpickled once, to read the token ids;
never pickled again).
"""

from __future__ import annotations

import logging
import traceback
from multiprocessing.connection import Connection

import zmq

from radixgen.runtime.detokenizer import IncrementalDetokenizer, add_tokens_batch
from radixgen.runtime.server.child_process import (
    freeze_startup_heap,
    parent_is_alive,
    setup_child_process,
)
from radixgen.runtime.server.ipc import IpcPaths, bind_pull, connect_push, drain_multipart
from radixgen.runtime.server.messages import (
    DetokenizeSpec,
    ProcessFailed,
    ProcessReady,
    RequestChanges,
    StepOutputs,
    dump_frame,
    load_frame,
)
from radixgen.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)

# How long the loop sleeps in poll() between checks that the parent is still alive.
POLL_INTERVAL_MS = 200


class DetokenizerManager:
    """Per-request incremental detokenizers, keyed by (rid, sample index)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.specs: dict[str, DetokenizeSpec] = {}
        self.streams: dict[tuple[str, int], IncrementalDetokenizer] = {}
        self.unfinished_samples: dict[str, int] = {}

    def apply(self, changes: RequestChanges) -> None:
        """Starts and forgets requests, in the scheduler's order."""
        for spec in changes.specs:
            self.specs[spec.rid] = spec
            self.unfinished_samples[spec.rid] = spec.num_samples
        for rid in changes.aborted_rids:
            self._forget(rid)

    def detokenize(self, step: StepOutputs) -> list[str]:
        """The text new in each row of `step` (stop strings trimmed; "" while a multi-byte
        character is incomplete), every decode of the step in one batched tokenizer call."""
        finished = step.finished.tolist()
        indices = step.sample_indices.tolist()
        rows, streams = [], []
        for row, rid in enumerate(step.rids):
            stream = self._stream(rid, indices[row])
            if stream is not None:
                rows.append(row)
                streams.append(stream)
        deltas = [""] * len(step)  # rows without a stream: rejected before they were registered
        texts = add_tokens_batch(
            self.tokenizer,
            streams,
            [step.new_token_ids(row) for row in rows],
            [finished[row] for row in rows],
        )
        for row, text in zip(rows, texts, strict=True):
            deltas[row] = text
            if finished[row]:
                rid = step.rids[row]
                del self.streams[(rid, indices[row])]
                self.unfinished_samples[rid] -= 1
                if self.unfinished_samples[rid] == 0:
                    self._forget(rid)
        return deltas

    def _stream(self, rid: str, index: int) -> IncrementalDetokenizer | None:
        """The sample's detokenizer (made on its first output); None for a request never
        registered (an error output: nothing to decode)."""
        key = (rid, index)
        stream = self.streams.get(key)
        if stream is None:
            spec = self.specs.get(rid)
            if spec is None:
                return None
            stream = IncrementalDetokenizer(
                self.tokenizer,
                spec.prompt_tail_ids,
                skip_special_tokens=spec.skip_special_tokens,
                stop_strings=spec.stop_strings,
            )
            self.streams[key] = stream
        return stream

    def _forget(self, rid: str) -> None:
        spec = self.specs.pop(rid, None)
        self.unfinished_samples.pop(rid, None)
        if spec is not None:
            for index in range(spec.num_samples):
                self.streams.pop((rid, index), None)


def run_detokenizer_process(
    server_args: ServerArgs, ipc_paths: IpcPaths, ready_writer: Connection, parent_pid: int
) -> None:
    """Entry point of the detokenizer process (spawned by the launcher)."""
    setup_child_process("detokenizer", server_args.log_level)
    try:
        from radixgen.runtime.tokenizer import load_decoder

        tokenizer = load_decoder(server_args.tokenizer_path or server_args.model_path)
    except Exception:
        ready_writer.send(ProcessFailed("detokenizer", traceback.format_exc()))
        raise SystemExit(1) from None
    context = zmq.Context()
    pull = bind_pull(context, ipc_paths.detokenizer_input)
    push = connect_push(context, ipc_paths.tokenizer_input)
    ready_writer.send(ProcessReady("detokenizer"))
    manager = DetokenizerManager(tokenizer)
    freeze_startup_heap()
    while parent_is_alive(parent_pid):
        if not pull.poll(POLL_INTERVAL_MS):
            continue
        for changes_frame, outputs_frame in drain_multipart(pull):
            changes = load_frame(changes_frame)
            if changes is not None:
                manager.apply(changes)
            if outputs_frame:
                deltas = manager.detokenize(load_frame(outputs_frame))
                push.send_multipart([outputs_frame, dump_frame(deltas)])
    logger.info("parent process is gone; detokenizer exits")
