"""`LoRAAdapter`: a PEFT LoRA adapter read from a local folder, validated once, kept on the host.

A PEFT folder holds `adapter_config.json` and `adapter_model.safetensors` with tensors named
`base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight` (A: [r, in],
B: [out, r]). Supported: plain LoRA (`peft_type: LORA`) on q/k/v/o/gate/up/down projections,
ranks up to the pool's `max_lora_rank`, `lora_alpha / r` scaling (`alpha / sqrt(r)` with
`use_rslora`). Refused with the reason named: adapters on embeddings or `lm_head`,
`modules_to_save`, DoRA, trained biases, per-module rank/alpha patterns, `.bin` checkpoints.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

# PEFT module name -> (fused model parameter, shard index in it).
TARGET_MODULES = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "o_proj": ("o_proj", 0),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
    "down_proj": ("down_proj", 0),
}
_TENSOR_NAME = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$"
)
_REFUSED_TARGETS = ("embed_tokens", "lm_head", "lora_embedding")


@dataclass(frozen=True)
class LoRAAdapter:
    """One adapter on the host (model dtype, CPU).

    Attributes:
        name: the name requests use (`lora_path`).
        path: the folder it was read from.
        rank: r. scaling: the factor of B @ A (alpha / r, or alpha / sqrt(r) with rsLoRA).
        target_modules: the PEFT module names it adapts (subset of TARGET_MODULES).
        weights: (layer, module) -> (A [r, in], B [out, r]).
    """

    name: str
    path: str
    rank: int
    scaling: float
    target_modules: frozenset[str]
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    # Distinguishes two adapters loaded under one name (an unload, then a load): part of the
    # radix cache namespace, so the second never reuses the first one's KV.
    load_id: int = 0


def _refuse(path: Path, reason: str) -> ValueError:
    return ValueError(f"LoRA adapter {str(path)!r}: {reason}")


def read_adapter_config(path: str | Path) -> dict:
    """Reads and validates `adapter_config.json` of `path`.

    Raises:
        ValueError: a missing file, or a feature radixgen does not serve (named).
    """
    folder = Path(path)
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise _refuse(folder, "no adapter_config.json (a local PEFT adapter folder is expected)")
    config = json.loads(config_file.read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise _refuse(folder, f"peft_type {config.get('peft_type')!r} (only LORA is supported)")
    if config.get("modules_to_save"):
        raise _refuse(
            folder,
            f"modules_to_save {config['modules_to_save']} (fully trained copies of modules, e.g. "
            "lm_head or embeddings) is not supported",
        )
    if config.get("use_dora"):
        raise _refuse(folder, "DoRA (use_dora) is not supported")
    if config.get("bias", "none") != "none":
        raise _refuse(folder, f"bias {config['bias']!r}: trained biases are not supported")
    if config.get("fan_in_fan_out"):
        raise _refuse(folder, "fan_in_fan_out (Conv1D weights) is not supported")
    for key in ("rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise _refuse(folder, f"{key} (per-module ranks or alphas) is not supported")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise _refuse(folder, f"r must be a positive integer, got {rank!r}")
    return config


def load_lora_adapter(
    name: str, path: str | Path, *, num_layers: int, max_rank: int, dtype: torch.dtype
) -> LoRAAdapter:
    """Reads a PEFT adapter folder (config + safetensors) onto the host.

    Args:
        name: the adapter's serving name.
        path: the local folder.
        num_layers: the base model's decoder layers (layer indices are checked against it).
        max_rank: the pool's `max_lora_rank`.
        dtype: the model dtype the weights are cast to.

    Raises:
        ValueError: what is wrong or unsupported, naming the folder (and tensor).
    """
    folder = Path(path)
    config = read_adapter_config(folder)
    rank = config["r"]
    if rank > max_rank:
        raise _refuse(folder, f"rank {rank} exceeds max_lora_rank {max_rank}")
    weights_file = folder / "adapter_model.safetensors"
    if not weights_file.is_file():
        reason = "no adapter_model.safetensors"
        if (folder / "adapter_model.bin").is_file():
            reason += " (adapter_model.bin pickles are not read: save with safe_serialization)"
        raise _refuse(folder, reason)
    alpha = config.get("lora_alpha", rank)
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for tensor_name, tensor in load_file(str(weights_file)).items():
        if any(refused in tensor_name for refused in _REFUSED_TARGETS):
            raise _refuse(
                folder, f"tensor {tensor_name!r}: LoRA on embeddings or lm_head is not supported"
            )
        match = _TENSOR_NAME.match(tensor_name)
        if match is None or match.group(2) not in TARGET_MODULES:
            raise _refuse(
                folder,
                f"tensor {tensor_name!r} is not a LoRA A/B weight of "
                f"{sorted(TARGET_MODULES)} in a decoder layer",
            )
        layer, module, half = int(match.group(1)), match.group(2), match.group(3)
        if layer >= num_layers:
            raise _refuse(folder, f"tensor {tensor_name!r}: the model has {num_layers} layers")
        halves.setdefault((layer, module), {})[half] = tensor
    weights = {}
    for (layer, module), pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise _refuse(folder, f"layer {layer} {module}: lora_A and lora_B must both be saved")
        lora_a, lora_b = pair["A"], pair["B"]
        if lora_a.shape[0] != rank or lora_b.ndim != 2 or lora_b.shape[1] != rank:
            raise _refuse(
                folder,
                f"layer {layer} {module}: A {tuple(lora_a.shape)} / B {tuple(lora_b.shape)} do "
                f"not have rank {rank}",
            )
        weights[(layer, module)] = (lora_a.to(dtype).contiguous(), lora_b.to(dtype).contiguous())
    if not weights:
        raise _refuse(folder, "no LoRA weights in adapter_model.safetensors")
    return LoRAAdapter(
        name=name,
        path=str(folder),
        rank=rank,
        scaling=float(scaling),
        target_modules=frozenset(module for _, module in weights),
        weights=weights,
    )
