"""Process 3: turns the scheduler's token outputs into text deltas for the tokenizer manager.

Running it in its own process keeps `tokenizer.decode` off both the scheduler's loop (which
must keep the device busy) and the HTTP event loop.
"""

from __future__ import annotations

import logging
import traceback
from multiprocessing.connection import Connection

import zmq

from radixgen.runtime.detokenizer import IncrementalDetokenizer
from radixgen.runtime.io_struct import AbortReq, BatchTokenOutput, ReqOutput
from radixgen.runtime.server.child_process import parent_is_alive, setup_child_process
from radixgen.runtime.server.ipc import IpcPaths, bind_pull, connect_push, drain
from radixgen.runtime.server.messages import (
    BatchStrOutput,
    DetokenizeSpec,
    ProcessFailed,
    ProcessReady,
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

    def handle(self, message: object) -> BatchStrOutput | None:
        if isinstance(message, DetokenizeSpec):
            self.specs[message.rid] = message
            self.unfinished_samples[message.rid] = message.num_samples
        elif isinstance(message, AbortReq):
            self._forget(message.rid)
        elif isinstance(message, BatchTokenOutput):
            deltas = [self._detokenize(output) for output in message.outputs]
            return BatchStrOutput(outputs=message.outputs, text_deltas=deltas)
        else:
            logger.error("detokenizer: unexpected message %r", type(message).__name__)
        return None

    def _detokenize(self, output: ReqOutput) -> str:
        key = (output.rid, output.index)
        stream = self.streams.get(key)
        if stream is None:
            spec = self.specs.get(output.rid)
            if spec is None:
                # Rejected before it was registered (an error output): nothing to decode.
                return ""
            stream = IncrementalDetokenizer(
                self.tokenizer,
                spec.prompt_tail_ids,
                skip_special_tokens=spec.skip_special_tokens,
                stop_strings=spec.stop_strings,
            )
            self.streams[key] = stream
        delta = stream.add_tokens(output.new_token_ids, finished=output.finished)
        if output.finished:
            del self.streams[key]
            self.unfinished_samples[output.rid] -= 1
            if self.unfinished_samples[output.rid] == 0:
                self._forget(output.rid)
        return delta

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
        from radixgen.runtime.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(server_args.tokenizer_path or server_args.model_path)
    except Exception:
        ready_writer.send(ProcessFailed("detokenizer", traceback.format_exc()))
        raise SystemExit(1) from None
    context = zmq.Context()
    pull = bind_pull(context, ipc_paths.detokenizer_input)
    push = connect_push(context, ipc_paths.tokenizer_input)
    ready_writer.send(ProcessReady("detokenizer"))
    manager = DetokenizerManager(tokenizer)
    while parent_is_alive(parent_pid):
        if not pull.poll(POLL_INTERVAL_MS):
            continue
        for message in drain(pull):
            result = manager.handle(message)
            if result is not None:
                push.send_pyobj(result)
    logger.info("parent process is gone; detokenizer exits")
