"""Seconds from launching `radixgen serve` to a healthy `/health`, and where they went.

    python scripts/bench_server_startup.py [--runs 3] [--model-path tiny] [--out PATH]

Each run starts a fresh server (`--skip-warmup`: the start-up alone, no kernel compiles) in a
subprocess, waits for `/health`, reads the two log lines that split the wait (the scheduler's
model loaded; the launcher's "model ... loaded", once both children are ready), and stops it.
CPU by default (`--device cpu --dtype float32`); prints one line a run and the median, and
writes them as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import time

from radixgen.runtime.server.subprocess_launcher import ServerProcess

LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+)\] (.*)$")


def log_seconds(log: str, started: datetime.datetime, process: str, text: str) -> float | None:
    """Seconds after `started` of the first `process` log line containing `text`."""
    for line in log.splitlines():
        match = LOG_TIME.match(line)
        if match and match.group(2) == process and text in match.group(3):
            stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            return (stamp - started).total_seconds()
    return None


def one_run(model_path: str, device_flags: list[str]) -> dict:
    flags = ["--model-path", model_path, *device_flags, "--skip-warmup", "--log-level", "info"]
    server = ServerProcess(flags, startup_timeout_s=300)
    started = datetime.datetime.now()
    start = time.monotonic()
    try:
        server.start()
        healthy_s = time.monotonic() - start
        log = server.log()
    finally:
        server.stop()
        server.close()
    return {
        "healthy_s": healthy_s,
        "scheduler_model_loaded_s": log_seconds(log, started, "scheduler", "loaded "),
        "children_ready_s": log_seconds(log, started, "server", "loaded: context length"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model-path", default="tiny")
    parser.add_argument("--device-flags", default="--device cpu --dtype float32")
    parser.add_argument("--out", default="server_startup.json")
    options = parser.parse_args()
    runs = [one_run(options.model_path, options.device_flags.split()) for _ in range(options.runs)]
    for index, run in enumerate(runs):
        print(f"run {index}: " + ", ".join(f"{k} {v:.2f}" for k, v in run.items() if v is not None))
    median = statistics.median(run["healthy_s"] for run in runs)
    print(f"median healthy_s {median:.2f}")
    with open(options.out, "w") as out:
        json.dump({"runs": runs, "median_healthy_s": median, **vars(options)}, out, indent=1)


if __name__ == "__main__":
    main()
