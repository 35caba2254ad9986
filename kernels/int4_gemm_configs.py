"""Launch configurations of `int4_gemm`, by projection shape and number of tokens.

The tuned table lives in `int4_gemm_configs.json` beside this module, so that the sweep of
`scripts/bench_int4_gemm.py --sweep` (which writes the same file to its --out folder) replaces it
by copying one file. Format:

    {"configs": [
        {"n": 6144, "k": 4096, "group_size": 128, "m_bucket": 1, "gemv": true, "block_m": 1,
         "block_n": 128, "block_k": 32, "split_k": 4, "num_warps": 1, "num_stages": 1,
         "swap_ab": false, "prefetch": 1},
        ...]}

A launch with M tokens takes the row of its (N, K, group size) and `m_bucket ==
next_power_of_2(M)`; shapes and buckets missing from the table, and the interpreter, use
`fallback_int4_config`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import triton

from radixgen.kernels.int4_reference import INTERLEAVED_SPAN, runtime_span

DEFAULT_TABLE_PATH = Path(__file__).with_name("int4_gemm_configs.json")
# Tokens up to which the untuned choice is the CUDA-core GEMV (the tuned table may pick it up to
# GEMV_M_LIMIT). ptxas (sm_90) counts 43 instructions per packed word and token in the GEMV's
# loop, 57-69 per word for all of up to 16 tokens in the GEMM's: from 2 tokens the GEMM issues
# fewer (both kernels are instruction-bound, not HBM-bound, at these sizes).
GEMV_M_MAX = 1
# The most tokens the GEMV runs (one program row per token: the weights are re-read from L2).
GEMV_M_LIMIT = 4


@dataclass(frozen=True)
class Int4GemmConfig:
    """Kernel, tiles, split-K and launch options of one `int4_gemm` launch."""

    gemv: bool  # the CUDA-core split-K GEMV (one token per program) or the tensor-core GEMM
    block_m: int  # tokens per program (1 for the GEMV; >= 16 for tl.dot)
    block_n: int  # output columns per program
    block_k: int  # input rows per inner-loop step: divides the group size (one scale per tile)
    split_k: int  # programs sharing one output tile's K range (fp32 partials, then one reduce)
    num_warps: int
    num_stages: int
    swap_ab: bool = False  # GEMM: compute out^T = W^T x^T (the weights as the registers operand)
    prefetch: int = 1  # GEMV: K steps of words loaded ahead of the one computing (1 or 2)
    # GEMM over the interleaved packing (group sizes that are multiples of 128): one dot per
    # nibble (`_int4_nibble_gemm_kernel`) or the whole unpacked tile in one dot, permuted and
    # reshaped to input-row order (`_int4_gemm_kernel`). Other packings always take the latter.
    per_nibble: bool = True
    # GEMV with 16-bit x on CUDA: products summed in packed fp16 pairs within each word (two
    # weights an instruction; `_packed_f16_step`), float32 across words. Elsewhere: float32.
    packed_f16: bool = False
    # Nibble GEMM: the chunk's 8 unpacked tiles multiplied in one dot (its wgmma steps back to
    # back) rather than one dot a nibble (each waited for before the next).
    chunk_dot: bool = False
    # Nibble GEMM: the next chunk's words, scales and zeros loaded into registers before this
    # chunk is unpacked and multiplied (the GEMV's `prefetch`; ~10 registers a thread more).
    prefetch_words: bool = False
    # GEMV of a down projection: the layer takes the MLP's gate | up and the launch computes
    # silu(gate) * up as it loads x (`int4_gemm(..., gated=True)`). Opt-in per row: every
    # thread recomputes the step's x values it broadcasts over its columns.
    gated: bool = False
    # GEMV or nibble GEMM of a merged gate | up projection: the launch writes silu(gate) * up,
    # each tile holding block_n / 2 gate columns and their up columns (`int4_gemm(...,
    # silu_out=True)`; the activation kernel after the layer goes). Opt-in per row.
    silu_out: bool = False
    # GEMV of a merged q | k | v projection: the launch also rotates q and k and writes k and v
    # into the KV cache (`int4_gemm(..., rope_store=)`; the rotary kernel after the layer
    # goes). Opt-in per row.
    rope_store: bool = False

    def __post_init__(self) -> None:
        if self.gated and not self.gemv:
            raise ValueError("gated is a GEMV option (gemv=True)")
        if self.silu_out and (self.gated or not (self.gemv or self.per_nibble)):
            raise ValueError(
                "silu_out is a GEMV or nibble-GEMM option (gemv=True or per_nibble=True), "
                "not with gated"
            )
        if self.chunk_dot and (self.gemv or not self.per_nibble):
            raise ValueError("chunk_dot is a nibble-GEMM option (gemv=False, per_nibble=True)")
        if self.rope_store and (not self.gemv or self.gated or self.silu_out):
            raise ValueError("rope_store is a GEMV option (gemv=True), not with gated/silu_out")
        if self.prefetch_words and (self.gemv or not self.per_nibble):
            raise ValueError("prefetch_words is a nibble-GEMM option (gemv=False, per_nibble=True)")
        if self.packed_f16 and not self.gemv:
            raise ValueError("packed_f16 is a GEMV option (gemv=True)")
        for name in ("block_m", "block_n", "block_k", "split_k"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if self.block_k < 8:
            raise ValueError(f"block_k must be a multiple of 8, got {self.block_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"num_stages must be in 1..8, got {self.num_stages}")
        if self.prefetch not in (1, 2):
            raise ValueError(f"prefetch must be 1 or 2, got {self.prefetch}")

    def with_overrides(self, **overrides) -> Int4GemmConfig:
        """A copy with the given fields that are not None replaced (validated again)."""
        unknown = set(overrides) - {field.name for field in fields(self)}
        if unknown:
            raise ValueError(f"unknown int4_gemm overrides {sorted(unknown)}")
        config = replace(self, **{k: v for k, v in overrides.items() if v is not None})
        if not config.gemv and config.block_m < 16:
            config = replace(config, block_m=16)  # tl.dot needs 16 rows
        return config

    def to_row(self, n: int, k: int, group_size: int, m_bucket: int) -> dict:
        return {"n": n, "k": k, "group_size": group_size, "m_bucket": m_bucket, **asdict(self)}


# {(n, k, group_size, m_bucket): config}
ConfigTable = dict[tuple[int, int, int, int], Int4GemmConfig]


def parse_config_table(data: dict) -> ConfigTable:
    """The table of a parsed `int4_gemm_configs.json` (ValueError naming a bad row)."""
    table: ConfigTable = {}
    for index, row in enumerate(data.get("configs", [])):
        try:
            key = (row["n"], row["k"], row["group_size"], row["m_bucket"])
            names = {field.name for field in fields(Int4GemmConfig)}
            unknown = set(row) - names - {"n", "k", "group_size", "m_bucket"}
            if unknown:
                raise ValueError(f"unknown fields {sorted(unknown)}")
            table[key] = Int4GemmConfig(**{name: row[name] for name in names if name in row})
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"int4 config row {index} {row}: {error}") from error
    return table


@functools.cache
def load_config_table(path: Path = DEFAULT_TABLE_PATH) -> ConfigTable:
    """The tuned table (read once per process; empty if the file is absent)."""
    if not path.exists():
        return {}
    return parse_config_table(json.loads(path.read_text()))


def m_bucket(m: int) -> int:
    return triton.next_power_of_2(max(m, 1))


def largest_block_k(group_size: int, limit: int) -> int:
    """The largest power of two <= limit dividing group_size (a tile lies in one group)."""
    block_k = limit
    while group_size % block_k:
        block_k //= 2
    return block_k


def _power_of_two_at_most(value: int) -> int:
    return 1 << (max(value, 1).bit_length() - 1)


def fallback_int4_config(m: int, n: int, k: int, group_size: int, num_sms: int) -> Int4GemmConfig:
    """The untuned choice.

    GEMV (M <= GEMV_M_MAX): one warp per program over 128 columns (a layout with every tile row
    in one thread, so the 1-D scale and zero loads need no shared-memory layout conversion) and
    32 K rows per step, two steps of words in flight while one computes (136 registers, ptxas
    sm_90); split-K until about 16 programs per SM keep enough bytes in flight, down to 4 steps
    per split. GEMM: 128 x 128 weight tiles per K step, split-K up to about two programs per SM
    (128 registers a thread at 8 warps) with at least two K steps each.
    """
    if m <= GEMV_M_MAX:
        block_n, block_k = 128, largest_block_k(group_size, 32)
        tiles = m * triton.cdiv(n, block_n)
        max_split = _power_of_two_at_most(k // (4 * block_k))
        wanted = triton.next_power_of_2(triton.cdiv(16 * num_sms, tiles))
        split_k = max(1, min(max_split, 32, wanted))
        return Int4GemmConfig(
            True, 1, block_n, block_k, split_k, num_warps=1, num_stages=1, prefetch=2
        )
    block_m = min(64, max(16, triton.next_power_of_2(m)))
    if runtime_span(group_size) == INTERLEAVED_SPAN:
        # The one-dot-per-nibble GEMM: 64 columns and 4 warps (~3-4 programs an SM), x W (the
        # weights through shared memory), split-K to about four programs per SM -- the H200's
        # best tiles at 16 and 32 tokens on all four Llama shapes (sixteenth session).
        tiles = triton.cdiv(m, block_m) * triton.cdiv(n, 64)
        max_split = _power_of_two_at_most(k // (2 * INTERLEAVED_SPAN))
        split_k = max(1, min(max_split, 16, _power_of_two_at_most(triton.cdiv(4 * num_sms, tiles))))
        return Int4GemmConfig(False, block_m, 64, INTERLEAVED_SPAN, split_k, 4, num_stages=3)
    block_n, block_k = 128, largest_block_k(group_size, 128)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    max_split = _power_of_two_at_most(k // (2 * block_k))
    split_k = max(1, min(max_split, 16, triton.next_power_of_2(triton.cdiv(2 * num_sms, tiles))))
    num_warps = 8 if block_m >= 64 else 4
    # Up to 16 tokens, out^T = W^T x^T: the tokens are the tensor cores' narrow N side (wgmma
    # needs 64 rows on the M side), 10% fewer instructions per word than x W at BLOCK_M = 16.
    swap_ab = block_m == 16
    return Int4GemmConfig(
        False, block_m, block_n, block_k, split_k, num_warps, num_stages=3, swap_ab=swap_ab
    )


def int4_config(
    m: int, n: int, k: int, group_size: int, num_sms: int, table: ConfigTable | None = None
) -> Int4GemmConfig:
    """The tuned row of (n, k, group_size, m's bucket), else `fallback_int4_config`."""
    table = load_config_table() if table is None else table
    tuned = table.get((n, k, group_size, m_bucket(m)))
    # A GEMM row over the interleaved layout (either GEMM) steps one 128-row chunk at a time.
    interleaved_gemm = tuned is not None and not tuned.gemv and runtime_span(group_size) > 8
    if (
        tuned is not None
        and group_size % tuned.block_k == 0
        and (not interleaved_gemm or tuned.block_k == INTERLEAVED_SPAN)
    ):
        return tuned
    return fallback_int4_config(m, n, k, group_size, num_sms)
