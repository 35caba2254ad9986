"""`radixgen bench serving`: load a running server and measure it like the common serving
benchmarks do (request/token throughput; TTFT, TPOT, ITL and end-to-end latency).

Works against radixgen's native `/generate` API (`--backend radixgen`) and against any
OpenAI-compatible server's `/v1/completions` (`--backend openai`). Every request streams,
so that time to first token and inter-token latencies are observed on the client.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Literal
from urllib.parse import urlsplit

import numpy as np
from tqdm import tqdm

from radixgen.runtime.bench.datasets import BenchRequest, DatasetArgs, build_dataset

BackendName = Literal["radixgen", "openai"]


@dataclass(frozen=True)
class ServingArgs:
    base_url: str = "http://127.0.0.1:30000"
    # SGLang's --host/--port: they replace base_url's host and port when given.
    host: str | None = None
    port: int | None = None
    backend: BackendName = "radixgen"
    model: str | None = None  # OpenAI model name; None: the server's first model
    api_key: str | None = None
    request_rate: float = float("inf")  # Poisson arrivals per second; inf: all at once
    max_concurrency: int | None = None
    seed: int = 0
    disable_ignore_eos: bool = False
    timeout_s: float = 3600.0

    @property
    def url(self) -> str:
        """`base_url`, with `host` and `port` in place of its own where they are given."""
        if self.host is None and self.port is None:
            return self.base_url
        url = urlsplit(self.base_url)
        host = self.host or url.hostname or "127.0.0.1"
        port = self.port or url.port or 30000
        return f"{url.scheme or 'http'}://{host}:{port}"


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int = 0
    output_len: int = 0
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    start_s: float = 0.0  # when the client began sending it, since the run's start
    itl_s: list[float] = field(default_factory=list)  # gaps between streamed chunks
    cached_tokens: int = 0
    output_ids: list[int] | None = None
    error: str = ""


def _headers(args: ServingArgs) -> dict:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def _iter_sse_payloads(line: str):
    if line.startswith("data:"):
        payload = line[len("data:") :].strip()
        if payload and payload != "[DONE]":
            yield json.loads(payload)


async def _send_native(
    client, args: ServingArgs, request: BenchRequest, input_ids
) -> RequestResult:
    sampling = {
        "max_new_tokens": request.output_len,
        "temperature": 0.0,
        "ignore_eos": not args.disable_ignore_eos,
    }
    if request.json_schema is not None:
        sampling["json_schema"] = json.dumps(request.json_schema)
        sampling["ignore_eos"] = False
    body = {"sampling_params": sampling, "stream": True}
    if input_ids is not None:
        body["input_ids"] = input_ids
    else:
        body["text"] = request.text
    result = RequestResult(ok=False, prompt_len=len(input_ids or []))
    start = last = time.perf_counter()
    async with client.stream(
        "POST", f"{args.url}/generate", json=body, headers=_headers(args)
    ) as response:
        if response.status_code != 200:
            result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
            return result
        meta = {}
        async for line in response.aiter_lines():
            for chunk in _iter_sse_payloads(line):
                now = time.perf_counter()
                if result.ttft_s == 0.0:
                    result.ttft_s = now - start
                else:
                    result.itl_s.append(now - last)
                last = now
                meta = chunk.get("meta_info", meta)
                if "output_ids" in chunk:
                    result.output_ids = chunk["output_ids"]
    result.e2e_s = time.perf_counter() - start
    result.output_len = int(meta.get("completion_tokens", 0))
    result.prompt_len = int(meta.get("prompt_tokens", result.prompt_len))
    result.cached_tokens = int(meta.get("cached_tokens", 0))
    result.ok = result.output_len > 0
    return result


async def _send_openai(
    client, args: ServingArgs, request: BenchRequest, input_ids, model
) -> RequestResult:
    body = {
        "model": model,
        "prompt": input_ids if input_ids is not None else request.text,
        "max_tokens": request.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if not args.disable_ignore_eos:
        body["ignore_eos"] = True  # extra-body field understood by radixgen, SGLang and vLLM
    if request.json_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "bench", "schema": request.json_schema},
        }
        body.pop("ignore_eos", None)
    result = RequestResult(ok=False, prompt_len=len(input_ids or []))
    start = last = time.perf_counter()
    async with client.stream(
        "POST", f"{args.url}/v1/completions", json=body, headers=_headers(args)
    ) as response:
        if response.status_code != 200:
            result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
            return result
        async for line in response.aiter_lines():
            for chunk in _iter_sse_payloads(line):
                usage = chunk.get("usage")
                if usage:
                    result.output_len = int(usage.get("completion_tokens", 0))
                    result.prompt_len = int(usage.get("prompt_tokens", result.prompt_len))
                    details = usage.get("prompt_tokens_details") or {}
                    result.cached_tokens = int(details.get("cached_tokens") or 0)
                if not chunk.get("choices"):
                    continue
                now = time.perf_counter()
                if result.ttft_s == 0.0:
                    result.ttft_s = now - start
                else:
                    result.itl_s.append(now - last)
                last = now
    result.e2e_s = time.perf_counter() - start
    result.ok = result.output_len > 0
    return result


async def _get_json(client, url: str, args: ServingArgs) -> dict | None:
    try:
        response = await client.get(url, headers=_headers(args))
        return response.json() if response.status_code == 200 else None
    except Exception:  # noqa: BLE001 - the server may not offer this endpoint
        return None


def _percentiles(values: list[float], scale: float = 1000.0) -> dict:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    array = np.asarray(values) * scale
    return {
        "mean": float(array.mean()),
        "median": float(np.median(array)),
        "p99": float(np.percentile(array, 99)),
    }


def summarize(results: list[RequestResult], duration_s: float) -> dict:
    ok = [r for r in results if r.ok]
    input_tokens = sum(r.prompt_len for r in ok)
    output_tokens = sum(r.output_len for r in ok)
    tpots = [(r.e2e_s - r.ttft_s) / (r.output_len - 1) for r in ok if r.output_len > 1]
    itls = [gap for r in ok for gap in r.itl_s]
    summary = {
        "successful_requests": len(ok),
        "failed_requests": len(results) - len(ok),
        "duration_s": duration_s,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration_s,
        "input_token_throughput": input_tokens / duration_s,
        "output_token_throughput": output_tokens / duration_s,
        "total_token_throughput": (input_tokens + output_tokens) / duration_s,
        "client_cached_tokens": sum(r.cached_tokens for r in ok),
    }
    for name, values in (
        ("ttft_ms", [r.ttft_s for r in ok]),
        ("tpot_ms", tpots),
        ("itl_ms", itls),
        ("e2e_latency_ms", [r.e2e_s for r in ok]),
    ):
        for stat, value in _percentiles(values).items():
            summary[f"{stat}_{name}"] = value
    if ok:
        # The run's timeline: the client's sending span, and when the last request saw its
        # first token (the end of the prefill phase when every request arrives at once).
        summary["last_send_ms"] = 1000 * max(r.start_s for r in ok)
        summary["last_first_token_ms"] = 1000 * max(r.start_s + r.ttft_s for r in ok)
    errors = [r.error for r in results if not r.ok and r.error]
    if errors:
        summary["first_error"] = errors[0]
    return summary


async def run_serving(
    args: ServingArgs, requests: list[BenchRequest]
) -> tuple[dict, list[RequestResult]]:
    import httpx

    # No idle connections kept: httpcore 1.0's pool walks every connection for every idle one
    # each time a request starts or ends, so keeping a finished request's connection makes
    # the client's own work quadratic in the requests in flight (1,024 requests at once: 14 s
    # of client CPU, against 3 s without; docs/benchmarks.md). Each request opens its own
    # connection, as SGLang's client (a session per request) does.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=args.timeout_s, limits=limits) as client:
        model = args.model
        if args.backend == "openai" and model is None:
            models = await _get_json(client, f"{args.url}/v1/models", args)
            if not models or not models.get("data"):
                raise RuntimeError(f"no model listed at {args.url}/v1/models; pass --model")
            model = models["data"][0]["id"]
        semaphore = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
        histories: dict[int, list[int]] = {}  # multi-turn: conversation -> ids so far

        async def one(request: BenchRequest) -> RequestResult:
            input_ids = request.input_ids
            if request.conversation is not None:
                input_ids = histories.get(request.conversation, []) + request.input_ids
            sent_at = time.perf_counter()
            try:
                if args.backend == "radixgen":
                    result = await _send_native(client, args, request, input_ids)
                else:
                    result = await _send_openai(client, args, request, input_ids, model)
            except Exception as error:  # noqa: BLE001 - a failed request is a result
                return RequestResult(ok=False, error=f"{type(error).__name__}: {error}")
            result.start_s = sent_at - start
            if request.conversation is not None:
                answer = result.output_ids or [request.input_ids[-1]] * result.output_len
                histories[request.conversation] = input_ids + answer
            return result

        progress = tqdm(total=len(requests), desc="requests", disable=not requests)

        async def guarded(request: BenchRequest) -> RequestResult:
            try:
                if semaphore is None:
                    return await one(request)
                async with semaphore:
                    return await one(request)
            finally:
                progress.update(1)

        async def conversation(turns: list[BenchRequest]) -> list[RequestResult]:
            return [await guarded(turn) for turn in turns]  # turns run in order

        rng = np.random.default_rng(args.seed)
        server_before = await _get_json(client, f"{args.url}/get_server_info", args)
        start = time.perf_counter()
        tasks = []
        if requests and requests[0].conversation is not None:
            by_conversation: dict[int, list[BenchRequest]] = {}
            for request in requests:
                by_conversation.setdefault(request.conversation, []).append(request)
            for turns in by_conversation.values():
                tasks.append(asyncio.create_task(conversation(turns)))
                if args.request_rate != float("inf"):
                    await asyncio.sleep(rng.exponential(1.0 / args.request_rate))
            nested = await asyncio.gather(*tasks)
            results = [r for group in nested for r in group]
        else:
            for request in requests:
                tasks.append(asyncio.create_task(guarded(request)))
                if args.request_rate != float("inf"):
                    await asyncio.sleep(rng.exponential(1.0 / args.request_rate))
                else:
                    # Each request starts (and the earlier ones send) before the next is built:
                    # otherwise every request's body is encoded before the first byte leaves,
                    # and the server idles for the client's whole build-up (1,024 requests of
                    # 2,176 ids on the H200: the last began 1.2 s in; docs/benchmarks.md).
                    await asyncio.sleep(0)
            results = list(await asyncio.gather(*tasks))
        duration_s = time.perf_counter() - start
        progress.close()
        server_after = await _get_json(client, f"{args.url}/get_server_info", args)
    summary = summarize(results, duration_s)
    if server_after:
        summary["server_cache_hit_rate"] = _cache_hit_rate(server_before, server_after)
        summary.update(_scheduler_time(server_before, server_after))
    return summary, results


SCHEDULER_TIMES = ("step_time_s", "deliver_time_s", "intake_time_s", "idle_time_s")


def _scheduler_time(before: dict | None, after: dict) -> dict:
    """Where the server's scheduler loop spent this run's wall time (`server_step_time_s`,
    ...): set beside the run's duration, what is left was spent outside the scheduler."""
    old = (before or {}).get("scheduler") or {}
    new = after.get("scheduler") or {}
    return {
        f"server_{name}": float(new[name]) - float(old.get(name, 0.0))
        for name in SCHEDULER_TIMES
        if name in new
    }


def _cache_hit_rate(before: dict | None, after: dict) -> float | None:
    """Hit rate over this run, from the server's cumulative cache counters where present."""

    def counters(info: dict | None) -> tuple[float, float]:
        cache = (info or {}).get("cache_stats") or {}
        return float(cache.get("matched_tokens", 0)), float(cache.get("lookup_tokens", 0))

    matched_after, looked_after = counters(after)
    matched_before, looked_before = counters(before)
    if looked_after > looked_before:
        return (matched_after - matched_before) / (looked_after - looked_before)
    rate = after.get("cache_hit_rate")
    return float(rate) if rate is not None else None


def print_summary(title: str, summary: dict) -> None:
    print(f"{'=' * 20} {title} {'=' * 20}")
    for key, value in summary.items():
        if isinstance(value, float):
            print(f"{key:<32} {value:>14.3f}")
        else:
            print(f"{key:<32} {value!s:>14}")


def main_serving(serving: ServingArgs, dataset: DatasetArgs, output_json: str | None) -> dict:
    requests = build_dataset(dataset)
    summary, results = asyncio.run(run_serving(serving, requests))
    summary["dataset"] = asdict(dataset)
    summary["backend"] = serving.backend
    summary["request_rate"] = serving.request_rate
    summary["max_concurrency"] = serving.max_concurrency
    print_summary(f"serving {dataset.dataset}", summary)
    if output_json:
        per_request = [
            {
                "start_ms": 1000 * r.start_s,
                "ttft_ms": 1000 * r.ttft_s,
                "e2e_ms": 1000 * r.e2e_s,
                "output_len": r.output_len,
            }
            for r in results
            if r.ok
        ]
        with open(output_json, "w") as f:
            json.dump({**summary, "per_request": per_request}, f, indent=2, default=str)
    return summary
