"""Launch-size tables the kernels read from JSON: rows bucketed by a size bound.

A table maps a key (a head dim, a projection shape) to rows, each a launch config with an upper
bound on the size it serves (`null`: every larger size). The extend-attention and LoRA decode
tables share this form; their modules say what the key and the bound are.

    {"note": ..., "source": ..., "<section>": {"<key>": [
        {"<bound>": 1024, ...config fields...}, {"<bound>": null, ...}]}}
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

Config = TypeVar("Config")
BucketRows = tuple[tuple[int | None, Config], ...]  # bound ascending, None last


def parse_bucketed_rows(
    rows: list[dict], bound_field: str, make_config: Callable[..., Config], where: str
) -> BucketRows:
    """One key's rows as (bound, config) sorted by bound; ValueError naming `where` and the
    row for a missing or non-integer bound, unknown config fields, or no rows at all."""
    parsed = []
    for row in rows:
        fields = dict(row)
        if bound_field not in fields:
            raise ValueError(f"{where}: row without {bound_field}: {row}")
        bound = fields.pop(bound_field)
        if bound is not None and not isinstance(bound, int):
            raise ValueError(f"{where}: {bound_field} must be int or null: {row}")
        try:
            parsed.append((bound, make_config(**fields)))
        except TypeError as error:
            raise ValueError(f"{where}: bad row {row}: {error}") from error
    if not parsed:
        raise ValueError(f"{where}: no rows")
    parsed.sort(key=lambda item: float("inf") if item[0] is None else item[0])
    return tuple(parsed)


def parse_shape_rows(
    data: dict, make_config: Callable[..., Config], what: str, *, bounded: bool = False
) -> dict[tuple[int, int], BucketRows]:
    """A table keyed by projection shape, `{"shapes": {"INxOUT": [rows bucketed by
    max_tokens]}}` (the LoRA decode, GEMV and FP8 GEMM tables): `{(in, out): rows}`.
    `bounded`: every row needs a max_tokens (a table that serves small token counts only,
    read through `select_bounded_bucket`). Raises ValueError naming the key or row."""
    check_table_keys(data, "shapes", what)
    table = {}
    for key, rows in data["shapes"].items():
        try:
            in_features, out_features = (int(part) for part in key.split("x"))
        except ValueError as error:
            raise ValueError(f"shape key must be 'INxOUT', got {key!r}") from error
        parsed = parse_bucketed_rows(rows, "max_tokens", make_config, f"shape {key}")
        if bounded and parsed[-1][0] is None:
            raise ValueError(f"shape {key}: every row of the {what} needs a max_tokens")
        table[(in_features, out_features)] = parsed
    return table


def load_json_table(path: Path, parse: Callable[[dict], dict]) -> dict:
    """`parse` of the JSON file at `path`, or {} when there is no such file."""
    if not Path(path).is_file():
        return {}
    return parse(json.loads(Path(path).read_text()))


def select_bucket(rows: BucketRows, size: int) -> Config:
    """The first row whose bound is >= size (or open), else the last row."""
    for bound, config in rows:
        if bound is None or size <= bound:
            return config
    return rows[-1][1]


def select_bounded_bucket(rows: BucketRows | None, size: int) -> Config | None:
    """Like `select_bucket`, but None past the last row's bound (or without rows): the caller
    then takes its untabled path."""
    if not rows or size > rows[-1][0]:
        return None
    return select_bucket(rows, size)


def check_table_keys(data: dict, section: str, what: str) -> None:
    if set(data) - {"note", "source", section} or section not in data:
        raise ValueError(f"{what} keys must be note, source, {section}; got {sorted(data)}")


def format_shape_table(data: dict) -> str:
    """A shape-keyed table (`parse_shape_rows`' form) in the shipped files' layout: what the
    LoRA decode, GEMV and FP8 GEMM sweeps write."""
    return format_bucketed_table(data, "shapes")


def format_bucketed_table(data: dict, section: str) -> str:
    """The JSON form with one row per line (the shipped files' layout, easy to diff)."""
    lines = ["{"] + [
        f"  {json.dumps(k)}: {json.dumps(data[k])}," for k in ("note", "source") if k in data
    ]
    lines.append(f"  {json.dumps(section)}: {{")
    keys = list(data[section].items())
    for i, (key, rows) in enumerate(keys):
        lines.append(f"    {json.dumps(str(key))}: [")
        lines += [f"      {json.dumps(row)}," for row in rows]
        lines[-1] = lines[-1].rstrip(",")
        lines.append("    ]" + ("," if i + 1 < len(keys) else ""))
    return "\n".join(lines + ["  }", "}"]) + "\n"
