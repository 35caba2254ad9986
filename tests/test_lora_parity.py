"""LoRA parity with `peft` on CPU in float32: random adapters saved by peft on random small
Llama / Qwen2 / Qwen3 models; radixgen's logits equal PeftModel's (unmerged, and merged with
`merge_and_unload`) within 1e-4, in one extend batch that mixes three adapters and the base
model, then in batched decode steps."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from lora_fixtures import ADAPTERS, random_base_model, save_random_adapter
from test_model_parity import VOCAB

from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.server_args import ServerArgs

peft = pytest.importorskip("peft")  # the dev extra; the H200 wheel set needs it too

TOLERANCE = 1e-4
CASES = {
    "llama": (transformers.LlamaConfig, {}),
    "qwen2": (transformers.Qwen2Config, {"tie_word_embeddings": True}),
    "qwen3": (transformers.Qwen3Config, {"head_dim": 32}),
}
# (adapter or None, prompt length) of the mixed batch: three adapters and the base model.
MIXED = [("all", 7), (None, 5), ("qv", 11), ("mlp", 6), ("all", 4)]
DECODE_STEPS = 3


@pytest.fixture(scope="module", params=sorted(CASES))
def setup(request, tmp_path_factory):
    config_class, overrides = CASES[request.param]
    base = random_base_model(config_class, **overrides)
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    base.save_pretrained(root / "base")
    paths = {
        name: save_random_adapter(base, root / name, name, seed=index + 1)
        for index, name in enumerate(ADAPTERS)
    }
    runner = ModelRunner(
        ServerArgs(
            model_path=str(root / "base"),
            device="cpu",
            dtype="float32",
            max_total_tokens=512,
            lora_paths=[f"{name}={path}" for name, path in paths.items()],
            max_loras_per_batch=3,
        )
    )
    return base, paths, runner


def _reference_logits(base, paths, adapter, token_ids, merged):
    """PeftModel's logits [len, vocab] (the base model's for adapter None), on a copy of the
    base model (PeftModel injects its layers into the model it wraps)."""
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        if adapter is None:
            return base(input_ids=ids).logits[0]
        model = peft.PeftModel.from_pretrained(copy.deepcopy(base), str(paths[adapter])).eval()
        if merged:
            model = model.merge_and_unload()
        return model(input_ids=ids).logits[0]


def _tokens(count, seed):
    return torch.randint(0, VOCAB, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("merged", [False, True])
def test_mixed_batch_matches_peft(setup, merged):
    base, paths, runner = setup
    manager = runner.lora_manager
    prompts = [_tokens(n + DECODE_STEPS, seed=i) for i, (_, n) in enumerate(MIXED)]
    lora_slots = [manager.acquire(name) if name else -1 for name, _ in MIXED]
    assert sorted(set(lora_slots) - {-1}) == [0, 1, 2]
    expected = [
        _reference_logits(base, paths, name, prompt, merged)
        for (name, _), prompt in zip(MIXED, prompts, strict=True)
    ]
    base_logits = _reference_logits(base, paths, None, prompts[0], merged)
    assert (base_logits - expected[0]).abs().max() > 0.05  # the adapters change the outputs
    lens = [n for _, n in MIXED]
    rows = runner.req_to_token_pool.alloc(len(MIXED))
    slots = runner.slot_allocator.alloc(sum(lens) + len(MIXED) * DECODE_STEPS)
    batch = runner.build_forward_batch(
        mode=ForwardMode.EXTEND,
        input_ids=[p[:n] for p, n in zip(prompts, lens, strict=True)],
        req_pool_indices=rows,
        prefix_lens=[0] * len(MIXED),
        out_cache_loc=slots[: sum(lens)],
        return_all_logits=True,
        lora_slots=lora_slots,
    )
    logits = runner.forward(batch)
    offset = 0
    for n, reference in zip(lens, expected, strict=True):
        torch.testing.assert_close(
            logits[offset : offset + n], reference[:n], atol=TOLERANCE, rtol=0
        )
        offset += n
    used = sum(lens)
    for step in range(DECODE_STEPS):
        batch = runner.build_forward_batch(
            mode=ForwardMode.DECODE,
            input_ids=[[p[n + step]] for p, n in zip(prompts, lens, strict=True)],
            req_pool_indices=rows,
            prefix_lens=[n + step for n in lens],
            out_cache_loc=slots[used : used + len(MIXED)],
            lora_slots=lora_slots,
        )
        used += len(MIXED)
        logits = runner.forward(batch)
        for i, n in enumerate(lens):
            torch.testing.assert_close(logits[i], expected[i][n + step], atol=TOLERANCE, rtol=0)
    runner.slot_allocator.free(slots)
    runner.req_to_token_pool.free(rows)
    for name, _ in MIXED:
        if name:
            manager.release(name)
    manager.pool.check_integrity()


def _dequantized_into(hf_model, runner: ModelRunner) -> None:
    """Copies radixgen's int4 weights, dequantized, over `hf_model`'s projections (q/k/v and
    gate/up split back into their modules): the model the int4 one computes, in float32."""
    from radixgen.kernels.int4_reference import dequantize_int4_ref

    fused = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    for ours, theirs in zip(runner.model.model.layers, hf_model.model.layers, strict=True):
        for block, hf_block in ((ours.self_attn, theirs.self_attn), (ours.mlp, theirs.mlp)):
            for name, layer in block.named_children():
                if not hasattr(layer, "qweight"):
                    continue
                weight = dequantize_int4_ref(
                    layer.qweight, layer.scales, layer.zeros, layer.group_size
                ).T
                parts = weight.split(list(layer.output_sizes))  # [out, in] each
                for hf_name, part in zip(fused.get(name, (name,)), parts, strict=True):
                    getattr(hf_block, hf_name).weight.data.copy_(part)


def test_adapter_on_int4_base_layers_matches_peft(tmp_path):
    """LoRA over int4 base layers (`quantization="awq"`: a float checkpoint quantized by
    round-to-nearest at load): radixgen's logits, prefill and decode, equal PeftModel's on the
    transformers model holding the same dequantized weights, within 1e-4 (float32)."""
    base = random_base_model(transformers.LlamaConfig, hidden_size=128, intermediate_size=256)
    base.save_pretrained(tmp_path / "base")
    adapter = save_random_adapter(base, tmp_path / "all", "all", seed=3)
    runner = ModelRunner(
        ServerArgs(
            model_path=str(tmp_path / "base"),
            device="cpu",
            dtype="float32",
            max_total_tokens=128,
            lora_paths=[f"all={adapter}"],
            quantization="awq",
        )
    )
    qkv = runner.model.model.layers[0].self_attn.qkv_proj
    assert type(qkv.method.base).__name__ == "Int4LinearMethod"
    _dequantized_into(base, runner)
    prompt = _tokens(12, seed=5)
    with torch.no_grad():
        reference = peft.PeftModel.from_pretrained(base, str(adapter)).eval()
        expected = reference(input_ids=torch.tensor([prompt])).logits[0]  # [12, vocab]
        with reference.disable_adapter():
            unadapted = reference(input_ids=torch.tensor([prompt])).logits[0]
    assert (unadapted - expected).abs().max() > 0.05  # the adapter changes the outputs
    slot = runner.lora_manager.acquire("all")
    rows = runner.req_to_token_pool.alloc(1)
    slots = runner.slot_allocator.alloc(len(prompt))
    batch = runner.build_forward_batch(
        mode=ForwardMode.EXTEND,
        input_ids=[prompt[:10]],
        req_pool_indices=rows,
        prefix_lens=[0],
        out_cache_loc=slots[:10],
        return_all_logits=True,
        lora_slots=[slot],
    )
    torch.testing.assert_close(runner.forward(batch), expected[:10], atol=TOLERANCE, rtol=0)
    for position in (10, 11):
        batch = runner.build_forward_batch(
            mode=ForwardMode.DECODE,
            input_ids=[[prompt[position]]],
            req_pool_indices=rows,
            prefix_lens=[position],
            out_cache_loc=slots[position : position + 1],
            lora_slots=[slot],
        )
        logits = runner.forward(batch)[0]
        torch.testing.assert_close(logits, expected[position], atol=TOLERANCE, rtol=0)
    runner.lora_manager.release("all")


@pytest.mark.gpu
def test_gpu_triton_kernels_and_decode_graphs_match_peft(tmp_path):
    """On CUDA: the SGMV kernels in every projection, decode replayed from CUDA graphs (the
    adapter slots read from the graph's static buffer), a mixed batch against PeftModel."""
    base = random_base_model(transformers.LlamaConfig)
    base.save_pretrained(tmp_path / "base")
    paths = {
        name: save_random_adapter(base, tmp_path / name, name, seed=index + 1)
        for index, name in enumerate(ADAPTERS)
    }
    runner = ModelRunner(
        ServerArgs(
            model_path=str(tmp_path / "base"),
            device="cuda",
            dtype="float32",
            max_total_tokens=512,
            lora_paths=[f"{name}={path}" for name, path in paths.items()],
            max_loras_per_batch=3,
            cuda_graph_max_bs=8,
        )
    )
    assert runner.cuda_graph_runner is not None
    assert runner.lora_manager.state.shrink_stream is not None  # decode shrinks beside GEMMs
    lora_slots = [runner.lora_manager.acquire(name) if name else -1 for name, _ in MIXED]
    prompts = [_tokens(n + DECODE_STEPS, seed=i) for i, (_, n) in enumerate(MIXED)]
    expected = [
        _reference_logits(base, paths, name, prompt, merged=False)
        for (name, _), prompt in zip(MIXED, prompts, strict=True)
    ]
    lens = [n for _, n in MIXED]
    rows = runner.req_to_token_pool.alloc(len(MIXED))
    slots = runner.slot_allocator.alloc(sum(lens) + len(MIXED) * DECODE_STEPS)
    runner.forward(
        runner.build_forward_batch(
            mode=ForwardMode.EXTEND,
            input_ids=[p[:n] for p, n in zip(prompts, lens, strict=True)],
            req_pool_indices=rows,
            prefix_lens=[0] * len(MIXED),
            out_cache_loc=slots[: sum(lens)],
            lora_slots=lora_slots,
        )
    )
    used = sum(lens)
    for step in range(DECODE_STEPS):  # graphs: batch 5 replays the padded batch-8 graph
        batch = runner.build_forward_batch(
            mode=ForwardMode.DECODE,
            input_ids=[[p[n + step]] for p, n in zip(prompts, lens, strict=True)],
            req_pool_indices=rows,
            prefix_lens=[n + step for n in lens],
            out_cache_loc=slots[used : used + len(MIXED)],
            lora_slots=lora_slots,
        )
        used += len(MIXED)
        logits = runner.forward(batch).cpu()
        for i, n in enumerate(lens):  # tf32 tensor cores in the kernels: 1e-2
            torch.testing.assert_close(logits[i], expected[i][n + step], atol=1e-2, rtol=0)
