"""The router's HTTP front end: proxies generation requests to the replica its policy picks.

- `POST /generate`, `/v1/completions`, `/v1/chat/completions`: routed by the prompt (text as
  characters, token ids as ids; a batch by its first prompt) in its cache namespace (LoRA
  adapter, `cache_salt`: a replica reuses KV only within one), streamed or not, byte for byte.
  A replica that refuses the connection is taken out of rotation and the request goes to the
  next one (nothing was sent yet); with none left the client gets 503 in the OpenAI error shape.
- `GET /health`: 200 while at least one replica is healthy. `GET /v1/models`,
  `/get_model_info`: from a healthy replica. `POST /flush_cache`, `/load_lora_adapter`,
  `/unload_lora_adapter`: on every healthy replica (each holds its own adapters). A replica
  that joins the rotation (again: restarted, or out of it meanwhile) first gets the adapters
  loaded through the router.
- `GET /workers`: each replica's URL, health, requests in flight and remembered prefix size.
- A background task asks every replica's `/health` each `health_check_interval_s`; after
  `health_failure_threshold` failures in a row a replica leaves the rotation, and it comes
  back with its first success.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixgen.runtime.router.policy import (
    CacheAwareSettings,
    RoutingPolicyName,
    Worker,
    make_policy,
)
from radixgen.runtime.router.prefix_tree import ApproximatePrefixTree, RoutingKey

logger = logging.getLogger("radixgen.router")

ROUTED_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
# Posted to every healthy replica: each replica loads and unloads its own adapters.
BROADCAST_PATHS = ("/load_lora_adapter", "/unload_lora_adapter")
# Headers a proxy must not copy between connections (RFC 9110 hop-by-hop, and lengths httpx
# recomputes).
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass(frozen=True)
class RouterArgs:
    worker_urls: tuple[str, ...]
    routing_policy: RoutingPolicyName = "cache_aware"
    cache_aware: CacheAwareSettings = CacheAwareSettings()
    health_check_interval_s: float = 2.0
    health_failure_threshold: int = 2
    request_timeout_s: float = 600.0

    def __post_init__(self):
        if not self.worker_urls:
            raise ValueError("worker_urls must name at least one worker")
        for url in self.worker_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"worker_urls: {url!r} must start with http:// or https://")
        if not self.health_check_interval_s > 0:
            raise ValueError(
                f"health_check_interval_s must be > 0, got {self.health_check_interval_s}"
            )
        if self.health_failure_threshold < 1:
            raise ValueError(
                f"health_failure_threshold must be >= 1, got {self.health_failure_threshold}"
            )


def routing_key(path: str, body: dict) -> RoutingKey:
    """What the prefix tree matches on: the prompt as text or token ids (first of a batch),
    after a marker of its cache namespace when it has one (a LoRA adapter, a `cache_salt`):
    requests of two namespaces never reuse each other's KV, so their keys share no prefix
    (text keys at most the marker's first character)."""
    key = _prompt_key(path, body)
    namespace = _cache_namespace(path, body)
    if namespace is None:
        return key
    digest = hashlib.blake2s(repr(namespace).encode(), digest_size=8).hexdigest()
    if isinstance(key, str):
        return f"\x00{digest}\x00{key}"
    return (("namespace", digest), *key)


def _cache_namespace(path: str, body: dict) -> tuple | None:
    """(adapter, salt) of the request's first prompt; None for the base model without salt.
    On the OpenAI endpoints `model` names the adapter (or the served model: then requests
    there and on /generate route apart, which only costs clients that mix the two)."""
    if path == "/generate":
        adapter, salt = body.get("lora_path"), body.get("cache_salt")
    else:
        adapter, salt = body.get("model"), body.get("cache_salt")
    adapter = adapter[0] if isinstance(adapter, list) and adapter else adapter
    salt = salt[0] if isinstance(salt, list) and salt else salt
    if adapter is None and salt is None:
        return None
    return (str(adapter), str(salt))


def _prompt_key(path: str, body: dict) -> RoutingKey:
    if path == "/v1/chat/completions":
        messages = body.get("messages") or []
        return "".join(
            f"{m.get('role', '')}:{m.get('content') or ''}\n"
            for m in messages
            if isinstance(m, dict)
        )
    prompt = body.get("prompt") if path == "/v1/completions" else body.get("text")
    if prompt is None and path == "/generate":
        prompt = body.get("input_ids")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]  # a batch goes where its first prompt goes
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(token, int) for token in prompt):
        return tuple(prompt)
    return ""  # malformed: the worker answers with its 400


def _error(status: int, message: str) -> JSONResponse:
    body = {"error": {"message": message, "type": "service_unavailable", "code": status}}
    return JSONResponse(body, status_code=status)


def _forward_headers(headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}


class Router:
    """The replicas, the policy and the HTTP client; see the module docstring."""

    def __init__(self, args: RouterArgs):
        self.args = args
        max_elements = args.cache_aware.max_tree_elements
        self.workers = [
            Worker(url.rstrip("/"), tree=ApproximatePrefixTree(max_elements))
            for url in args.worker_urls
        ]
        self.policy = make_policy(args.routing_policy, args.cache_aware)
        self.client: httpx.AsyncClient | None = None
        # Adapter changes made through the router, repeated on each replica that joins the
        # rotation: name -> (path, body, headers) of its last load or unload.
        self.adapter_changes: dict[str, tuple[str, bytes, dict[str, str]]] = {}

    def healthy_workers(self) -> list[Worker]:
        return [worker for worker in self.workers if worker.healthy]

    def mark_failed(self, worker: Worker, reason: str) -> None:
        if worker.healthy:
            logger.warning("worker %s out of rotation: %s", worker.url, reason)
        worker.healthy = False

    async def check_health_forever(self) -> None:
        while True:
            await asyncio.gather(*(self.check_health(worker) for worker in self.workers))
            await asyncio.sleep(self.args.health_check_interval_s)

    async def check_health(self, worker: Worker) -> None:
        try:
            response = await self.client.get(f"{worker.url}/health", timeout=5.0)
            ok = response.status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok and not worker.healthy:
            ok = await self.restore_adapters(worker)
            if ok:
                logger.info("worker %s in rotation", worker.url)
        if ok:
            worker.healthy, worker.consecutive_failures = True, 0
            return
        worker.consecutive_failures += 1
        if worker.consecutive_failures >= self.args.health_failure_threshold:
            self.mark_failed(worker, "health check failed")

    async def route(self, request: Request, path: str) -> Response:
        raw = await request.body()
        try:
            body = await request.json()
        except ValueError:
            body = None
        key = routing_key(path, body) if isinstance(body, dict) else ""
        headers = _forward_headers(request.headers)
        tried: set[str] = set()
        while True:
            candidates = [w for w in self.healthy_workers() if w.url not in tried]
            if not candidates:
                return _error(503, "no healthy worker to serve the request")
            worker = self.policy.choose(candidates, key)
            tried.add(worker.url)
            worker.in_flight += 1
            outgoing = self.client.build_request(
                "POST", f"{worker.url}{path}", content=raw, headers=headers
            )
            try:
                response = await self.client.send(outgoing, stream=True)
            except (httpx.ConnectError, httpx.RemoteProtocolError) as error:
                worker.in_flight -= 1
                self.mark_failed(worker, f"{type(error).__name__}: {error}")
                continue  # nothing reached the worker's model: fail over
            except httpx.HTTPError as error:
                worker.in_flight -= 1
                return _error(502, f"worker {worker.url} failed: {error}")
            return self._relay(worker, response)

    def _relay(self, worker: Worker, response: httpx.Response) -> Response:
        """Streams the worker's answer through as it comes (SSE or one JSON body)."""
        headers = _forward_headers(response.headers)

        async def body():
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            finally:
                await response.aclose()
                worker.in_flight -= 1

        return StreamingResponse(body(), status_code=response.status_code, headers=headers)

    async def forward_get(self, path: str, request: Request) -> Response:
        for worker in self.healthy_workers():
            try:
                response = await self.client.get(
                    f"{worker.url}{path}", headers=_forward_headers(request.headers)
                )
            except httpx.HTTPError as error:
                self.mark_failed(worker, str(error))
                continue
            return Response(
                response.content,
                status_code=response.status_code,
                media_type=response.headers.get("content-type"),
            )
        return _error(503, "no healthy worker")

    async def flush_all(self, request: Request) -> Response:
        async def flush(worker: Worker) -> bool:
            try:
                response = await self.client.post(
                    f"{worker.url}/flush_cache", headers=_forward_headers(request.headers)
                )
                return response.status_code == 200
            except httpx.HTTPError:
                return False

        results = await asyncio.gather(*(flush(worker) for worker in self.healthy_workers()))
        for worker in self.workers:
            worker.tree = ApproximatePrefixTree(self.args.cache_aware.max_tree_elements)
        ok = bool(results) and all(results)
        return JSONResponse({"success": ok}, status_code=200 if ok else 503)

    async def restore_adapters(self, worker: Worker) -> bool:
        """Repeats the adapter loads and unloads made through the router on `worker` before it
        (re)joins the rotation (a load it holds already, an unload it never had: refused, and
        fine); False if it could not be reached."""
        for name, (path, raw, headers) in list(self.adapter_changes.items()):
            try:
                response = await self.client.post(
                    f"{worker.url}{path}", content=raw, headers=headers
                )
            except httpx.HTTPError:
                return False
            harmless = response.status_code == 404 or "already loaded" in response.text
            if response.status_code >= 400 and not harmless:
                logger.warning("worker %s: %s %r: %s", worker.url, path, name, response.text)
        return True

    async def post_to_all(self, request: Request, path: str) -> Response:
        """Posts the request's body to every healthy replica; answers with the first replica
        that refused it (its status and body), else with the first replica's answer. Replicas
        out of rotation meanwhile miss it (docs/distributed.md)."""
        raw = await request.body()
        headers = _forward_headers(request.headers)

        async def post(worker: Worker) -> httpx.Response | None:
            try:
                return await self.client.post(f"{worker.url}{path}", content=raw, headers=headers)
            except httpx.HTTPError as error:
                self.mark_failed(worker, f"{type(error).__name__}: {error}")
                return None

        answers = await asyncio.gather(*(post(worker) for worker in self.healthy_workers()))
        answered = [answer for answer in answers if answer is not None]
        if not answered:
            return _error(503, "no healthy worker")
        refused = [answer for answer in answered if answer.status_code >= 400]
        chosen = refused[0] if refused else answered[0]
        if not refused:
            with contextlib.suppress(ValueError, TypeError, KeyError):  # accepted: it is named
                self.adapter_changes[json.loads(raw)["lora_name"]] = (path, raw, headers)
        return Response(
            chosen.content,
            status_code=chosen.status_code,
            media_type=chosen.headers.get("content-type"),
        )

    def describe(self) -> list[dict]:
        return [
            {
                "url": worker.url,
                "healthy": worker.healthy,
                "in_flight": worker.in_flight,
                "remembered_prefix_elements": worker.tree.num_elements,
            }
            for worker in self.workers
        ]


def create_router_app(args: RouterArgs) -> FastAPI:
    router = Router(args)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        timeout = httpx.Timeout(args.request_timeout_s, connect=5.0)
        # No idle connections kept, as in `bench serving`'s client: httpcore 1.0's pool walks
        # every connection for every idle one on each request's start and end (quadratic in
        # the requests in flight), and a kept connection the worker has closed fails the
        # request reusing it (docs/benchmarks.md, the benchmark client's connection pool).
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        router.client = httpx.AsyncClient(timeout=timeout, limits=limits)
        checker = asyncio.create_task(router.check_health_forever())
        try:
            yield
        finally:
            checker.cancel()
            await router.client.aclose()

    app = FastAPI(lifespan=lifespan)
    app.state.router = router

    def post_handler(forward, path: str):
        async def handle(request: Request) -> Response:
            return await forward(request, path)

        return handle

    for paths, forward in ((ROUTED_PATHS, router.route), (BROADCAST_PATHS, router.post_to_all)):
        for path in paths:
            app.add_api_route(path, post_handler(forward, path), methods=["POST"])

    @app.get("/health")
    async def health() -> Response:
        if router.healthy_workers():
            return Response(status_code=200)
        return _error(503, "no healthy worker")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await router.forward_get("/v1/models", request)

    @app.get("/get_model_info")
    async def model_info(request: Request) -> Response:
        return await router.forward_get("/get_model_info", request)

    @app.post("/flush_cache")
    async def flush_cache(request: Request) -> Response:
        return await router.flush_all(request)

    @app.get("/workers")
    async def workers() -> JSONResponse:
        return JSONResponse({"policy": args.routing_policy, "workers": router.describe()})

    return app
