"""What the scheduler and detokenizer processes share: start-up reports and lifetime rules.

A child reports once on its pipe to the launcher, `ProcessReady` or `ProcessFailed` (see
`messages.py`), then serves until its parent dies or
it is terminated. Children ignore SIGINT: a Ctrl+C in the terminal reaches the whole process
group, and the launcher, not each child, decides the order of shutdown.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
from typing import Any


def setup_child_process(name: str, log_level: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(name, log_level)


def freeze_startup_heap() -> None:
    """Takes every object alive now (modules, the model's and the tokenizer's Python objects)
    out of the garbage collector's scans; call once, before a process's serving loop (the
    in-process Engine calls it at the end of its start-up and `gc.unfreeze` at shutdown). A full
    collection then scans only what serving allocated: before, one took ~270 ms in the HTTP
    process (1,024 requests in flight, CPU machine; docs/benchmarks.md), a pause of its event
    loop, and ~220 ms in the scheduler, a pause between two forwards."""
    gc.collect()
    gc.freeze()


def configure_logging(process_name: str, log_level: str) -> None:
    logging.basicConfig(
        level=log_level.upper(),
        format=f"[%(asctime)s {process_name}] %(levelname)s %(name)s: %(message)s",
        force=True,
    )


def parent_is_alive(parent_pid: int) -> bool:
    # A dead parent re-parents us (to init or a subreaper), changing getppid().
    return os.getppid() == parent_pid


def run_entry_point(entry: str, *args: Any, **kwargs: Any) -> None:
    """A spawned child's target: calls `entry` ("module:function"), imported in the child."""
    module, name = entry.split(":")
    getattr(importlib.import_module(module), name)(*args, **kwargs)
