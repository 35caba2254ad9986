"""A plain-PyTorch Llama for training `tiny`: dense [batch, seq] tensors, no KV cache.

The runtime's `models/llama.py` runs on paged KV memory and cannot train; this module is its
training twin. Its parameter names are the Hugging Face checkpoint's (`model.layers.0.
self_attn.q_proj.weight`, ...), and its math is transformers' Llama (rotate-half RoPE, RMSNorm
in float32, SwiGLU), so the state dict saves as a checkpoint both loaders read. The input
embedding doubles as the LM head (tied), so there is no `lm_head.weight`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(seq_len: int, head_dim: int, theta: float, device) -> tuple[torch.Tensor, ...]:
    """cos, sin: float32 [seq_len, head_dim], halves repeated (the rotate-half layout)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [batch, heads, seq, head_dim]; cos/sin: [seq, head_dim]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden, head_dim = config["hidden_size"], config["head_dim"]
        self.num_heads = config["num_attention_heads"]
        self.num_kv_heads = config["num_key_value_heads"]
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden, self.num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape  # x: [batch, seq, hidden]
        q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Each KV head serves num_heads / num_kv_heads consecutive query heads (transformers'
        # repeat_kv). Repeated explicitly: every SDPA backend (flash too) takes equal heads.
        groups = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden, intermediate = config["hidden_size"], config["intermediate_size"]
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: dict, dropout: float):
        super().__init__()
        self.dropout = dropout
        eps = config["rms_norm_eps"]
        self.input_layernorm = RMSNorm(config["hidden_size"], eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config["hidden_size"], eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(x), cos, sin)
        x = x + F.dropout(attn, self.dropout, self.training)
        mlp = self.mlp(self.post_attention_layernorm(x))
        return x + F.dropout(mlp, self.dropout, self.training)


class Decoder(nn.Module):
    def __init__(self, config: dict, dropout: float):
        super().__init__()
        self.embed_tokens = nn.Embedding(config["vocab_size"], config["hidden_size"])
        layers = [DecoderLayer(config, dropout) for _ in range(config["num_hidden_layers"])]
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config["hidden_size"], config["rms_norm_eps"])


class TrainableLlama(nn.Module):
    """Causal LM over [batch, seq] token ids; `forward` returns logits [batch, seq, vocab].

    dropout: on each residual branch's output, in training mode only (the corpus is small
    and is seen many times); inference is the plain Llama.
    """

    def __init__(self, config: dict, dropout: float = 0.0):
        super().__init__()
        if not config.get("tie_word_embeddings"):
            raise ValueError("config: TrainableLlama needs tie_word_embeddings=True")
        self.config = config
        self.model = Decoder(config, dropout)

    def init_weights(self, generator: torch.Generator) -> None:
        """N(0, std) everywhere; residual outputs scaled by 1/sqrt(2 * layers) (GPT-2)."""
        std = self.config["initializer_range"]
        residual_std = std / math.sqrt(2 * self.config["num_hidden_layers"])
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(param)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(param, std=residual_std, generator=generator)
            else:
                nn.init.normal_(param, std=std, generator=generator)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]  # input_ids: [batch, seq]
        head_dim = self.config["head_dim"]
        cos, sin = rope_tables(seq, head_dim, self.config["rope_theta"], input_ids.device)
        x = self.model.embed_tokens(input_ids)  # [batch, seq, hidden]
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        return F.linear(x, self.model.embed_tokens.weight)  # [batch, seq, vocab]
