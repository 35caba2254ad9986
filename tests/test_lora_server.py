"""Multi-LoRA over HTTP on the `tiny` model, with real clients (httpx, openai): adapters chosen by
`lora_path` on /generate and by `model` ("base:adapter" or the adapter's name) on the OpenAI
endpoints, listed by /v1/models, loaded and unloaded at run time; unknown adapters are 404s
naming them. The server is the suite's shared OpenAI server (shared_servers.py), which loads
adapter "a" and takes an API key."""

from __future__ import annotations

import httpx
import openai
import pytest

GREEDY = {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True}
PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def server(openai_server):
    return openai_server


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers=server.headers, timeout=60)


def openai_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key, max_retries=0)


def generate(server, lora_path=None) -> list[int]:
    response = post(
        server, "/generate", {"text": PROMPT, "sampling_params": GREEDY, "lora_path": lora_path}
    )
    assert response.status_code == 200, response.text
    return response.json()["output_ids"]


def test_adapters_by_lora_path_and_by_openai_model(server):
    client = openai_client(server)
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny", "a"] and models[1].parent == "tiny"
    base_ids, adapter_ids = generate(server), generate(server, "a")
    assert base_ids != adapter_ids
    tokens = {}
    for model in ("tiny", "tiny:a", "a"):
        completion = client.completions.create(
            model=model, prompt=PROMPT, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
        )
        tokens[model] = completion.choices[0].text
    assert tokens["tiny:a"] == tokens["a"] != tokens["tiny"]
    batch = post(
        server,
        "/generate",
        {"text": [PROMPT, PROMPT], "sampling_params": GREEDY, "lora_path": ["a", None]},
    ).json()
    assert [item["output_ids"] for item in batch] == [adapter_ids, base_ids]


def test_unknown_adapters_are_404s_naming_them(server):
    response = post(server, "/generate", {"text": PROMPT, "lora_path": "zzz"})
    assert response.status_code == 404 and "'zzz'" in response.json()["error"]["message"]
    assert response.json()["error"]["param"] == "lora_path"
    client = openai_client(server)
    with pytest.raises(openai.NotFoundError, match="tiny:zzz"):
        client.completions.create(model="tiny:zzz", prompt=PROMPT, max_tokens=2)
    response = post(server, "/generate", {"text": [PROMPT], "lora_path": ["a", "a"]})
    assert response.status_code == 400 and "lora_path has 2 entries" in response.text


def test_load_and_unload_at_run_time(server, lora_adapter_paths, tmp_path):
    body = {"lora_name": "b", "lora_path": lora_adapter_paths["b"]}
    loaded = post(server, "/load_lora_adapter", body)
    assert loaded.status_code == 200 and loaded.json()["loaded_adapters"] == ["a", "b"]
    models = httpx.get(f"{server.base_url}/v1/models", headers=server.headers).json()["data"]
    assert [m["id"] for m in models] == ["tiny", "a", "b"]
    first = post(server, "/generate", {"text": PROMPT, "sampling_params": GREEDY, "lora_path": "b"})
    again = post(server, "/generate", {"text": PROMPT, "sampling_params": GREEDY, "lora_path": "b"})
    assert first.json()["meta_info"]["cached_tokens"] == 0  # b's namespace: computed once
    assert again.json()["meta_info"]["cached_tokens"] > 0
    assert first.json()["output_ids"] not in (generate(server), generate(server, "a"))
    bad = post(server, "/load_lora_adapter", {"lora_name": "c", "lora_path": str(tmp_path)})
    assert bad.status_code == 400 and "adapter_config.json" in bad.text
    unloaded = post(server, "/unload_lora_adapter", {"lora_name": "b"})
    assert unloaded.status_code == 200 and unloaded.json()["loaded_adapters"] == ["a"]
    assert post(server, "/unload_lora_adapter", {"lora_name": "b"}).status_code == 404
    assert post(server, "/generate", {"text": PROMPT, "lora_path": "b"}).status_code == 404
    assert post(server, "/load_lora_adapter", {"lora_name": "x"}).status_code == 400


def test_dsl_backends_send_the_adapter(server):
    import radixgen as rg

    @rg.function
    def complete(s):
        s += rg.user("Say something.")
        s += rg.assistant(rg.gen("reply", max_tokens=5, ignore_eos=True))

    openai_backend = rg.OpenAI("tiny", base_url=f"{server.base_url}/v1", api_key=server.api_key)
    endpoint = rg.RuntimeEndpoint(server.base_url, api_key=server.api_key)
    replies = {
        (name, adapter): complete.run(temperature=0, lora_path=adapter, backend=backend)["reply"]
        for name, backend in (("openai", openai_backend), ("native", endpoint))
        for adapter in (None, "a")
    }
    assert replies[("openai", "a")] == replies[("native", "a")] != replies[("native", None)]
    assert replies[("openai", None)] == replies[("native", None)]
