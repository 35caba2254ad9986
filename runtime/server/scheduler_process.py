"""Process 2: owns the model and the scheduler, and runs the `SchedulerLoop` over ZeroMQ.

The loop is the Engine's (`runtime/scheduler_loop.py`); only the transport differs: requests
and control messages arrive on a PULL socket, outputs go to the detokenizer, control replies
to the tokenizer manager. It blocks in `poll()` only when idle, so a busy scheduler never
waits on the network, and an idle one costs no CPU. An exception in a step is a bug or a
device fault: the process logs it and exits non-zero, and the launcher turns that into a
clean, non-zero exit of the whole server.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from multiprocessing.connection import Connection

import zmq

from radixgen.runtime.io_struct import AbortReq, ReqOutput
from radixgen.runtime.request_schema import GenerateReq
from radixgen.runtime.scheduler_loop import SchedulerLoop, SchedulerTransport
from radixgen.runtime.server.child_process import (
    freeze_startup_heap,
    parent_is_alive,
    setup_child_process,
)
from radixgen.runtime.server.ipc import IpcPaths, bind_pull, connect_push, drain
from radixgen.runtime.server.messages import (
    DetokenizeSpec,
    ProcessFailed,
    ProcessReady,
    RequestChanges,
    ServedModelInfo,
    StepOutputs,
    WarmupDone,
    dump_frame,
)
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.warmup import WarmupReport, warm_up

logger = logging.getLogger(__name__)

# Idle wait between checks that the parent is alive; a new request wakes poll() at once.
POLL_INTERVAL_MS = 200
# Wait after a step that produced nothing; far below any forward pass, so never a slowdown.
IDLE_STEP_WAIT_MS = 1
# Prompt tokens the detokenizer needs as decoding context (see runtime/detokenizer.py).
DETOKENIZE_CONTEXT_TOKENS = 8


class ZmqTransport(SchedulerTransport):
    """Requests from the tokenizer manager; outputs to the detokenizer, one message per step
    (`[RequestChanges, StepOutputs]`: the requests started and aborted since the last
    message, ahead of the step's outputs); control replies back to the tokenizer manager."""

    def __init__(
        self,
        *,
        requests: zmq.Socket,
        to_detokenizer: zmq.Socket,
        to_tokenizer: zmq.Socket,
        parent_pid: int,
    ):
        self.requests = requests
        self.to_detokenizer = to_detokenizer
        self.to_tokenizer = to_tokenizer
        self.parent_pid = parent_pid
        self.changes = RequestChanges()  # for the detokenizer, sent with the next outputs

    def is_open(self) -> bool:
        if parent_is_alive(self.parent_pid):
            return True
        logger.info("parent process is gone; scheduler exits")
        return False

    def receive(self, *, block: bool) -> list[object]:
        if block:
            if self.changes:  # idle: aborts must not wait for the next step's outputs
                self._send_to_detokenizer(None)
            self.requests.poll(POLL_INTERVAL_MS)
        return drain(self.requests)

    def on_request(self, request: GenerateReq) -> None:
        params = request.sampling_params
        self.changes.specs.append(
            DetokenizeSpec(
                rid=request.rid,
                num_samples=params.n,
                prompt_tail_ids=request.input_ids[-DETOKENIZE_CONTEXT_TOKENS:],
                skip_special_tokens=params.skip_special_tokens,
                stop_strings=params.stop_strings,
            )
        )

    def on_abort(self, message: AbortReq) -> None:
        self.changes.aborted_rids.append(message.rid)  # the detokenizer drops its state

    def deliver(self, outputs: list[ReqOutput]) -> list[str]:
        self._send_to_detokenizer(StepOutputs.from_outputs(outputs))
        return []  # the tokenizer manager sends an AbortReq for a vanished client

    def _send_to_detokenizer(self, outputs: StepOutputs | None) -> None:
        changes = self.changes if self.changes else None
        self.to_detokenizer.send_multipart([dump_frame(changes), dump_frame(outputs)])
        self.changes = RequestChanges()

    def reply(self, message: object, value: object) -> None:
        self.to_tokenizer.send_pyobj(value)  # replies come back in request order

    def after_empty_step(self) -> None:
        # Nothing to run yet (e.g. a grammar still compiling on another thread): yield the
        # CPU for a moment instead of spinning on has_work().
        self.requests.poll(IDLE_STEP_WAIT_MS)

    def fail(self, error: BaseException) -> None:
        pass  # the process exits non-zero; the launcher fails every waiting client (503)


def describe_model(server_args: ServerArgs, scheduler) -> ServedModelInfo:
    return ServedModelInfo(
        model_path=server_args.model_path,
        served_model_name=server_args.served_model_name or server_args.model_path,
        context_length=scheduler.context_length,
        vocab_size=scheduler.vocab_size,
        max_total_tokens=scheduler.kv.capacity,
        max_running_requests=scheduler.runner.max_running_requests,
    )


def run_scheduler_process(
    server_args: ServerArgs,
    ipc_paths: IpcPaths,
    ready_writer: Connection,
    parent_pid: int,
    tp_init_method: str | None = None,
) -> None:
    """Entry point of the scheduler process (spawned by the launcher). Under tensor
    parallelism it is rank 0, joining the followers at `tp_init_method`."""
    setup_child_process("scheduler", server_args.log_level)
    try:
        from radixgen.runtime.scheduler import Scheduler

        runner = None
        if server_args.tp_size > 1:
            from radixgen.runtime.model_runner import ModelRunner
            from radixgen.runtime.tp_worker import join_tensor_parallel

            parallel = join_tensor_parallel(server_args, 0, tp_init_method)
            runner = ModelRunner(server_args, parallel)
        scheduler = Scheduler(server_args, model_runner=runner)
        model_info = describe_model(server_args, scheduler)
    except Exception:
        ready_writer.send(ProcessFailed("scheduler", traceback.format_exc()))
        raise SystemExit(1) from None
    context = zmq.Context()
    transport = ZmqTransport(
        requests=bind_pull(context, ipc_paths.scheduler_input),
        to_detokenizer=connect_push(context, ipc_paths.detokenizer_input),
        to_tokenizer=connect_push(context, ipc_paths.tokenizer_input),
        parent_pid=parent_pid,
    )
    # Ready (the model is loaded) before the warm-up: the HTTP server starts meanwhile and
    # answers /health with 503 "warming up" until `WarmupDone` arrives.
    ready_writer.send(ProcessReady("scheduler", info=dataclasses.asdict(model_info)))
    report = WarmupReport(num_requests=0, duration_s=0.0)
    if not server_args.skip_warmup:
        try:
            report = warm_up(scheduler)
        except Exception:  # a broken model or kernel: never report healthy
            logger.exception("warm-up failed; the scheduler exits")
            raise SystemExit(1) from None
    freeze_startup_heap()
    transport.to_tokenizer.send_pyobj(WarmupDone(report.num_requests, report.duration_s))
    SchedulerLoop(scheduler, transport).run()
    scheduler.runner.stop_followers()
