"""Where a 1-token request's time goes inside `radixgen serve` (a profiling aid, not a test).

    python scripts/trace_request_path.py [--model-path tiny] [--preload 256] [--num 20] \\
        [--output-json OUT.json] [-- SERVER FLAGS...]

Starts the server with a `sitecustomize` (from a temporary folder on PYTHONPATH) that wraps a
few methods in every server process and logs `time.monotonic()` (one clock for all processes
on Linux) per event; optionally runs `bench serving` random-ids first (`--preload` prompts at 64
concurrent, as `scripts/ab_bench.sh serving-json` does before its TTFT bench, which fills the
radix cache); then sends 1-token /generate requests one at a time, alternating unconstrained and
a never-seen JSON schema (`bench_schema_ttft.py`'s). Prints, per kind, the median time from the
client's send to each event (ms), and the median duration of the step that produced the token
and of the idle integrity checks:
http_enter/http_parsed (route), built_req (validation), admit (tokenizer manager), sched_add,
compile_begin/compile_end (grammar thread), grammar_ready (the scheduler's poll), step_out (the
step with the token ended), idle_check (an integrity check ended), route (outputs back in the
HTTP process), end (response at the client). Works on older trees too (missing methods are
skipped), so it can compare a baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx

from radixgen.runtime.bench.datasets import DatasetArgs, build_dataset
from radixgen.runtime.bench.serving import ServingArgs, run_serving
from radixgen.runtime.server.subprocess_launcher import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_schema_ttft import fresh_schema  # noqa: E402

SITECUSTOMIZE = r"""
import functools, importlib.abc, importlib.util, os, sys, threading, time
_DIR = os.environ.get("RADIXGEN_TRACE_DIR")
_lock = threading.Lock()
_log = []

def ev(name, extra=""):
    with _lock:
        if not _log:
            _log.append(open(os.path.join(_DIR, f"{os.getpid()}.log"), "a", buffering=1))
        _log[0].write(f"{time.monotonic():.6f} {name} {extra}\n")

def wrap(owner, attr, before=None, after=None):
    fn = getattr(owner, attr, None)
    if fn is None:
        return
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.monotonic()
        if before: before(*args, **kwargs)
        result = fn(*args, **kwargs)
        if after: after(result, start, *args, **kwargs)
        return result
    setattr(owner, attr, wrapper)

def scheduler(m):
    wrap(m.Scheduler, "add_request", before=lambda s, r: ev("sched_add", r.rid))
    wrap(m.Scheduler, "step", after=lambda out, t, s: ev(
        "step", f"{1e3 * (time.monotonic() - t):.3f} " + ",".join(o.rid for o in out[:4])))
    for name in ("check_integrity_when_idle", "_check_integrity_when_idle"):
        wrap(m.Scheduler, name, after=lambda out, t, s: ev(
            "idle_check", f"{1e3 * (time.monotonic() - t):.3f}"))

def grammar(m):
    def ready(out, t, hook, req):
        if getattr(req, "grammar_ready", False) and not getattr(req, "_traced", False):
            req._traced = True
            ev("grammar_ready", req.rid)
    wrap(m.GrammarHook, "poll", after=ready)

def backend(m):
    wrap(m.GrammarBackend, "_compile_key", before=lambda s, k: ev("compile_begin"),
         after=lambda out, t, s, k: ev("compile_end"))

def tokenizer_manager(m):
    wrap(m.TokenizerManager, "_admit", after=lambda rid, t, s, r: ev("admit", rid))
    wrap(m.TokenizerManager, "_route_outputs",
         before=lambda s, step, deltas: ev("route", ",".join(step.rids[:4])))

def native_api(m):
    parse = m.parse_json_body
    @functools.wraps(parse)
    async def traced_parse(*args, **kwargs):
        ev("http_enter")
        return await parse(*args, **kwargs)
    m.parse_json_body = traced_parse
    wrap(m, "build_request", after=lambda out, t, **k: ev("built_req"))

PATCHES = {
    "radixgen.runtime.scheduler": scheduler,
    "radixgen.runtime.grammar_hook": grammar,
    "radixgen.constrained.backend": backend,
    "radixgen.runtime.server.tokenizer_manager": tokenizer_manager,
    "radixgen.runtime.server.native_api": native_api,
}

class PatchAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        def patched(module):
            exec_module(module)
            PATCHES[name](module)
        spec.loader.exec_module = patched
        return spec

if _DIR:
    sys.meta_path.insert(0, PatchAfterImport())
"""


def send_requests(base_url: str, num: int) -> list[tuple[str, float, float, str]]:
    """(kind, sent, answered, rid) per request, monotonic seconds; 3 warm-up pairs first."""
    one = {"max_new_tokens": 1, "temperature": 0, "constraint_budget": False}
    rows = []
    with httpx.Client(base_url=base_url, timeout=120) as client:
        for index in range(-3, num):
            for kind, params in (("plain", one), ("schema", {**one, "json_schema": None})):
                if kind == "schema":
                    params["json_schema"] = fresh_schema(index)
                body = {"text": "Describe a person as JSON: ", "sampling_params": params}
                sent = time.monotonic()
                response = client.post("/generate", json=body)
                answered = time.monotonic()
                response.raise_for_status()
                if index >= 0:
                    rows.append((kind, sent, answered, response.json()["meta_info"]["id"]))
    return rows


def read_events(folder: str) -> list[tuple[float, str, str]]:
    events = []
    for path in Path(folder).glob("*.log"):
        for line in path.read_text().splitlines():
            stamp, name, *extra = line.split(" ", 2)
            events.append((float(stamp), name, extra[0] if extra else ""))
    return sorted(events)


def summarize(rows, events) -> dict:
    """Per kind: median ms from send to each event's first occurrence inside the request."""
    offsets: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for kind, sent, answered, rid in rows:
        seen: dict[str, float] = {}
        for stamp, name, extra in events:
            if not sent <= stamp <= answered:
                continue
            if name == "step":
                duration_ms, _, rids = extra.partition(" ")
                if rid not in rids.split(","):
                    continue
                name = "step_out"
                offsets[kind]["step_out_duration"].append(float(duration_ms))
            elif name == "idle_check":
                offsets[kind]["idle_check_duration"].append(float(extra))
            seen.setdefault(name, 1e3 * (stamp - sent))
        seen["end"] = 1e3 * (answered - sent)
        for name, value in seen.items():
            offsets[kind][name].append(value)
    return {
        kind: {
            name: round(statistics.median(values), 2)
            for name, values in sorted(table.items(), key=lambda item: statistics.median(item[1]))
        }
        for kind, table in offsets.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default="tiny")
    parser.add_argument(
        "--preload", type=int, default=256, help="random-ids prompts first (0: none)"
    )
    parser.add_argument("--num", type=int, default=20)
    parser.add_argument("--output-json", default=None)
    parser.add_argument("server_flags", nargs=argparse.REMAINDER, help="after --: server flags")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="radixgen-trace-")
    Path(folder, "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {
        "RADIXGEN_TRACE_DIR": folder,
        "PYTHONPATH": os.pathsep.join([folder, os.environ.get("PYTHONPATH", "")]),
    }
    flags = ["--model-path", args.model_path, "--log-level", "warning"]
    flags += [flag for flag in args.server_flags if flag != "--"]
    with ServerProcess(flags, env=env, startup_timeout_s=900) as server:
        if args.preload:
            dataset = DatasetArgs(
                dataset="random-ids",
                num_prompts=args.preload,
                random_input_len=64,
                random_output_len=48,
            )
            serving = ServingArgs(base_url=server.base_url, max_concurrency=64)
            asyncio.run(run_serving(serving, build_dataset(dataset)))
        rows = send_requests(server.base_url, args.num)
        time.sleep(0.5)  # the last idle check's line
    result = {"num": args.num, "preload": args.preload, **summarize(rows, read_events(folder))}
    print(json.dumps(result, indent=1))
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
