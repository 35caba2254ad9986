"""GPU checks of the model core (run on the H200: `pytest -m gpu -s tests/test_gpu_model.py`).

- bf16 parity with transformers: greedy tokens agree over 64 steps (up to bf16 near-ties),
  for each attention backend available (torch reference, triton kernels);
- the Llama-3.1-8B shape with dummy weights loads (KV sized from free memory) and runs a
  prefill and a decode step;
- the default model, `tiny`, runs with all-default ServerArgs on CUDA.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import time

import pytest
import torch

from radixgen.runtime.bench.model_configs import PRESETS
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.tiny_model import resolve_model_path

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

GREEDY_STEPS = 64
BACKENDS = [
    "torch",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("radixgen.runtime.attention.triton_backend") is None,
            reason="triton attention backend not written yet",
        ),
    ),
]
LLAMA_31_8B_CONFIG = PRESETS["llama-3.1-8b"]


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    """A small random Llama-3-style transformers model (bf16, CUDA) and its saved folder.

    The LM head is drawn with a large std so that the top-2 logit gap dwarfs bf16 rounding:
    greedy agreement then tests the model, not coin flips between near-tied tokens.
    """
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name == "lm_head.weight":
                param.normal_(0.0, 1.0)
            else:
                param.normal_(0.0, 0.05)
    folder = tmp_path_factory.mktemp("llama3_small")
    model.save_pretrained(folder)
    return model.to("cuda", torch.bfloat16).eval(), folder


def _release_gpu_memory() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _hf_logits(model, token_ids: list[int]) -> torch.Tensor:  # [len, vocab] float32
    with torch.no_grad():
        return model(input_ids=torch.tensor([token_ids], device="cuda")).logits[0].float()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_greedy_matches_transformers(hf_checkpoint, backend, greedy_output_ids):
    """radixgen's free-running greedy tokens are transformers' greedy choices.

    bf16 logits carry ~1% noise (transformers' own bf16 logits differ from its fp32 ones by
    as much as ours do), so a step where transformers' top two logits are closer than that
    may go either way. We therefore teacher-force transformers on our tokens and require, at
    every one of the 64 steps, our token to be its argmax or within NEAR_TIE (of the logit
    std) of it, and exact agreement on at least MIN_EXACT of the steps. A wrong model picks
    tokens whose logits sit several stds below the max.
    """
    near_tie, min_exact = 0.1, 0.9
    hf_model, folder = hf_checkpoint
    server_args = dict(
        model_path=str(folder),
        dtype="bfloat16",
        attention_backend=backend,
        max_total_tokens=8192,
    )
    runner = ModelRunner(ServerArgs(**server_args))
    assert runner.device.type == "cuda" and runner.attn_backend_name == backend
    del runner
    _release_gpu_memory()
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 2048, (n,), generator=generator).tolist() for n in (7, 33, 120)]
    # Through the Engine (scheduler, CUDA graphs, overlap); the folder has no tokenizer.
    ours = greedy_output_ids(
        prompts, GREEDY_STEPS, tokenizer_path=resolve_model_path("tiny"), **server_args
    )
    exact = 0
    for prompt, tokens in zip(prompts, ours, strict=True):
        assert len(tokens) == GREEDY_STEPS
        # Row len(prompt) - 1 + i predicts our token i.
        logits = _hf_logits(hf_model, prompt + tokens)[len(prompt) - 1 : -1]
        chosen = logits.gather(1, torch.tensor(tokens, device="cuda")[:, None]).squeeze(1)
        shortfall = (logits.max(dim=1).values - chosen) / logits.std(dim=1)
        assert shortfall.max().item() <= near_tie, f"step {int(shortfall.argmax())} not greedy"
        exact += int((logits.argmax(dim=1).cpu() == torch.tensor(tokens)).sum())
    total = GREEDY_STEPS * len(prompts)
    assert exact >= min_exact * total
    print(f"\n[{backend}] {exact}/{total} greedy tokens equal to transformers' bf16 argmax")


def test_dummy_llama_31_8b_loads_and_runs(tmp_path):
    folder = tmp_path / "llama-3.1-8b-shape"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_31_8B_CONFIG))
    _release_gpu_memory()  # the KV pool is sized from what is free now
    torch.cuda.synchronize()
    start = time.perf_counter()
    runner = ModelRunner(ServerArgs(model_path=str(folder), load_format="dummy"))
    torch.cuda.synchronize()
    load_s = time.perf_counter() - start
    num_params = sum(p.numel() for p in runner.model.parameters())
    assert 8.0e9 < num_params < 8.1e9
    assert runner.dtype == torch.bfloat16 and runner.model_config.rope.rope_type == "llama3"
    assert runner.max_total_num_tokens > 100_000  # most of an H200 left for KV

    prompt_lens = [512, 1000]
    rows = runner.req_to_token_pool.alloc(len(prompt_lens))
    slots = runner.slot_allocator.alloc(sum(prompt_lens) + len(prompt_lens))
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 128256, (n,), generator=generator).tolist() for n in prompt_lens]
    prefill = runner.build_forward_batch(
        mode=ForwardMode.EXTEND,
        input_ids=prompts,
        req_pool_indices=rows,
        prefix_lens=[0, 0],
        out_cache_loc=slots[: sum(prompt_lens)],
    )
    torch.cuda.synchronize()
    start = time.perf_counter()
    logits = runner.forward(prefill)
    torch.cuda.synchronize()
    prefill_s = time.perf_counter() - start
    assert logits.shape == (2, 128256) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    decode = runner.build_forward_batch(
        mode=ForwardMode.DECODE,
        input_ids=[[t] for t in logits.argmax(-1).tolist()],
        req_pool_indices=rows,
        prefix_lens=prompt_lens,
        out_cache_loc=slots[sum(prompt_lens) :],
    )
    start = time.perf_counter()
    decode_logits = runner.forward(decode)
    torch.cuda.synchronize()
    decode_s = time.perf_counter() - start
    assert decode_logits.shape == (2, 128256) and torch.isfinite(decode_logits).all()
    print(
        f"\n[8B dummy] {num_params / 1e9:.2f}B params, load {load_s:.1f}s, "
        f"{runner.max_total_num_tokens} KV slots, attention {runner.attn_backend_name}, "
        f"prefill {sum(prompt_lens)} tokens {prefill_s * 1e3:.0f} ms (first call), "
        f"decode bs=2 {decode_s * 1e3:.1f} ms, "
        f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
    )
    del runner, logits, decode_logits, prefill, decode
    torch.cuda.empty_cache()


def test_tiny_runs_with_default_args(greedy_output_ids):
    _release_gpu_memory()
    runner = ModelRunner(ServerArgs())
    assert runner.device.type == "cuda" and runner.dtype == torch.bfloat16
    del runner
    _release_gpu_memory()
    outputs = greedy_output_ids([[1, 2, 3], [4, 5, 6, 7, 8]], 16)  # the Engine, default args
    assert [len(o) for o in outputs] == [16, 16]
    torch.cuda.empty_cache()
