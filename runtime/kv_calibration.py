"""The FP8 KV cache calibration pass: the largest |K| and |V| each layer writes for sample
prompts, as the scales file `--quantization-param-path` reads (runtime/kv_cache_scales.py).

The prompts run through the model runner as extend forwards into an unquantized pool (the
model's dtype, and the weights as they will be served: FP8 or int4 weights change K and V too);
after each batch the pool rows just written give every layer's amax, reduced on the device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.kv_cache_scales import FILE_DTYPES, KVCacheScales
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.server_args import ServerArgs

DEFAULT_MAX_BATCH_TOKENS = 8192  # prompt tokens per extend forward


def measure_kv_amax(
    runner, prompts: Sequence[Sequence[int]], max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
) -> list[tuple[float, float]]:
    """Per layer, the largest |K| and |V| the prompts' tokens store in `runner`'s pool (which
    must be unquantized).

    Raises:
        ValueError: no prompts, an empty prompt, an FP8 pool, or a prompt that does not fit.
    """
    pool = runner.token_to_kv_pool
    if pool.is_fp8:
        raise ValueError("calibration needs an unquantized KV pool (kv_cache_dtype='auto')")
    if not prompts or not all(prompts):
        raise ValueError("prompts: calibration needs at least one non-empty prompt")
    num_layers = runner.model_config.num_layers
    amax = torch.zeros(num_layers, 2, dtype=torch.float32, device=runner.device)  # [layer, k/v]
    # Batches fit the pool (a prompt longer than the pool does not: refused below).
    for batch in _batches(prompts, min(max_batch_tokens, runner.max_total_num_tokens)):
        lengths = [len(prompt) for prompt in batch]
        rows = runner.req_to_token_pool.alloc(len(batch))
        slots = runner.slot_allocator.alloc(sum(lengths))
        if rows is None or slots is None:
            raise ValueError(
                f"prompts: a prompt of {sum(lengths)} tokens does not fit in the KV pool "
                f"({runner.max_total_num_tokens} slots)"
            )
        try:
            forward_batch = runner.build_forward_batch(
                mode=ForwardMode.EXTEND,
                input_ids=[list(prompt) for prompt in batch],
                req_pool_indices=rows,
                prefix_lens=[0] * len(batch),
                out_cache_loc=slots,
            )
            runner.forward(forward_batch)
            for layer in range(num_layers):
                k, v = pool.get_kv_buffer(layer)  # [slots, kv_heads, head_dim]
                written = torch.stack([k[slots].abs().amax(), v[slots].abs().amax()]).float()
                torch.maximum(amax[layer], written, out=amax[layer])
        finally:
            runner.slot_allocator.free(slots)
            runner.req_to_token_pool.free(rows)
    return [(k, v) for k, v in amax.tolist()]


def _batches(prompts: Sequence[Sequence[int]], max_tokens: int):
    """Consecutive prompts grouped up to `max_tokens` (a longer prompt alone)."""
    batch, tokens = [], 0
    for prompt in prompts:
        if batch and tokens + len(prompt) > max_tokens:
            yield batch
            batch, tokens = [], 0
        batch.append(prompt)
        tokens += len(prompt)
    if batch:
        yield batch


def calibrate_kv_cache_scales(
    server_args: ServerArgs,
    prompts: Sequence[Sequence[int]],
    *,
    kv_cache_dtype: str = "fp8_e4m3",
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
) -> KVCacheScales:
    """Scales for an FP8 pool of `kv_cache_dtype` (a --kv-cache-dtype value) measured on the
    token-id `prompts` with the model `server_args` describes (its kv_cache_dtype and
    quantization_param_path are ignored: the pass stores K/V unquantized).

    Raises:
        ValueError: naming kv_cache_dtype, or as `measure_kv_amax`.
    """
    if kv_cache_dtype not in FILE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype must be one of {sorted(FILE_DTYPES)}, got {kv_cache_dtype!r}"
        )
    args = dataclasses.replace(server_args, kv_cache_dtype="auto", quantization_param_path=None)
    runner = ModelRunner(args)
    amax = measure_kv_amax(runner, prompts, max_batch_tokens)
    return KVCacheScales.from_amax(FILE_DTYPES[kv_cache_dtype], amax)
