"""ZeroMQ plumbing between the server's three processes.

    tokenizer manager --(GenerateReq, AbortReq, FlushCacheReq, GetStatsReq)--> scheduler
    scheduler --([RequestChanges, StepOutputs], one per step)--> detokenizer
    detokenizer --([StepOutputs, text deltas], one per step)--> tokenizer manager
    scheduler --(SchedulerStats, FlushCacheOutput, WarmupDone)--> tokenizer manager

Each process binds the PULL socket it reads from; senders connect PUSH sockets. The sockets
are unix-domain `ipc://` files in a private folder (mode 0700), so no other user on the
machine can inject requests, and two servers on one machine never collide.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

import zmq


@dataclass(frozen=True)
class IpcPaths:
    """The socket addresses of one server instance."""

    folder: str
    scheduler_input: str
    detokenizer_input: str
    tokenizer_input: str

    @classmethod
    def create(cls) -> IpcPaths:
        # mkdtemp creates the folder with mode 0700; chmod again in case of an odd umask.
        folder = tempfile.mkdtemp(prefix="radixgen-ipc-")
        os.chmod(folder, 0o700)
        return cls(
            folder=folder,
            scheduler_input=f"ipc://{folder}/scheduler",
            detokenizer_input=f"ipc://{folder}/detokenizer",
            tokenizer_input=f"ipc://{folder}/tokenizer",
        )

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _configure(socket: zmq.Socket) -> zmq.Socket:
    # Unbounded queues: a burst of requests must never block the event loop or drop a message;
    # the tokenizer manager bounds the number of requests in flight instead.
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    # Do not wait for undelivered messages at shutdown.
    socket.setsockopt(zmq.LINGER, 0)
    return socket


def bind_pull(context: zmq.Context, address: str) -> zmq.Socket:
    socket = _configure(context.socket(zmq.PULL))
    socket.bind(address)
    return socket


def connect_push(context: zmq.Context, address: str) -> zmq.Socket:
    socket = _configure(context.socket(zmq.PUSH))
    socket.connect(address)
    return socket


def drain_multipart(socket: zmq.Socket) -> list[list[bytes]]:
    """Every multi-frame message waiting on `socket` (its raw frames), without blocking."""
    messages = []
    while True:
        try:
            messages.append(socket.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            return messages


def drain(socket: zmq.Socket) -> list[object]:
    """Every message waiting on `socket`, without blocking."""
    messages = []
    while True:
        try:
            messages.append(socket.recv_pyobj(zmq.NOBLOCK))
        except zmq.Again:
            return messages
