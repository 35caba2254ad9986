"""The Llama-family decoder: Llama 2/3/3.1/3.2, Mistral, Qwen2/2.5 and Qwen3.

One module covers the family; `ModelConfig` switches the variants: GQA (num_kv_heads),
qkv bias (Qwen2), q/k RMSNorm (Qwen3), tied embeddings, llama3 RoPE scaling.
Attention runs through `forward_batch.attn_backend` over the paged KV pool, so the model
itself holds no KV cache and no per-request state.

Parameter names follow the HF checkpoints, except that q/k/v and gate/up projections are
fused (`qkv_proj`, `gate_up_proj`): one matmul each instead of three and two.
`PACKED_MODULES` tells the loader how checkpoint tensors stack into them. Every projection is
a `LinearBase` (runtime/models/linear.py) whose method the `QuantConfig` picks (unquantized or
FP8); the LM head stays in the model dtype.

Under tensor parallelism (`parallel.size > 1`) each rank builds its part of every layer
(runtime/models/parallel_layers.py): its heads, its MLP features, its vocabulary rows; the
checkpoint loads through the same names, each layer keeping only its slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.kernels.activation import silu_and_mul
from radixgen.kernels.fp8_gemm import Fp8Activations, quantize_fp8_activations
from radixgen.kernels.rope_store import RopeStore
from radixgen.runtime.distributed import TensorParallel
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode
from radixgen.runtime.model_config import ModelConfig
from radixgen.runtime.models.layers import RMSNorm, RotaryEmbedding, add_float_delta
from radixgen.runtime.models.linear import LinearMethod, MergedLinear, RowLinear
from radixgen.runtime.models.parallel_layers import (
    VocabParallelEmbedding,
    column_slice,
    kv_head_partition,
    row_slice,
)
from radixgen.runtime.models.quantization import QuantConfig

# fused parameter -> checkpoint modules stacked (in this order) along the output dimension.
PACKED_MODULES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def _linear_method(
    quant_config: QuantConfig | None, prefix: str, modules: tuple[str, ...]
) -> LinearMethod | None:
    """The method of the layer stacking checkpoint modules `prefix + m` (None: unquantized)."""
    if quant_config is None:
        return None
    return quant_config.linear_method([prefix + module for module in modules])


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        quant_config: QuantConfig | None,
        parallel: TensorParallel,
    ):
        super().__init__()
        self.layer_id = layer_id
        self.parallel = parallel
        # This rank's heads (all of them without tensor parallelism).
        first_head, self.num_heads = parallel.split(config.num_heads, "num_attention_heads")
        first_kv_head, self.num_kv_heads = kv_head_partition(config.num_kv_heads, parallel)
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * config.head_dim
        self.kv_size = self.num_kv_heads * config.head_dim
        self.scaling = config.head_dim**-0.5
        prefix = f"model.layers.{layer_id}.self_attn."
        q_start, kv_start = first_head * config.head_dim, first_kv_head * config.head_dim
        self.qkv_proj = MergedLinear(
            config.hidden_size,
            (self.q_size, self.kv_size, self.kv_size),
            bias=config.qkv_bias,
            method=_linear_method(quant_config, prefix, PACKED_MODULES["qkv_proj"]),
            checkpoint_slice=column_slice(
                parallel,
                (q_start, kv_start, kv_start),
                (config.q_size, config.kv_size, config.kv_size),
            ),
        )
        self.o_proj = RowLinear(
            self.q_size,
            config.hidden_size,
            bias=config.o_proj_bias,
            method=_linear_method(quant_config, prefix, ("o_proj",)),
            checkpoint_slice=row_slice(parallel, q_start, config.q_size),
        )
        # Per-tensor scales of an FP8 KV cache (stored = value / scale), from the checkpoint's
        # k_scale / v_scale when it has them; read by the runner, unused otherwise.
        self.kv_cache_scales = (1.0, 1.0)
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        hidden_states: torch.Tensor | Fp8Activations,  # [num_tokens, hidden_size]
        forward_batch: ForwardBatch,
        rotary_emb: RotaryEmbedding,
        residual: torch.Tensor | None = None,  # [num_tokens, hidden_size], summed with ours next
        post_norm: RMSNorm | None = None,  # o_proj adds residual and applies it (takes_add_norm)
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # [num_tokens, hidden_size]
        """The attention output; with `post_norm`, `post_norm.add_and_norm(output, residual)`
        from o_proj's GEMV (the caller checked `o_proj.takes_add_norm`)."""
        num_tokens = hidden_states.shape[0]
        pool = forward_batch.token_to_kv_pool
        if (
            forward_batch.mode == ForwardMode.DECODE
            and self.q_norm is None
            and self.qkv_proj.takes_rope_store(num_tokens)
        ):
            # The qkv GEMV rotates q and k and writes k and v into the cache in its epilogue
            # (its table row says so: decode batch 1): no rotary kernel after it. Decode
            # attention reads k and v from the cache.
            k_cache, v_cache = pool.get_kv_buffer(self.layer_id)
            rope = RopeStore(
                forward_batch.positions, forward_batch.out_cache_loc, rotary_emb.cos_cache,
                rotary_emb.sin_cache, k_cache, v_cache, pool.kv_scales(self.layer_id),
                self.num_heads, self.num_kv_heads, self.head_dim,
            )  # fmt: skip
            q = self.qkv_proj(hidden_states, rope_store=rope)  # [num_tokens, q_size]
            attn_output = forward_batch.attn_backend.forward(
                q.view(num_tokens, self.num_heads, self.head_dim), None, None, self.layer_id,
                forward_batch, self.scaling, kv_stored=True,
            )  # fmt: skip
            return self._project_out(
                attn_output.reshape(num_tokens, self.q_size), residual, post_norm
            )
        # A LoRA delta (computed beside the GEMM) is added by the fused rotary + KV store at
        # decode (where attention reads v from the cache, not from `v`); elsewhere here.
        qkv, delta = self.qkv_proj(hidden_states, with_delta=True)
        if delta is not None and (
            self.q_norm is not None or forward_batch.mode != ForwardMode.DECODE
        ):
            qkv, delta = add_float_delta(qkv, delta), None
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # Rotary and the KV-cache store of the new tokens in one kernel on CUDA (into an FP8
        # pool quantized with the layer's scales, as the pool's `set_kv` would).
        q, k = rotary_emb.forward_and_store_kv(
            forward_batch.positions, q, k, v, pool, self.layer_id, forward_batch.out_cache_loc,
            delta,
        )  # fmt: skip
        # [num_tokens, num_heads, head_dim]
        attn_output = forward_batch.attn_backend.forward(
            q, k, v, self.layer_id, forward_batch, self.scaling, kv_stored=True
        )
        return self._project_out(attn_output.reshape(num_tokens, self.q_size), residual, post_norm)

    def _project_out(
        self,
        attn_output: torch.Tensor,  # [num_tokens, q_size]
        residual: torch.Tensor | None,
        post_norm: RMSNorm | None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # [num_tokens, hidden_size]
        """o_proj of the attention output (`forward`'s return)."""
        if post_norm is not None:
            return self.o_proj(attn_output, add_norm=(residual, post_norm))
        # Row parallel: each rank's heads contribute a partial sum of the output.
        if self.parallel.size > 1:
            return self.parallel.all_reduce(self.o_proj(attn_output))
        return self.o_proj(attn_output, add_to=residual)


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        quant_config: QuantConfig | None,
        parallel: TensorParallel,
    ):
        super().__init__()
        self.parallel = parallel
        start, self.intermediate_size = parallel.split(
            config.intermediate_size, "intermediate_size"
        )
        full = config.intermediate_size
        prefix = f"model.layers.{layer_id}.mlp."
        self.gate_up_proj = MergedLinear(
            config.hidden_size,
            (self.intermediate_size, self.intermediate_size),
            bias=config.mlp_bias,
            method=_linear_method(quant_config, prefix, PACKED_MODULES["gate_up_proj"]),
            checkpoint_slice=column_slice(parallel, (start, start), (full, full)),
        )
        self.down_proj = RowLinear(
            self.intermediate_size,
            config.hidden_size,
            bias=config.mlp_bias,
            method=_linear_method(quant_config, prefix, ("down_proj",)),
            checkpoint_slice=row_slice(parallel, start, full),
        )

    def forward(
        self,
        x: torch.Tensor | Fp8Activations,
        residual: torch.Tensor | None = None,  # [num_tokens, hidden_size], summed with ours next
        next_norm: RMSNorm | None = None,  # the norm after our residual add (16-bit output)
    ) -> torch.Tensor | Prenormed:  # [num_tokens, hidden_size]
        """The MLP output; with `next_norm` where down_proj takes it (`takes_add_norm`, one
        rank), `Prenormed`: the residual add and `next_norm` done by down_proj's GEMV."""
        if self.gate_up_proj.takes_silu_output(x.shape[0]):
            # The gate | up GEMV writes silu(gate) * up in its epilogue (the same bits): no
            # activation kernel at decode batch 1 where its table row says so.
            activated = self.gate_up_proj(x, silu_out=True)  # [num_tokens, intermediate]
        else:
            # [num_tokens, 2 * intermediate] each; a LoRA delta (computed beside the GEMM) is
            # added by the activation kernel.
            gate_up, delta = self.gate_up_proj(x, with_delta=True)
            if delta is None and self.down_proj.takes_gated_input(gate_up.shape[0]):
                # The down projection's GEMV computes silu(gate) * up as it loads it: one
                # launch fewer a layer at decode batch 1.
                out = self.down_proj(gate_up, gated=True)
                return self.parallel.all_reduce(out) if self.parallel.size > 1 else out
            # An FP8 down_proj takes its input quantized by the activation kernel (one pass).
            quantize = self.down_proj.takes_fp8_activations(gate_up.shape[0])
            if delta is not None and (quantize or not gate_up.is_cuda):
                gate_up, delta = add_float_delta(gate_up, delta), None
            if gate_up.is_cuda:  # fused silu(gate) * up: one Triton kernel, same rounding
                activated = silu_and_mul(gate_up, quantize, delta)
            else:
                gate, up = gate_up.split(self.intermediate_size, dim=-1)
                activated = F.silu(gate) * up
                if quantize:
                    activated = quantize_fp8_activations(activated)
        if self.parallel.size > 1:  # row parallel: summed over the ranks
            return self.parallel.all_reduce(self.down_proj(activated))
        if next_norm is not None and self.down_proj.takes_add_norm(activated.shape[0]):
            return Prenormed(*self.down_proj(activated, add_norm=(residual, next_norm)))
        return self.down_proj(activated, add_to=residual)


@dataclass(frozen=True)
class Prenormed:
    """A decoder layer's output whose residual add and next RMSNorm its down projection's GEMV
    already did (`LinearBase.takes_add_norm`): the next layer (or the final norm) takes
    `normed` as its normed input and `residual` as the residual stream."""

    normed: torch.Tensor  # [num_tokens, hidden_size]
    residual: torch.Tensor  # [num_tokens, hidden_size]


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        quant_config: QuantConfig | None,
        parallel: TensorParallel,
    ):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id, quant_config, parallel)
        self.mlp = LlamaMLP(config, layer_id, quant_config, parallel)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,  # [num_tokens, hidden_size]: the previous layer's MLP out
        residual: torch.Tensor | None,  # [num_tokens, hidden_size]; None in layer 0
        forward_batch: ForwardBatch,
        rotary_emb: RotaryEmbedding,
        next_norm: RMSNorm | None = None,  # the next layer's input norm, or the final one
    ) -> tuple[torch.Tensor | Prenormed, torch.Tensor]:  # (MLP output, residual), not summed
        # Each residual add is fused into the norm that follows it; the last layer's add is
        # done by the final norm (`LlamaModel.forward`). Where the o / down projections' GEMV
        # rows say so (batch-1 decode), their GEMVs do the add and the norm after them
        # (`Prenormed`; `next_norm` must then take a 16-bit input).
        # FP8 qkv / gate_up projections take their input quantized by the norm's kernel.
        if isinstance(hidden_states, Prenormed):
            normed, residual = hidden_states.normed, hidden_states.residual
            return self._after_input_norm(normed, residual, forward_batch, rotary_emb, next_norm)
        num_tokens = hidden_states.shape[0]
        quantize_qkv = self.self_attn.qkv_proj.takes_fp8_activations(num_tokens)
        if residual is None:
            residual = hidden_states
            normed = self.input_layernorm(hidden_states, quantize_qkv)
        else:
            normed, residual = self.input_layernorm.add_and_norm(
                hidden_states, residual, quantize_qkv
            )
        return self._after_input_norm(normed, residual, forward_batch, rotary_emb, next_norm)

    def _after_input_norm(
        self,
        normed: torch.Tensor | Fp8Activations,  # [num_tokens, hidden_size]
        residual: torch.Tensor,  # [num_tokens, hidden_size], the add already done
        forward_batch: ForwardBatch,
        rotary_emb: RotaryEmbedding,
        next_norm: RMSNorm | None,
    ) -> tuple[torch.Tensor | Prenormed, torch.Tensor]:
        num_tokens = normed.shape[0]
        quantize_gate_up = self.mlp.gate_up_proj.takes_fp8_activations(num_tokens)
        # The projections before each residual add may add part of their output (LoRA deltas)
        # to `residual` directly.
        if (
            not quantize_gate_up
            and self.self_attn.parallel.size == 1
            and self.self_attn.o_proj.takes_add_norm(num_tokens)
        ):
            normed, residual = self.self_attn(
                normed, forward_batch, rotary_emb, residual, self.post_attention_layernorm
            )
        else:
            attn_output = self.self_attn(normed, forward_batch, rotary_emb, residual)
            normed, residual = self.post_attention_layernorm.add_and_norm(
                attn_output, residual, quantize_gate_up
            )
        out = self.mlp(normed, residual, next_norm)
        return out, out.residual if isinstance(out, Prenormed) else residual


class LlamaModel(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        max_positions: int,
        quant_config: QuantConfig | None,
        parallel: TensorParallel,
    ):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, parallel)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, layer_id, quant_config, parallel)
            for layer_id in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, max_positions, config.rope)

    def forward(self, forward_batch: ForwardBatch) -> torch.Tensor:  # [num_tokens, hidden]
        hidden_states = self.embed_tokens(forward_batch.input_ids)
        residual = None
        num_tokens = hidden_states.shape[0]
        for i, layer in enumerate(self.layers):
            hidden_states, residual = layer(
                hidden_states, residual, forward_batch, self.rotary_emb,
                self._norm_after(i, num_tokens),
            )  # fmt: skip
        if isinstance(hidden_states, Prenormed):  # the last down projection normed it
            return hidden_states.normed
        if residual is None:  # no layers
            return self.norm(hidden_states)
        return self.norm.add_and_norm(hidden_states, residual)[0]

    def _norm_after(self, layer_index: int, num_tokens: int) -> RMSNorm | None:
        """The norm after layer `layer_index`'s residual add, where a 16-bit input suits it
        (a down projection's GEMV may apply it: `LlamaMLP.forward`); else None."""
        if layer_index + 1 == len(self.layers):
            return self.norm  # the LM head takes 16-bit hidden states
        after = self.layers[layer_index + 1]
        if after.self_attn.qkv_proj.takes_fp8_activations(num_tokens):
            return None
        return after.input_layernorm


class LlamaForCausalLM(nn.Module):
    """Decoder + LM head. `forward(forward_batch)` returns float32 logits.

    Args:
        config: the model's shapes and variant switches.
        max_positions: size of the RoPE table (the runtime's context length).
        quant_config: how the projections are quantized (None: not at all).
        parallel: this rank's tensor-parallel group (None: one device, no parallelism).
    """

    def __init__(
        self,
        config: ModelConfig,
        max_positions: int | None = None,
        quant_config: QuantConfig | None = None,
        parallel: TensorParallel | None = None,
    ):
        super().__init__()
        self.config = config
        self.quant_config = quant_config
        self.parallel = parallel or TensorParallel()
        self.model = LlamaModel(
            config, max_positions or config.context_length, quant_config, self.parallel
        )
        # Tied: the LM head reads embed_tokens.weight, so there is no second parameter to
        # load or to keep tied after `load_state_dict(assign=True)` replaces tensors.
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = VocabParallelEmbedding(
                config.vocab_size, config.hidden_size, self.parallel
            )

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [vocab rows of this rank, hidden_size]
        return self.output_embedding.weight

    @property
    def output_embedding(self) -> VocabParallelEmbedding:
        return self.model.embed_tokens if self.lm_head is None else self.lm_head

    def kv_cache_scales(self) -> list[tuple[float, float]]:
        """(k_scale, v_scale) of each layer for an FP8 KV cache (1.0 where the checkpoint
        has none)."""
        return [layer.self_attn.kv_cache_scales for layer in self.model.layers]

    def forward(
        self, forward_batch: ForwardBatch, return_hidden_states: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Returns float32 logits: [batch, vocab] for each request's last token, or
        [num_tokens, vocab] for every token when `forward_batch.return_all_logits`; with
        `return_hidden_states`, also every token's last hidden state (after the final norm:
        what the LM head reads; EAGLE's features), [num_tokens, hidden_size]."""
        all_hidden_states = self.model(forward_batch)  # [num_tokens, hidden_size]
        hidden_states = all_hidden_states
        if not forward_batch.return_all_logits and forward_batch.mode == ForwardMode.EXTEND:
            hidden_states = hidden_states[forward_batch.last_token_indices]
        logits = self.output_embedding.logits(hidden_states).float()  # [n, vocab_size]
        return (logits, all_hidden_states) if return_hidden_states else logits


def checkpoint_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors of a HF checkpoint of this config (unfused names)."""
    hidden, intermediate = config.hidden_size, config.intermediate_size
    q_size, kv_size = config.q_size, config.kv_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for layer_id in range(config.num_layers):
        attn = f"model.layers.{layer_id}.self_attn."
        mlp = f"model.layers.{layer_id}.mlp."
        projections = {
            attn + "q_proj": ((q_size, hidden), config.qkv_bias),
            attn + "k_proj": ((kv_size, hidden), config.qkv_bias),
            attn + "v_proj": ((kv_size, hidden), config.qkv_bias),
            attn + "o_proj": ((hidden, q_size), config.o_proj_bias),
            mlp + "gate_proj": ((intermediate, hidden), config.mlp_bias),
            mlp + "up_proj": ((intermediate, hidden), config.mlp_bias),
            mlp + "down_proj": ((hidden, intermediate), config.mlp_bias),
        }
        for name, (shape, has_bias) in projections.items():
            shapes[name + ".weight"] = shape
            if has_bias:
                shapes[name + ".bias"] = shape[:1]
        if config.qk_norm:
            shapes[attn + "q_norm.weight"] = (config.head_dim,)
            shapes[attn + "k_norm.weight"] = (config.head_dim,)
        shapes[f"model.layers.{layer_id}.input_layernorm.weight"] = (hidden,)
        shapes[f"model.layers.{layer_id}.post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


# Checkpoint names of per-tensor KV-cache scales (FP8 checkpoints) -> "k" or "v".
_KV_SCALE_SUFFIXES = {
    ".self_attn.k_scale": "k",
    ".self_attn.v_scale": "v",
    ".self_attn.k_proj.output_scale": "k",
    ".self_attn.v_proj.output_scale": "v",
}


def kv_cache_scale_target(name: str) -> tuple[int, str] | None:
    """(layer index, "k" or "v") if `name` is a checkpoint's KV-cache scale, else None."""
    for suffix, which in _KV_SCALE_SUFFIXES.items():
        if name.endswith(suffix) and name.startswith("model.layers."):
            layer = name[len("model.layers.") :].split(".", 1)[0]
            if layer.isdigit():
                return int(layer), which
    return None


def checkpoint_name_to_param(name: str) -> tuple[str, int, int]:
    """Maps a checkpoint tensor name to (model parameter, shard index, number of shards).

    Unfused tensors map to themselves as shard 0 of 1.
    """
    for fused, parts in PACKED_MODULES.items():
        for index, part in enumerate(parts):
            if f".{part}." in name:
                return name.replace(f".{part}.", f".{fused}."), index, len(parts)
    return name, 0, 1
