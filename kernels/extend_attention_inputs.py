"""Input checks and TMA addressing of `extend_attention` (see extend_attention.py)."""

from __future__ import annotations

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def new_token_tma_descriptors(
    k_new, v_new, block_n: int
) -> tuple[TensorDescriptor, TensorDescriptor] | None:
    """TMA descriptors of k_new/v_new viewed as [num_tokens, num_kv_heads * head_dim], or None
    where TMA cannot address them (heads not packed in a token, misaligned rows or base)."""
    num_tokens, num_kv_heads, head_dim = k_new.shape
    descriptors = []
    for t in (k_new, v_new):
        aligned = t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
        if t.stride(1) != head_dim or not aligned or head_dim & (head_dim - 1):
            return None
        shape = [num_tokens, num_kv_heads * head_dim]
        descriptors.append(TensorDescriptor(t, shape, [t.stride(0), 1], [block_n, head_dim]))
    return descriptors[0], descriptors[1]


def check_extend_inputs(q, k_new, v_new, k_buffer, v_buffer, req_to_token, per_request) -> None:
    """Raises ValueError/TypeError naming the argument whose shape, dtype or stride is wrong."""
    if q.dim() != 3:
        raise ValueError(f"q must be [num_tokens, num_heads, head_dim], got {tuple(q.shape)}")
    num_tokens, num_heads, head_dim = q.shape
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if t.dim() != 3 or t.shape[0] != num_tokens or t.shape[2] != head_dim:
            raise ValueError(
                f"{name} must be [num_tokens={num_tokens}, num_kv_heads, head_dim={head_dim}], "
                f"got {tuple(t.shape)}"
            )
    num_kv_heads = k_new.shape[1]
    if v_new.shape[1] != num_kv_heads or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}) "
            f"and k_new/v_new must agree, got v_new heads {v_new.shape[1]}"
        )
    for name, t in (("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if t.dim() != 3 or t.shape[1] != num_kv_heads or t.shape[2] != head_dim:
            raise ValueError(
                f"{name} must be [num_slots, num_kv_heads={num_kv_heads}, head_dim={head_dim}], "
                f"got {tuple(t.shape)}"
            )
        if t.stride(2) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim")
    for name, t in (("q", q), ("k_new", k_new), ("v_new", v_new)):
        if t.stride(2) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim")
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise TypeError(f"{name} must be float16/bfloat16/float32, got {t.dtype}")
    pool_ok = k_buffer.dtype == v_buffer.dtype and k_buffer.dtype in (q.dtype, *FP8_KV_DTYPES)
    if not pool_ok or k_new.dtype != q.dtype or v_new.dtype != q.dtype:
        raise TypeError(
            f"q, k_new, v_new must share one dtype and k_buffer/v_buffer be it or FP8, got q "
            f"{q.dtype}, k_new {k_new.dtype}, k_buffer {k_buffer.dtype}, v_buffer {v_buffer.dtype}"
        )
    if req_to_token.dtype != torch.int32 or req_to_token.dim() != 2 or req_to_token.stride(1) != 1:
        raise TypeError("req_to_token must be a contiguous int32 [rows, max_context_len] tensor")
    batch = per_request["req_pool_indices"].shape[0]
    for name, t in per_request.items():
        if t.shape != (batch,) or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be an int32/int64 [batch={batch}] tensor")
    if head_dim > 256:
        raise ValueError(f"head_dim must be <= 256, got {head_dim}")
