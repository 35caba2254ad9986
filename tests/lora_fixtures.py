"""Random small models and random PEFT LoRA adapters saved with `peft`, for the LoRA tests."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from test_model_parity import SMALL, _perturbed_model

# name -> (rank, alpha, target modules, use_rslora)
ADAPTERS = {
    "all": (
        8,
        16,
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        False,
    ),
    "qv": (4, 8, ["q_proj", "v_proj"], False),
    "mlp": (16, 8, ["gate_proj", "down_proj", "o_proj"], True),
}


def random_base_model(config_class, **overrides) -> transformers.PreTrainedModel:
    """A small random model (test_model_parity's shapes), every parameter perturbed."""
    return _perturbed_model(config_class, dict(SMALL, **overrides))


def save_random_adapter(base: transformers.PreTrainedModel, folder: Path, name: str, seed: int):
    """Saves a random LoRA adapter of `ADAPTERS[name]` (A and B both random: PEFT's default
    B = 0 would make every adapter the base model) with `peft` into `folder`."""
    import peft

    rank, alpha, targets, rslora = ADAPTERS[name]
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=targets, use_rslora=rslora, lora_dropout=0.0
    )
    torch.manual_seed(seed)
    model = peft.get_peft_model(base, config)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "lora_" in param_name:
                param.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    model.unload()  # the base model back as it was, for the next adapter
    return folder
