"""`ModelConfig`: what the model core needs from a HF checkpoint's config.json.

Reads both config layouts in the wild: transformers 4.x (`rope_theta` + `rope_scaling`,
`torch_dtype`) and 5.x (`rope_parameters`, `dtype`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# architectures name in config.json -> model family implemented in runtime/models/.
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
# For configs saved without "architectures" (e.g. a bare PretrainedConfig.save_pretrained).
_ARCHITECTURE_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters. `rope_type` "llama3" uses the four scaling fields."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and options of a Llama-family decoder, read from config.json."""

    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2: always; Llama/Qwen3: config "attention_bias"
    o_proj_bias: bool  # Llama/Qwen3 "attention_bias"; never in Qwen2
    mlp_bias: bool  # Llama "mlp_bias"
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    context_length: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    checkpoint_dtype: str | None  # "bfloat16", "float16", "float32" or None if unstated
    # config.json's "quantization_config" as stored (runtime/models/quantization.py reads it).
    quantization_config: dict | None = field(default=None, compare=False, hash=False)

    @classmethod
    def from_dict(cls, config: dict, generation_config: dict | None = None) -> ModelConfig:
        """Builds a ModelConfig from a parsed config.json (and generation_config.json).

        Raises:
            ValueError: unsupported architecture or RoPE type, or a missing required key.
        """
        architecture = _architecture(config)
        try:
            hidden_size = int(config["hidden_size"])
            num_heads = int(config["num_attention_heads"])
            num_layers = int(config["num_hidden_layers"])
            intermediate_size = int(config["intermediate_size"])
            vocab_size = int(config["vocab_size"])
        except KeyError as missing:
            raise ValueError(f"config.json lacks the required key {missing}") from None
        num_kv_heads = int(config.get("num_key_value_heads") or num_heads)
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({num_heads}) must be a multiple of "
                f"num_key_value_heads ({num_kv_heads})"
            )
        head_dim = int(config.get("head_dim") or hidden_size // num_heads)
        attention_bias = bool(config.get("attention_bias", False))
        is_qwen2 = architecture == "Qwen2ForCausalLM"
        context_length = int(config.get("max_position_embeddings", 4096))
        # Sliding-window attention is not implemented; within the window it equals full
        # attention, so an active window caps the context instead of changing results.
        sliding_window = config.get("sliding_window")
        window_active = config.get("use_sliding_window", architecture == "MistralForCausalLM")
        if sliding_window and window_active:
            context_length = min(context_length, int(sliding_window))
        return cls(
            architecture=architecture,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate_size,
            vocab_size=vocab_size,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope=_rope_config(config),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or attention_bias,
            o_proj_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(config.get("mlp_bias", False)),
            qk_norm=architecture == "Qwen3ForCausalLM",
            context_length=context_length,
            eos_token_ids=_eos_token_ids(config, generation_config or {}),
            bos_token_id=config.get("bos_token_id"),
            checkpoint_dtype=config.get("dtype") or config.get("torch_dtype"),
            quantization_config=config.get("quantization_config"),
        )

    @classmethod
    def from_folder(cls, model_path: str | Path) -> ModelConfig:
        """Reads `config.json` (and `generation_config.json` if present) from a HF folder.

        Raises:
            FileNotFoundError: the folder or its config.json does not exist.
            ValueError: see `from_dict`.
        """
        folder = Path(model_path)
        config_file = folder / "config.json"
        if not folder.is_dir():
            raise FileNotFoundError(f"model_path {str(model_path)!r} is not a folder")
        if not config_file.is_file():
            raise FileNotFoundError(f"model_path {str(model_path)!r} has no config.json")
        config = json.loads(config_file.read_text())
        generation_file = folder / "generation_config.json"
        generation = json.loads(generation_file.read_text()) if generation_file.is_file() else {}
        return cls.from_dict(config, generation)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def _architecture(config: dict) -> str:
    architectures = config.get("architectures") or []
    if not architectures and config.get("model_type") in _ARCHITECTURE_BY_MODEL_TYPE:
        architectures = [_ARCHITECTURE_BY_MODEL_TYPE[config["model_type"]]]
    for name in architectures:
        if name in SUPPORTED_ARCHITECTURES:
            return name
    raise ValueError(
        f"unsupported architecture {architectures or config.get('model_type')!r}; "
        f"radixgen supports {list(SUPPORTED_ARCHITECTURES)}"
    )


def _rope_config(config: dict) -> RopeConfig:
    # transformers 5 writes "rope_parameters" (theta inside); 4.x writes rope_theta + rope_scaling.
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported RoPE type {rope_type!r}; radixgen supports {SUPPORTED_ROPE_TYPES}"
        )
    if rope_type == "default":
        return RopeConfig(theta=theta)
    defaults = RopeConfig()
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", defaults.low_freq_factor)),
        high_freq_factor=float(params.get("high_freq_factor", defaults.high_freq_factor)),
        original_max_position_embeddings=int(
            params.get(
                "original_max_position_embeddings", defaults.original_max_position_embeddings
            )
        ),
    )


def _eos_token_ids(config: dict, generation_config: dict) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (generation_config, config):
        value = source.get("eos_token_id")
        for token_id in value if isinstance(value, list) else [value]:
            if token_id is not None and int(token_id) not in ids:
                ids.append(int(token_id))
    return tuple(ids)
