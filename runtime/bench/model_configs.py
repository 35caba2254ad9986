"""Real model shapes for benchmarks with random weights (`--load-format dummy`).

`write_dummy_model_folder("llama-3.1-8b", folder)` writes a checkpoint folder with the real
config.json and no weights; the tokenizer files are the tiny model's (benchmarks send token
ids, so only the config's shapes matter). Load it with `load_format="dummy"`.

    python -m radixgen.runtime.bench.model_configs llama-3.1-8b /tmp/llama-3.1-8b
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

PRESETS: dict[str, dict] = {
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": _LLAMA3_ROPE,
        "tie_word_embeddings": False,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "torch_dtype": "bfloat16",
    },
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0},
        "tie_word_embeddings": True,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "torch_dtype": "bfloat16",
    },
}

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_dummy_model_folder(preset: str, folder: str | Path) -> Path:
    """Writes config.json of `preset` and the tiny tokenizer into `folder`; returns it."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    from radixgen.runtime.tiny_model import resolve_model_path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(PRESETS[preset], indent=2))
    tiny = Path(resolve_model_path("tiny"))
    for name in _TOKENIZER_FILES:
        if (tiny / name).exists():
            shutil.copy(tiny / name, folder / name)
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(
            f"usage: python -m radixgen.runtime.bench.model_configs {{{','.join(PRESETS)}}} FOLDER"
        )
    print(write_dummy_model_folder(sys.argv[1], sys.argv[2]))
