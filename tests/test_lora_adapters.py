"""LoRA adapters and their device pool: PEFT folders that are refused (with the reason named),
options, and the pool's slots (LRU eviction of idle adapters, never of one in use)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from lora_fixtures import random_base_model, save_random_adapter
from safetensors.torch import load_file, save_file

from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.lora.adapter import load_lora_adapter
from radixgen.runtime.lora.pool import LoRALayerShape, LoRAMemoryPool
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.server_args import ServerArgs, parse_lora_paths


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-adapters")
    base = random_base_model(transformers.LlamaConfig)
    base.save_pretrained(root / "base")
    save_random_adapter(base, root / "qv", "qv", seed=1)
    save_random_adapter(base, root / "all", "all", seed=2)
    return root


def _variant(saved, tmp_path, *, config=None, tensors=None):
    """A copy of the `qv` adapter with its config and/or tensors edited."""
    folder = tmp_path / "variant"
    folder.mkdir()
    adapter_config = json.loads((saved / "qv" / "adapter_config.json").read_text())
    adapter_config.update(config or {})
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config))
    weights = load_file(str(saved / "qv" / "adapter_model.safetensors"))
    weights.update(tensors or {})
    save_file(weights, str(folder / "adapter_model.safetensors"))
    return folder


@pytest.mark.parametrize(
    "config,tensors,message",
    [
        ({"modules_to_save": ["lm_head"]}, None, "modules_to_save"),
        ({"use_dora": True}, None, "DoRA"),
        ({"bias": "all"}, None, "bias"),
        ({"rank_pattern": {"q_proj": 8}}, None, "rank_pattern"),
        ({"peft_type": "IA3"}, None, "peft_type"),
        (None, {"base_model.model.lm_head.lora_A.weight": torch.zeros(4, 64)}, "lm_head"),
        (
            None,
            {"base_model.model.model.embed_tokens.lora_embedding_A": torch.zeros(4, 384)},
            "embeddings",
        ),
        (
            None,
            {"base_model.model.model.layers.9.mlp.up_proj.lora_A.weight": torch.zeros(4, 64)},
            "2 layers",
        ),
    ],
)
def test_refused_adapters_name_the_reason(saved, tmp_path, config, tensors, message):
    folder = _variant(saved, tmp_path, config=config, tensors=tensors)
    with pytest.raises(ValueError, match=message):
        load_lora_adapter("x", folder, num_layers=2, max_rank=64, dtype=torch.float32)


def test_rank_missing_files_and_paths(saved, tmp_path):
    with pytest.raises(ValueError, match="exceeds max_lora_rank 2"):
        load_lora_adapter("x", saved / "qv", num_layers=2, max_rank=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="no adapter_config.json"):
        load_lora_adapter("x", tmp_path, num_layers=2, max_rank=64, dtype=torch.float32)
    assert parse_lora_paths(["a=/x/y", "/p/q"]) == {"a": "/x/y", "q": "/p/q"}
    with pytest.raises(ValueError, match="given twice"):
        parse_lora_paths(["a=/x", "a=/y"])
    with pytest.raises(ValueError, match="max_loras_per_batch"):
        ServerArgs(max_loras_per_batch=0)
    with pytest.raises(ValueError, match="lora_paths must be a list"):
        ServerArgs(lora_paths="a=/x")


def test_runner_pool_targets_and_run_time_loading(saved):
    runner = ModelRunner(
        ServerArgs(
            model_path=str(saved / "base"),
            device="cpu",
            dtype="float32",
            max_total_tokens=64,
            lora_paths=[f"qv={saved / 'qv'}"],
            max_loras_per_batch=2,
            max_lora_rank=8,
        )
    )
    manager = runner.lora_manager
    assert manager.pool.served_modules == {"q_proj", "k_proj", "v_proj"}  # the qkv buffers
    # Sized by the start-up adapter's targets: one adapting the MLP does not fit.
    with pytest.raises(ValueError, match="outside lora_target_modules"):
        manager.load_adapter("all", str(saved / "all"))
    with pytest.raises(ValueError, match="already loaded"):
        manager.load_adapter("qv", str(saved / "qv"))
    manager.unload_adapter("qv")
    with pytest.raises(KeyError, match="not loaded"):
        manager.unload_adapter("qv")


def test_pool_lru_evicts_idle_adapters_only(saved):
    shapes = {(layer, "qkv_proj"): LoRALayerShape(64, (64, 32, 32)) for layer in (0, 1)}
    pool = LoRAMemoryPool(shapes, num_slots=2, max_rank=8, dtype=torch.float32, device="cpu")
    adapter = load_lora_adapter("qv", saved / "qv", num_layers=2, max_rank=8, dtype=torch.float32)

    def named(name):
        return type(adapter)(**{**adapter.__dict__, "name": name})

    a, b, c = named("a"), named("b"), named("c")
    assert pool.acquire(a) == 0 and pool.acquire(b) == 1
    assert pool.acquire(c) is None  # both in use: c waits
    pool.release("a")
    pool.release("b")  # both idle now; a is the least recently used
    assert pool.acquire(c) == 0 and "a" not in pool.slot_of
    assert pool.acquire(b) == 1  # still loaded: no copy, no eviction
    with pytest.raises(ValueError, match="in use"):
        pool.evict("b")
    pool.check_integrity()
    # The written slot holds A in the q and v rank rows (k stays zero), B in q and v rows.
    q_a = adapter.weights[(0, "q_proj")][0]
    assert torch.equal(pool.lora_a[(0, "qkv_proj")][0, :4], q_a)
    assert torch.count_nonzero(pool.lora_a[(0, "qkv_proj")][0, 8:16]) == 0
    assert torch.count_nonzero(pool.lora_b[(0, "qkv_proj")][0, 64:96]) == 0


def test_cli_flags_reach_server_args():
    from radixgen.runtime.cli import build_parser, server_args_from_namespace

    namespace = build_parser().parse_args(
        ["serve", "--lora-paths", "a=/x", "b=/y", "--max-loras-per-batch", "4",
         "--max-lora-rank", "16", "--lora-target-modules", "all"]
    )  # fmt: skip
    args = server_args_from_namespace(namespace)
    assert args.lora_paths == ("a=/x", "b=/y") and args.lora_target_modules == ("all",)
    assert args.max_loras_per_batch == 4 and args.max_lora_rank == 16 and args.lora_enabled


def test_lora_composes_with_fp8_base_layers(saved):
    def runner(quantization):
        return ModelRunner(
            ServerArgs(
                model_path=str(saved / "base"),
                device="cpu",
                dtype="float32",
                max_total_tokens=64,
                lora_paths=[f"all={saved / 'all'}"],
                quantization=quantization,
            )
        )

    full, fp8 = runner(None), runner("fp8")
    qkv = fp8.model.model.layers[0].self_attn.qkv_proj
    assert type(qkv.method).__name__ == "LoRALinearMethod"
    assert type(qkv.method.base).__name__ == "Fp8LinearMethod"
    assert qkv.weight.dtype == torch.float8_e4m3fn
    tokens = list(range(3, 15))
    logits = {}
    for name, model_runner in (("full", full), ("fp8", fp8)):
        for adapter in ("all", None):
            slot = model_runner.lora_manager.acquire(adapter) if adapter else -1
            rows = model_runner.req_to_token_pool.alloc(1)
            slots = model_runner.slot_allocator.alloc(len(tokens))
            batch = model_runner.build_forward_batch(
                mode=ForwardMode.EXTEND,
                input_ids=[tokens],
                req_pool_indices=rows,
                prefix_lens=[0],
                out_cache_loc=slots,
                lora_slots=[slot],
            )
            logits[(name, adapter)] = model_runner.forward(batch)[0]
            model_runner.slot_allocator.free(slots)
            model_runner.req_to_token_pool.free(rows)
            if adapter:
                model_runner.lora_manager.release(adapter)

    def cosine(a, b):
        return torch.nn.functional.cosine_similarity(a, b, dim=0).item()

    # FP8 keeps the adapter's effect: close to full precision under the adapter, and the
    # adapter moves the FP8 model as it moves the full-precision one.
    assert cosine(logits[("fp8", "all")], logits[("full", "all")]) > 0.99
    shift_full = logits[("full", "all")] - logits[("full", None)]
    shift_fp8 = logits[("fp8", "all")] - logits[("fp8", None)]
    assert cosine(shift_fp8, shift_full) > 0.9
