"""Tensor-parallel ranks as processes: where they meet, and the followers' entry point.

Rank 0 lives where the scheduler lives (the Engine's process, or the server's scheduler
process); ranks 1..tp_size-1 of this node are spawned processes running `run_follower_process`:
they load their slice of the model, report ready, then run rank 0's batches until it stops
them (`ModelRunner.follow`). Nodes other than 0 (`node_rank > 0`) run only followers.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

import torch

from radixgen.runtime.distributed import (
    TensorParallel,
    destroy_tensor_parallel,
    init_tensor_parallel,
)
from radixgen.runtime.model_runner import ModelRunner, resolve_device
from radixgen.runtime.nccl_env import disable_nvlink_multicast
from radixgen.runtime.server.subprocess_launcher import find_free_port
from radixgen.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)

# How often a follower checks that its parent is alive (it may be blocked in a collective).
PARENT_CHECK_INTERVAL_S = 0.5
# Seconds followers get to exit after rank 0 stopped them, before they are killed.
FOLLOWER_STOP_TIMEOUT_S = 10.0


def tensor_parallel_init_method(server_args: ServerArgs) -> str:
    """`tcp://host:port` where the ranks meet: `dist_init_addr`, or a free local port."""
    if server_args.dist_init_addr is not None:
        return f"tcp://{server_args.dist_init_addr}"
    return f"tcp://127.0.0.1:{find_free_port()}"


def node_ranks(server_args: ServerArgs) -> range:
    """The tensor-parallel ranks this node runs (rank 0 is node 0's)."""
    per_node = server_args.tp_ranks_per_node
    return range(server_args.node_rank * per_node, (server_args.node_rank + 1) * per_node)


def join_tensor_parallel(server_args: ServerArgs, rank: int, init_method: str) -> TensorParallel:
    """This process's `TensorParallel` (rank `rank` of `tp_size`), after its peers joined."""
    return init_tensor_parallel(
        rank=rank,
        size=server_args.tp_size,
        init_method=init_method,
        device=resolve_device(server_args.device),
        local_rank=rank % server_args.tp_ranks_per_node,
        timeout_s=server_args.dist_timeout,
        # Peer memory spans one node's GPUs only.
        peer_all_reduce=not server_args.disable_custom_all_reduce and server_args.nnodes == 1,
    )


@dataclass
class FollowerProcess:
    rank: int
    process: multiprocessing.process.BaseProcess
    ready_reader: Connection

    @property
    def name(self) -> str:
        return f"tp-rank-{self.rank}"


def start_followers(server_args: ServerArgs, init_method: str) -> list[FollowerProcess]:
    """Spawns this node's follower ranks (all its ranks but 0); each reports on its pipe
    (`ProcessReady` / `ProcessFailed`, as the server's children do)."""
    disable_nvlink_multicast()  # inherited by the spawned ranks, before NCCL starts there
    context = multiprocessing.get_context("spawn")
    followers = []
    for rank in node_ranks(server_args):
        if rank == 0:
            continue
        reader, writer = context.Pipe(duplex=False)
        process = context.Process(
            target=run_follower_process,
            args=(server_args, rank, init_method, writer, os.getpid()),
            name=f"radixgen-tp-rank-{rank}",
            daemon=True,
        )
        process.start()
        writer.close()  # the child holds the only writer: its death means EOF here
        followers.append(FollowerProcess(rank, process, reader))
    return followers


def run_follower_process(
    server_args: ServerArgs, rank: int, init_method: str, ready_writer: Connection, parent_pid: int
) -> None:
    """Entry point of a follower rank: load, report ready, follow rank 0, exit 0 when stopped.

    A failed collective (rank 0 or a peer died, or `dist_timeout` passed) exits non-zero.
    """
    from radixgen.runtime.server.child_process import freeze_startup_heap, setup_child_process
    from radixgen.runtime.server.messages import ProcessFailed, ProcessReady

    setup_child_process(f"tp-rank-{rank}", server_args.log_level)
    _exit_with_parent(parent_pid)
    try:
        parallel = join_tensor_parallel(server_args, rank, init_method)
        runner = ModelRunner(server_args, parallel)
    except Exception:
        ready_writer.send(ProcessFailed(f"tp-rank-{rank}", traceback.format_exc()))
        raise SystemExit(1) from None
    ready_writer.send(ProcessReady(f"tp-rank-{rank}", info={}))
    freeze_startup_heap()  # a collection's pause here would stall every rank's collective
    try:
        with torch.no_grad():
            runner.follow()
    except Exception as error:  # the group is broken: a peer died or timed out
        logger.error("tensor-parallel rank %d stops: %s", rank, error)
        raise SystemExit(1) from None
    destroy_tensor_parallel(parallel)


def _exit_with_parent(parent_pid: int) -> None:
    """Exits this process when its parent dies, even while the main thread waits inside a
    collective (which only the group's timeout would end)."""
    from radixgen.runtime.server.child_process import parent_is_alive

    def watch() -> None:
        while parent_is_alive(parent_pid):
            time.sleep(PARENT_CHECK_INTERVAL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def wait_for_followers(followers: list[FollowerProcess]) -> None:
    """Blocks until every follower reported ready.

    Raises:
        RuntimeError: a follower failed to start (with its traceback) or died.
    """
    from radixgen.runtime.server.messages import ProcessFailed, ProcessReady

    for follower in followers:
        wait([follower.ready_reader, follower.process.sentinel])
        try:
            message = follower.ready_reader.recv()
        except EOFError:
            message = None
        if isinstance(message, ProcessFailed):
            raise RuntimeError(f"{follower.name} failed to start:\n{message.traceback}")
        if not isinstance(message, ProcessReady):
            follower.process.join(1.0)
            raise RuntimeError(
                f"{follower.name} exited during start-up (exit code {follower.process.exitcode})"
            )


class InProcessTensorParallel:
    """The Engine's tensor parallelism: rank 0 in this process, the followers spawned.

    `runner` is rank 0's ModelRunner, for the Engine's scheduler; `shutdown()` stops the
    followers and leaves the group.
    """

    def __init__(self, server_args: ServerArgs):
        if server_args.nnodes != 1:
            raise ValueError("Engine: nnodes must be 1 (multi-node runs through `radixgen serve`)")
        init_method = tensor_parallel_init_method(server_args)
        self.followers = start_followers(server_args, init_method)
        try:
            self.parallel = join_tensor_parallel(server_args, 0, init_method)
            self.runner = ModelRunner(server_args, self.parallel)
            wait_for_followers(self.followers)
        except BaseException:
            self._stop_processes()
            raise

    def shutdown(self) -> None:
        if any(follower.process.is_alive() for follower in self.followers):
            try:
                self.runner.stop_followers()
            except Exception as error:  # a follower died: the group is broken
                logger.warning("stopping the tensor-parallel followers: %s", error)
        self._stop_processes()
        destroy_tensor_parallel(self.parallel)

    def _stop_processes(self) -> None:
        for follower in self.followers:
            follower.process.join(FOLLOWER_STOP_TIMEOUT_S)
            if follower.process.is_alive():
                follower.process.kill()
                follower.process.join()
