"""Loads a Llama-family model from a HF checkpoint folder, or with dummy weights.

The model is built on the meta device (no memory), then its parameters are assigned the
loaded tensors (gpt-fast style), so an 8B model never exists twice in memory. Tensors stream
one by one from safetensors files straight to the target device and dtype; fused parameters
(qkv_proj, gate_up_proj) are concatenated as soon as all their shards have arrived.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import torch

from radixgen.runtime.model_config import ModelConfig
from radixgen.runtime.models.llama import (
    LlamaForCausalLM,
    checkpoint_name_to_param,
    checkpoint_weight_shapes,
)

LoadFormat = Literal["auto", "safetensors", "dummy"]
# Checkpoint tensors that carry nothing the model needs (old Llama exports store inv_freq).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Std of dummy weights: small enough that activations stay tame through many layers.
DUMMY_WEIGHT_STD = 0.02


def load_model(
    model_path: str | Path,
    *,
    model_config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device | str,
    load_format: LoadFormat = "auto",
    seed: int = 0,
    max_positions: int | None = None,
) -> LlamaForCausalLM:
    """Builds the model and loads its weights, in `dtype` on `device`, in eval mode.

    Args:
        model_path: HF folder (only config.json is needed with load_format="dummy").
        model_config: the parsed config of that folder.
        load_format: "auto"/"safetensors" read the weight files; "dummy" draws random
            weights of the real shapes (seeded by `seed`) without reading any.
        max_positions: RoPE table size; defaults to the config's context length.

    Raises:
        FileNotFoundError: no safetensors weights in the folder.
        ValueError: unknown load_format, or tensors missing from / unexpected in the checkpoint.
    """
    if load_format not in ("auto", "safetensors", "dummy"):
        raise ValueError(
            f"load_format must be 'auto', 'safetensors' or 'dummy', got {load_format!r}"
        )
    device = torch.device(device)
    with torch.device("meta"):
        model = LlamaForCausalLM(model_config, max_positions)
    if load_format == "dummy":
        tensors = random_checkpoint_tensors(model_config, seed=seed, dtype=dtype, device=device)
    else:
        tensors = read_checkpoint_tensors(Path(model_path), dtype=dtype, device=device)
    state = _to_model_state(tensors, model, model_config)
    model.load_state_dict(state, strict=True, assign=True)
    # Moves what is not a loaded parameter (the RoPE tables, built on the CPU).
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def weight_files(model_path: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder (sharded through its index, or single).

    Raises:
        FileNotFoundError: with what was found instead, if there are none.
    """
    index_file = model_path / "model.safetensors.index.json"
    if index_file.is_file():
        weight_map = json.loads(index_file.read_text()).get("weight_map", {})
        files = [model_path / name for name in sorted(set(weight_map.values()))]
        missing = [str(f.name) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(
                f"model_path {str(model_path)!r}: {index_file.name} lists missing shard(s) "
                f"{missing}"
            )
        return files
    files = sorted(model_path.glob("*.safetensors"))
    if files:
        return files
    other = sorted(p.name for p in model_path.glob("*.bin")) + sorted(
        p.name for p in model_path.glob("*.pt")
    )
    found = f" (found {other}: only safetensors weights are supported)" if other else ""
    raise FileNotFoundError(
        f"model_path {str(model_path)!r} has no *.safetensors weights{found}; "
        "use load_format='dummy' for random weights"
    )


def read_checkpoint_tensors(
    model_path: Path, *, dtype: torch.dtype, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (checkpoint name, tensor in `dtype` on `device`) for every stored tensor."""
    from safetensors import safe_open

    # safetensors reads straight into GPU memory when asked; it needs an indexed device.
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        open_device = f"cuda:{index}"
    else:
        open_device = "cpu"
    for path in weight_files(model_path):
        with safe_open(str(path), framework="pt", device=open_device) as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name).to(device=device, dtype=dtype)


def random_checkpoint_tensors(
    config: ModelConfig, *, seed: int, dtype: torch.dtype, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields random tensors named and shaped like a checkpoint of `config`.

    Norm weights are ones and biases zeros (as in a fresh model); matrices are
    N(0, DUMMY_WEIGHT_STD). Drawn on `device` with a seeded generator: fast for 8B shapes.
    """
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, shape in checkpoint_weight_shapes(config).items():
        if name.endswith("norm.weight"):
            yield name, torch.ones(shape, dtype=dtype, device=device)
        elif name.endswith(".bias"):
            yield name, torch.zeros(shape, dtype=dtype, device=device)
        else:
            tensor = torch.empty(shape, dtype=dtype, device=device)
            yield name, tensor.normal_(0.0, DUMMY_WEIGHT_STD, generator=generator)


def _to_model_state(
    tensors: Iterator[tuple[str, torch.Tensor]],
    model: LlamaForCausalLM,
    config: ModelConfig,
) -> dict[str, torch.Tensor]:
    """Renames checkpoint tensors to model parameters, fusing shards; checks completeness."""
    expected = dict(model.state_dict())  # name -> meta tensor (shape reference)
    state: dict[str, torch.Tensor] = {}
    pending: dict[str, list[torch.Tensor | None]] = {}
    unexpected: list[str] = []
    for name, tensor in tensors:
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # some tied checkpoints store the shared matrix twice
        param_name, shard, num_shards = checkpoint_name_to_param(name)
        if param_name not in expected:
            unexpected.append(name)
            continue
        if num_shards == 1:
            state[param_name] = tensor
            continue
        shards = pending.setdefault(param_name, [None] * num_shards)
        shards[shard] = tensor
        if all(s is not None for s in shards):
            state[param_name] = torch.cat(shards, dim=0)
            del pending[param_name]
    if unexpected:
        raise ValueError(
            f"checkpoint has {len(unexpected)} tensor(s) this {config.architecture} does not "
            f"use, e.g. {unexpected[:5]}"
        )
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensor(s), e.g. {missing[:5]}")
    wrong_shapes = [
        f"{name}: {tuple(tensor.shape)} != {tuple(expected[name].shape)}"
        for name, tensor in state.items()
        if tensor.shape != expected[name].shape
    ]
    if wrong_shapes:
        raise ValueError(f"checkpoint tensors do not match the config: {wrong_shapes[:5]}")
    return state
