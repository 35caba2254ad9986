"""The embedded default model, `tiny`: a small Llama trained on Python's standard library.

`resolve_model_path("tiny")` builds, once, a real HF checkpoint folder under
`$RADIXGEN_CACHE/tiny` (default `~/.cache/radixgen/tiny`), which then loads through the same
code path as any downloaded checkpoint. The build copies the committed trained weights and
tokenizer from `tiny_assets/` (trained by `python -m radixgen.runtime.tiny_assets.train`) and
writes the configs; it is deterministic and takes well under a second. Concurrent first uses
are safe: each builds in its own temporary folder and renames it into place; the loser of the
race keeps the winner's.

`write_random_model` builds a checkpoint of any shape with seeded random weights and the same
tokenizer, for tests that need a model other than the trained one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from radixgen.runtime.hf_cache import looks_like_hub_id, resolve_hub_id

TINY_MODEL_NAME = "tiny"
# tiny's draft models for speculative decoding (speculative_draft_model_path), trained by
# `python -m radixgen.runtime.tiny_assets.train_drafts`: only their own tensors are committed;
# the builds add tiny's embedding (the STANDALONE draft's is tiny's, shared and tied).
TINY_EAGLE_NAME = "tiny-eagle"  # the EAGLE head (one layer on tiny's hidden states)
TINY_DRAFT_NAME = "tiny-draft"  # the one-layer STANDALONE draft
# The EAGLE head drafts among the training corpus's most frequent tokens (94% of held-out ones).
TINY_EAGLE_DRAFT_VOCAB_SIZE = 8192
# Bump when the recipe changes: a cached build with another version is rebuilt.
TINY_MODEL_VERSION = "3"
_VERSION_FILE = "radixgen_tiny_version"
TINY_ASSETS_DIR = Path(__file__).parent / "tiny_assets"
RANDOM_WEIGHT_STD = 0.02

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    # The shape chosen by measurement (docs/model.md): the tied 32000 x 256 embedding is 8.2M
    # of 12.9M parameters; intermediate_size is a multiple of 128 and the head counts of 4.
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": True,
    "initializer_range": RANDOM_WEIGHT_STD,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "bfloat16",
}
# ChatML: <|im_start|>role\ncontent<|im_end|>\n per message, then the assistant's header.
# With `tools`, the Hermes format (as Qwen 2.5 writes it): the tools' JSON in a system block,
# an assistant's calls as <tool_call> blocks, tool results as <tool_response> blocks of a user
# turn. Without tools the prompt is plain ChatML, as before; null content reads as "".
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first and tools %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set function = call['function'] if call['function'] is defined else call %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + function['name'] + '\", \"arguments\": ' }}"
    "{{- (function['arguments'] if function['arguments'] is string "
    "else function['arguments'] | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + (message['content'] or '') }}"
    "{{- '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TINY_TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "unk_token": None,
    "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
    "add_bos_token": False,
    "add_eos_token": False,
    "clean_up_tokenization_spaces": False,
    "model_max_length": 4096,
    "chat_template": CHAT_TEMPLATE,
}
# <|im_end|> ends a chat turn, <|endoftext|> a document.
TINY_GENERATION_CONFIG = {"bos_token_id": 0, "eos_token_id": [2, 0], "pad_token_id": 0}


def cache_root() -> Path:
    """`$RADIXGEN_CACHE`, or `~/.cache/radixgen`."""
    return Path(os.environ.get("RADIXGEN_CACHE") or Path.home() / ".cache" / "radixgen")


def resolve_model_path(model_path: str) -> str:
    """Returns a local checkpoint folder: builds `tiny` on first use; a Hub ID that is not a
    local path resolves from the local Hugging Face cache (hf_cache.py); other paths as given.

    Raises:
        FileNotFoundError: a Hub ID that is not in the local cache (the message says how to
            point at a folder instead).
    """
    model_path = os.fspath(model_path)  # a pathlib.Path works too
    builders = {
        TINY_MODEL_NAME: write_tiny_model,
        TINY_EAGLE_NAME: write_tiny_eagle_head,
        TINY_DRAFT_NAME: write_tiny_draft_model,
    }
    if model_path in builders:
        return str(ensure_built(cache_root(), model_path, builders[model_path]))
    expanded = os.path.expanduser(model_path)
    if "/" in model_path and looks_like_hub_id(expanded):
        return resolve_hub_id(model_path)
    return expanded


def ensure_tiny_model(root: Path) -> Path:
    """Returns `root/tiny`, building it first if it is missing or from another version."""
    return ensure_built(root, TINY_MODEL_NAME, write_tiny_model)


def ensure_built(root: Path, name: str, write: Callable[[Path], None]) -> Path:
    """Returns `root/name`, built by `write` first if it is missing or from another version."""
    target = root / name
    if _is_current(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-build-", dir=root))
    try:
        write(staging)
        if target.exists() and not _is_current(target):
            # A stale build: move it aside (atomic) so the rename below can take its place.
            stale = Path(tempfile.mkdtemp(prefix=f".{name}-stale-", dir=root))
            try:
                os.rename(target, stale / name)
            except OSError:
                pass  # another process moved it first
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(staging, target)
        except OSError:
            if not _is_current(target):  # lost the race to a build that is not usable
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def write_tiny_model(folder: Path) -> None:
    """Writes the complete trained tiny checkpoint (weights, configs, tokenizer) into `folder`."""
    _write_checkpoint(folder, TINY_CONFIG, weights_file=TINY_ASSETS_DIR / "model.safetensors")


def write_tiny_eagle_head(folder: Path) -> None:
    """Writes tiny's EAGLE head folder (runtime/models/llama_eagle.py) into `folder`."""
    from radixgen.runtime.models.llama_eagle import EAGLE_ARCHITECTURE

    config = {
        **TINY_CONFIG,
        "architectures": [EAGLE_ARCHITECTURE],
        "num_hidden_layers": 1,
        "draft_vocab_size": TINY_EAGLE_DRAFT_VOCAB_SIZE,
    }
    _write_checkpoint(folder, config, weights_file=TINY_ASSETS_DIR / "eagle_head.safetensors")


def write_tiny_draft_model(folder: Path) -> None:
    """Writes tiny's one-layer STANDALONE draft: its layer and norm on tiny's embedding."""
    from safetensors.torch import load_file

    embedding = "model.embed_tokens.weight"
    weights = {embedding: load_file(TINY_ASSETS_DIR / "model.safetensors")[embedding]}
    weights |= load_file(TINY_ASSETS_DIR / "draft_layers.safetensors")
    _write_checkpoint(folder, {**TINY_CONFIG, "num_hidden_layers": 1}, weights=weights)


def write_random_model(folder: Path, config: dict, seed: int = 0) -> None:
    """Writes a checkpoint of `config`'s shape with seeded random weights and tiny's tokenizer.

    Args:
        folder: an existing folder to write into.
        config: a Llama config.json dict; its vocab_size must be tiny's (32000).
        seed: NumPy's PCG64 seed (the same bits on any machine and torch build).
    """
    if config.get("vocab_size") != TINY_CONFIG["vocab_size"]:
        raise ValueError(f"config: vocab_size must be {TINY_CONFIG['vocab_size']} (the tokenizer)")
    _write_checkpoint(folder, config, weights=random_weights(config, seed))


def _write_checkpoint(
    folder: Path, config: dict, *, weights_file: Path | None = None, weights: dict | None = None
) -> None:
    from safetensors.torch import save_file

    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "generation_config.json").write_text(
        json.dumps(TINY_GENERATION_CONFIG, indent=2) + "\n"
    )
    (folder / "tokenizer_config.json").write_text(
        json.dumps(TINY_TOKENIZER_CONFIG, indent=2) + "\n"
    )
    shutil.copyfile(TINY_ASSETS_DIR / "tokenizer.json", folder / "tokenizer.json")
    if weights_file is not None:
        shutil.copyfile(weights_file, folder / "model.safetensors")
    else:
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    # mkdtemp and safetensors create owner-only modes; the cache may be shared between users.
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)
    # Written last: its presence marks a complete build.
    (folder / _VERSION_FILE).write_text(TINY_MODEL_VERSION + "\n")


def random_weights(config: dict, seed: int) -> dict:
    """bf16 tensors for `config`, N(0, 0.02) from NumPy's seeded PCG64, norms at 1.

    NumPy rather than torch: its bit stream does not depend on the torch build, so the CPU
    and GPU machines build the same weights.
    """
    import numpy as np
    import torch

    from radixgen.runtime.model_config import ModelConfig
    from radixgen.runtime.models.llama import checkpoint_weight_shapes

    model_config = ModelConfig.from_dict(config, TINY_GENERATION_CONFIG)
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in checkpoint_weight_shapes(model_config).items():
        if name.endswith("norm.weight"):
            values = np.ones(shape, dtype=np.float32)
        else:
            values = rng.standard_normal(shape, dtype=np.float32) * np.float32(RANDOM_WEIGHT_STD)
        weights[name] = torch.from_numpy(values).to(torch.bfloat16)
    return weights


def _is_current(folder: Path) -> bool:
    version_file = folder / _VERSION_FILE
    return version_file.is_file() and version_file.read_text().strip() == TINY_MODEL_VERSION
