"""The one linear layer of the models: `LinearBase` with a pluggable `LinearMethod`.

A `LinearBase` knows its shapes and how checkpoint tensors land in it: a merged layer (q/k/v,
gate/up) stacks several checkpoint modules ("shards") along the output dimension. Its
`LinearMethod` decides everything about the numbers: which tensors a checkpoint stores for it
(`create_weights`), what they become once loaded (`process_weights_after_loading`, e.g. a
bf16 weight quantized to FP8), and the product (`apply`). Quantized formats (FP8 here; int4
later) are new methods; LoRA and tensor-parallel shards wrap or slice the same layer.

Loading: `load_weight(name, tensor, shard)` copies one checkpoint tensor into its rows of the
registered parameter (allocated on the tensor's device at the first shard); once every
parameter has all its shards, the layer calls `process_weights_after_loading` at once, so a
checkpoint quantized at load time never holds more than one layer in high precision.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.kernels.fp8_gemm import (
    FP8_DTYPE,
    Fp8Activations,
    fp8_linear,
    fp8_split_k_counter_slots,
    quantize_fp8_per_token_ref,
)
from radixgen.kernels.gemv import (
    FP8_TABLE_PATH,
    AddNorm,
    GemvConfig,
    GemvTable,
    gemv,
    gemv_counter_slots,
    load_gemv_table,
    select_gemv_config,
)
from radixgen.kernels.rope_store import RopeStore


@dataclass(frozen=True)
class ParamLayout:
    """How one checkpoint tensor kind of a linear layer is stored and sharded.

    Attributes:
        rows_per_shard: rows each shard contributes (dim 0 of the registered parameter).
        trailing_shape: the parameter's shape after dim 0 (`(input_size,)` for a weight).
        dtype: the dtype the checkpoint must store it in, or None for any floating dtype
            (already cast to the model dtype by the loader).
    """

    rows_per_shard: tuple[int, ...]
    trailing_shape: tuple[int, ...] = ()
    dtype: torch.dtype | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return (sum(self.rows_per_shard), *self.trailing_shape)


@dataclass(frozen=True)
class CheckpointSlice:
    """The part of each checkpoint tensor a tensor-parallel rank keeps.

    Column parallel (`dim=0`, q/k/v and gate/up): checkpoint shard i keeps its output rows
    `[starts[i], starts[i] + output_sizes[i])` of `full_sizes[i]`. Row parallel (`dim=1`, o and
    down): weights keep input columns `[starts[0], starts[0] + input_size)` of `full_sizes[0]`;
    the bias is added once, by the rank with `keep_bias` (the others hold zeros), because the
    ranks' outputs are summed.
    """

    dim: int
    starts: tuple[int, ...]
    full_sizes: tuple[int, ...]
    keep_bias: bool = True

    def select(self, layer: LinearBase, name: str, tensor: torch.Tensor, shard: int):
        """This rank's part of checkpoint tensor `name` of shard `shard` (a copy: the full
        tensor is freed as soon as the loader drops it)."""
        if name == "weight_scale_inv":
            raise ValueError("block-quantized FP8 checkpoints do not support tensor parallelism")
        if self.dim == 0:
            if tensor.ndim >= 1 and tensor.shape[0] == self.full_sizes[shard]:
                start, rows = self.starts[shard], layer.output_sizes[shard]
                return tensor.narrow(0, start, rows).clone()
            return tensor  # per-tensor scales: shared by every rank
        if name == "bias":
            return tensor if self.keep_bias else torch.zeros_like(tensor)
        if tensor.ndim == 2 and tensor.shape[1] == self.full_sizes[0]:
            return tensor.narrow(1, self.starts[0], layer.input_size).clone()
        return tensor


class LinearMethod(abc.ABC):
    """How a linear layer stores its weights and computes `x @ W.T + b`."""

    # Checkpoint tensors accepted and discarded (e.g. static activation scales, replaced by
    # dynamic per-token ones).
    ignored_names: tuple[str, ...] = ()

    @abc.abstractmethod
    def create_weights(self, layer: LinearBase) -> dict[str, ParamLayout]:
        """The checkpoint tensors of `layer` (name -> layout), bias excluded."""

    def prepare_checkpoint_tensor(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """One checkpoint tensor in the layout `create_weights` declares (shards stacked along
        dim 0, e.g. int4 codes unpacked output-row first); default: as stored."""
        return tensor

    def process_weights_after_loading(self, layer: LinearBase) -> None:  # noqa: B027
        """Turns the loaded checkpoint tensors into the runtime format; default: as loaded."""

    @abc.abstractmethod
    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        """`x: [..., input_size]` -> `[..., output_size]` in x's dtype."""

    def apply_adding_to(
        self, layer: LinearBase, x: torch.Tensor, add_to: torch.Tensor
    ) -> torch.Tensor:
        """`apply`, for a caller that adds the output into `add_to` next: a method may add
        terms of its output to `add_to` (in place) instead of returning them, the sum being
        the same. Default: `apply`, `add_to` untouched."""
        return self.apply(layer, x)

    def apply_with_delta(
        self, layer: LinearBase, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(y, delta)` whose sum `y + delta` (rounded to y's dtype) is `apply`'s output, for
        a caller whose next kernel adds `delta` itself; `delta` is float32 or None. Default:
        `(apply(...), None)`."""
        return self.apply(layer, x), None

    def takes_fp8_activations(self, layer: LinearBase, num_tokens: int) -> bool:
        """Whether `apply` wants `Fp8Activations` at `num_tokens` tokens (quantized by the
        kernel before the layer). Default: never."""
        return False

    def takes_gated_input(self, layer: LinearBase, num_tokens: int) -> bool:
        """Whether `apply_gated` runs at `num_tokens` tokens (a GEMV that computes an MLP's
        activation as it loads its input). Default: never."""
        return False

    def apply_gated(self, layer: LinearBase, gate_up: torch.Tensor) -> torch.Tensor:
        """`gate_up: [M, 2 * input_size]` (gate | up) -> `apply(silu(gate) * up)`, the
        activation rounded as `silu_and_mul` rounds it, where `takes_gated_input` says so."""
        raise NotImplementedError(f"{type(self).__name__} takes no gated input")

    def takes_silu_output(self, layer: LinearBase, num_tokens: int) -> bool:
        """Whether `apply_silu_output` runs at `num_tokens` tokens (a merged gate | up
        projection whose GEMV writes the MLP's activation). Default: never."""
        return False

    def apply_silu_output(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        """`silu_and_mul(apply(x))` (gate | up halves), in one launch, where
        `takes_silu_output` says so."""
        raise NotImplementedError(f"{type(self).__name__} writes no activation")

    def takes_add_norm(self, layer: LinearBase, num_tokens: int) -> bool:
        """Whether `apply_add_norm` runs at `num_tokens` tokens (a projection before a
        residual add and RMSNorm whose GEMV does both). Default: never."""
        return False

    def apply_add_norm(
        self, layer: LinearBase, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`norm.add_and_norm(apply(x), residual)` (`(normed, apply(x) + residual)`) in one
        launch, where `takes_add_norm` says so."""
        raise NotImplementedError(f"{type(self).__name__} adds no norm")

    def takes_rope_store(self, layer: LinearBase, num_tokens: int) -> bool:
        """Whether `apply_rope_store` runs at `num_tokens` tokens (a merged q | k | v
        projection whose GEMV also applies rotary and writes the KV cache). Default: never."""
        return False

    def apply_rope_store(
        self, layer: LinearBase, x: torch.Tensor | Fp8Activations, rope: RopeStore
    ) -> torch.Tensor:
        """The rotated q `[M, num_heads * head_dim]` of `apply(x)`'s q | k | v, its rotated k
        and v written into `rope`'s caches at its slots (`kernels/rope_store.py`), in one
        launch, where `takes_rope_store` says so."""
        raise NotImplementedError(f"{type(self).__name__} stores no rotary output")


class UnquantizedLinearMethod(LinearMethod):
    """Weights in the model dtype: `F.linear`, or on CUDA the split-K Triton GEMV for the token
    counts where the GPU's table (`kernels/gemv_configs.json`) has it faster."""

    def create_weights(self, layer: LinearBase) -> dict[str, ParamLayout]:
        layer.gemv_configs = {}  # tokens -> GemvConfig, filled once the weight is loaded
        return {"weight": ParamLayout(layer.output_sizes, (layer.input_size,))}

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        # Resolved once: the table's configs for this shape, by token count (none: F.linear).
        if layer.weight.is_cuda:
            layer.gemv_configs = resolve_gemv_configs(layer)
        if layer.gemv_configs:  # the GEMV sums its K splits in-kernel with these (zeros)
            slots = gemv_counter_slots(layer.output_size, GEMV_MAX_TOKENS)
            counters = torch.zeros(slots, dtype=torch.int32, device=layer.weight.device)
            layer.register_buffer("split_k_counters", counters, persistent=False)
            # A row's arrived tiles for `add_norm` launches (zeros between calls).
            norm_counters = torch.zeros(GEMV_MAX_TOKENS, dtype=torch.int32, device=counters.device)
            layer.register_buffer("norm_counters", norm_counters, persistent=False)

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        configs = layer.gemv_configs
        config = configs.get(x.numel() // x.shape[-1]) if configs else None
        if config is None or x.stride(-1) != 1:
            return F.linear(x, layer.weight, layer.bias)
        out = gemv(x.reshape(-1, x.shape[-1]), layer.weight, config, layer.split_k_counters)
        out = out.reshape(*x.shape[:-1], layer.output_size)
        return out if layer.bias is None else out + layer.bias

    def takes_gated_input(self, layer: LinearBase, num_tokens: int) -> bool:
        config = layer.gemv_configs.get(num_tokens)
        return config is not None and config.gated

    def apply_gated(self, layer: LinearBase, gate_up: torch.Tensor) -> torch.Tensor:
        config = layer.gemv_configs[gate_up.shape[0]]
        out = gemv(gate_up, layer.weight, config, layer.split_k_counters, gated=True)
        return out if layer.bias is None else out + layer.bias

    def takes_silu_output(self, layer: LinearBase, num_tokens: int) -> bool:
        return _gemv_writes_silu(layer, layer.gemv_configs.get(num_tokens))

    def apply_silu_output(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        config = layer.gemv_configs[x.shape[0]]
        return gemv(x, layer.weight, config, layer.split_k_counters, silu_out=True)

    def takes_add_norm(self, layer: LinearBase, num_tokens: int) -> bool:
        config = layer.gemv_configs.get(num_tokens)
        return config is not None and config.add_norm and layer.bias is None

    def apply_add_norm(
        self, layer: LinearBase, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module
    ) -> tuple[torch.Tensor, torch.Tensor]:
        config = layer.gemv_configs[x.shape[0]]
        add_norm = AddNorm(residual, norm.weight, norm.eps, layer.norm_counters)
        return gemv(x, layer.weight, config, layer.split_k_counters, add_norm=add_norm)

    def takes_rope_store(self, layer: LinearBase, num_tokens: int) -> bool:
        return _gemv_stores_rope(layer, layer.gemv_configs.get(num_tokens))

    def apply_rope_store(self, layer: LinearBase, x: torch.Tensor, rope: RopeStore) -> torch.Tensor:
        config = layer.gemv_configs[x.shape[0]]
        return gemv(x, layer.weight, config, layer.split_k_counters, rope_store=rope)


# The most tokens a linear layer's GEMV takes (decode at small batch; the table decides).
GEMV_MAX_TOKENS = 4


def is_unbiased_gate_up(layer: LinearBase) -> bool:
    """Whether the layer can write its MLP activation (`silu_out`): a merged gate | up layer of
    two equal halves without a bias (the activation needs the biased sums)."""
    sizes = layer.output_sizes
    return len(sizes) == 2 and sizes[0] == sizes[1] and layer.bias is None


def _gemv_writes_silu(layer: LinearBase, config: GemvConfig | None) -> bool:
    """A table row marked `silu_out` on an unbiased gate | up layer."""
    return config is not None and config.silu_out and is_unbiased_gate_up(layer)


def is_unbiased_qkv(layer: LinearBase) -> bool:
    """Whether the layer can rotate and store its output (`rope_store`): a merged q | k | v
    layer with equal k and v parts and no bias (the rotation needs the biased sums)."""
    sizes = layer.output_sizes
    return len(sizes) == 3 and sizes[1] == sizes[2] and layer.bias is None


def _gemv_stores_rope(layer: LinearBase, config: GemvConfig | None) -> bool:
    """A table row marked `rope_store` on an unbiased q | k | v layer."""
    return config is not None and config.rope_store and is_unbiased_qkv(layer)


def resolve_gemv_configs(
    layer: LinearBase, table: GemvTable | None = None
) -> dict[int, GemvConfig]:
    """The GEMV table's configs (default: the 16-bit one, `gemv_configs.json`) for the layer's
    shape, by token count (1..GEMV_MAX_TOKENS); token counts without one take the layer's
    other kernel."""
    configs = {}
    for tokens in range(1, GEMV_MAX_TOKENS + 1):
        config = select_gemv_config(layer.input_size, layer.output_size, tokens, table)
        if config is not None:
            configs[tokens] = config
    return configs


# FP8 checkpoint layouts (runtime/models/quantization.py picks one from config.json).
FP8_FROM_HIGH_PRECISION = "high_precision"  # bf16/fp16/fp32 weights, quantized at load time
FP8_PER_TENSOR = "per_tensor"  # fp8 weight + one scale per checkpoint module
FP8_PER_CHANNEL = "per_channel"  # fp8 weight + one scale per output channel
FP8_BLOCK = "block"  # fp8 weight + `weight_scale_inv` per [block_n, block_k] tile


class Fp8LinearMethod(LinearMethod):
    """W8A8 e4m3: per-output-channel weight scales, dynamic per-token activation scales.

    At run time every layer holds `weight: [out, in] e4m3` and `weight_scale: [out] fp32`,
    whatever the checkpoint stored: per-tensor scales are broadcast to their channels, and
    block-scaled weights are dequantized and requantized per channel at load time.

    Args:
        checkpoint_format: one of FP8_FROM_HIGH_PRECISION, FP8_PER_TENSOR, FP8_PER_CHANNEL,
            FP8_BLOCK.
        block_size: `(block_n, block_k)` of FP8_BLOCK checkpoints.
        fast_accum: large-M GEMMs (prefill, decode batches over 64) accumulate through the
            tensor cores' fast FP8 accumulation (`fp8_linear`'s `fast_accum`).
    """

    ignored_names = ("input_scale",)

    def __init__(
        self,
        checkpoint_format: str,
        block_size: tuple[int, int] | None = None,
        *,
        fast_accum: bool = False,
    ):
        formats = (FP8_FROM_HIGH_PRECISION, FP8_PER_TENSOR, FP8_PER_CHANNEL, FP8_BLOCK)
        if checkpoint_format not in formats:
            raise ValueError(
                f"checkpoint_format must be one of {formats}, got {checkpoint_format!r}"
            )
        if (checkpoint_format == FP8_BLOCK) != (block_size is not None):
            raise ValueError("block_size is required for, and only for, FP8_BLOCK checkpoints")
        self.checkpoint_format = checkpoint_format
        self.block_size = block_size
        self.fast_accum = fast_accum

    def create_weights(self, layer: LinearBase) -> dict[str, ParamLayout]:
        layer.fp8_gemv_configs = {}  # tokens -> GemvConfig, filled once the weight is loaded
        rows, in_features = layer.output_sizes, (layer.input_size,)
        if self.checkpoint_format == FP8_FROM_HIGH_PRECISION:
            return {"weight": ParamLayout(rows, in_features)}
        weight = ParamLayout(rows, in_features, FP8_DTYPE)
        if self.checkpoint_format == FP8_PER_TENSOR:
            scale = ParamLayout((1,) * len(rows), (), torch.float32)
            return {"weight": weight, "weight_scale": scale}
        if self.checkpoint_format == FP8_PER_CHANNEL:
            return {"weight": weight, "weight_scale": ParamLayout(rows, (), torch.float32)}
        block_n, block_k = self.block_size
        for size in rows[:-1]:
            if size % block_n:  # a block would straddle two checkpoint modules
                raise ValueError(
                    f"block-quantized FP8: merged output sizes {rows} must be multiples of "
                    f"block_n={block_n}"
                )
        scale_rows = tuple(-(-size // block_n) for size in rows)
        scale_cols = (-(-layer.input_size // block_k),)
        return {
            "weight": weight,
            "weight_scale_inv": ParamLayout(scale_rows, scale_cols, torch.float32),
        }

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        weight = layer.weight.data
        if self.checkpoint_format == FP8_FROM_HIGH_PRECISION:
            quantized, scale = quantize_fp8_per_token_ref(weight)
        elif self.checkpoint_format == FP8_PER_TENSOR:
            sizes = torch.tensor(layer.output_sizes, device=weight.device)
            quantized = weight
            scale = layer.weight_scale.data.repeat_interleave(sizes)
            del layer.weight_scale
        elif self.checkpoint_format == FP8_PER_CHANNEL:
            quantized, scale = weight, layer.weight_scale.data
            del layer.weight_scale
        else:
            block_n, block_k = self.block_size
            scale_inv = layer.weight_scale_inv.data  # [cdiv(out, block_n), cdiv(in, block_k)]
            expanded = scale_inv.repeat_interleave(block_n, 0).repeat_interleave(block_k, 1)
            rows, cols = weight.shape
            dequantized = weight.float() * expanded[:rows, :cols]
            quantized, scale = quantize_fp8_per_token_ref(dequantized)
            del layer.weight_scale_inv
        layer.weight = nn.Parameter(quantized.contiguous(), requires_grad=False)
        layer.weight_scale = nn.Parameter(scale.float().contiguous(), requires_grad=False)
        # Resolved once: the FP8 GEMV's configs for this shape by token count, where the GPU's
        # table (`kernels/gemv_fp8_configs.json`) has it faster than the skinny GEMM.
        if quantized.is_cuda:
            layer.fp8_gemv_configs = resolve_gemv_configs(layer, load_gemv_table(FP8_TABLE_PATH))
        # The skinny GEMM's (and the GEMV's) split-K partials are summed in its own launch
        # with these (zeros between calls; one per output tile at decode sizes).
        slots = fp8_split_k_counter_slots(quantized.shape[0])
        if layer.fp8_gemv_configs:
            slots = max(slots, gemv_counter_slots(quantized.shape[0], GEMV_MAX_TOKENS))
        counters = torch.zeros(slots, dtype=torch.int32, device=quantized.device)
        layer.register_buffer("split_k_counters", counters, persistent=False)

    def apply(self, layer: LinearBase, x: torch.Tensor | Fp8Activations) -> torch.Tensor:
        counters = layer.split_k_counters
        return fp8_linear(
            x, layer.weight, layer.weight_scale, layer.bias, counters, layer.fp8_gemv_configs,
            fast_accum=self.fast_accum,
        )  # fmt: skip

    def takes_fp8_activations(self, layer: LinearBase, num_tokens: int) -> bool:
        # Not where the GEMV launch takes 16-bit activations (W8A16, `a16`).
        config = layer.fp8_gemv_configs.get(num_tokens)
        return config is None or not config.a16

    def takes_gated_input(self, layer: LinearBase, num_tokens: int) -> bool:
        config = layer.fp8_gemv_configs.get(num_tokens)
        return config is not None and config.a16 and config.gated  # W8A16: x in its own dtype

    def takes_silu_output(self, layer: LinearBase, num_tokens: int) -> bool:
        return _gemv_writes_silu(layer, layer.fp8_gemv_configs.get(num_tokens))

    def apply_silu_output(
        self, layer: LinearBase, x: torch.Tensor | Fp8Activations
    ) -> torch.Tensor:
        return fp8_linear(
            x, layer.weight, layer.weight_scale, None, layer.split_k_counters,
            layer.fp8_gemv_configs, silu_out=True,
        )  # fmt: skip

    def takes_rope_store(self, layer: LinearBase, num_tokens: int) -> bool:
        return _gemv_stores_rope(layer, layer.fp8_gemv_configs.get(num_tokens))

    def apply_rope_store(
        self, layer: LinearBase, x: torch.Tensor | Fp8Activations, rope: RopeStore
    ) -> torch.Tensor:
        return fp8_linear(
            x, layer.weight, layer.weight_scale, None, layer.split_k_counters,
            layer.fp8_gemv_configs, rope_store=rope,
        )  # fmt: skip

    def apply_gated(self, layer: LinearBase, gate_up: torch.Tensor) -> torch.Tensor:
        config = layer.fp8_gemv_configs[gate_up.shape[0]]
        out = gemv(
            gate_up, layer.weight, config, layer.split_k_counters,
            weight_scale=layer.weight_scale, gated=True,
        )  # fmt: skip
        return out if layer.bias is None else out + layer.bias


class LinearBase(nn.Module):
    """`y = x @ W.T + b` whose weight stacks `len(output_sizes)` checkpoint modules.

    Args:
        input_size: in features.
        output_sizes: out features of each checkpoint module stacked here (one for a plain
            projection; q, k, v sizes for a merged qkv projection).
        bias: whether the checkpoint stores a bias (kept in the model dtype).
        method: the LinearMethod (default: unquantized).
        checkpoint_slice: under tensor parallelism, the part of each checkpoint tensor this
            rank keeps (`input_size` and `output_sizes` are then this rank's sizes); None: all.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: tuple[int, ...],
        *,
        bias: bool,
        method: LinearMethod | None = None,
        checkpoint_slice: CheckpointSlice | None = None,
    ):
        super().__init__()
        self.checkpoint_slice = checkpoint_slice
        self.input_size = input_size
        self.output_sizes = tuple(output_sizes)
        self.output_size = sum(self.output_sizes)
        self.method = method or UnquantizedLinearMethod()
        self.layouts = dict(self.method.create_weights(self))
        if bias:
            self.layouts["bias"] = ParamLayout(self.output_sizes)
        for name, layout in self.layouts.items():
            # Meta until loaded: the real tensor is allocated where the checkpoint arrives.
            placeholder = torch.empty(layout.shape, dtype=layout.dtype, device="meta")
            self.register_parameter(name, nn.Parameter(placeholder, requires_grad=False))
        if not bias:
            self.bias = None
        self._loaded: set[tuple[str, int]] = set()
        self._processed = False

    @property
    def num_shards(self) -> int:
        return len(self.output_sizes)

    def takes_fp8_activations(self, num_tokens: int) -> bool:
        """Whether `forward` wants `Fp8Activations` at `num_tokens` tokens (an FP8 layer: the
        kernel before it then quantizes its output in its own pass instead of the layer doing
        it), False where the layer's FP8 GEMV launch takes 16-bit activations (W8A16, `a16`)."""
        return self.method.takes_fp8_activations(self, num_tokens)

    def takes_gated_input(self, num_tokens: int) -> bool:
        """Whether `forward(gate_up, gated=True)` runs at `num_tokens` tokens: the MLP's
        activation computed inside this (down) projection's GEMV, no activation kernel."""
        return self.method.takes_gated_input(self, num_tokens)

    def takes_silu_output(self, num_tokens: int) -> bool:
        """Whether `forward(x, silu_out=True)` runs at `num_tokens` tokens: this merged gate | up
        projection's GEMV writes the MLP's activation, no activation kernel after it."""
        return self.method.takes_silu_output(self, num_tokens)

    def takes_add_norm(self, num_tokens: int) -> bool:
        """Whether `forward(x, add_norm=(residual, norm))` runs at `num_tokens` tokens: this
        projection's GEMV also adds the residual and writes the next RMSNorm of the row."""
        return self.method.takes_add_norm(self, num_tokens)

    def takes_rope_store(self, num_tokens: int) -> bool:
        """Whether `forward(x, rope_store=...)` runs at `num_tokens` tokens: this merged
        q | k | v projection's GEMV also rotates q and k and writes k and v into the cache."""
        return self.method.takes_rope_store(self, num_tokens)

    def forward(
        self,
        x: torch.Tensor | Fp8Activations,  # [..., input_size]; gated: [M, 2 * input_size]
        add_to: torch.Tensor | None = None,  # [..., output_size]
        *,
        with_delta: bool = False,
        gated: bool = False,
        silu_out: bool = False,
        add_norm: tuple[torch.Tensor, nn.Module] | None = None,
        rope_store: RopeStore | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:  # [..., output_size]
        """The output; `(y, delta)` with `with_delta`; with `gated` (where
        `takes_gated_input`), the output for `silu(gate) * up` of x = gate | up; with
        `silu_out` (where `takes_silu_output`), `silu(gate) * up` of the output's gate | up
        halves, `[M, output_size / 2]`; with `add_norm = (residual, norm)` (where
        `takes_add_norm`; `norm` an `RMSNorm`), `norm.add_and_norm(output, residual)`; with
        `rope_store` (where `takes_rope_store`), the rotated q `[M, q_size]`, k and v stored.

        Args:
            add_to: the tensor (a residual stream) the caller adds the output into next; the
                method may add part of the output there directly (LoRA's delta, beside the
                base GEMM: `LinearMethod.apply_adding_to`). Only where nothing happens to the
                output in between (not before a tensor-parallel all-reduce).
            with_delta: return the output as `(y, delta)`, `y + delta` rounded to y's dtype,
                for a caller whose next kernel adds a float32 `delta` itself (None: the method
                has none; `LinearMethod.apply_with_delta`).
        """
        if gated:
            return self.method.apply_gated(self, x)
        if silu_out:
            return self.method.apply_silu_output(self, x)
        if add_norm is not None:
            return self.method.apply_add_norm(self, x, *add_norm)
        if rope_store is not None:
            return self.method.apply_rope_store(self, x, rope_store)
        if with_delta:
            return self.method.apply_with_delta(self, x)
        if add_to is None:
            return self.method.apply(self, x)
        return self.method.apply_adding_to(self, x, add_to)

    def load_weight(self, name: str, tensor: torch.Tensor, shard: int = 0) -> None:
        """Copies checkpoint tensor `name` of shard `shard` into its rows.

        Raises:
            ValueError: a name this layer's method does not store, a shard out of range, a
                shape or dtype that does not match, or a tensor loaded twice.
        """
        if name in self.method.ignored_names:
            return
        if name not in self.layouts or self._processed:
            state = "already complete" if self._processed else f"stores {sorted(self.layouts)}"
            raise ValueError(f"linear layer {state}: unexpected tensor {name!r}")
        if not 0 <= shard < self.num_shards:
            raise ValueError(f"{name}: shard {shard} out of range for {self.num_shards} shard(s)")
        if (name, shard) in self._loaded:
            raise ValueError(f"{name}: shard {shard} loaded twice")
        # The method's layout first (e.g. int4 codes unpacked), then this rank's slice of it.
        tensor = self.method.prepare_checkpoint_tensor(name, tensor)
        if self.checkpoint_slice is not None:
            tensor = self.checkpoint_slice.select(self, name, tensor, shard)
        layout = self.layouts[name]
        rows = layout.rows_per_shard[shard]
        expected = (rows, *layout.trailing_shape)
        if tensor.numel() == rows and not layout.trailing_shape:
            tensor = tensor.reshape(rows)  # scales stored as [rows, 1] or [] (per tensor)
        if tuple(tensor.shape) != expected:
            raise ValueError(f"{name}: shape {tuple(tensor.shape)} != {expected}")
        if layout.dtype is not None and tensor.dtype != layout.dtype:
            raise ValueError(f"{name}: dtype {tensor.dtype} != {layout.dtype}")
        param = getattr(self, name)
        if param.is_meta:
            param = nn.Parameter(
                torch.empty(layout.shape, dtype=tensor.dtype, device=tensor.device),
                requires_grad=False,
            )
            setattr(self, name, param)
        offset = sum(layout.rows_per_shard[:shard])
        param.data[offset : offset + rows].copy_(tensor)
        self._loaded.add((name, shard))
        if self.is_loaded:
            self.method.process_weights_after_loading(self)
            self._processed = True

    @property
    def is_loaded(self) -> bool:
        return self._processed or len(self._loaded) == len(self.layouts) * self.num_shards

    def missing_tensors(self) -> list[str]:
        """`name[shard]` of every checkpoint tensor not loaded yet."""
        if self._processed:
            return []
        return [
            f"{name}[{shard}]"
            for name in self.layouts
            for shard in range(self.num_shards)
            if (name, shard) not in self._loaded
        ]

    def extra_repr(self) -> str:
        return (
            f"in={self.input_size}, out={self.output_sizes}, bias={self.bias is not None}, "
            f"method={type(self.method).__name__}"
        )


class MergedLinear(LinearBase):
    """Several checkpoint projections of the same input fused into one matmul (q/k/v,
    gate/up); shard i of the checkpoint fills output rows `[sum(sizes[:i]), sum(sizes[:i+1]))`.
    Tensor parallelism splits it by output rows (column parallel)."""


class RowLinear(LinearBase):
    """A projection whose input is the concatenated heads or intermediate features (o_proj,
    down_proj). Tensor parallelism splits it by input columns (row parallel)."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        bias: bool,
        method=None,
        checkpoint_slice: CheckpointSlice | None = None,
    ):
        super().__init__(
            input_size,
            (output_size,),
            bias=bias,
            method=method,
            checkpoint_slice=checkpoint_slice,
        )
