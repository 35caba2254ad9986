"""A minimal generation loop over `ModelRunner`: one prefill, then batched decode steps.

For the demo and the tests only; the engine (scheduler, radix cache, streaming) replaces it.
All prompts run as one batch; each request stops at an EOS token or after max_new_tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from radixgen.runtime.forward_batch import ForwardMode

if TYPE_CHECKING:
    from radixgen.runtime.model_runner import ModelRunner


def sample_next_tokens(
    logits: torch.Tensor,  # [batch, vocab] float32
    temperature: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:  # [batch] int64
    """Greedy when temperature == 0, else a draw from softmax(logits / temperature)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


def generate(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    stop_token_ids: Sequence[int] | None = None,
    seed: int = 0,
) -> list[list[int]]:
    """Generates a continuation of each prompt (token ids), all prompts in one batch.

    Args:
        runner: the loaded model and its KV pools.
        prompts: token ids of each prompt (each non-empty).
        max_new_tokens: upper bound of generated tokens per prompt.
        temperature: 0 for greedy decoding, > 0 to sample.
        stop_token_ids: tokens that end a request (kept in its output); default the
            model's EOS tokens.
        seed: seeds the sampler when temperature > 0.

    Returns:
        The generated token ids of each prompt (without the prompt).

    Raises:
        ValueError: bad arguments, or not enough KV slots / request rows for the batch.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not prompts or any(len(prompt) == 0 for prompt in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token lists")
    longest = max(len(prompt) for prompt in prompts) + max_new_tokens
    if longest > runner.context_length:
        raise ValueError(
            f"prompt + max_new_tokens ({longest} tokens) exceeds the context length "
            f"{runner.context_length}"
        )
    stop_ids = set(runner.eos_token_ids if stop_token_ids is None else stop_token_ids)
    generator = torch.Generator(device=runner.device).manual_seed(seed)

    rows = runner.req_to_token_pool.alloc(len(prompts))
    if rows is None:
        raise ValueError(f"{len(prompts)} prompts exceed the free request rows")
    # Reserve every slot the batch may need up front, so decoding never runs out mid-way.
    seq_lens = [len(prompt) for prompt in prompts]
    needed = sum(seq_lens) + len(prompts) * (max_new_tokens - 1)
    slots = runner.slot_allocator.alloc(needed)
    if slots is None:
        runner.req_to_token_pool.free(rows)
        raise ValueError(f"the batch needs {needed} KV slots; the pool has fewer free")
    try:
        return _generate_loop(
            runner, prompts, rows, slots, max_new_tokens, temperature, stop_ids, generator
        )
    finally:
        runner.slot_allocator.free(slots)
        runner.req_to_token_pool.free(rows)


def _generate_loop(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    rows: list[int],
    slots: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    stop_ids: set[int],
    generator: torch.Generator,
) -> list[list[int]]:
    num_prompt_tokens = sum(len(prompt) for prompt in prompts)
    batch = runner.build_forward_batch(
        mode=ForwardMode.EXTEND,
        input_ids=prompts,
        req_pool_indices=rows,
        prefix_lens=[0] * len(prompts),
        out_cache_loc=slots[:num_prompt_tokens],
    )
    next_tokens = sample_next_tokens(runner.forward(batch), temperature, generator).tolist()
    outputs: list[list[int]] = [[token] for token in next_tokens]
    seq_lens = [len(prompt) for prompt in prompts]
    used = num_prompt_tokens
    active = [i for i, token in enumerate(next_tokens) if token not in stop_ids]
    for _ in range(max_new_tokens - 1):
        if not active:
            break
        batch = runner.build_forward_batch(
            mode=ForwardMode.DECODE,
            input_ids=[[outputs[i][-1]] for i in active],
            req_pool_indices=[rows[i] for i in active],
            prefix_lens=[seq_lens[i] for i in active],
            out_cache_loc=slots[used : used + len(active)],
        )
        used += len(active)
        next_tokens = sample_next_tokens(runner.forward(batch), temperature, generator).tolist()
        still_active = []
        for i, token in zip(active, next_tokens, strict=True):
            outputs[i].append(token)
            seq_lens[i] += 1
            if token not in stop_ids:
                still_active.append(i)
        active = still_active
    return outputs
