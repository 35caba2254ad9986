"""Building blocks of the Llama family: RMSNorm and rotary position embeddings."""

from __future__ import annotations

import math

import torch
from torch import nn

from radixgen.kernels.fp8_gemm import Fp8Activations, quantize_fp8_activations
from radixgen.kernels.rms_norm import fused_add_rms_norm, rms_norm
from radixgen.kernels.rotary import rotary_embedding, rotary_embedding_and_store_kv
from radixgen.radix_cache.memory_pool import TokenToKVPool
from radixgen.runtime.model_config import RopeConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 and cast back (as transformers does)."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, quantize_fp8: bool = False
    ) -> torch.Tensor | Fp8Activations:  # [..., hidden_size]
        """The normed x; with `quantize_fp8` (an FP8 linear reads it), quantized per token
        (in the same kernel on CUDA; x must then be [num_tokens, hidden_size])."""
        if x.is_cuda:  # one Triton kernel instead of eight launches, same rounding
            return rms_norm(x, self.weight, self.eps, quantize_fp8)
        input_dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        normed = self.weight * x.to(input_dtype)
        return quantize_fp8_activations(normed) if quantize_fp8 else normed

    def add_and_norm(
        self,
        x: torch.Tensor,  # [..., hidden_size]
        residual: torch.Tensor,  # [..., hidden_size]
        quantize_fp8: bool = False,
    ) -> tuple[torch.Tensor | Fp8Activations, torch.Tensor]:
        """`h = x + residual`; returns `(self(h, quantize_fp8), h)`: the residual add before
        each norm of a decoder layer, in one kernel on CUDA (same values: the sum is rounded
        as torch does)."""
        if x.is_cuda:
            return fused_add_rms_norm(x, residual, self.weight, self.eps, quantize_fp8)
        summed = x + residual
        return self(summed, quantize_fp8), summed


def rope_inverse_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """Returns the [head_dim // 2] float32 inverse frequencies, with linear/llama3 scaling."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type != "llama3":
        return inv_freq
    # Llama 3.1: long wavelengths are slowed down by `factor`, short ones kept, and the band
    # between interpolated smoothly (the wavelength bounds come from the original context).
    low_freq_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
    high_freq_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def add_float_delta(x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """`x + delta` for a float32 `delta` (a LoRA delta), rounded once to x's dtype: what the
    kernels that take such a delta compute (`silu_and_mul`, the rotary + KV store)."""
    return (x.float() + delta).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE (the HF Llama layout) from a precomputed cos/sin table.

    The table is built on the CPU even under a meta-device context, so that a model built on
    meta and loaded with `assign=True` only has to move it (`model.to(device)`).
    """

    def __init__(self, head_dim: int, max_positions: int, rope: RopeConfig):
        super().__init__()
        inv_freq = rope_inverse_frequencies(head_dim, rope)
        positions = torch.arange(max_positions, dtype=torch.float32, device="cpu")
        freqs = torch.outer(positions, inv_freq)  # [max_positions, head_dim // 2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [max_positions, head_dim]
        self.register_buffer("cos_cache", angles.cos(), persistent=False)
        self.register_buffer("sin_cache", angles.sin(), persistent=False)

    def forward(
        self,
        positions: torch.Tensor,  # [num_tokens] int64
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if q.is_cuda:  # one Triton kernel for q and k instead of ~14 launches, same rounding
            return rotary_embedding(positions, q, k, self.cos_cache, self.sin_cache)
        cos = self.cos_cache[positions].unsqueeze(1).to(q.dtype)  # [num_tokens, 1, head_dim]
        sin = self.sin_cache[positions].unsqueeze(1).to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin

    def forward_and_store_kv(
        self,
        positions: torch.Tensor,  # [num_tokens] int64
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        pool: TokenToKVPool,
        layer_id: int,
        slots: torch.Tensor,  # [num_tokens] int64
        delta: torch.Tensor | None = None,  # [num_tokens, q | k | v] fp32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`, plus the rotated keys and the values written to their slots of the
        layer's cache: one Triton kernel on CUDA (the attention backend then skips its own
        store; into an FP8 pool quantized with the layer's scales, as `set_kv` does), the pool's
        `set_kv` elsewhere. `delta` (a LoRA delta computed beside the qkv GEMM) is added to q,
        k and v first; `v` itself is left as given."""
        if q.is_cuda:
            k_cache, v_cache = pool.get_kv_buffer(layer_id)
            return rotary_embedding_and_store_kv(
                positions, q, k, v, self.cos_cache, self.sin_cache, k_cache, v_cache, slots, delta,
                pool.kv_scales(layer_id),
            )  # fmt: skip
        if delta is not None:
            q_delta, k_delta, v_delta = delta.split([q[0].numel(), k[0].numel(), v[0].numel()], -1)
            q = add_float_delta(q, q_delta.view(q.shape))
            k = add_float_delta(k, k_delta.view(k.shape))
            v = add_float_delta(v, v_delta.view(v.shape))
        q, k = self(positions, q, k)
        pool.set_kv(layer_id, slots, k, v)
        return q, k


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
