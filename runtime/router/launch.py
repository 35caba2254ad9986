"""Runs the router: standalone (`radixgen router`) or over `--dp-size` local replicas.

`radixgen serve --dp-size N` starts N replicas (each a whole `radixgen serve` of `--tp-size`
ranks, on a free local port; on GPUs replica i sees GPUs [i * tp, (i + 1) * tp) of
CUDA_VISIBLE_DEVICES) and serves the router on `--host`/`--port`. A replica that dies leaves
the rotation; SIGINT / SIGTERM stop the router, then every replica (each drains its requests).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import signal
import threading
import time

import uvicorn

from radixgen.runtime.router.app import RouterArgs, create_router_app
from radixgen.runtime.server.child_process import configure_logging, freeze_startup_heap
from radixgen.runtime.server.launch import ShutdownRequested, signals_raise_shutdown
from radixgen.runtime.server.subprocess_launcher import find_free_port
from radixgen.runtime.server_args import ServerArgs

logger = logging.getLogger("radixgen.router")

# Seconds replicas get to drain and exit after SIGTERM before they are killed.
REPLICA_STOP_TIMEOUT_S = 30.0
# Replicas start unhealthy; the first checks should find them soon after they load.
DP_HEALTH_CHECK_INTERVAL_S = 1.0
# How often a replica checks that the front end that started it is alive.
PARENT_CHECK_INTERVAL_S = 0.5


def serve_router(args: RouterArgs, *, host: str, port: int, log_level: str = "info") -> int:
    """Serves the router until SIGINT / SIGTERM; returns 0."""
    configure_logging("router", log_level)
    logger.info("routing (%s) over %s", args.routing_policy, ", ".join(args.worker_urls))
    app = create_router_app(args)
    freeze_startup_heap()
    uvicorn.run(app, host=host, port=port, log_level=log_level.lower())
    return 0


def launch_data_parallel(server_args: ServerArgs) -> int:
    """`--dp-size N`: N replicas behind the router; returns the exit code."""
    context = multiprocessing.get_context("spawn")
    ports = [find_free_port() for _ in range(server_args.dp_size)]
    replicas = []
    for index, port in enumerate(ports):
        replica_args = dataclasses.replace(server_args, dp_size=1, host="127.0.0.1", port=port)
        # Not a daemon: a replica starts children of its own.
        process = context.Process(
            target=_run_replica,
            args=(replica_args, index, os.getpid()),
            name=f"radixgen-dp-{index}",
        )
        process.start()
        replicas.append(process)
    args = RouterArgs(
        worker_urls=tuple(f"http://127.0.0.1:{port}" for port in ports),
        routing_policy=server_args.routing_policy,
        health_check_interval_s=DP_HEALTH_CHECK_INTERVAL_S,
    )
    try:
        with signals_raise_shutdown():
            return serve_router(
                args, host=server_args.host, port=server_args.port, log_level=server_args.log_level
            )
    except ShutdownRequested:
        return 0
    finally:
        for process in replicas:
            if process.is_alive():
                process.terminate()
        for process in replicas:
            process.join(REPLICA_STOP_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join()


def _run_replica(server_args: ServerArgs, index: int, parent_pid: int) -> None:
    from radixgen.runtime.server.child_process import parent_is_alive
    from radixgen.runtime.server.launch import launch_server

    def stop_with_parent() -> None:  # a killed front end must not leave replicas behind
        while parent_is_alive(parent_pid):
            time.sleep(PARENT_CHECK_INTERVAL_S)
        os.kill(os.getpid(), signal.SIGTERM)  # the replica's own graceful stop

    threading.Thread(target=stop_with_parent, name="parent-watch", daemon=True).start()

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(i) for i in range(64)]
    tp = server_args.tp_size
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[index * tp : (index + 1) * tp])
    raise SystemExit(launch_server(server_args))
