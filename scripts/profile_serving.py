"""Where a served benchmark spends its CPU time, per server process (a profiling aid, not a test).

    .venv/bin/python scripts/profile_serving.py [--num-groups 4 --prompts-per-group 16 ...]

Starts `radixgen serve` (tiny model on the CPU unless --model-path), runs `bench serving` on
a scaled-down generated-shared-prefix workload (or random ids), and reports, per process (HTTP + tokenizer
manager, scheduler, detokenizer), and for `bench serving`'s client (this process):
- the CPU seconds it used during the run (/proc/PID/stat), against the run's wall time;
- a cProfile of its main thread during the run, top functions by own time.
Then it runs the same workload in-process (`bench offline`'s Engine) for the served /
in-process ratio. Profiling: every server process imports a `sitecustomize` from a temporary
folder that starts cProfile on SIGUSR1 and writes it on SIGUSR2 (py-spy is not installed).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import json
import os
import pstats
import signal
import sys
import tempfile
import time

import httpx

from radixgen.runtime.bench.datasets import DatasetArgs, build_dataset
from radixgen.runtime.bench.offline import OfflineArgs, run_offline
from radixgen.runtime.bench.serving import ServingArgs, run_serving
from radixgen.runtime.server.subprocess_launcher import ServerProcess
from radixgen.runtime.server_args import ServerArgs

SITECUSTOMIZE = """
import cProfile, gc, json, os, signal, time
_profile_dir = os.environ.get("RADIXGEN_PROFILE_DIR")
if _profile_dir:
    _profiler = cProfile.Profile()
    _gc = {"on": False, "start": 0.0, "seconds": [0.0, 0.0, 0.0], "count": [0, 0, 0]}
    def _gc_timer(phase, info):  # collector pauses between the two signals, per generation
        if not _gc["on"]:
            return
        if phase == "start":
            _gc["start"] = time.perf_counter()
        else:
            _gc["seconds"][info["generation"]] += time.perf_counter() - _gc["start"]
            _gc["count"][info["generation"]] += 1
    gc.callbacks.append(_gc_timer)
    def _start(signum, frame):
        _gc["on"] = True
        _profiler.enable()
    def _stop(signum, frame):
        _profiler.disable()
        _gc["on"] = False
        _profiler.dump_stats(os.path.join(_profile_dir, f"{os.getpid()}.prof"))
        with open(os.path.join(_profile_dir, f"{os.getpid()}.gc.json"), "w") as file:
            json.dump({"seconds": _gc["seconds"], "count": _gc["count"]}, file)
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
"""


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def top_functions(path: str, limit: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(path, stream=out)
    stats.sort_stats("tottime").print_stats(limit)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if "ncalls" in line)
    header = [line for line in lines[:start] if "function calls" in line]
    return "\n".join(header + lines[start:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", default="tiny")
    parser.add_argument("--dataset", choices=("generated-shared-prefix", "random-ids"),
                        default="generated-shared-prefix")  # fmt: skip
    parser.add_argument("--num-prompts", type=int, default=256)  # random-ids
    parser.add_argument("--input-len", type=int, default=24)  # random-ids
    parser.add_argument("--num-groups", type=int, default=4)
    parser.add_argument("--prompts-per-group", type=int, default=16)
    parser.add_argument("--system-prompt-len", type=int, default=512)
    parser.add_argument("--question-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--skip-offline", action="store_true")
    args = parser.parse_args()
    dataset = DatasetArgs(
        dataset=args.dataset,
        num_prompts=args.num_prompts,
        random_input_len=args.input_len,
        random_output_len=args.output_len,
        gsp_num_groups=args.num_groups,
        gsp_prompts_per_group=args.prompts_per_group,
        gsp_system_prompt_len=args.system_prompt_len,
        gsp_question_len=args.question_len,
        gsp_output_len=args.output_len,
    )
    requests = build_dataset(dataset)
    profile_dir = tempfile.mkdtemp(prefix="radixgen-profile-")
    with open(os.path.join(profile_dir, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    env = {
        "RADIXGEN_PROFILE_DIR": profile_dir,
        "PYTHONPATH": os.pathsep.join([profile_dir, os.environ.get("PYTHONPATH", "")]),
    }
    flags = ["--model-path", args.model_path, "--log-level", "warning"]
    with ServerProcess(flags, env=env) as server:
        info = httpx.get(f"{server.base_url}/get_server_info").json()
        pids = info["process_ids"]  # {"server", "scheduler", "detokenizer"}
        serving = ServingArgs(base_url=server.base_url)
        # A short untimed run first, so both sides are warm (as `bench offline` does).
        asyncio.run(run_serving(serving, requests[:4]))
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        for pid in pids.values():
            os.kill(pid, signal.SIGUSR1)
        start, client_start = time.perf_counter(), time.process_time()
        summary, _ = asyncio.run(run_serving(serving, requests))
        wall_s = time.perf_counter() - start
        client_s = time.process_time() - client_start  # this process: bench serving's client
        for pid in pids.values():
            os.kill(pid, signal.SIGUSR2)
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        cpu["client"] = client_s
        time.sleep(1.0)  # the profiles are written by the signal handlers
    print(f"workload: {len(requests)} requests, {dataclasses.asdict(dataset)}")
    print(
        f"served: {wall_s:.2f} s wall, mean TTFT {summary['mean_ttft_ms']:.1f} ms, "
        f"mean TPOT {summary['mean_tpot_ms']:.2f} ms"
    )
    tokens = summary["total_output_tokens"]
    for name, seconds in cpu.items():
        gc_path = os.path.join(profile_dir, f"{pids.get(name)}.gc.json")
        collector = ""
        if name in pids and os.path.exists(gc_path):  # a server process's collector pauses
            with open(gc_path) as file:
                gc_stats = json.load(file)
            collector = (
                f"; GC {sum(gc_stats['seconds']):.2f} s, "
                f"{gc_stats['count'][2]} full collections ({gc_stats['seconds'][2]:.2f} s)"
            )
        print(
            f"  {name:<12} CPU {seconds:6.2f} s  ({100 * seconds / wall_s:5.1f}% of wall, "
            f"{1e6 * seconds / tokens:6.1f} us per output token{collector})"
        )
    if not args.skip_offline:
        offline = run_offline(
            ServerArgs(model_path=args.model_path, log_level="warning"), dataset, OfflineArgs()
        )
        ratio = wall_s / offline["duration_s"]
        print(f"in-process: {offline['duration_s']:.2f} s wall; served / in-process {ratio:.2f}x")
    for name, pid in pids.items():
        path = os.path.join(profile_dir, f"{pid}.prof")
        if os.path.exists(path):
            print(f"\n===== {name} (pid {pid}): main thread, by own time =====")
            print(top_functions(path, args.top))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
