"""The embedded `tiny` model: deterministic build, real-checkpoint layout, same load path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from radixgen.runtime.model_config import ModelConfig
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.tiny_model import (
    TINY_ASSETS_DIR,
    TINY_CONFIG,
    ensure_tiny_model,
    resolve_model_path,
    write_random_model,
)
from radixgen.runtime.tokenizer import load_tokenizer

CHECKPOINT_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


def test_two_builds_are_byte_identical(tmp_path):
    first = ensure_tiny_model(tmp_path / "a")
    second = ensure_tiny_model(tmp_path / "b")
    names = {p.name for p in first.iterdir()}
    assert CHECKPOINT_FILES <= names
    assert names == {p.name for p in second.iterdir()}
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    # No staging folders left behind.
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["tiny"]


def test_cached_build_is_reused_and_stale_build_replaced(tmp_path):
    folder = ensure_tiny_model(tmp_path)
    weights = folder / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path) == folder
    assert weights.stat().st_mtime_ns == mtime
    (folder / "radixgen_tiny_version").write_text("0\n")
    (folder / "leftover.txt").write_text("from an older recipe")
    rebuilt = ensure_tiny_model(tmp_path)
    assert not (rebuilt / "leftover.txt").exists()
    assert CHECKPOINT_FILES <= {p.name for p in rebuilt.iterdir()}


def test_resolve_model_path_uses_radixgen_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXGEN_CACHE", str(tmp_path))
    assert resolve_model_path("tiny") == str(tmp_path / "tiny")
    assert resolve_model_path("/some/hf/folder") == "/some/hf/folder"


def test_config_matches_the_spec(tiny_model_path):
    config = ModelConfig.from_folder(tiny_model_path)
    assert config.architecture == "LlamaForCausalLM"
    shape = (config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads)
    assert shape == (256, 8, 8, 4)
    assert config.vocab_size == 32000 and config.context_length == 4096
    assert config.tie_word_embeddings
    # [9/14]'s int4 groups of 128 and [13/14]'s tensor parallelism over 4 devices.
    assert config.intermediate_size % 128 == 0
    assert config.num_heads % 4 == 0 and config.num_kv_heads % 4 == 0
    raw = json.loads((Path(tiny_model_path) / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLM"]


def test_the_committed_trained_weights_are_what_loads(tiny_model_path):
    shipped = Path(tiny_model_path) / "model.safetensors"
    assert shipped.read_bytes() == (TINY_ASSETS_DIR / "model.safetensors").read_bytes()
    tensors = load_file(shipped)
    assert "lm_head.weight" not in tensors  # tied to the input embedding
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert sum(t.numel() for t in tensors.values()) == 12_914_944
    # What the repository ships for the model stays within its ~30 MB budget.
    assert shipped.stat().st_size + (TINY_ASSETS_DIR / "tokenizer.json").stat().st_size < 28e6


def test_the_trained_drafts_build_load_and_stay_small(tiny_model_path):
    """tiny-draft (STANDALONE) and tiny-eagle (EAGLE) build from their committed tensors, load
    beside tiny, and keep everything the repository ships for the model within ~30 MB."""
    from radixgen.runtime.speculative.eagle import EagleProposer

    assets = [
        TINY_ASSETS_DIR / name for name in ("eagle_head.safetensors", "draft_layers.safetensors")
    ]
    assert all(path.stat().st_size < 2e6 for path in assets)
    shipped = ["model.safetensors", "tokenizer.json"]
    total = sum((TINY_ASSETS_DIR / name).stat().st_size for name in shipped)
    assert total + sum(path.stat().st_size for path in assets) < 30e6
    draft = ModelRunner(ServerArgs(model_path="tiny-draft", device="cpu", max_total_tokens=64))
    assert draft.model_config.num_layers == 1
    target = ModelRunner(ServerArgs(model_path="tiny", device="cpu", max_total_tokens=64))
    # Shared, not copied: the draft's embedding equals tiny's; the head has none.
    assert torch.equal(draft.model.lm_head_weight, target.model.lm_head_weight)
    proposer = EagleProposer.from_target(target, "tiny-eagle")
    head_tensors = {name for name, _ in proposer.head.state_dict().items()}
    assert not any("embed" in name for name in head_tensors)
    assert proposer.head.hot_token_ids.shape == (8192,)
    proposer.check_integrity()


def test_random_model_of_another_shape_loads(tmp_path):
    config = {**TINY_CONFIG, "num_hidden_layers": 2, "tie_word_embeddings": False}
    write_random_model(tmp_path, config, seed=1)
    runner = ModelRunner(ServerArgs(model_path=str(tmp_path), device="cpu", max_total_tokens=64))
    assert runner.model_config.num_layers == 2
    tensors = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" in tensors
    with pytest.raises(ValueError, match="vocab_size"):
        write_random_model(tmp_path, {**config, "vocab_size": 100})


def test_tokenizer_and_chat_template(tiny_model_path):
    tokenizer = load_tokenizer(tiny_model_path)
    assert len(tokenizer) == 32000
    text = "def greet(name):\n    return f'hello {name}'  # ünïcode"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text) / 2  # BPE trained on Python merges this code well
    assert tokenizer.eos_token == "<|im_end|>"
    prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    special = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert tokenizer(prompt, add_special_tokens=False)["input_ids"][0] == special[1]
    config = ModelConfig.from_folder(tiny_model_path)
    assert set(config.eos_token_ids) == {special[2], special[0]}


def test_tiny_loads_through_the_runner_and_generates(tiny_model_path, greedy_output_ids):
    runner = ModelRunner(ServerArgs(model_path="tiny", device="cpu", max_total_tokens=512))
    assert runner.model_path == tiny_model_path
    tokenizer = load_tokenizer("tiny")
    prompt = tokenizer("import os\nprint(", add_special_tokens=False)["input_ids"]
    engine_args = dict(model_path="tiny", device="cpu", max_total_tokens=512)
    first, second = greedy_output_ids([prompt, prompt], 8, **engine_args)
    assert first == second and len(first) == 8
    assert all(0 <= token < 32000 for token in first)
    # Trained on the stdlib: after `import os`, `print(` gets an os call.
    assert tokenizer.decode(first).startswith("os."), tokenizer.decode(first)


def test_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
