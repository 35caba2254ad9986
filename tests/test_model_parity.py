"""Parity with transformers (the reference) on CPU in float32, for each supported family.

Each case random-initialises a small transformers model (every parameter perturbed, so biases
and norms are non-trivial), saves it with `save_pretrained`, loads it through radixgen's
ModelRunner and compares logits: batched prefill of prompts of different lengths, 16
batched decode steps, and a prompt split into a cached prefix plus an extension.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.server_args import ServerArgs

TOLERANCE = 1e-4
VOCAB = 384
SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
CASES = {
    "llama2": (transformers.LlamaConfig, dict(SMALL)),
    "llama3.2_rope_scaled_tied": (
        transformers.LlamaConfig,
        dict(
            SMALL,
            hidden_size=128,
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    "mistral": (transformers.MistralConfig, dict(SMALL, sliding_window=None)),
    "qwen2_tied": (transformers.Qwen2Config, dict(SMALL, tie_word_embeddings=True)),
    "qwen3": (transformers.Qwen3Config, dict(SMALL, head_dim=32)),
}
PROMPT_LENS = (5, 13, 9)
DECODE_STEPS = 16


def _perturbed_model(config_class, kwargs) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config_class(**kwargs), dtype=torch.float32
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.08)
    return model.eval()


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    """(transformers model, radixgen ModelRunner) with the same weights."""
    config_class, kwargs = CASES[request.param]
    hf_model = _perturbed_model(config_class, kwargs)
    folder = tmp_path_factory.mktemp(request.param)
    hf_model.save_pretrained(folder)
    runner = ModelRunner(
        ServerArgs(model_path=str(folder), device="cpu", dtype="float32", max_total_tokens=1024)
    )
    return hf_model, runner


def _hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:  # [len, vocab]
    with torch.no_grad():
        return hf_model(input_ids=torch.tensor([token_ids])).logits[0].float()


def _random_tokens(count: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (count,), generator=generator).tolist()


def _release(runner: ModelRunner, rows: list[int], slots: torch.Tensor) -> None:
    runner.slot_allocator.free(slots)
    runner.req_to_token_pool.free(rows)


def test_prefill_and_decode_match_transformers(pair):
    hf_model, runner = pair
    prompts = [_random_tokens(n, seed=n) for n in PROMPT_LENS]
    continuations = [_random_tokens(DECODE_STEPS, seed=100 + n) for n in PROMPT_LENS]
    expected = [_hf_logits(hf_model, p + c) for p, c in zip(prompts, continuations, strict=True)]

    rows = runner.req_to_token_pool.alloc(len(prompts))
    slots = runner.slot_allocator.alloc(sum(PROMPT_LENS) + len(prompts) * DECODE_STEPS)
    prefill = runner.build_forward_batch(
        mode=ForwardMode.EXTEND,
        input_ids=prompts,
        req_pool_indices=rows,
        prefix_lens=[0] * len(prompts),
        out_cache_loc=slots[: sum(PROMPT_LENS)],
        return_all_logits=True,
    )
    all_logits = runner.forward(prefill)  # [num_tokens, vocab]
    assert all_logits.dtype == torch.float32
    offset = 0
    for prompt, reference in zip(prompts, expected, strict=True):
        got = all_logits[offset : offset + len(prompt)]
        torch.testing.assert_close(got, reference[: len(prompt)], atol=TOLERANCE, rtol=0)
        offset += len(prompt)

    used = sum(PROMPT_LENS)
    for step in range(DECODE_STEPS):
        # Step 0 feeds each prompt's first continuation token, and so on.
        batch = runner.build_forward_batch(
            mode=ForwardMode.DECODE,
            input_ids=[[c[step]] for c in continuations],
            req_pool_indices=rows,
            prefix_lens=[n + step for n in PROMPT_LENS],
            out_cache_loc=slots[used : used + len(prompts)],
        )
        used += len(prompts)
        logits = runner.forward(batch)  # [batch, vocab]
        for i, n in enumerate(PROMPT_LENS):
            torch.testing.assert_close(logits[i], expected[i][n + step], atol=TOLERANCE, rtol=0)
    _release(runner, rows, slots)


def test_last_token_logits_match_all_logits(pair):
    hf_model, runner = pair
    prompts = [_random_tokens(n, seed=7 * n) for n in PROMPT_LENS]
    rows = runner.req_to_token_pool.alloc(len(prompts))
    slots = runner.slot_allocator.alloc(sum(PROMPT_LENS))
    batch = runner.build_forward_batch(
        mode=ForwardMode.EXTEND,
        input_ids=prompts,
        req_pool_indices=rows,
        prefix_lens=[0] * len(prompts),
        out_cache_loc=slots,
    )
    logits = runner.forward(batch)
    assert logits.shape == (len(prompts), VOCAB)
    for i, prompt in enumerate(prompts):
        reference = _hf_logits(hf_model, prompt)[-1]
        torch.testing.assert_close(logits[i], reference, atol=TOLERANCE, rtol=0)
    _release(runner, rows, slots)


def test_prefix_plus_extension_matches_transformers(pair):
    hf_model, runner = pair
    prompt = _random_tokens(23, seed=5)
    prefix, extension = prompt[:9], prompt[9:]
    reference = _hf_logits(hf_model, prompt)
    rows = runner.req_to_token_pool.alloc(1)
    slots = runner.slot_allocator.alloc(len(prompt))
    # The prefix goes in first (as a cached prefix would), then the extension attends to it.
    first = runner.build_forward_batch(
        mode=ForwardMode.EXTEND,
        input_ids=[prefix],
        req_pool_indices=rows,
        prefix_lens=[0],
        out_cache_loc=slots[: len(prefix)],
    )
    runner.forward(first)
    second = runner.build_forward_batch(
        mode=ForwardMode.EXTEND,
        input_ids=[extension],
        req_pool_indices=rows,
        prefix_lens=[len(prefix)],
        out_cache_loc=slots[len(prefix) :],
        return_all_logits=True,
    )
    logits = runner.forward(second)
    torch.testing.assert_close(logits, reference[len(prefix) :], atol=TOLERANCE, rtol=0)
    _release(runner, rows, slots)
