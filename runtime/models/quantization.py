"""`QuantConfig`: which `LinearMethod` each linear layer gets, from `--quantization` and the
checkpoint's `quantization_config`.

Supported (docs/quantization.md):
- `--quantization fp8` on a bf16/fp16/fp32 checkpoint: weights quantized to e4m3 at load time,
  one scale per output channel;
- checkpoints already in FP8: HF `quant_method: fp8` (per-tensor `weight_scale`, or block-wise
  `weight_scale_inv` with `weight_block_size`) and compressed-tensors `float-quantized` with
  8-bit float weights, per-tensor or per-channel;
- int4 weight-only checkpoints (runtime/models/int4_linear.py): AWQ (`quant_method: awq`, GEMM
  packing, zero points) and GPTQ (4-bit, `desc_act` with `g_idx`, symmetric or not, v1 or v2
  zeros); `--quantization awq|gptq` on an unquantized checkpoint quantizes it by
  round-to-nearest (group 128) at load time. vLLM's `awq_marlin` / `gptq_marlin` are aliases.
Every other `quantization_config` is refused with its method named. Activations are always
quantized dynamically per token: static `input_scale` tensors are read and discarded.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from radixgen.runtime.models.int4_checkpoint import Int4Scheme, parse_int4_quantization_config
from radixgen.runtime.models.int4_linear import Int4LinearMethod
from radixgen.runtime.models.linear import (
    FP8_BLOCK,
    FP8_FROM_HIGH_PRECISION,
    FP8_PER_CHANNEL,
    FP8_PER_TENSOR,
    Fp8LinearMethod,
    LinearMethod,
    UnquantizedLinearMethod,
)

QuantizationName = Literal["fp8", "awq", "gptq", "awq_marlin", "gptq_marlin"]
SUPPORTED_CHECKPOINT_METHODS = (
    "fp8",
    "compressed-tensors (float-quantized, 8-bit)",
    "awq (4-bit, GEMM packing)",
    "gptq (4-bit)",
)
# vLLM's names of the same checkpoints read by its Marlin kernels.
_METHOD_ALIASES = {"awq_marlin": "awq", "gptq_marlin": "gptq"}
# QuantConfig.checkpoint_format of int4 layers.
INT4_PACKED = "int4_packed"  # AWQ/GPTQ tensors (QuantConfig.int4 says which)
INT4_FROM_HIGH_PRECISION = "int4_high_precision"  # float weights, RTN-quantized at load time


@dataclass(frozen=True)
class QuantConfig:
    """How the model's linear layers are quantized.

    Attributes:
        method: the quantization ("fp8", "awq" or "gptq"; aliases resolved).
        checkpoint_format: how the checkpoint stores the weights (linear.FP8_*, INT4_*).
        block_size: (block_n, block_k) of block-quantized checkpoints.
        ignored_modules: checkpoint module names (or "re:" regexes) left unquantized.
        int4: the int4 checkpoint format ("awq" and "gptq" only).
        fp8_fast_accum: FP8 layers' large-M GEMMs use the tensor cores' fast accumulation
            (ServerArgs.disable_fp8_fast_accum turns it off).
    """

    method: QuantizationName
    checkpoint_format: str
    block_size: tuple[int, int] | None = None
    ignored_modules: tuple[str, ...] = ()
    int4: Int4Scheme | None = None
    fp8_fast_accum: bool = False

    def linear_method(self, checkpoint_modules: Sequence[str]) -> LinearMethod:
        """The method of a layer that stacks `checkpoint_modules` (e.g. its q, k, v names).

        Raises:
            ValueError: some but not all of the stacked modules are in the ignore list.
        """
        ignored = [self._is_ignored(name) for name in checkpoint_modules]
        if all(ignored):
            return UnquantizedLinearMethod()
        if any(ignored):
            raise ValueError(
                "quantization_config ignores only some of the fused modules "
                f"{list(checkpoint_modules)}"
            )
        if self.int4 is not None:
            from_high_precision = self.checkpoint_format == INT4_FROM_HIGH_PRECISION
            return Int4LinearMethod(self.int4, from_high_precision=from_high_precision)
        block_size = self.block_size if self.checkpoint_format == FP8_BLOCK else None
        return Fp8LinearMethod(self.checkpoint_format, block_size, fast_accum=self.fp8_fast_accum)

    def _is_ignored(self, module_name: str) -> bool:
        for pattern in self.ignored_modules:
            if pattern.startswith("re:"):
                if re.fullmatch(pattern[3:], module_name):
                    return True
            elif module_name == pattern or module_name.endswith("." + pattern):
                return True
        return False


def resolve_quant_config(
    checkpoint_quantization: dict | None,
    requested: QuantizationName | None,
    *,
    dummy_weights: bool = False,
) -> QuantConfig | None:
    """Combines the checkpoint's `quantization_config` with the `quantization` option.

    Args:
        checkpoint_quantization: config.json's "quantization_config", or None.
        requested: ServerArgs.quantization (None: whatever the checkpoint is; otherwise it
            must agree with the checkpoint's, or quantizes an unquantized one at load time).
        dummy_weights: load_format="dummy": random high-precision weights are drawn whatever
            the checkpoint stores, and quantized at load time if the checkpoint is quantized.

    Raises:
        ValueError: an unsupported quantization method or scheme (named), or a requested
            quantization the checkpoint's contradicts.
    """
    if requested not in (None, *QuantizationName.__args__):
        raise ValueError(
            f"quantization must be None or one of {QuantizationName.__args__}, got {requested!r}"
        )
    method = _METHOD_ALIASES.get(requested, requested)
    if checkpoint_quantization is None:
        if method is None:
            return None
        if method == "fp8":
            return QuantConfig(method=method, checkpoint_format=FP8_FROM_HIGH_PRECISION)
        return QuantConfig(method, INT4_FROM_HIGH_PRECISION, int4=Int4Scheme(packing=method))
    parsed = _parse_checkpoint_quantization(checkpoint_quantization)
    if method is not None and method != parsed.method:
        raise ValueError(
            f"quantization={requested!r} contradicts the checkpoint's quantization_config "
            f"(quant_method {checkpoint_quantization.get('quant_method')!r})"
        )
    if dummy_weights:
        high_precision = INT4_FROM_HIGH_PRECISION if parsed.int4 else FP8_FROM_HIGH_PRECISION
        return dataclasses.replace(parsed, checkpoint_format=high_precision, block_size=None)
    return parsed


def _parse_checkpoint_quantization(config: dict) -> QuantConfig:
    method = config.get("quant_method")
    if method == "fp8":
        return _parse_hf_fp8(config)
    if method == "compressed-tensors":
        return _parse_compressed_tensors(config)
    int4_method = _METHOD_ALIASES.get(str(method).lower(), str(method).lower())
    if int4_method in ("awq", "gptq"):
        scheme, ignored = parse_int4_quantization_config(config, int4_method)
        return QuantConfig(int4_method, INT4_PACKED, ignored_modules=ignored, int4=scheme)
    raise ValueError(
        f"the checkpoint's quantization_config has quant_method {method!r}, which radixgen "
        f"does not support; supported: {list(SUPPORTED_CHECKPOINT_METHODS)}"
    )


def _parse_hf_fp8(config: dict) -> QuantConfig:
    fmt = config.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"quant_method 'fp8' with fmt {fmt!r} is not supported (only e4m3)")
    ignored = tuple(config.get("ignored_layers") or config.get("modules_to_not_convert") or ())
    block = config.get("weight_block_size")
    if block is not None:
        if len(block) != 2:
            raise ValueError(f"quant_method 'fp8': weight_block_size must be [n, k], got {block}")
        return QuantConfig("fp8", FP8_BLOCK, (int(block[0]), int(block[1])), ignored)
    return QuantConfig("fp8", FP8_PER_TENSOR, None, ignored)


def _parse_compressed_tensors(config: dict) -> QuantConfig:
    fmt = config.get("format")
    if fmt != "float-quantized":
        raise ValueError(
            f"compressed-tensors format {fmt!r} is not supported; radixgen reads "
            "'float-quantized' (8-bit float weights)"
        )
    groups = config.get("config_groups") or {}
    strategies = set()
    for name, group in groups.items():
        weights = group.get("weights") or {}
        if weights.get("type") != "float" or weights.get("num_bits") != 8:
            raise ValueError(
                f"compressed-tensors group {name!r}: weights must be 8-bit float, got "
                f"type {weights.get('type')!r} num_bits {weights.get('num_bits')!r}"
            )
        if weights.get("dynamic"):
            raise ValueError(f"compressed-tensors group {name!r}: dynamic weight scales")
        strategy = weights.get("strategy")
        if strategy not in ("tensor", "channel"):
            raise ValueError(
                f"compressed-tensors group {name!r}: weight strategy {strategy!r} is not "
                "supported (tensor or channel)"
            )
        activations = group.get("input_activations")
        if activations and (activations.get("type"), activations.get("num_bits")) != ("float", 8):
            raise ValueError(
                f"compressed-tensors group {name!r}: input activations must be 8-bit float "
                "(or absent)"
            )
        if group.get("output_activations"):
            raise ValueError(f"compressed-tensors group {name!r}: output activations")
        targets = group.get("targets") or []
        if targets != ["Linear"]:
            raise ValueError(f"compressed-tensors group {name!r}: targets {targets} (Linear only)")
        strategies.add(strategy)
    if len(strategies) != 1:
        raise ValueError(
            "compressed-tensors: expected one weight scheme over all groups, got "
            f"{sorted(strategies)}"
        )
    checkpoint_format = FP8_PER_TENSOR if strategies == {"tensor"} else FP8_PER_CHANNEL
    return QuantConfig("fp8", checkpoint_format, None, tuple(config.get("ignore") or ()))
