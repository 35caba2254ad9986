"""Multi-LoRA decode kernels: one row per request, adapters grouped by pool slot (BGMV).

The SGMV kernels of `lora.py` give each one-token segment its own program, which then walks
the whole `K` of the shrink alone (14336 steps of `down` in one program) and expands through
narrow tiles: at decode that is latency, not bandwidth. Here, with `token_slots: [T]` (each row's
slot, -1: the base model):

- shrink: grid `(num_slots, num_splits)` (a batch with fewer rows than slots: `(rows,
  num_splits)`, each row's program serving its slot once, so batch 1 launches one program per
  split instead of one per pool slot). Program (s, j) streams the `K` chunk j of slot s's
  `A` once (split-K) and multiplies it by every row of slot s (rows of other slots are masked
  out of the loads, so `x` is read once in all), writing fp32 partial sums
  `partials[j, t, :] = x[t, chunk j] @ A[s, :, chunk j].T`. A slot no row uses returns after
  reading `token_slots`, so base-model rows and idle slots cost one small load.
- expand: grid `(num_slots or rows as above, output blocks over every shard)`. Program (s, n)
  reads its
  `[BLOCK_N, R]` tile of `B[s]` once, sums the partials of slot s's rows, and adds
  `scaling[s] * h @ B.T` into the base output `y` in place (q/k/v, gate/up: one launch).

Two launches per projection whatever the shard count; the grid depends only on the
pool, the shapes and `T` (never on which slot a row uses), so decode steps capture in CUDA
graphs and replays read fresh `token_slots`. Partial sums are summed in a fixed order
(deterministic; no atomics, no zeroed buffer). Launch sizes come from a per-shape table
(`lora_decode_configs.json`, written by `scripts/bench_lora.py kernels --sweep`) or a fallback.
A one-launch variant (every expand block recomputing its rank activations over all of K, no
shrink launch) measured 1.6-6x slower than the pair at every shape and batch on the H200
(docs/benchmarks.md, fifth session) and was removed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from radixgen.kernels.launch_tables import (
    load_json_table,
    parse_shape_rows,
    select_bucket,
)

DEFAULT_TABLE_PATH = Path(__file__).with_name("lora_decode_configs.json")
MAX_SHARDS = 3  # q/k/v


@dataclass(frozen=True)
class LoRADecodeConfig:
    """Launch sizes of one decode `lora_apply` (shrink then expand)."""

    split_k: int  # shrink programs per slot along K (the chunk is rounded to block_k)
    block_k: int  # shrink: K columns per inner step
    shrink_warps: int
    block_n: int  # expand: output columns per program
    expand_warps: int

    def __post_init__(self) -> None:
        for name in ("block_k", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {value}")
        if not 1 <= self.split_k <= 256:
            raise ValueError(f"split_k must be in 1..256, got {self.split_k}")
        for name in ("shrink_warps", "expand_warps"):
            if getattr(self, name) not in (1, 2, 4, 8, 16):
                raise ValueError(f"{name} must be 1, 2, 4, 8 or 16, got {getattr(self, name)}")


# {(in_features, out_features): ((max_tokens or None, config), ...)}, max_tokens ascending.
DecodeConfigTable = dict[tuple[int, int], tuple[tuple[int | None, LoRADecodeConfig], ...]]


def parse_decode_config_table(data: dict) -> DecodeConfigTable:
    """Validates the JSON form:

        {"note": ..., "source": ..., "shapes": {"4096x6144": [
            {"max_tokens": 1, "split_k": 16, "block_k": 64, "shrink_warps": 4,
             "block_n": 128, "expand_warps": 4},
            {"max_tokens": null, ...}]}}          # null: every larger batch

    keyed by "in_features x out_features" (all shards). Raises ValueError naming the row.
    """
    return parse_shape_rows(data, LoRADecodeConfig, "LoRA decode table")


@functools.cache
def load_decode_config_table(path: Path = DEFAULT_TABLE_PATH) -> DecodeConfigTable:
    """The parsed table (read once per path); empty when the file does not exist."""
    return load_json_table(path, parse_decode_config_table)


def fallback_decode_config(in_features: int, out_features: int, on_cuda: bool) -> LoRADecodeConfig:
    """Shapes the table lacks: K chunks of ~256 columns (at most 32 per slot), wide tiles."""
    if not on_cuda:  # the interpreter: few, small programs
        return LoRADecodeConfig(split_k=2, block_k=16, shrink_warps=1, block_n=16, expand_warps=1)
    split_k = max(1, min(32, triton.cdiv(in_features, 256)))
    block_n = 256 if out_features >= 8192 else 128
    return LoRADecodeConfig(split_k, block_k=64, shrink_warps=4, block_n=block_n, expand_warps=4)


def select_decode_config(
    in_features: int,
    out_features: int,
    num_tokens: int,
    on_cuda: bool,
    table: DecodeConfigTable | None = None,
) -> LoRADecodeConfig:
    """The table's row for this projection and batch size, or the fallback."""
    table = (load_decode_config_table() if table is None else table) if on_cuda else {}
    rows = table.get((in_features, out_features))
    if not rows:
        return fallback_decode_config(in_features, out_features, on_cuda)
    return select_bucket(rows, num_tokens)


GROUP = 16  # rows per tile: tl.dot's minimum; a slot's rows are gathered into groups of 16


@triton.jit
def _program_slot(token_slot_ptr, T, SCAN: tl.constexpr, BY_ROW: tl.constexpr):
    """The adapter slot this program serves. The grid's first axis walks the pool's slots, or
    (BY_ROW, a batch with fewer rows than slots) the rows: a row serves its slot unless an
    earlier row has it. A program with nothing to serve gets -2, a slot no row has (-1 rows
    are the base model's), and does nothing."""
    if BY_ROW:  # T <= SCAN: one load sees every earlier row
        row = tl.program_id(0)
        slot = tl.load(token_slot_ptr + row)
        earlier = tl.arange(0, SCAN)
        seen = tl.load(token_slot_ptr + earlier, mask=earlier < row, other=-3)
        taken = tl.sum((seen == slot).to(tl.int32)) > 0
        return tl.where(taken | (slot < 0), -2, slot)
    return tl.program_id(0)


@triton.jit
def _slot_rows(token_slot_ptr, slot, m0, T, SCAN: tl.constexpr):
    """Rows [m0, m0 + SCAN) that use `slot`: (rows, mine, each row's rank among them, count)."""
    rows = m0 + tl.arange(0, SCAN)
    mine = tl.load(token_slot_ptr + rows, mask=rows < T, other=-1) == slot
    rank = tl.cumsum(mine.to(tl.int32), axis=0) - 1
    return rows, mine, rank, tl.sum(mine.to(tl.int32))


@triton.jit
def _row_group(rows, mine, rank, count, g0, GROUP: tl.constexpr):
    """The slot's rows of ranks [g0, g0 + GROUP) (compacted: [GROUP] row ids) and their mask."""
    j = g0 + tl.arange(0, GROUP)
    pick = (rank[None, :] == j[:, None]) & mine[None, :]  # [GROUP, SCAN]
    return tl.sum(tl.where(pick, rows[None, :], 0), axis=1).to(tl.int64), j < count


@triton.jit
def _output_block(block, size0, size1, size2, blocks0, blocks1, BLOCK_N: tl.constexpr):
    """Output block `block` of the grid's walk over every shard: (its shard, its columns of y /
    rows of B [BLOCK_N], their mask)."""
    in1 = (block >= blocks0).to(tl.int32)  # past shard 0
    in2 = (block >= blocks0 + blocks1).to(tl.int32)  # past shard 1
    local_block = block - in1 * blocks0 - in2 * blocks1
    shard_size = size0 + in1 * (size1 - size0) + in2 * (size2 - size1)
    offs_n = local_block * BLOCK_N + tl.arange(0, BLOCK_N)
    return in1 + in2, in1 * size0 + in2 * size1 + offs_n, offs_n < shard_size


@triton.jit
def _add_delta(h, b, scaling, y_ptr, group, valid, cols, n_mask, stride_yt):
    """y[group, cols] += scaling * h @ b.T, for h [GROUP, BLOCK_R] fp32 rank activations and
    b [BLOCK_N, BLOCK_R] the B tile."""
    # 16-bit weights: the rank activations are rounded to them for the tensor cores.
    delta = tl.dot(h.to(b.dtype), tl.trans(b))  # [GROUP, BLOCK_N] fp32
    y_ptrs = y_ptr + group[:, None] * stride_yt + cols[None, :]
    out_mask = valid[:, None] & n_mask[None, :]
    y = tl.load(y_ptrs, mask=out_mask, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + scaling * delta).to(y_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _lora_decode_shrink_kernel(
    x_ptr,  # [T, K]
    a_ptr,  # [num_slots, RR, K]
    partial_ptr,  # [num_splits, T, RR] fp32
    token_slot_ptr,  # [T] int32
    T,
    K,
    RR,
    k_per_split,  # a multiple of BLOCK_K
    stride_xt,
    stride_a_slot,
    stride_ar,
    stride_ps,
    stride_pt,
    SCAN: tl.constexpr,
    BY_ROW: tl.constexpr,  # the grid walks rows, not slots (`_program_slot`)
    GROUP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    slot = _program_slot(token_slot_ptr, T, SCAN, BY_ROW)
    k_start = tl.program_id(1) * k_per_split
    offs_r = tl.arange(0, BLOCK_R)
    offs_k = tl.arange(0, BLOCK_K)
    r_mask = offs_r < RR
    a_rows = a_ptr + slot.to(tl.int64) * stride_a_slot + offs_r[:, None] * stride_ar
    out_base = partial_ptr + tl.program_id(1).to(tl.int64) * stride_ps
    for m0 in range(0, T, SCAN):
        rows, mine, rank, count = _slot_rows(token_slot_ptr, slot, m0, T, SCAN)
        for g0 in range(0, count, GROUP):  # none: a slot no row uses costs one small load
            group, valid = _row_group(rows, mine, rank, count, g0, GROUP)
            x_rows = x_ptr + group[:, None] * stride_xt
            acc = tl.zeros((GROUP, BLOCK_R), dtype=tl.float32)
            for kk in range(0, k_per_split, BLOCK_K):
                cols = k_start + kk + offs_k
                k_mask = cols < K
                x = tl.load(
                    x_rows + cols[None, :], mask=valid[:, None] & k_mask[None, :], other=0.0
                )  # [GROUP, BLOCK_K]
                a = tl.load(
                    a_rows + cols[None, :], mask=r_mask[:, None] & k_mask[None, :], other=0.0
                )  # [BLOCK_R, BLOCK_K]
                acc += tl.dot(x, tl.trans(a))
            tl.store(
                out_base + group[:, None] * stride_pt + offs_r[None, :],
                acc,
                mask=valid[:, None] & r_mask[None, :],
            )


@triton.jit
def _lora_decode_expand_kernel(
    partial_ptr,  # [num_splits, T, num_shards * R] fp32
    b_ptr,  # [num_slots, N, R]
    y_ptr,  # [T, N], updated in place
    scaling_ptr,  # [num_slots] fp32
    token_slot_ptr,  # [T] int32
    T,
    R,
    num_splits,
    stride_ps,
    stride_pt,
    stride_b_slot,
    stride_bn,
    stride_yt,
    size0,  # the shards' output sizes (0 past the last shard)
    size1,
    size2,
    blocks0,  # output blocks of shards 0 and 1 (the grid's second axis walks all shards)
    blocks1,
    SCAN: tl.constexpr,
    BY_ROW: tl.constexpr,  # the grid walks rows, not slots (`_program_slot`)
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
):
    slot = _program_slot(token_slot_ptr, T, SCAN, BY_ROW)
    shard, cols, n_mask = _output_block(
        tl.program_id(1), size0, size1, size2, blocks0, blocks1, BLOCK_N
    )
    offs_r = tl.arange(0, BLOCK_R)
    r_mask = offs_r < R
    offs_s = tl.arange(0, SPLIT_CHUNK)
    for m0 in range(0, T, SCAN):
        rows, mine, rank, count = _slot_rows(token_slot_ptr, slot, m0, T, SCAN)
        if count > 0:  # B's tile once per scan (one scan: decode batches up to SCAN rows)
            b_tile = b_ptr + slot.to(tl.int64) * stride_b_slot + cols[:, None] * stride_bn
            b = tl.load(
                b_tile + offs_r[None, :], mask=n_mask[:, None] & r_mask[None, :], other=0.0
            )  # [BLOCK_N, BLOCK_R]
            scaling = tl.load(scaling_ptr + slot)
            for g0 in range(0, count, GROUP):
                group, valid = _row_group(rows, mine, rank, count, g0, GROUP)
                # The K splits' partial sums, SPLIT_CHUNK splits per load (independent loads
                # in flight rather than one L2 round trip per split).
                h_ptrs = (
                    partial_ptr
                    + offs_s[:, None, None] * stride_ps
                    + group[None, :, None] * stride_pt
                    + (shard * R + offs_r)[None, None, :]
                )  # [SPLIT_CHUNK, GROUP, BLOCK_R]
                h_mask = valid[None, :, None] & r_mask[None, None, :]
                h = tl.zeros((GROUP, BLOCK_R), dtype=tl.float32)
                for s0 in range(0, num_splits, SPLIT_CHUNK):
                    chunk_mask = h_mask & ((s0 + offs_s) < num_splits)[:, None, None]
                    h += tl.sum(tl.load(h_ptrs + s0 * stride_ps, mask=chunk_mask, other=0.0), 0)
                _add_delta(h, b, scaling, y_ptr, group, valid, cols, n_mask, stride_yt)


@dataclass(frozen=True)
class DecodeLaunch:
    """The launch geometry both decode kernels of one projection share."""

    config: LoRADecodeConfig
    scan: int  # rows read per slot scan
    by_row: bool  # the grid's first axis walks rows, not pool slots (`_program_slot`)
    programs: int  # the grid's first axis
    k_per_split: int  # shrink: K columns per split (a multiple of block_k)
    num_splits: int


def plan_decode_launch(
    num_tokens: int,
    in_features: int,
    out_features: int,
    num_slots: int,
    on_cuda: bool,
    config: LoRADecodeConfig | None = None,
) -> DecodeLaunch:
    """The launch of one projection's decode kernels (config None: the table's, or the
    fallback)."""
    if config is None:
        config = select_decode_config(in_features, out_features, num_tokens, on_cuda=on_cuda)
    scan = max(16, min(256, triton.next_power_of_2(num_tokens)))
    # Fewer rows than pool slots (batch 1 with 8 slots): a program per row, whose slot it
    # serves (once per slot), rather than a program per slot that mostly finds no rows.
    by_row = num_tokens < num_slots and num_tokens <= scan  # one scan finds earlier rows
    k_per_split = triton.cdiv(triton.cdiv(in_features, config.split_k), config.block_k)
    k_per_split *= config.block_k
    return DecodeLaunch(
        config=config,
        scan=scan,
        by_row=by_row,
        programs=num_tokens if by_row else num_slots,
        k_per_split=k_per_split,
        num_splits=triton.cdiv(in_features, k_per_split),
    )


def lora_decode_shrink(
    x: torch.Tensor,  # [T, K]
    lora_a: torch.Tensor,  # [num_slots, num_shards * R, K]
    token_slots: torch.Tensor,  # [T] int32, each row's slot (-1: base model)
    launch: DecodeLaunch,
    partials: torch.Tensor,  # [num_splits, T, num_shards * R] fp32, written
) -> torch.Tensor:
    """Each row's rank activations, one fp32 partial sum per K split (`partials`). Reads only
    `x` and `A`, not the base output: it may run beside the base GEMM (another stream)."""
    num_tokens, in_features = x.shape
    stacked_rank = lora_a.shape[1]
    if num_tokens == 0:
        return partials
    config = launch.config
    _lora_decode_shrink_kernel[(launch.programs, launch.num_splits)](
        x,
        lora_a,
        partials,
        token_slots,
        num_tokens,
        in_features,
        stacked_rank,
        launch.k_per_split,
        x.stride(0),
        lora_a.stride(0),
        lora_a.stride(1),
        partials.stride(0),
        partials.stride(1),
        SCAN=launch.scan,
        BY_ROW=launch.by_row,
        GROUP=GROUP,
        BLOCK_R=max(16, triton.next_power_of_2(stacked_rank)),
        BLOCK_K=config.block_k,
        num_warps=config.shrink_warps,
    )
    return partials


def lora_decode_expand(
    partials: torch.Tensor,  # [num_splits, T, num_shards * R] fp32, from lora_decode_shrink
    y: torch.Tensor,  # [T, N], updated in place
    lora_b: torch.Tensor,  # [num_slots, N, R]
    scalings: torch.Tensor,  # [num_slots] fp32
    token_slots: torch.Tensor,  # [T] int32
    output_sizes: tuple[int, ...],
    launch: DecodeLaunch,
) -> torch.Tensor:
    """Adds `scaling * (sum of partials) @ B.T` to each adapter row of `y` (in place)."""
    num_tokens = y.shape[0]
    max_rank = lora_b.shape[2]
    if num_tokens == 0:
        return y
    config = launch.config
    sizes = list(output_sizes) + [0] * (MAX_SHARDS - len(output_sizes))
    blocks = [triton.cdiv(size, config.block_n) for size in sizes]
    block_rank = max(16, triton.next_power_of_2(max_rank))
    num_splits = launch.num_splits
    _lora_decode_expand_kernel[(launch.programs, sum(blocks))](
        partials,
        lora_b,
        y,
        scalings,
        token_slots,
        num_tokens,
        max_rank,
        num_splits,
        partials.stride(0),
        partials.stride(1),
        lora_b.stride(0),
        lora_b.stride(1),
        y.stride(0),
        sizes[0],
        sizes[1],
        sizes[2],
        blocks[0],
        blocks[1],
        SCAN=launch.scan,
        BY_ROW=launch.by_row,
        GROUP=GROUP,
        BLOCK_N=config.block_n,
        BLOCK_R=block_rank,
        # Up to 8 splits per load, at most ~8k fp32 values in flight per program.
        SPLIT_CHUNK=max(
            1, min(8, triton.next_power_of_2(num_splits), 4096 // (GROUP * block_rank))
        ),
        num_warps=config.expand_warps,
    )
    return y


def decode_partials(x: torch.Tensor, lora_a: torch.Tensor, launch: DecodeLaunch) -> torch.Tensor:
    """The shrink's output buffer: [num_splits, T, num_shards * R] fp32. Rows of unused slots
    stay unwritten: the expand never reads them."""
    return torch.empty(
        launch.num_splits, x.shape[0], lora_a.shape[1], dtype=torch.float32, device=x.device
    )


def lora_apply_decode(
    x: torch.Tensor,  # [T, K]
    y: torch.Tensor,  # [T, N], updated in place
    lora_a: torch.Tensor,  # [num_slots, num_shards * R, K]
    lora_b: torch.Tensor,  # [num_slots, N, R]
    scalings: torch.Tensor,  # [num_slots] fp32
    token_slots: torch.Tensor,  # [T] int32, each row's slot (-1: base model)
    output_sizes: tuple[int, ...],
    config: LoRADecodeConfig | None = None,
) -> torch.Tensor:
    """Adds each row's adapter delta to `y` (in place; shapes checked by `lora_apply`): the
    shrink, then the expand, on the current stream.

    Args:
        config: launch sizes; None: the per-shape table's (or the fallback).
    """
    if len(output_sizes) > MAX_SHARDS:
        raise ValueError(f"the decode kernels take at most {MAX_SHARDS} shards: {output_sizes}")
    if x.shape[0] == 0:
        return y
    launch = plan_decode_launch(
        x.shape[0], x.shape[1], y.shape[1], lora_a.shape[0], x.device.type == "cuda", config
    )
    partials = lora_decode_shrink(
        x, lora_a, token_slots, launch, decode_partials(x, lora_a, launch)
    )
    return lora_decode_expand(partials, y, lora_b, scalings, token_slots, output_sizes, launch)
