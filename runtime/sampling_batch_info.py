"""`SamplingBatchInfo`: the per-batch sampling tensors, kept on the device.

The running decode batch keeps one instance across steps: `filter` drops finished rows,
`merge` appends newly prefilled requests, and `record_sampled` updates the penalty counts
on the device after each step, so penalties never re-upload the whole output history.
A batch built from scratch (`from_reqs`) rebuilds the counts from each request's output ids,
which is what makes a retracted request resume with the same penalties.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.host_copy import (
    host_ints_to_device,
    host_parts_to_device,
    host_values_to_device,
)
from radixgen.runtime.request_schema import GREEDY_TEMPERATURE_EPS

if TYPE_CHECKING:
    from radixgen.runtime.req import Req


@dataclass(frozen=True)
class RowSampling:
    """What one row needs of the sampler, kept on the host so that the batch's flags follow
    `filter` / `merge` without reading the device tensors back (a sync with the step in
    flight under the overlapped schedule)."""

    greedy: bool
    top_k_or_p: bool  # sampled, with top-k or top-p filtering
    min_p: bool  # sampled, with min-p filtering
    penalties: bool = False  # frequency, presence or repetition penalty
    logit_bias: bool = False


@dataclass
class SamplingBatchInfo:
    temperatures: torch.Tensor  # [batch, 1] float32; 1.0 for greedy rows (unused there)
    top_ps: torch.Tensor  # [batch] float32
    top_ks: torch.Tensor  # [batch] int64; vocab_size where top-k is off
    min_ps: torch.Tensor  # [batch] float32
    greedy: torch.Tensor  # [batch] bool
    seeds: torch.Tensor  # [batch] int64, each request's sampling seed
    vocab_size: int
    all_greedy: bool
    need_top_k_or_p: bool
    need_min_p: bool
    # Penalties: allocated only when some row uses them.
    frequency_penalties: torch.Tensor | None = None  # [batch, 1] float32
    presence_penalties: torch.Tensor | None = None  # [batch, 1] float32
    repetition_penalties: torch.Tensor | None = None  # [batch, 1] float32
    output_counts: torch.Tensor | None = None  # [batch, vocab] int32, output token counts
    seen_tokens: torch.Tensor | None = None  # [batch, vocab] bool, prompt or output tokens
    # OpenAI's logit_bias, dense so that filter/merge stay row slices: allocated only when
    # some row has one (each request holds at most 300 entries; the rest are zeros).
    logit_biases: torch.Tensor | None = None  # [batch, vocab] float32
    # Per-step vocab-mask hook, set by the scheduler before sampling:
    # packed allowed-token bits, bit j of word w <-> token 32*w + j (constrained rows;
    # unconstrained rows are all ones).
    vocab_bitmask: torch.Tensor | None = None  # [batch, ceil(vocab / 32)] int32
    vocab_bitmask_rows: torch.Tensor | None = None  # [num_constrained] int64, rows to mask
    # (row, token) pairs banned this step, e.g. EOS before min_new_tokens.
    banned_rows: torch.Tensor | None = None  # [num_bans] int64
    banned_token_ids: torch.Tensor | None = None  # [num_bans] int64
    # Each row's flags on the host (`from_reqs`); None: `_refresh_flags` reads the tensors.
    rows_on_host: list[RowSampling] | None = None

    @property
    def batch_size(self) -> int:
        return int(self.top_ps.shape[0])

    @property
    def has_penalties(self) -> bool:
        return self.output_counts is not None

    @classmethod
    def from_reqs(cls, reqs: list[Req], vocab_size: int, device: torch.device) -> SamplingBatchInfo:
        """Builds the tensors for `reqs`; penalty counts come from their output ids so far."""
        params = [req.sampling_params for req in reqs]
        greedy = [p.temperature <= GREEDY_TEMPERATURE_EPS for p in params]
        top_ks = [p.top_k if p.top_k > 0 else vocab_size for p in params]
        rows = [
            RowSampling(
                greedy=g,
                top_k_or_p=not g and (p.top_p < 1.0 or k < vocab_size),
                min_p=not g and p.min_p > 0.0,
                penalties=_uses_penalties(p),
                logit_bias=bool(p.logit_bias),
            )
            for p, g, k in zip(params, greedy, top_ks, strict=True)
        ]
        # Two host-to-device copies (pinned: no wait for the step in flight), 16-byte
        # aligned views (the sampling kernels' pointers).
        temperatures, top_ps, min_ps = host_parts_to_device(
            [
                [1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)],
                [p.top_p for p in params],
                [p.min_p for p in params],
            ],
            device,
            torch.float32,
        )
        top_ks_tensor, seeds, greedy_tensor = host_parts_to_device(
            [top_ks, [req.sampling_seed for req in reqs], [int(g) for g in greedy]], device
        )
        info = cls(
            temperatures=temperatures.unsqueeze(1),
            top_ps=top_ps,
            top_ks=top_ks_tensor,
            min_ps=min_ps,
            greedy=greedy_tensor.bool(),
            seeds=seeds,
            vocab_size=vocab_size,
            **_batch_flags(rows),
            rows_on_host=rows,
        )
        if any(row.penalties for row in rows):
            info._build_penalties(reqs, device)
        if any(row.logit_bias for row in rows):
            info._build_logit_biases(params, device)
        return info

    def _build_logit_biases(self, params: list, device: torch.device) -> None:
        rows, token_ids, biases = [], [], []
        for row, p in enumerate(params):
            for token_id, bias in (p.logit_bias or {}).items():
                rows.append(row)
                token_ids.append(token_id)
                biases.append(bias)
        self.logit_biases = torch.zeros(
            (len(params), self.vocab_size), dtype=torch.float32, device=device
        )
        # One upload of the (row, id, bias) triples, one scatter.
        index = (host_ints_to_device(rows, device), host_ints_to_device(token_ids, device))
        self.logit_biases[index] = host_values_to_device(biases, torch.float32, device)

    def _build_penalties(self, reqs: list[Req], device: torch.device) -> None:
        params = [req.sampling_params for req in reqs]
        self.frequency_penalties = _column([p.frequency_penalty for p in params], device)
        self.presence_penalties = _column([p.presence_penalty for p in params], device)
        self.repetition_penalties = _column([p.repetition_penalty for p in params], device)
        batch = len(reqs)
        self.output_counts = torch.zeros((batch, self.vocab_size), dtype=torch.int32, device=device)
        self.seen_tokens = torch.zeros((batch, self.vocab_size), dtype=torch.bool, device=device)
        self._count_tokens(range(batch), reqs)

    def recount_rows(self, rows: list[int], reqs: list[Req]) -> None:
        """Recounts the penalty state of `rows` from their requests' ids (`reqs[i]` is row
        `rows[i]`): after a jump-forward changed an output by more than its sampled token,
        which is all that `record_sampled` counts. No host sync."""
        if self.output_counts is None or not rows:
            return
        index = host_ints_to_device(list(rows), self.output_counts.device)
        self.output_counts[index] = 0
        self.seen_tokens[index] = False
        self._count_tokens(rows, reqs)

    def _count_tokens(self, rows, reqs: list[Req]) -> None:
        """Adds each request's output ids to the counts of its row (`rows[i]` for
        `reqs[i]`) and marks its prompt and output ids seen."""
        device = self.output_counts.device
        # One upload of every request's ids, then two vectorised scatters.
        output_rows, output_ids, seen_rows, seen_ids = [], [], [], []
        for row, req in zip(rows, reqs, strict=True):
            output_rows += [row] * len(req.output_ids)
            output_ids += req.output_ids
            seen_rows += [row] * (len(req.origin_input_ids) + len(req.output_ids))
            seen_ids += req.origin_input_ids + req.output_ids
        if output_ids:
            row_index = host_ints_to_device(output_rows, device)
            ids = host_ints_to_device(output_ids, device)
            self.output_counts.index_put_(
                (row_index, ids), torch.ones_like(ids, dtype=torch.int32), accumulate=True
            )
        if seen_ids:
            row_index = host_ints_to_device(seen_rows, device)
            ids = host_ints_to_device(seen_ids, device)
            self.seen_tokens[row_index, ids] = True

    def record_sampled(self, next_token_ids: torch.Tensor) -> None:
        """Counts the tokens just sampled (next_token_ids: [batch] int64) for the penalties."""
        if self.output_counts is None:
            return
        rows = torch.arange(self.batch_size, device=next_token_ids.device)
        self.output_counts[rows, next_token_ids] += 1
        self.seen_tokens[rows, next_token_ids] = True

    def filter(self, keep: list[int]) -> None:
        """Keeps only rows `keep` (indices into the current batch), in that order."""
        index = host_ints_to_device(list(keep), self.top_ps.device)
        for name in _ROW_TENSORS:
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[index])
        if self.rows_on_host is not None:
            self.rows_on_host = [self.rows_on_host[row] for row in keep]
        self._drop_unused_state()
        self._refresh_flags()

    def merge(self, other: SamplingBatchInfo) -> None:
        """Appends `other`'s rows after this batch's rows."""
        if self.has_penalties != other.has_penalties:
            self._ensure_penalties()
            other._ensure_penalties()
        if (self.logit_biases is None) != (other.logit_biases is None):
            for info in (self, other):
                if info.logit_biases is None:  # zero biases: no effect
                    info.logit_biases = torch.zeros(
                        (info.batch_size, info.vocab_size),
                        dtype=torch.float32,
                        device=info.top_ps.device,
                    )
        for name in _ROW_TENSORS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is not None:
                setattr(self, name, torch.cat((mine, theirs)))
        if self.rows_on_host is not None and other.rows_on_host is not None:
            self.rows_on_host = self.rows_on_host + other.rows_on_host
        else:
            self.rows_on_host = None
        self._drop_unused_state()
        self._refresh_flags()

    def _drop_unused_state(self) -> None:
        """Frees the penalty and logit-bias tensors once no row uses them. The running batch
        lives on across requests: without this, one penalised request (the CUDA warm-up sends
        one) left every later batch paying `apply_penalties` and the count updates over
        `[batch, vocab]` each step, ~10% of a batch-1024 decode step on the H200. Kept when
        the rows' needs are unknown (`rows_on_host` None: reading them would sync)."""
        rows = self.rows_on_host
        if rows is None:
            return
        if self.output_counts is not None and not any(row.penalties for row in rows):
            self.frequency_penalties = self.presence_penalties = None
            self.repetition_penalties = self.output_counts = self.seen_tokens = None
        if self.logit_biases is not None and not any(row.logit_bias for row in rows):
            self.logit_biases = None

    def _ensure_penalties(self) -> None:
        """Neutral penalty tensors (no effect) so a penalised batch can merge with this one."""
        if self.has_penalties:
            return
        batch, device = self.batch_size, self.top_ps.device
        self.frequency_penalties = torch.zeros((batch, 1), dtype=torch.float32, device=device)
        self.presence_penalties = torch.zeros((batch, 1), dtype=torch.float32, device=device)
        self.repetition_penalties = torch.ones((batch, 1), dtype=torch.float32, device=device)
        self.output_counts = torch.zeros((batch, self.vocab_size), dtype=torch.int32, device=device)
        self.seen_tokens = torch.zeros((batch, self.vocab_size), dtype=torch.bool, device=device)

    def _refresh_flags(self) -> None:
        if self.rows_on_host is not None:
            for name, value in _batch_flags(self.rows_on_host).items():
                setattr(self, name, value)
            return
        # Built without host flags (benchmarks, tests): read back, a host sync.
        not_greedy = ~self.greedy
        self.all_greedy = not bool(not_greedy.any())
        self.need_top_k_or_p = bool(
            (not_greedy & ((self.top_ps < 1.0) | (self.top_ks < self.vocab_size))).any()
        )
        self.need_min_p = bool((not_greedy & (self.min_ps > 0.0)).any())


_ROW_TENSORS = (
    "temperatures",
    "top_ps",
    "top_ks",
    "min_ps",
    "greedy",
    "seeds",
    "frequency_penalties",
    "presence_penalties",
    "repetition_penalties",
    "output_counts",
    "seen_tokens",
    "logit_biases",
)


def _uses_penalties(params) -> bool:
    return (
        params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
        or params.repetition_penalty != 1.0
    )


def _batch_flags(rows: list[RowSampling]) -> dict[str, bool]:
    """The batch's sampler flags from its rows' host records."""
    return {
        "all_greedy": all(row.greedy for row in rows),
        "need_top_k_or_p": any(row.top_k_or_p for row in rows),
        "need_min_p": any(row.min_p for row in rows),
    }


def _column(values: list[float], device: torch.device) -> torch.Tensor:
    return host_values_to_device(values, torch.float32, device).unsqueeze(1)


def set_min_token_bans(reqs: list[Req], info: SamplingBatchInfo) -> None:
    """Bans EOS and stop ids for requests still below min_new_tokens (this step only)."""
    device = info.top_ps.device
    rows, token_ids = [], []
    for row, req in enumerate(reqs):
        params = req.sampling_params
        if len(req.output_ids) < params.min_new_tokens:
            banned = set(params.stop_token_ids or ())
            if not params.ignore_eos:
                banned |= req.eos_token_ids
            rows += [row] * len(banned)
            token_ids += sorted(banned)
    if rows:
        info.banned_rows = host_ints_to_device(rows, device)
        info.banned_token_ids = host_ints_to_device(token_ids, device)
    else:
        info.banned_rows = info.banned_token_ids = None
