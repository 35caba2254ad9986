"""Data parallelism: the prefix tree, the routing policies, and real replicas behind
`radixgen serve --dp-size 2` and a standalone `radixgen router`."""

from __future__ import annotations

import os
import random
import signal
import time

import httpx
import pytest

from radixgen.runtime.router.app import routing_key
from radixgen.runtime.router.policy import (
    CacheAwarePolicy,
    CacheAwareSettings,
    RoundRobinPolicy,
    Worker,
    make_policy,
)
from radixgen.runtime.router.prefix_tree import ApproximatePrefixTree, common_prefix_len
from radixgen.runtime.server.subprocess_launcher import ServerProcess


def _brute_force_match(keys: list[str], key: str) -> int:
    return max((len(os.path.commonprefix([kept, key])) for kept in keys), default=0)


def test_prefix_tree_matches_brute_force():
    rng = random.Random(0)
    tree = ApproximatePrefixTree(max_elements=10**6)
    keys: list[str] = []
    for _ in range(300):
        base = rng.choice(keys) if keys and rng.random() < 0.6 else ""
        key = base[: rng.randint(0, len(base))] + "".join(rng.choices("abc", k=rng.randint(0, 6)))
        probe = "".join(rng.choices("abc", k=rng.randint(0, 8)))
        for query in (key, probe, key + "a"):
            assert tree.match_len(query) == _brute_force_match(keys, query), query
        tree.insert(key)
        if key:
            keys.append(key)


def test_prefix_tree_forgets_the_oldest_prompts():
    tree = ApproximatePrefixTree(max_elements=100)
    tree.insert(tuple(range(60)))  # token ids work as keys too
    tree.insert(tuple(range(1000, 1060)))  # over the bound: the first prompt is forgotten
    assert tree.num_elements == 60
    assert tree.match_len(tuple(range(60))) == 0
    assert tree.match_len(tuple(range(1000, 1030))) == 30


def _workers(count: int) -> list[Worker]:
    return [Worker(f"http://w{index}", healthy=True) for index in range(count)]


def test_cache_aware_follows_the_prefix_until_load_is_imbalanced():
    policy = CacheAwarePolicy(CacheAwareSettings(balance_abs_threshold=4))
    workers = _workers(2)
    first = policy.choose(workers, "system A: question 1")
    other = policy.choose(workers, "system B: question 1")
    assert other is not first  # no match: the replica that remembers less
    for question in range(3):
        assert policy.choose(workers, f"system A: question {question}") is first
        assert policy.choose(workers, f"system B: question {question}") is other
    first.in_flight = 10  # imbalanced: 10 - 0 > 4 and 10 > 1.5 * 0
    assert policy.choose(workers, "system A: question 9") is other


def test_round_robin_cycles_and_policy_names_are_checked():
    workers = _workers(3)
    policy = RoundRobinPolicy()
    assert [policy.choose(workers, "same").url for _ in range(4)] == [
        "http://w0",
        "http://w1",
        "http://w2",
        "http://w0",
    ]
    with pytest.raises(ValueError, match="routing_policy"):
        make_policy("random", CacheAwareSettings())
    with pytest.raises(ValueError, match="cache_threshold"):
        CacheAwareSettings(cache_threshold=2.0)


def test_routing_keys():
    assert routing_key("/generate", {"text": "abc"}) == "abc"
    assert routing_key("/generate", {"input_ids": [[5, 6], [7]]}) == (5, 6)
    assert routing_key("/v1/completions", {"prompt": ["p1", "p2"]}) == "p1"
    chat = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}
    assert routing_key("/v1/chat/completions", chat) == "system:S\nuser:U\n"
    # Cache namespaces (LoRA adapter, cache_salt): keys that share no more than a marker.
    tuned = routing_key("/generate", {"text": "abc", "lora_path": "a"})
    salted = routing_key("/generate", {"text": "abc", "cache_salt": "tenant"})
    assert tuned.endswith("abc") and salted.endswith("abc") and "abc" not in (tuned[:3], salted[:3])
    assert common_prefix_len(tuned, salted) <= 1
    assert routing_key("/generate", {"text": "abc", "lora_path": ["a", None]}) == tuned
    assert routing_key("/v1/completions", {"prompt": "abc", "model": "a"}) == tuned
    by_ids = routing_key("/generate", {"input_ids": [5, 6], "lora_path": "a"})
    assert by_ids[1:] == (5, 6) and by_ids[0] != routing_key("/generate", {"input_ids": [5]})[0]


SERVE_FLAGS = ["--device", "cpu", "--dtype", "float32", "--skip-warmup"]
SERVE_FLAGS += ["--context-length", "512", "--log-level", "warning"]
SYSTEM_PROMPTS = [f"You are assistant number {n}. " * 8 for n in range(4)]


def _generate(base_url: str, text: str) -> dict:
    body = {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    response = httpx.post(f"{base_url}/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _cached_fraction(base_url: str) -> float:
    """Cluster cache hit rate of a second question right after the first, per system prompt
    (round robin over 2 replicas sends the two to different replicas)."""
    cached = prompt = 0
    for system in SYSTEM_PROMPTS:
        _generate(base_url, system + "First question?")
        meta = _generate(base_url, system + "Second question?")["meta_info"]
        cached += meta["cached_tokens"]
        prompt += meta["prompt_tokens"]
    return cached / prompt


def _adapters(base_url: str) -> list[str]:
    models = httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"]
    return [card["id"] for card in models[1:]]  # the base model's card comes first


def test_dp_replicas_and_standalone_router(lora_adapter_paths):
    flags = [*SERVE_FLAGS, "--dp-size", "2", "--lora-paths", f"a={lora_adapter_paths['a']}"]
    with ServerProcess(flags, startup_timeout_s=180) as front:
        # The front end is healthy at the first replica; wait for the second too.
        deadline = time.monotonic() + 120
        while True:
            workers = httpx.get(f"{front.base_url}/workers").json()["workers"]
            if all(worker["healthy"] for worker in workers) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [worker["healthy"] for worker in workers] == [True, True]
        urls = [worker["url"] for worker in workers]
        # Cache-aware (the default): every second question finds its system prompt cached.
        assert _cached_fraction(front.base_url) > 0.8
        # Adapters load and unload on every replica through the front end.
        load = {"lora_name": "b", "lora_path": lora_adapter_paths["b"]}
        response = httpx.post(f"{front.base_url}/load_lora_adapter", json=load, timeout=60)
        assert response.status_code == 200, response.text
        assert [_adapters(url) for url in urls] == [["a", "b"], ["a", "b"]]
        body = {"text": "def f():", "lora_path": "b", "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(f"{front.base_url}/generate", json=body, timeout=60).status_code == 200
        unload = {"lora_name": "b"}
        response = httpx.post(f"{front.base_url}/unload_lora_adapter", json=unload, timeout=60)
        assert response.status_code == 200, response.text
        assert [_adapters(url) for url in urls] == [["a"], ["a"]]
        response = httpx.post(f"{front.base_url}/unload_lora_adapter", json=unload, timeout=60)
        assert response.status_code == 404  # a replica's refusal comes through
        router_flags = ["--worker-urls", *urls, "--policy", "round_robin"]
        router_flags += ["--health-check-interval-s", "0.2", "--log-level", "warning"]
        entry = ("-m", "radixgen.runtime.cli", "router")
        with ServerProcess(router_flags, entry=entry) as router:
            assert httpx.post(f"{router.base_url}/flush_cache").json() == {"success": True}
            # Round robin over 2 replicas: each second question lands on the other replica.
            assert _cached_fraction(router.base_url) < 0.2
            assert httpx.get(f"{router.base_url}/v1/models").status_code == 200
            # A dead replica leaves the rotation; requests keep being served by the other.
            pid = httpx.get(f"{urls[1]}/get_server_info").json()["process_ids"]["server"]
            os.kill(pid, signal.SIGKILL)
            for question in range(4):
                _generate(router.base_url, f"after the crash {question}")
                _generate(front.base_url, f"after the crash {question}")
            described = httpx.get(f"{router.base_url}/workers").json()["workers"]
            assert [worker["healthy"] for worker in described] == [True, False]
        survivor = httpx.get(f"{urls[0]}/get_server_info").json()["process_ids"]["server"]
    # Stopping the front end (SIGTERM) stopped its replicas too.
    with pytest.raises(ProcessLookupError):
        os.kill(survivor, 0)


def test_parallel_flags_parse_and_are_validated():
    from radixgen.runtime.cli import build_parser, server_args_from_namespace
    from radixgen.runtime.server_args import ServerArgs

    flags = ["serve", "--tp-size", "4", "--dp-size", "2", "--policy", "round_robin"]
    flags += ["--nnodes", "1", "--dist-init-addr", "10.0.0.1:5000", "--dist-timeout", "60"]
    args = server_args_from_namespace(build_parser().parse_args(flags))
    assert (args.tp_size, args.dp_size, args.routing_policy) == (4, 2, "round_robin")
    assert args.dist_init_addr == "10.0.0.1:5000" and args.dist_timeout == 60
    for bad, match in (
        (dict(tp_size=0), "tp_size"),
        (dict(tp_size=3, nnodes=2, dist_init_addr="h:1"), "multiple of nnodes"),
        (dict(tp_size=2, nnodes=2), "dist_init_addr"),
        (dict(dist_init_addr="no-port"), "host:port"),
        (dict(node_rank=1), "node_rank"),
        (dict(routing_policy="random"), "routing_policy"),
    ):
        with pytest.raises(ValueError, match=match):
            ServerArgs(**bad)
    with pytest.raises(ValueError, match="dp_size"):
        from radixgen.runtime.engine import Engine

        Engine("tiny", dp_size=2)
    router = build_parser().parse_args(
        ["router", "--worker-urls", "http://a:1", "--policy", "round_robin"]
    )
    assert router.routing_policy == "round_robin" and router.worker_urls == ["http://a:1"]


def _wait_for_health(router_url: str, healthy: bool) -> None:
    deadline = time.monotonic() + 60
    while httpx.get(f"{router_url}/workers").json()["workers"][0]["healthy"] != healthy:
        assert time.monotonic() < deadline, f"the worker never became healthy={healthy}"
        time.sleep(0.1)


def test_a_replica_that_comes_back_gets_the_routers_adapters(lora_adapter_paths):
    """A replica restarted after an adapter was loaded through the router, and another
    unloaded, holds the loaded one (and not the other) before it serves again."""
    flags = [*SERVE_FLAGS, "--lora-paths", f"a={lora_adapter_paths['a']}"]
    with ServerProcess(flags) as worker:
        router_flags = ["--worker-urls", worker.base_url, "--health-check-interval-s", "0.1"]
        entry = ("-m", "radixgen.runtime.cli", "router")
        with ServerProcess([*router_flags, "--log-level", "warning"], entry=entry) as router:
            load = {"lora_name": "b", "lora_path": lora_adapter_paths["b"]}
            assert httpx.post(f"{router.base_url}/load_lora_adapter", json=load).status_code == 200
            unload = {"lora_name": "a"}
            response = httpx.post(f"{router.base_url}/unload_lora_adapter", json=unload)
            assert response.status_code == 200
            worker.stop()
            _wait_for_health(router.base_url, healthy=False)
            worker.start()  # the same port, a fresh process: "a" loaded at start-up, no "b"
            _wait_for_health(router.base_url, healthy=True)
            assert _adapters(worker.base_url) == ["b"]
