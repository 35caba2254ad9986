"""Tensor parallelism end to end on CPU (gloo): the Engine and `radixgen serve --tp-size 2`
give the greedy outputs of one process, with and without LoRA adapters (one loaded at
start-up, one while serving), and a rank that dies stops the server (exit 1)."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from radixgen.runtime.engine import Engine
from radixgen.runtime.server.subprocess_launcher import ServerProcess

PROMPTS = ["def fibonacci(n):", "import os\nimport", "class Stack:\n    def push(self, item):"]
GREEDY = {"max_new_tokens": 12, "temperature": 0}
OPTIONS = dict(device="cpu", dtype="float32", skip_warmup=True, context_length=256)
# Each prompt's adapter in the LoRA checks: "a" is loaded at start-up, "b" while serving.
ADAPTERS = ["a", None, "b"]


@pytest.fixture(scope="module")
def single_process_texts(tiny_model_path, lora_adapter_paths) -> dict[str, list[str]]:
    """One process's greedy texts: "base" without adapters, "lora" with ADAPTERS."""
    paths = [f"{name}={path}" for name, path in lora_adapter_paths.items()]
    with Engine(tiny_model_path, lora_paths=paths, **OPTIONS) as engine:
        base = [output["text"] for output in engine.generate(PROMPTS, GREEDY)]
        tuned = engine.generate(PROMPTS, GREEDY, lora_path=ADAPTERS)
    texts = {"base": base, "lora": [output["text"] for output in tuned]}
    assert texts["lora"][0] != base[0] and texts["lora"][1] == base[1]  # the adapters act
    return texts


def test_engine_tp2_equals_tp1(tiny_model_path, lora_adapter_paths, single_process_texts):
    start_up = [f"a={lora_adapter_paths['a']}"]
    with Engine(tiny_model_path, tp_size=2, lora_paths=start_up, **OPTIONS) as engine:
        # One prompt twice: the second reuses the first's cached prefix (rank 0's radix tree
        # chose the slots; the follower reads them from the broadcast rows).
        texts = [output["text"] for output in engine.generate(PROMPTS, GREEDY)]
        again = engine.generate(PROMPTS[0], GREEDY)
        assert again["meta_info"]["cached_tokens"] > 0
        engine.load_lora_adapter("b", lora_adapter_paths["b"])  # the follower loads it too
        tuned = engine.generate(PROMPTS, GREEDY, lora_path=ADAPTERS)
        engine.check_integrity()
    assert texts == single_process_texts["base"]
    assert again["text"] == single_process_texts["base"][0]
    assert [output["text"] for output in tuned] == single_process_texts["lora"]


@pytest.mark.parametrize("algorithm", ["STANDALONE", "EAGLE"])
def test_engine_tp2_speculative_equals_tp1(
    tiny_model_path, lora_adapter_paths, single_process_texts, algorithm
):
    """Drafting on rank 0: a STANDALONE draft (tiny as its own: every draft accepted), or tiny's
    EAGLE head over the embedding and LM head gathered whole from the ranks (its drafts are
    only accepted if those are right); the verify forwards reach the follower like any batch,
    as one extend batch or as decode rows, with their LoRA adapters' slots."""
    draft = {"STANDALONE": tiny_model_path, "EAGLE": "tiny-eagle"}[algorithm]
    options = dict(
        OPTIONS,
        speculative_algorithm=algorithm,
        speculative_draft_model_path=draft,
        speculative_num_steps=3,
        speculative_min_accept_length=0,
        lora_paths=[f"{name}={path}" for name, path in lora_adapter_paths.items()],
    )
    with Engine(tiny_model_path, tp_size=2, **options) as engine:
        texts = [output["text"] for output in engine.generate(PROMPTS[:2], GREEDY)]
        engine._scheduler.speculative.verify_as_decode_rows = True  # no public switch
        texts.append(engine.generate(PROMPTS[2], GREEDY)["text"])
        stats = engine.get_stats()
        tuned = engine.generate(PROMPTS, GREEDY, lora_path=ADAPTERS)
        engine.check_integrity()
    assert texts == single_process_texts["base"]
    assert stats["spec_accept_length"] > 1.3  # tokens per request per verify step
    assert [output["text"] for output in tuned] == single_process_texts["lora"]


def _generate(base_url: str, prompt: str, adapter: str | None = None) -> str:
    body = {"text": prompt, "sampling_params": GREEDY, "lora_path": adapter}
    response = httpx.post(f"{base_url}/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["text"]


def test_server_tp2_equals_tp1_and_a_dead_rank_stops_it(lora_adapter_paths, single_process_texts):
    flags = ["--tp-size", "2", "--device", "cpu", "--dtype", "float32", "--skip-warmup"]
    flags += ["--context-length", "256", "--log-level", "warning"]
    flags += ["--lora-paths", f"a={lora_adapter_paths['a']}"]
    with ServerProcess(flags) as server:
        texts = [_generate(server.base_url, prompt) for prompt in PROMPTS]
        assert texts == single_process_texts["base"]
        body = {"lora_name": "b", "lora_path": lora_adapter_paths["b"]}
        response = httpx.post(f"{server.base_url}/load_lora_adapter", json=body, timeout=60)
        assert response.status_code == 200, response.text
        tuned = [_generate(server.base_url, p, a) for p, a in zip(PROMPTS, ADAPTERS, strict=True)]
        assert tuned == single_process_texts["lora"]
        info = httpx.get(f"{server.base_url}/get_server_info", timeout=30).json()
        os.kill(info["process_ids"]["tp-rank-1"], signal.SIGKILL)
        assert server.wait(timeout_s=30) == 1
        assert "the tp-rank-1 process died (exit code -9)" in server.log()
        with pytest.raises(ProcessLookupError):
            os.kill(info["process_ids"]["scheduler"], 0)


@pytest.mark.gpu
def test_engine_tp2_on_two_gpus_equals_tp1(tiny_model_path, lora_adapter_paths):
    """NCCL, the Triton backend and CUDA graphs (each rank captures the same graphs, the
    all-reduces inside them), LoRA's Triton kernels on each rank's cut of the adapters: greedy
    outputs of TP = 2 equal TP = 1 in float32."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    options = dict(device="cuda", dtype="float32", context_length=256)
    options["lora_paths"] = [f"{name}={path}" for name, path in lora_adapter_paths.items()]
    outputs = {}
    for tp_size in (1, 2):
        with Engine(tiny_model_path, tp_size=tp_size, **options) as engine:
            base = engine.generate(PROMPTS, GREEDY)
            tuned = engine.generate(PROMPTS, GREEDY, lora_path=ADAPTERS)
            engine.check_integrity()
        outputs[tp_size] = [output["text"] for output in base + tuned]
    assert outputs[2] == outputs[1]
