"""The qkv projection's rotary + KV-store epilogue (`rope_store`) for the split-K GEMVs.

At decode batch 1 the qkv GEMV is followed by one small kernel (`rotary.py`:
`rotary_embedding_and_store_kv`) that rotates q and k and writes k and v into the layer's
paged cache: ~2-3 us a layer of dependent loads (the token's position, then its cos / sin rows,
then q / k / v) on the critical path. With `rope_store` the GEMV does it in its epilogue:

- its output tiles pair the two halves of each head (`rope_tile_rows`): a tile of B weight rows
  holds B / 2 rows `h D + j` (first halves, D = head_dim) and the matching `h D + D / 2 + j`,
  so the tile that sums a value also holds the value rotate-half pairs it with;
- the position, the cache slot and the cos / sin values of the tile's columns load before the K
  loop (`rope_load`, after the PDL wait: the host wrote positions and slots), their latency
  hidden behind the weights';
- the tile's sums (all splits summed: SPLIT_MODE 0 or 2) are rounded to the output dtype, as
  the GEMV's output would be, then rotated exactly as `rotary.py` rounds (`store_rope`): q
  heads go to the `[M, num_heads * D]` output, k heads (rotated) and v heads into the cache at
  the token's slot, an FP8 cache quantized by the layer's scales as the rotary kernel does.

The weight's rows are q | k | v heads of head_dim D each (Llama's merged qkv projection, this
rank's heads under tensor parallelism). `RopeStore` carries the host side.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from radixgen.kernels.extend_attention_inputs import FP8_KV_DTYPES
from radixgen.kernels.rotary import (
    cache_value,
    rotary_embedding_and_store_kv_ref,
    rotate_halves,
    round_to,
)


class RopeStore(NamedTuple):
    """What the qkv GEMV's `rope_store` epilogue needs (decode: one position and slot a
    token); `num_heads` / `num_kv_heads` are the weight's q and k (= v) head counts."""

    positions: torch.Tensor  # [M] int
    slots: torch.Tensor  # [M] int, distinct
    cos_cache: torch.Tensor  # [max_positions, head_dim] float32
    sin_cache: torch.Tensor  # [max_positions, head_dim] float32
    k_cache: torch.Tensor  # [num_slots, num_kv_heads, head_dim]
    v_cache: torch.Tensor  # [num_slots, num_kv_heads, head_dim]
    kv_scales: tuple[float, float]  # an FP8 cache's (k_scale, v_scale); else ignored
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def check(self, m: int, n: int, dtype: torch.dtype) -> None:
        """Raises ValueError / TypeError naming the field that does not fit `m` tokens of an
        `n`-row qkv weight with outputs in `dtype`."""
        d, heads, kv_heads = self.head_dim, self.num_heads, self.num_kv_heads
        if d % 2 or heads < 1 or kv_heads < 1 or n != (heads + 2 * kv_heads) * d:
            raise ValueError(
                f"rope_store: the weight's {n} rows must be (num_heads={heads} + 2 * "
                f"num_kv_heads={kv_heads}) heads of an even head_dim={d}"
            )
        for name in ("positions", "slots"):
            ids = getattr(self, name)
            if ids.shape != (m,) or ids.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"rope_store.{name} must be an int32/int64 [{m}] tensor")
        for name in ("cos_cache", "sin_cache"):
            table = getattr(self, name)
            if table.dim() != 2 or table.shape[1] != d or table.dtype != torch.float32:
                raise ValueError(f"rope_store.{name} must be float32 [max_positions, {d}]")
            if table.stride(1) != 1 or table.stride(0) != self.cos_cache.stride(0):
                raise ValueError(f"rope_store.{name} must be contiguous like cos_cache")
        for name in ("k_cache", "v_cache"):
            cache = getattr(self, name)
            if cache.dim() != 3 or cache.shape[1:] != (kv_heads, d) or not cache.is_contiguous():
                raise ValueError(
                    f"rope_store.{name} must be contiguous [num_slots, {kv_heads}, {d}]"
                )
        if self.k_cache.dtype != self.v_cache.dtype or (
            self.k_cache.dtype not in FP8_KV_DTYPES and self.k_cache.dtype != dtype
        ):
            raise TypeError(
                f"rope_store's caches must share the output dtype {dtype} or an FP8 dtype, got "
                f"{self.k_cache.dtype} and {self.v_cache.dtype}"
            )
        if len(self.kv_scales) != 2 or not all(scale > 0 for scale in self.kv_scales):
            raise ValueError(f"rope_store.kv_scales must be two positive floats: {self.kv_scales}")

    @property
    def q_width(self) -> int:
        """The width of the launch's output: the rotated q's `num_heads * head_dim`."""
        return self.num_heads * self.head_dim

    def launch_args(self, m: int, n: int, dtype: torch.dtype) -> dict:
        """The GEMV launch's epilogue arguments (its runtime tuple and constexprs), after
        `check(m, n, dtype)`."""
        self.check(m, n, dtype)
        fp8_max = (
            torch.finfo(self.k_cache.dtype).max if self.k_cache.dtype in FP8_KV_DTYPES else 0.0
        )
        runtime = (
            self.positions, self.slots, self.cos_cache, self.sin_cache, self.cos_cache.stride(0),
            self.k_cache, self.v_cache, self.k_cache.stride(0), float(self.kv_scales[0]),
            float(self.kv_scales[1]), self.num_heads, self.num_kv_heads,
        )  # fmt: skip
        return {"rope": runtime, "ROPE_HALF": self.head_dim // 2, "KV_FP8_MAX": fp8_max}


def rope_store_ref(qkv: torch.Tensor, rope: RopeStore) -> torch.Tensor:
    """Plain-torch reference: `[M, (heads + 2 kv_heads) D]` qkv outputs -> rotated q `[M,
    heads * D]`, the rotated k and the v written into the caches at the slots (as the rotary
    kernel after the GEMV would)."""
    m, d = qkv.shape[0], rope.head_dim
    q, k, v = qkv.split([rope.num_heads * d, rope.num_kv_heads * d, rope.num_kv_heads * d], -1)
    q_out, _ = rotary_embedding_and_store_kv_ref(
        rope.positions, q.reshape(m, -1, d), k.reshape(m, -1, d), v.reshape(m, -1, d),
        rope.cos_cache, rope.sin_cache, rope.k_cache, rope.v_cache, rope.slots, rope.kv_scales,
    )  # fmt: skip
    return q_out.reshape(m, rope.q_width)


@triton.jit
def rope_tile_rows(pid_n, N, BLOCK_N: tl.constexpr, ROPE_HALF: tl.constexpr):
    """`(rows, mask)` `[BLOCK_N]`: tile `pid_n`'s weight rows, pair `c` of the tile (`c =
    pid_n B/2 + r % (B/2)`, in head `c // ROPE_HALF` at `j = c % ROPE_HALF`) being the first
    half's row `head D + j` then the second's `head D + ROPE_HALF + j`."""
    r = tl.arange(0, BLOCK_N)
    pair = pid_n * (BLOCK_N // 2) + r % (BLOCK_N // 2)
    rows = (
        (pair // ROPE_HALF) * (2 * ROPE_HALF) + pair % ROPE_HALF + (r // (BLOCK_N // 2)) * ROPE_HALF
    )
    return rows, pair < N // 2


@triton.jit
def rope_load(
    rope, row, pid_n, BLOCK_N: tl.constexpr, ROPE_HALF: tl.constexpr, DTYPE: tl.constexpr
):
    """The token's slot and the `[B/2]` cos / sin values of the tile's pairs (rounded to DTYPE,
    as the rotary kernel rounds them): `(slot, cos1, cos2, sin1, sin2)`."""
    positions_ptr, slots_ptr, cos_ptr, sin_ptr, stride_cos = (
        rope[0],
        rope[1],
        rope[2],
        rope[3],
        rope[4],
    )
    position = tl.load(positions_ptr + row).to(tl.int64)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    j = (pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)) % ROPE_HALF
    cos_row = cos_ptr + position * stride_cos + j
    sin_row = sin_ptr + position * stride_cos + j
    cos1 = round_to(tl.load(cos_row), DTYPE)
    cos2 = round_to(tl.load(cos_row + ROPE_HALF), DTYPE)
    sin1 = round_to(tl.load(sin_row), DTYPE)
    sin2 = round_to(tl.load(sin_row + ROPE_HALF), DTYPE)
    return slot, cos1, cos2, sin1, sin2


@triton.jit
def rope_prologue(rope, row, BLOCK_N: tl.constexpr, ROPE_HALF: tl.constexpr, out_ptr):
    """The `rope` argument `split_k.store_split` takes, for a GEMV kernel to build after its
    PDL wait and before its K loop (the loads' latency then hides behind the weights'): with
    ROPE_HALF > 0, (the kernel's rope tuple, `rope_load`'s slot and cos / sin values, the
    token row, the tile); else a placeholder (compiled away)."""
    if ROPE_HALF > 0:
        pid_n = tl.program_id(1)
        dtype = out_ptr.dtype.element_ty
        epilogue = (rope, rope_load(rope, row, pid_n, BLOCK_N, ROPE_HALF, dtype), row, pid_n)
    else:
        epilogue = row
    return epilogue


@triton.jit
def store_rope(
    total, out_ptr, rope, loaded, row, pid_n, BLOCK_N: tl.constexpr, ROPE_HALF: tl.constexpr,
    KV_FP8_MAX: tl.constexpr,
):  # fmt: skip
    """The epilogue of a tile's fp32 sums `total` `[B]` (`rope_tile_rows`' order): q heads
    rotated into out `[M, num_heads D]`, k heads rotated and v heads as they are into the
    caches at the token's slot (`loaded`: `rope_load`'s values)."""
    dtype = out_ptr.dtype.element_ty
    k_cache_ptr, v_cache_ptr, stride_slot = rope[5], rope[6], rope[7]
    k_scale, v_scale, num_heads, num_kv_heads = rope[8], rope[9], rope[10], rope[11]
    slot, cos1, cos2, sin1, sin2 = loaded
    halves = tl.permute(tl.reshape(total, [2, BLOCK_N // 2]), [1, 0])
    x1, x2 = tl.split(halves)  # [B/2] each: the pairs' first and second halves
    x1 = round_to(x1, dtype)  # the GEMV's output, as stored
    x2 = round_to(x2, dtype)
    rot1, rot2 = rotate_halves(x1, x2, cos1, cos2, sin1, sin2, dtype)
    pair = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    head = pair // ROPE_HALF
    j = pair % ROPE_HALF
    is_q = head < num_heads
    is_k = (head >= num_heads) & (head < num_heads + num_kv_heads)
    is_v = (head >= num_heads + num_kv_heads) & (head < num_heads + 2 * num_kv_heads)
    q_row = out_ptr + row * (num_heads * 2 * ROPE_HALF) + head * (2 * ROPE_HALF) + j
    tl.store(q_row, rot1.to(dtype), mask=is_q)
    tl.store(q_row + ROPE_HALF, rot2.to(dtype), mask=is_q)
    cache_dtype = k_cache_ptr.dtype.element_ty
    k_row = k_cache_ptr + slot * stride_slot + (head - num_heads) * (2 * ROPE_HALF) + j
    tl.store(k_row, cache_value(rot1, dtype, cache_dtype, k_scale, KV_FP8_MAX), mask=is_k)
    tl.store(
        k_row + ROPE_HALF, cache_value(rot2, dtype, cache_dtype, k_scale, KV_FP8_MAX), mask=is_k
    )
    v_head = head - num_heads - num_kv_heads
    v_row = v_cache_ptr + slot * stride_slot + v_head * (2 * ROPE_HALF) + j
    tl.store(v_row, cache_value(x1, dtype, cache_dtype, v_scale, KV_FP8_MAX), mask=is_v)
    tl.store(v_row + ROPE_HALF, cache_value(x2, dtype, cache_dtype, v_scale, KV_FP8_MAX), mask=is_v)
