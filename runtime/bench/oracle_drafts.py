"""The oracle-draft harness of `scripts/bench_speculative.py oracle` (docs/benchmarks.md).

`OracleProposer` drafts a known greedy continuation of each prompt, each position replaced by
a wrong token with probability 1 - alpha: what a draft of acceptance rate alpha would cost.
`PinnedGreedy` makes that continuation the target's greedy output: with dummy weights the
greedy choice hangs on bf16 ties (logits ~N(0, 1.3^2) over 128k tokens, rounded to steps of
1/32 near the top), so the verify and decode kernels' rounding would part a recorded
continuation from the next run's within a few tokens. Benchmark tooling only: it replaces the
runner's `forward` on the instance and the scheduler decoder's proposer.
"""

from __future__ import annotations

import random

import torch

from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.req import Req


class PinnedGreedy:
    """Wraps `runner.forward` so that the argmax at every position is the continuation's token
    (benchmark harness; see the module docstring). A request is recognised by its prompt's
    first tokens at its prefill (prefix 0), which pins its `req_to_token` row to its sequence.

    Args:
        runner: the engine's model runner (its `forward` is replaced on the instance).
        sequences: prompt + continuation of each request, keyed by the prompt's first 16 ids.
    """

    MARGIN = 1e4

    def __init__(self, runner, sequences: dict[tuple[int, ...], list[int]]):
        self.sequences = sequences
        self.forward = runner.forward
        width = runner.context_length + 2
        # [rows, width] int64: the token to pin after each position of each request row.
        self.next_tokens = torch.zeros(
            (runner.max_running_requests, width), dtype=torch.int64, device=runner.device
        )
        runner.forward = self

    def __call__(self, forward_batch, return_hidden_states: bool = False):
        output = self.forward(forward_batch, return_hidden_states)
        logits = output[0] if return_hidden_states else output
        rows, positions = forward_batch.req_pool_indices, forward_batch.positions
        if forward_batch.mode == ForwardMode.EXTEND:
            self._register_prompts(forward_batch)
            if forward_batch.return_all_logits:
                rows = rows.repeat_interleave(forward_batch.extend_lens)
            else:
                positions = positions[forward_batch.last_token_indices]
        pinned = self.next_tokens[rows, positions + 1]  # [logits rows]
        logits.scatter_(1, pinned[:, None], self.MARGIN)
        return output

    def _register_prompts(self, forward_batch) -> None:
        start = 0
        for row, prefix, count in zip(
            forward_batch.req_pool_indices.tolist(),
            forward_batch.prefix_lens_cpu,
            forward_batch.extend_lens_cpu,
            strict=True,
        ):
            if prefix == 0:
                key = tuple(forward_batch.input_ids[start : start + 16].tolist())
                sequence = torch.tensor(self.sequences[key], dtype=torch.int64)
                self.next_tokens[row, 1 : len(sequence)] = sequence[1:].to(self.next_tokens)
            start += count


class OracleProposer:
    """Drafts the recorded greedy continuation of each prompt, each position replaced by a
    wrong token with probability 1 - alpha (seeded by prompt and position)."""

    uses_target_hidden_states = False

    def __init__(self, recorded: dict[tuple[int, ...], list[int]], alpha: float, vocab_size: int):
        self.recorded = recorded
        self.alpha = alpha
        self.vocab_size = vocab_size

    def propose(self, reqs: list[Req], limits: list[int]) -> list[list[int]]:
        return [self._propose_one(req, limit) for req, limit in zip(reqs, limits, strict=True)]

    def after_verify(self, reqs: list[Req], drafts: list[list[int]], hidden_states) -> None:
        pass

    def release(self, reqs: list[Req]) -> None:
        pass

    def check_integrity(self) -> None:
        pass

    def _propose_one(self, req: Req, max_tokens: int) -> list[int]:
        continuation = self.recorded.get(tuple(req.origin_input_ids), [])
        start = len(req.output_ids)
        drafts = continuation[start : start + max_tokens]
        rng = random.Random(hash((tuple(req.origin_input_ids[:8]), start)))
        for i, token in enumerate(drafts):
            if rng.random() >= self.alpha:
                drafts[i] = (token + 1 + rng.randrange(self.vocab_size - 1)) % self.vocab_size
        return drafts
