"""Starts the server: the scheduler and detokenizer processes, then HTTP in this process.

Lifetime rules:
- `/health` answers only once both children reported ready (the model is loaded).
- SIGINT / SIGTERM: graceful drain. New requests get 503 at once; requests in flight get up
  to `--shutdown-timeout` seconds to finish, then the rest are aborted (503, or a final SSE
  error event in a started stream); then uvicorn stops, every child is terminated, exit 0.
  A second signal skips the wait.
- A child that dies (at start-up or later) is logged with its exit code; the server fails
  the requests in flight with 503, stops, and exits with code 1. It never hangs.
- Children exit on their own if this process is killed (they watch their parent's pid).
- `--tp-size N`: the scheduler process is tensor-parallel rank 0, and ranks 1..N-1 are more
  children (runtime/tp_worker.py), watched like the others: a rank that dies stops the server
  (exit code 1). On `--node-rank > 0` this process only runs that node's ranks.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

import uvicorn

from radixgen.runtime.nccl_env import disable_nvlink_multicast
from radixgen.runtime.server.child_process import (
    configure_logging,
    freeze_startup_heap,
    run_entry_point,
)
from radixgen.runtime.server.ipc import IpcPaths
from radixgen.runtime.server.messages import ProcessFailed, ProcessReady, ServedModelInfo
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.tiny_model import TINY_MODEL_NAME, resolve_model_path

logger = logging.getLogger("radixgen.server")

# What both `logging` and uvicorn understand.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
# How often the HTTP process checks that its children are alive.
WATCHDOG_INTERVAL_S = 0.5
# Seconds a child gets to exit after SIGTERM before it is killed.
CHILD_STOP_TIMEOUT_S = 5.0
# Seconds uvicorn waits for open connections once the drain has ended every request (their
# final bytes, idle keep-alive sockets).
CONNECTION_CLOSE_S = 3
# How often the drain checks whether requests are still in flight.
DRAIN_POLL_S = 0.05


class ShutdownRequested(Exception):
    """SIGINT or SIGTERM arrived."""


class ServerFailure(Exception):
    """Start-up failed, or a child process died: the server exits with code 1."""


@dataclass
class ChildProcess:
    name: str
    process: multiprocessing.process.BaseProcess
    ready_reader: Connection


def launch_server(server_args: ServerArgs) -> int:
    """Runs the server until a signal (returns 0) or a child's death (returns 1)."""
    if server_args.log_level.lower() not in LOG_LEVELS:
        print(
            f"log_level must be one of {LOG_LEVELS}, got {server_args.log_level!r}", file=sys.stderr
        )
        return 2
    configure_logging("server", server_args.log_level)
    if server_args.dp_size > 1:  # replicas behind the router (runtime/router/launch.py)
        from radixgen.runtime.router.launch import launch_data_parallel

        return launch_data_parallel(server_args)
    # Inherited by every child: no NVLink multicast in NCCL, symmetric memory or NVSHMEM.
    disable_nvlink_multicast()
    if server_args.node_rank > 0:
        return _run_follower_node(server_args)
    model_path = server_args.model_path
    if model_path != TINY_MODEL_NAME:
        # Checked here, before two processes spend seconds importing torch to find out.
        try:
            folder = resolve_model_path(model_path)  # a Hub ID: from the local cache only
        except FileNotFoundError as error:
            logger.error("--model-path: %s", error)
            return 1
        if not os.path.isdir(folder):
            logger.error(
                "--model-path %r is not a folder (nor 'tiny', nor a cached Hub ID)", model_path
            )
            return 1
    ipc_paths = IpcPaths.create()
    children: list[ChildProcess] = []
    try:
        with signals_raise_shutdown():
            children = _start_children(server_args, ipc_paths)
            # The front end's tokenizer loads while the children load the model.
            tokenizer = _load_tokenizer(server_args)
            ready = _wait_until_ready(children)
            model_info = ServedModelInfo(**ready["scheduler"].info)
            logger.info(
                "model %s loaded: context length %d, %d KV slots",
                model_info.model_path,
                model_info.context_length,
                model_info.max_total_tokens,
            )
            _serve_http(server_args, ipc_paths, model_info, tokenizer, children)
        return 0
    except ShutdownRequested:
        logger.info("shutting down on a signal")
        return 0
    except ServerFailure as error:
        logger.error("%s; the server stops", error)
        return 1
    finally:
        _stop_children(children)
        ipc_paths.remove()


@contextmanager
def signals_raise_shutdown():
    # Outside uvicorn's own handling (start-up, and after it re-raises the signal it caught),
    # a signal unwinds the launcher so that the `finally` above stops the children.
    def handler(signum, frame):
        raise ShutdownRequested(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _load_tokenizer(server_args: ServerArgs):
    from radixgen.runtime.tokenizer import load_tokenizer

    path = server_args.tokenizer_path or server_args.model_path
    try:
        return load_tokenizer(path, server_args.chat_template)
    except (OSError, ValueError) as error:
        raise ServerFailure(f"cannot load the tokenizer from {path!r}: {error}") from None


def _start_children(server_args: ServerArgs, ipc_paths: IpcPaths) -> list[ChildProcess]:
    # spawn: a fresh interpreter, so no CUDA or thread state is inherited from this process.
    context = multiprocessing.get_context("spawn")
    children = []
    scheduler_kwargs = {}
    if server_args.tp_size > 1:
        from radixgen.runtime.tp_worker import start_followers, tensor_parallel_init_method

        init_method = tensor_parallel_init_method(server_args)
        scheduler_kwargs["tp_init_method"] = init_method
        for follower in start_followers(server_args, init_method):
            children.append(ChildProcess(follower.name, follower.process, follower.ready_reader))
    # The targets go by name: pickling a function imports its module here, and the scheduler's
    # imports torch (~3 s on the 2-core machine) before any child had started.
    for name, entry in (
        ("scheduler", "radixgen.runtime.server.scheduler_process:run_scheduler_process"),
        ("detokenizer", "radixgen.runtime.server.detokenizer_process:run_detokenizer_process"),
    ):
        reader, writer = context.Pipe(duplex=False)
        process = context.Process(
            target=run_entry_point,
            args=(entry, server_args, ipc_paths, writer, os.getpid()),
            kwargs=scheduler_kwargs if name == "scheduler" else {},
            name=f"radixgen-{name}",
            daemon=True,
        )
        process.start()
        writer.close()  # the child holds the only writer: its death means EOF here
        children.append(ChildProcess(name, process, reader))
    return children


def _run_follower_node(server_args: ServerArgs) -> int:
    """A node other than 0: runs its tensor-parallel ranks until they end (node 0 stops
    them), a signal (0), or a rank's failure (1)."""
    from radixgen.runtime.tp_worker import start_followers, tensor_parallel_init_method

    children: list[ChildProcess] = []
    try:
        with signals_raise_shutdown():
            init_method = tensor_parallel_init_method(server_args)
            for follower in start_followers(server_args, init_method):
                children.append(
                    ChildProcess(follower.name, follower.process, follower.ready_reader)
                )
            _wait_until_ready(children)
            logger.info("node %d: ranks ready, following node 0", server_args.node_rank)
            wait([child.process.sentinel for child in children])
            codes = [child.process.exitcode for child in children]
            return 0 if all(code == 0 for code in codes) else 1
    except ShutdownRequested:
        return 0
    except ServerFailure as error:
        logger.error("%s; the node stops", error)
        return 1
    finally:
        _stop_children(children)


def _wait_until_ready(children: list[ChildProcess]) -> dict[str, ProcessReady]:
    ready: dict[str, ProcessReady] = {}
    while len(ready) < len(children):
        waiting = [child for child in children if child.name not in ready]
        handles = [child.ready_reader for child in waiting]
        handles += [child.process.sentinel for child in waiting]
        signalled = wait(handles)
        for child in waiting:
            if child.ready_reader in signalled:
                try:
                    message = child.ready_reader.recv()
                except EOFError:
                    message = None
            elif child.process.sentinel in signalled:
                message = None
            else:
                continue
            if isinstance(message, ProcessFailed):
                raise ServerFailure(
                    f"the {child.name} process failed to start:\n{message.traceback}"
                )
            if not isinstance(message, ProcessReady):
                child.process.join(1.0)
                raise ServerFailure(
                    f"the {child.name} process exited during start-up "
                    f"(exit code {child.process.exitcode})"
                )
            ready[child.name] = message
    return ready


def _serve_http(
    server_args: ServerArgs,
    ipc_paths: IpcPaths,
    model_info: ServedModelInfo,
    tokenizer,
    children: list[ChildProcess],
) -> None:
    from radixgen.runtime.server.http_guards import BodyLimitMiddleware, header_timeout_protocol
    from radixgen.runtime.server.http_server import create_app
    from radixgen.runtime.server.metrics import ServerMetrics
    from radixgen.runtime.server.tokenizer_manager import TokenizerManager

    metrics = ServerMetrics(model_info.served_model_name)
    manager = TokenizerManager(server_args, model_info, ipc_paths, tokenizer, metrics)
    process_ids = {"server": os.getpid(), **{c.name: c.process.pid for c in children}}
    app = create_app(manager, api_key=server_args.api_key, process_ids=process_ids)
    app = BodyLimitMiddleware(app, server_args.max_request_bytes)
    config = uvicorn.Config(
        app,
        host=server_args.host,
        port=server_args.port,
        log_level=server_args.log_level.lower(),
        http=header_timeout_protocol(server_args.header_read_timeout),
        timeout_graceful_shutdown=CONNECTION_CLOSE_S,
    )
    server = DrainingServer(config, manager, server_args.shutdown_timeout)
    freeze_startup_heap()
    crash = asyncio.run(_serve_with_watchdog(server, manager, children))
    if crash is not None:
        raise ServerFailure(crash)


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose first SIGTERM/SIGINT drains requests before shutting down."""

    def __init__(self, config: uvicorn.Config, manager, shutdown_timeout_s: float):
        super().__init__(config)
        self.manager = manager
        self.shutdown_timeout_s = shutdown_timeout_s
        self.drain_task: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame) -> None:
        # A signal handler: it runs on the main thread, which also runs the event loop.
        if self.drain_task is not None or self.should_exit:
            super().handle_exit(sig, frame)  # a second signal: stop without waiting
            self.force_exit = True
            return
        self._captured_signals.append(sig)  # re-raised after serve(): the launcher returns 0
        self.manager.start_draining()
        self.drain_task = asyncio.get_event_loop().create_task(self._drain())

    async def _drain(self) -> None:
        logger.info(
            "draining %d request(s) in flight (up to %.1f s; new requests get 503)",
            self.manager.num_requests_in_flight,
            self.shutdown_timeout_s,
        )
        deadline = time.monotonic() + self.shutdown_timeout_s
        while self.manager.num_requests_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if self.manager.num_requests_in_flight:
            logger.warning(
                "aborting %d request(s) still in flight after %.1f s",
                self.manager.num_requests_in_flight,
                self.shutdown_timeout_s,
            )
            self.manager.abort_all("the server is shutting down", status_code=503)
            # Let the handlers send their 503s and final stream events.
            end = time.monotonic() + CONNECTION_CLOSE_S
            while self.manager.num_requests_in_flight and time.monotonic() < end:
                await asyncio.sleep(DRAIN_POLL_S)
        self.should_exit = True


async def _serve_with_watchdog(server, manager, children: list[ChildProcess]) -> str | None:
    """Serves HTTP until shutdown; returns why a child died, or None."""
    crash: str | None = None

    async def watch_children() -> None:
        nonlocal crash
        while True:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            for child in children:
                if child.process.exitcode is not None:
                    crash = f"the {child.name} process died (exit code {child.process.exitcode})"
                    logger.error("%s; failing requests in flight and shutting down", crash)
                    manager.fail_all(crash)
                    server.should_exit = True
                    return

    watchdog = asyncio.create_task(watch_children())
    try:
        await server.serve()
    finally:
        watchdog.cancel()
    return crash


def _stop_children(children: list[ChildProcess]) -> None:
    for child in children:
        if child.process.is_alive():
            child.process.terminate()
    for child in children:
        child.process.join(CHILD_STOP_TIMEOUT_S)
        if child.process.is_alive():
            logger.warning("the %s process ignored SIGTERM; killing it", child.name)
            child.process.kill()
            child.process.join()
