"""Loader and config parsing: sharded checkpoints, dtypes, dummy weights, clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixgen.runtime.loader import random_checkpoint_tensors, weight_files
from radixgen.runtime.model_config import ModelConfig
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.tiny_model import resolve_model_path

SMALL_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 128,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "eos_token_id": 2,
}


def _config_only_folder(tmp_path: Path, config: dict) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _runner(path, **kwargs) -> ModelRunner:
    return ModelRunner(
        ServerArgs(model_path=str(path), device="cpu", max_total_tokens=256, **kwargs)
    )


def _greedy(greedy_output_ids, path, **kwargs) -> list[int]:
    """Six greedy tokens through the Engine; the tiny tokenizer serves every test model."""
    tokenizer_path = resolve_model_path("tiny")
    return greedy_output_ids(
        [[5, 6, 7, 8]],
        6,
        model_path=str(path),
        device="cpu",
        max_total_tokens=256,
        tokenizer_path=tokenizer_path,
        **kwargs,
    )[0]


@pytest.fixture()
def sharded_tiny(tmp_path, tiny_model_path) -> Path:
    """The tiny checkpoint re-saved as two shards with a model.safetensors.index.json."""
    folder = tmp_path / "sharded"
    shutil.copytree(tiny_model_path, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    weight_map = {}
    for file_name, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, str(folder / file_name))
        weight_map.update({n: file_name for n in shard_names})
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def test_sharded_checkpoint_loads_like_the_single_file(
    sharded_tiny, tiny_model_path, greedy_output_ids
):
    assert [p.name for p in weight_files(sharded_tiny)] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert _greedy(greedy_output_ids, sharded_tiny) == _greedy(greedy_output_ids, tiny_model_path)


def test_missing_shard_is_named(sharded_tiny):
    (sharded_tiny / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002"):
        _runner(sharded_tiny)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_dtype_is_honoured(tiny_model_path, dtype, greedy_output_ids):
    runner = _runner(tiny_model_path, dtype=dtype)
    expected = getattr(torch, dtype)
    assert runner.dtype == expected
    assert {p.dtype for p in runner.model.parameters()} == {expected}
    assert runner.token_to_kv_pool.k_buffers[0].dtype == expected
    assert len(_greedy(greedy_output_ids, tiny_model_path, dtype=dtype)) == 6


def test_auto_dtype_on_cpu_is_float32(tiny_model_path):
    assert _runner(tiny_model_path).dtype == torch.float32


def test_dummy_format_needs_only_config(tmp_path, greedy_output_ids):
    folder = _config_only_folder(tmp_path, SMALL_LLAMA)
    runner = _runner(folder, load_format="dummy")
    params = dict(runner.model.named_parameters())
    assert params["model.layers.0.self_attn.qkv_proj.weight"].shape == (64 + 2 * 32, 64)
    assert torch.all(params["model.norm.weight"] == 1)
    first = _greedy(greedy_output_ids, folder, load_format="dummy")
    assert first == _greedy(greedy_output_ids, folder, load_format="dummy")  # seeded
    other_seed = _runner(folder, load_format="dummy", seed=1)
    assert not torch.equal(
        other_seed.model.model.embed_tokens.weight, runner.model.model.embed_tokens.weight
    )


def test_missing_folder_config_and_weights(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        _runner(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.json"):
        _runner(tmp_path)
    folder = _config_only_folder(tmp_path, SMALL_LLAMA)
    with pytest.raises(FileNotFoundError, match="load_format='dummy'"):
        _runner(folder)
    (folder / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="only safetensors"):
        _runner(folder)


def _write_weights(folder: Path, tensors: dict) -> None:
    save_file(tensors, str(folder / "model.safetensors"))


def _small_llama_tensors() -> dict:
    config = ModelConfig.from_dict(SMALL_LLAMA)
    cpu = torch.device("cpu")
    return dict(random_checkpoint_tensors(config, seed=0, dtype=torch.float32, device=cpu))


def test_missing_unexpected_and_misshapen_tensors(tmp_path, greedy_output_ids):
    folder = _config_only_folder(tmp_path, SMALL_LLAMA)
    tensors = _small_llama_tensors()
    _write_weights(folder, tensors)
    assert len(_greedy(greedy_output_ids, folder)) == 6

    missing = dict(tensors)
    del missing["model.layers.1.self_attn.k_proj.weight"]
    _write_weights(folder, missing)
    with pytest.raises(ValueError, match="lacks 1 tensor.*qkv_proj"):
        _runner(folder)

    extra = dict(tensors, **{"model.layers.0.self_attn.extra.weight": torch.zeros(2)})
    _write_weights(folder, extra)
    with pytest.raises(ValueError, match="does not use.*extra"):
        _runner(folder)

    wrong = dict(tensors, **{"model.norm.weight": torch.ones(65)})
    _write_weights(folder, wrong)
    with pytest.raises(ValueError, match="model.norm.weight"):
        _runner(folder)


def test_unsupported_architecture_and_rope():
    with pytest.raises(ValueError, match="unsupported architecture.*GPT2LMHeadModel"):
        ModelConfig.from_dict(dict(SMALL_LLAMA, architectures=["GPT2LMHeadModel"]))
    with pytest.raises(ValueError, match="unsupported RoPE type 'yarn'"):
        ModelConfig.from_dict(dict(SMALL_LLAMA, rope_scaling={"rope_type": "yarn", "factor": 4}))
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"]})


def test_config_parsing_variants():
    # transformers 4.x layout of Llama 3.1 (rope_theta + rope_scaling, torch_dtype).
    llama31 = ModelConfig.from_dict(
        dict(
            SMALL_LLAMA,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            torch_dtype="bfloat16",
            eos_token_id=[128001, 128009],
        ),
        {"eos_token_id": [128001, 128008, 128009]},
    )
    assert llama31.rope.rope_type == "llama3" and llama31.rope.theta == 500000.0
    assert llama31.rope.original_max_position_embeddings == 8192
    assert llama31.eos_token_ids == (128001, 128008, 128009)
    assert llama31.checkpoint_dtype == "bfloat16"
    assert not llama31.qkv_bias and not llama31.qk_norm

    qwen2 = ModelConfig.from_dict(dict(SMALL_LLAMA, architectures=["Qwen2ForCausalLM"]))
    assert qwen2.qkv_bias and not qwen2.o_proj_bias
    qwen3 = ModelConfig.from_dict(
        {**SMALL_LLAMA, "model_type": "qwen3", "head_dim": 48, "architectures": []}
    )
    assert qwen3.architecture == "Qwen3ForCausalLM" and qwen3.qk_norm and qwen3.head_dim == 48
    assert qwen3.num_kv_heads == 2

    mistral = ModelConfig.from_dict(
        dict(
            SMALL_LLAMA,
            architectures=["MistralForCausalLM"],
            max_position_embeddings=32768,
            sliding_window=4096,
        )
    )
    assert mistral.context_length == 4096  # no sliding-window kernel: capped at the window
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        ModelConfig.from_dict(dict(SMALL_LLAMA, num_key_value_heads=3))
