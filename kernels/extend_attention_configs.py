"""Launch configurations of `extend_attention`, chosen by head_dim and the longest new-token run.

The table lives in `extend_attention_configs.json` beside this module, so that a tuning sweep
(`scripts/tune_extend_attention.py`) can replace it by copying one file. Format:

    {"head_dim": {"128": [
        {"max_extend_len": 1024, "block_m": 64, "block_n": 64, "num_warps": 4,
         "num_stages": 3, "use_tma": false},
        ...,
        {"max_extend_len": null, ...}     # every longer run
    ]}}

A launch with `max_extend_len` n takes the first row (rows sorted by max_extend_len) whose
max_extend_len is >= n, else the last row. Head dims missing from the table, and devices other
than CUDA (the interpreter), use `fallback_extend_config`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from radixgen.kernels.launch_tables import (
    check_table_keys,
    format_bucketed_table,
    parse_bucketed_rows,
    select_bucket,
)

DEFAULT_TABLE_PATH = Path(__file__).with_name("extend_attention_configs.json")


@dataclass(frozen=True)
class ExtendAttentionConfig:
    """Tile sizes and pipelining of one extend_attention launch."""

    block_m: int  # query rows per program
    block_n: int  # keys per inner-loop step
    num_warps: int
    num_stages: int  # software-pipelining depth of the K/V loads
    use_tma: bool = False  # new tokens' K/V through TMA tensor descriptors (Hopper+)

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {value}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"num_stages must be in 1..8, got {self.num_stages}")

    def with_overrides(self, **fields: int | bool | None) -> ExtendAttentionConfig:
        """A copy with the fields that are not None replaced (validated again)."""
        return replace(self, **{k: v for k, v in fields.items() if v is not None})

    def to_row(self, max_extend_len: int | None) -> dict:
        return {"max_extend_len": max_extend_len, **asdict(self)}


# {head_dim: ((max_extend_len or None, config), ...)} sorted by max_extend_len, None last.
ConfigTable = dict[int, tuple[tuple[int | None, ExtendAttentionConfig], ...]]


def parse_config_table(data: dict) -> ConfigTable:
    """Validates the JSON form (see the module docstring); raises ValueError naming the row."""
    check_table_keys(data, "head_dim", "config table")
    return {
        int(head_dim): parse_bucketed_rows(
            rows, "max_extend_len", ExtendAttentionConfig, f"head_dim {head_dim}"
        )
        for head_dim, rows in data["head_dim"].items()
    }


def format_config_table(data: dict) -> str:
    """The JSON form with one row per line (the layout of the shipped file, easy to diff)."""
    return format_bucketed_table(data, "head_dim")


@functools.cache
def load_config_table(path: Path = DEFAULT_TABLE_PATH) -> ConfigTable:
    """The parsed table (read once per path: it is a constant of the installed package)."""
    return parse_config_table(json.loads(Path(path).read_text()))


def fallback_extend_config(head_dim: int, on_cuda: bool) -> ExtendAttentionConfig:
    """Head dims the table lacks; measured on the H200 before the table existed."""
    if not on_cuda:
        return ExtendAttentionConfig(32, 32, 4, 1)  # the interpreter: few, small programs
    if head_dim <= 64:
        return ExtendAttentionConfig(128, 64, 4, 3)
    if head_dim <= 128:
        return ExtendAttentionConfig(128, 128, 8, 3)  # 458 TFLOP/s at 8k causal
    return ExtendAttentionConfig(64, 32, 4, 2)  # 256: tiles and accumulators must still fit


def select_extend_config(
    head_dim: int, max_extend_len: int, on_cuda: bool, table: ConfigTable | None = None
) -> ExtendAttentionConfig:
    """The table's row for (head_dim, max_extend_len), or the fallback."""
    rows = (load_config_table() if table is None else table).get(head_dim) if on_cuda else None
    if not rows:
        return fallback_extend_config(head_dim, on_cuda)
    return select_bucket(rows, max_extend_len)


def extend_lengths_per_config(head_dim: int, table: ConfigTable | None = None) -> tuple[int, ...]:
    """One `max_extend_len` per distinct CUDA config of head_dim's rows (the row's bound, or
    one past the previous bound for the open-ended row): a run of each compiles every
    variant the launcher can pick. Empty when the table lacks head_dim (one fallback config)."""
    rows = (load_config_table() if table is None else table).get(head_dim) or ()
    lengths, seen, previous = [], set(), 0
    for bound, config in rows:
        length = previous + 1 if bound is None else bound
        if config not in seen:
            seen.add(config)
            lengths.append(length)
        previous = length if bound is not None else previous
    return tuple(lengths)
