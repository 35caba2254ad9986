"""FP8 KV cache scales: the JSON file `--quantization-param-path` reads, and the calibration pass
that writes one (`radixgen calibrate-kv-cache`).

An FP8 pool stores `K / k_scale` and `V / v_scale` per layer (radix_cache/memory_pool.py). The
default scale is the checkpoint's `k_scale` / `v_scale`, else 1.0. Calibration runs sample
prompts through the model with an unquantized pool and sets each layer's scale to
`amax / FP8_MAX`: the largest |K| (|V|) it saw lands on the format's largest value, so nothing
on those prompts saturates and small values keep their mantissa bits.

The file is the format SGLang's and vLLM's `--quantization-param-path` read, one factor per layer
and tensor-parallel rank for K and V together, with separate K and V factors beside it (which
radixgen prefers when present):

    {"model_type": "llama",
     "kv_cache": {"dtype": "float8_e4m3fn",
                  "scaling_factor": {"0": {"0": 0.031, "1": 0.027, ...}},
                  "k_scaling_factor": {"0": {"0": 0.031, ...}},
                  "v_scaling_factor": {"0": {"0": 0.012, ...}}}}

The outer key is the tensor-parallel rank; every rank uses one per-tensor scale, so radixgen
writes rank "0" and reads its own rank's entry, else rank 0's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

# The file's dtype names (torch's) for the --kv-cache-dtype values, and their largest values.
FILE_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "fp8": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
_KV_CACHE_KEYS = {"dtype", "scaling_factor", "k_scaling_factor", "v_scaling_factor"}


@dataclass(frozen=True)
class KVCacheScales:
    """Per-layer (k_scale, v_scale) of an FP8 KV cache of `dtype` (a FILE_DTYPES value)."""

    dtype: str
    layers: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if self.dtype not in FP8_MAX:
            raise ValueError(f"dtype must be one of {sorted(FP8_MAX)}, got {self.dtype!r}")
        for layer, pair in enumerate(self.layers):
            if not all(math.isfinite(s) and s > 0 for s in pair):
                raise ValueError(f"layer {layer}: scales must be finite and > 0, got {pair}")

    @classmethod
    def from_amax(cls, dtype: str, amax: list[tuple[float, float]]) -> KVCacheScales:
        """Scales that map each layer's measured max |K| and |V| to the format's max (a layer
        that saw only zeros keeps 1.0)."""
        top = FP8_MAX[dtype]
        return cls(dtype, tuple(tuple(a / top if a > 0 else 1.0 for a in pair) for pair in amax))

    def to_json(self, model_type: str | None = None) -> dict:
        def per_layer(values):
            return {"0": {str(layer): value for layer, value in enumerate(values)}}

        kv_cache = {
            "dtype": self.dtype,
            "scaling_factor": per_layer(max(k, v) for k, v in self.layers),
            "k_scaling_factor": per_layer(k for k, _ in self.layers),
            "v_scaling_factor": per_layer(v for _, v in self.layers),
        }
        data = {"kv_cache": kv_cache}
        return {"model_type": model_type, **data} if model_type else data

    @classmethod
    def from_json(cls, data: dict, *, num_layers: int, tp_rank: int = 0) -> KVCacheScales:
        """Raises ValueError naming the part of the file that is wrong (unknown keys, missing
        or extra layers, scales that are not positive numbers)."""
        if not isinstance(data, dict) or set(data) - {"model_type", "kv_cache"}:
            raise ValueError(f"expected the keys model_type and kv_cache, got {_keys(data)}")
        kv_cache = data.get("kv_cache")
        if not isinstance(kv_cache, dict) or "dtype" not in kv_cache:
            raise ValueError("kv_cache must be an object with a dtype and scaling factors")
        unknown = set(kv_cache) - _KV_CACHE_KEYS
        if unknown:
            raise ValueError(f"kv_cache has unknown keys {sorted(unknown)}")
        if "k_scaling_factor" in kv_cache or "v_scaling_factor" in kv_cache:
            k = _rank_layers(kv_cache, "k_scaling_factor", num_layers, tp_rank)
            v = _rank_layers(kv_cache, "v_scaling_factor", num_layers, tp_rank)
        else:
            k = v = _rank_layers(kv_cache, "scaling_factor", num_layers, tp_rank)
        return cls(kv_cache["dtype"], tuple(zip(k, v, strict=True)))


def _keys(data) -> list:
    return sorted(data) if isinstance(data, dict) else type(data).__name__


def _rank_layers(kv_cache: dict, key: str, num_layers: int, tp_rank: int) -> list[float]:
    """The factors of `tp_rank` (else rank 0) under `key`, one per layer 0..num_layers-1."""
    by_rank = kv_cache.get(key)
    if not isinstance(by_rank, dict) or not by_rank:
        raise ValueError(f"kv_cache.{key} must map a tensor-parallel rank to its layers")
    rank = str(tp_rank) if str(tp_rank) in by_rank else "0"
    layers = by_rank.get(rank)
    if not isinstance(layers, dict):
        raise ValueError(f"kv_cache.{key} has no layers for rank {rank}")
    expected = {str(layer) for layer in range(num_layers)}
    if set(layers) != expected:
        raise ValueError(
            f"kv_cache.{key}[{rank}] must have layers 0..{num_layers - 1} (the model's "
            f"{num_layers}), got {len(layers)}: {sorted(layers, key=str)[:4]}..."
        )
    values = [layers[str(layer)] for layer in range(num_layers)]
    if not all(isinstance(value, int | float) and not isinstance(value, bool) for value in values):
        raise ValueError(f"kv_cache.{key}[{rank}] values must be numbers")
    return [float(value) for value in values]


def load_kv_cache_scales(
    path: str | Path, *, num_layers: int, kv_cache_dtype: str, tp_rank: int = 0
) -> list[tuple[float, float]]:
    """The per-layer (k_scale, v_scale) in the file at `path` for a pool of `kv_cache_dtype`
    (a --kv-cache-dtype value).

    Raises:
        ValueError: naming quantization_param_path: unreadable JSON, a malformed file, or a
            file calibrated for another FP8 format.
    """
    try:
        data = json.loads(Path(path).read_text())
        scales = KVCacheScales.from_json(data, num_layers=num_layers, tp_rank=tp_rank)
    except (OSError, ValueError) as error:
        raise ValueError(f"quantization_param_path {str(path)!r}: {error}") from error
    wanted = FILE_DTYPES[kv_cache_dtype]
    if scales.dtype != wanted:
        raise ValueError(
            f"quantization_param_path {str(path)!r} holds scales for {scales.dtype}, but "
            f"kv_cache_dtype={kv_cache_dtype!r} stores {wanted}"
        )
    return list(scales.layers)
