"""Loads a Llama-family model from a HF checkpoint folder, or with dummy weights.

The model is built on the meta device (no memory), then filled with the loaded tensors
(gpt-fast style), so an 8B model never exists twice in memory. Tensors stream one by one from
safetensors files straight to the target device; each projection loads its own tensors
(`LinearBase.load_weight`: fused q/k/v and gate/up shards land in their rows, and a layer
quantized at load time is quantized as soon as its last shard arrives), the other parameters
(embeddings, norms) are assigned.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import torch

from radixgen.runtime.distributed import TensorParallel
from radixgen.runtime.model_config import ModelConfig
from radixgen.runtime.models.linear import LinearBase
from radixgen.runtime.models.llama import (
    LlamaForCausalLM,
    checkpoint_name_to_param,
    checkpoint_weight_shapes,
    kv_cache_scale_target,
)
from radixgen.runtime.models.llama_eagle import EagleHeadConfig, LlamaEagleHead
from radixgen.runtime.models.parallel_layers import VocabParallelEmbedding
from radixgen.runtime.models.quantization import QuantizationName, resolve_quant_config

LoadFormat = Literal["auto", "safetensors", "dummy"]
# Checkpoint tensors that carry nothing the model needs (old Llama exports store inv_freq).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Quantization scales stay float32 whatever the model dtype.
_SCALE_SUFFIXES = ("_scale", "_scale_inv")
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
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
    quantization: QuantizationName | None = None,
    parallel: TensorParallel | None = None,
    fp8_fast_accum: bool = False,
) -> LlamaForCausalLM:
    """Builds the model and loads its weights, in `dtype` on `device`, in eval mode.

    Args:
        model_path: HF folder (only config.json is needed with load_format="dummy").
        model_config: the parsed config of that folder.
        load_format: "auto"/"safetensors" read the weight files; "dummy" draws random
            weights of the real shapes (seeded by `seed`) without reading any.
        max_positions: RoPE table size; defaults to the config's context length.
        quantization: "fp8" quantizes a high-precision checkpoint at load time; None loads
            the checkpoint as it is (FP8 checkpoints stay FP8).
        parallel: this rank's tensor-parallel group: every layer keeps only its slice of
            each checkpoint tensor as it streams by (None: the whole model).
        fp8_fast_accum: FP8 layers' large-M GEMMs accumulate through the tensor cores' fast
            FP8 accumulation (`QuantConfig.fp8_fast_accum`).

    Raises:
        FileNotFoundError: no safetensors weights in the folder.
        ValueError: unknown load_format, an unsupported quantization config, or tensors
            missing from / unexpected in the checkpoint.
    """
    if load_format not in ("auto", "safetensors", "dummy"):
        raise ValueError(
            f"load_format must be 'auto', 'safetensors' or 'dummy', got {load_format!r}"
        )
    device = torch.device(device)
    quant_config = resolve_quant_config(
        model_config.quantization_config, quantization, dummy_weights=load_format == "dummy"
    )
    if quant_config is not None:
        quant_config = dataclasses.replace(quant_config, fp8_fast_accum=fp8_fast_accum)
    with torch.device("meta"):
        model = LlamaForCausalLM(model_config, max_positions, quant_config, parallel)
    if load_format == "dummy":
        tensors = random_checkpoint_tensors(model_config, seed=seed, dtype=dtype, device=device)
    else:
        tensors = read_checkpoint_tensors(Path(model_path), dtype=dtype, device=device)
    _load_weights(tensors, model, model_config)
    # Moves what is not a loaded parameter (the RoPE tables, built on the CPU).
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def load_eagle_head(
    head_path: str | Path,
    *,
    head_config: EagleHeadConfig,
    target: LlamaForCausalLM,
    dtype: torch.dtype,
    device: torch.device | str,
    whole_vocabulary: tuple[VocabParallelEmbedding, VocabParallelEmbedding] | None = None,
) -> LlamaEagleHead:
    """An EAGLE head (runtime/models/llama_eagle.py) from its folder, attached to `target`
    (whose embedding, LM head and RoPE table it shares; `whole_vocabulary`: the embedding and
    LM head to use instead, where the target's are split over tensor-parallel ranks).

    Raises:
        FileNotFoundError: no safetensors weights in the folder.
        ValueError: tensors missing from / unexpected in the checkpoint.
    """
    device = torch.device(device)
    with torch.device("meta"):
        head = LlamaEagleHead(head_config)
    tensors = read_checkpoint_tensors(Path(head_path), dtype=dtype, device=device)
    _load_weights(tensors, head, head_config.model)
    head.to(device)
    head.eval()
    head.requires_grad_(False)
    head.attach(target, whole_vocabulary)
    return head


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
    """Yields (checkpoint name, tensor on `device`) for every stored tensor: in `dtype`, except
    FP8 tensors (kept) and quantization scales (float32)."""
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
                tensor = handle.get_tensor(name)
                if name.endswith(_SCALE_SUFFIXES):
                    tensor = tensor.to(device=device, dtype=torch.float32)
                elif tensor.dtype in _FP8_DTYPES or not tensor.is_floating_point():
                    tensor = tensor.to(device=device)
                else:
                    tensor = tensor.to(device=device, dtype=dtype)
                yield name, tensor


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


def _load_weights(
    tensors: Iterator[tuple[str, torch.Tensor]],
    model: LlamaForCausalLM | LlamaEagleHead,
    config: ModelConfig,
) -> None:
    """Loads checkpoint tensors into the model: projections through their `LinearBase`, the
    rest by assignment; KV-cache scales onto their attention layer. Checks completeness."""
    modules = dict(model.named_modules())
    linears = {name: m for name, m in modules.items() if isinstance(m, LinearBase)}
    # Embedding / LM head parameters, which keep only their rows under tensor parallelism.
    vocab_rows = {
        f"{name}.weight": m for name, m in modules.items() if isinstance(m, VocabParallelEmbedding)
    }
    # name -> meta tensor (shape reference) of every parameter that is not in a LinearBase.
    plain_expected = {
        name: tensor
        for name, tensor in model.state_dict().items()
        if name.rpartition(".")[0] not in linears
    }
    plain: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for name, tensor in tensors:
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # some tied checkpoints store the shared matrix twice
        kv_scale = kv_cache_scale_target(name)
        if kv_scale is not None and kv_scale[0] < config.num_layers:
            attention = model.model.layers[kv_scale[0]].self_attn
            k_scale, v_scale = attention.kv_cache_scales
            value = float(tensor.float().max())  # per-tensor (host sync: once per layer)
            attention.kv_cache_scales = (value, v_scale) if kv_scale[1] == "k" else (k_scale, value)
            continue
        param_name, shard, _num_shards = checkpoint_name_to_param(name)
        module_name, _, leaf = param_name.rpartition(".")
        if module_name in linears:
            try:
                linears[module_name].load_weight(leaf, tensor, shard)
            except ValueError as error:
                raise ValueError(f"checkpoint tensor {name!r}: {error}") from None
        elif param_name in plain_expected:
            if param_name in vocab_rows:
                tensor = vocab_rows[param_name].shard_checkpoint(tensor)
            plain[param_name] = tensor
        else:
            unexpected.append(name)
    if unexpected:
        raise ValueError(
            f"checkpoint has {len(unexpected)} tensor(s) this {config.architecture} does not "
            f"use, e.g. {unexpected[:5]}"
        )
    missing = sorted(set(plain_expected) - set(plain))
    missing += [
        f"{name}.{tensor}" for name, layer in linears.items() for tensor in layer.missing_tensors()
    ]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensor(s), e.g. {missing[:5]}")
    wrong_shapes = [
        f"{name}: {tuple(tensor.shape)} != {tuple(plain_expected[name].shape)}"
        for name, tensor in plain.items()
        if tensor.shape != plain_expected[name].shape
    ]
    if wrong_shapes:
        raise ValueError(f"checkpoint tensors do not match the config: {wrong_shapes[:5]}")
    model.load_state_dict(plain, strict=False, assign=True)
