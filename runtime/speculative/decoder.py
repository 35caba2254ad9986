"""`SpeculativeDecoder`: one speculative step of the running batch.

The step proposes drafts for each request (NGRAM: `ngram.py`), allocates KV slots for every
request's last sampled token plus its drafts, runs ONE target forward over them as an extend
batch (each request's new tokens attend causally to its cached prefix and to each other),
accepts a prefix of each request's drafts (`verify.py`) plus the target's next token, and
frees the slots of the rejected drafts through the KV manager. Afterwards every request is
in the plain decode state again (its last token has no KV yet), so retraction, the radix
cache and the idle integrity check see nothing new.

Acceptance is vectorised (`verify.py`) unless a request has a grammar mask, logprobs,
penalties, a logit bias or a min-token ban: then the plain sampler replays the rows position
by position (`replay.py`). The step declines (returns None: the scheduler decodes plainly)
when the batch is larger than `max_batch_size`, when a request has a jump-forward run
pending, when no request found a draft, or when the KV pool cannot hold the drafts.
"""

from __future__ import annotations

from typing import Protocol

import torch

from radixgen.runtime.io_struct import SchedulerCounters
from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.req import Req, ReqStatus
from radixgen.runtime.result_processor import (
    ResultProcessor,
    StepResult,
    check_finished,
    make_req_output,
)
from radixgen.runtime.sampling_batch_info import SamplingBatchInfo
from radixgen.runtime.schedule_batch import ScheduleBatch
from radixgen.runtime.speculative.config import SpeculativeAlgorithm, SpeculativeConfig
from radixgen.runtime.speculative.eagle import EagleProposer
from radixgen.runtime.speculative.ngram import NgramProposer
from radixgen.runtime.speculative.replay import needs_replay, replay_verify
from radixgen.runtime.speculative.standalone import DraftModelProposer
from radixgen.runtime.speculative.verify import (
    build_verify_batch,
    build_verify_input,
    verify_drafts,
)


class DraftProposer(Protocol):
    """Proposes each request's next tokens (a chain) cheaply, without the target model."""

    # EAGLE: the verify forward also returns the target's last hidden states (for
    # `after_verify`), and a step runs even when no request has a draft (it collects them).
    uses_target_hidden_states: bool

    def propose(self, reqs: list[Req], limits: list[int]) -> list[list[int]]:
        """At most `limits[i]` tokens to follow `reqs[i]`'s last token ([] for none; a limit
        may be 0). `reqs` is the whole running batch: a proposer with per-request state may
        drop the state of requests not in it."""

    def after_verify(
        self, reqs: list[Req], drafts: list[list[int]], hidden_states: torch.Tensor | None
    ) -> None:
        """Called once the verified tokens are appended to `reqs` (the same batch as the
        `propose` call), e.g. to roll back a draft model's KV past the rejected drafts.
        `hidden_states` ([num_verify_tokens, hidden], request by request: its last token
        then its drafts) when `uses_target_hidden_states`, else None."""

    def release(self, reqs: list[Req]) -> None:
        """Frees whatever the proposer holds for requests not in `reqs` (the running batch;
        [] when the scheduler is idle)."""

    def check_integrity(self) -> None:
        """Raises AssertionError if the proposer's own memory (if any) leaked."""


# Backing off: plain steps before the next probe, doubling up to this while probes still fail.
MAX_BACKOFF_STEPS = 64
# Weight of the newest verify step in the moving average of the accept length.
ACCEPT_LENGTH_EMA_WEIGHT = 0.25
# A verify forward as decode rows (replaying a decode CUDA graph) reads each request's cached
# prefix once per row instead of once: allowed while those extra reads stay within this many
# tokens of KV (Llama-3.1-8B: 128 KiB a token, 4 GiB, a quarter of its weights' 16 GB).
MAX_EXTRA_PREFIX_READS = 32768


def can_speculate(req: Req) -> bool:
    """A plain one-token decode state (a jump-forward's pending run goes first)."""
    return req.status is ReqStatus.DECODING


def build_proposer(config: SpeculativeConfig, target_runner) -> DraftProposer:
    """The proposer of `config.algorithm`."""
    if config.algorithm is SpeculativeAlgorithm.STANDALONE:
        return DraftModelProposer.from_target(target_runner, config.draft_model_path)
    if config.algorithm is SpeculativeAlgorithm.EAGLE:
        return EagleProposer.from_target(target_runner, config.draft_model_path)
    return NgramProposer(min_window=config.ngram_min_window, max_window=config.ngram_max_window)


class SpeculativeDecoder:
    """Args:
    config: the resolved speculative options.
    runner: the model runner (the target model).
    kv: the KV manager (slots for drafts, freed on rejection).
    results: finishing and outputs.
    counters: the speculative counts go here.
    context_length: no draft goes past it.
    proposer: where drafts come from (None: the config's algorithm: NGRAM, or STANDALONE's
        draft model loaded beside `runner`; a benchmark's oracle draft goes here).
    """

    def __init__(
        self,
        config: SpeculativeConfig,
        *,
        runner,
        kv: KVCacheManager,
        results: ResultProcessor,
        counters: SchedulerCounters,
        context_length: int,
        proposer: DraftProposer | None = None,
    ):
        self.config = config
        self.runner = runner
        self.kv = kv
        self.results = results
        self.counters = counters
        self.context_length = context_length
        self.proposer = proposer or build_proposer(config, runner)
        # The measured rule: a moving average of the accept length; below the configured
        # minimum the next `backoff_steps` steps decode plainly, then one step probes again.
        self.accept_length_ema: float | None = None
        self.backoff_steps = 0
        self.next_backoff = 1
        # None: verify as decode rows when a decode CUDA graph takes them (the rule below);
        # True/False forces it (tests compare both on the CPU).
        self.verify_as_decode_rows: bool | None = None

    def _verifies_as_decode_rows(self, num_rows: int, num_prefix_tokens: int) -> bool:
        """Decode rows while a CUDA graph replays them (eager launches cost more than the
        extra prefix reads at short contexts); EAGLE's forwards return hidden states, which
        the graphs keep when the runner was built for EAGLE (`graphs_keep_hidden_states`)."""
        if self.verify_as_decode_rows is not None:
            return self.verify_as_decode_rows
        graphs = self.runner.cuda_graph_runner
        return (
            graphs is not None
            and (graphs.keeps_hidden_states or not self.proposer.uses_target_hidden_states)
            and num_rows <= graphs.max_batch_size
            and self.config.num_steps * num_prefix_tokens <= MAX_EXTRA_PREFIX_READS
        )

    def applies_to(self, batch: ScheduleBatch) -> bool:
        """Whether a step of `batch` may speculate (before looking for drafts)."""
        return 0 < batch.batch_size <= self.config.max_batch_size and all(
            can_speculate(req) for req in batch.reqs
        )

    def step(self, batch: ScheduleBatch) -> StepResult | None:
        """Runs one verify forward of the running `batch` and commits it (finished requests
        leave `batch`); None when it declines (nothing was run or allocated)."""
        if not self.applies_to(batch):
            return None
        if self.backoff_steps > 0:
            self.backoff_steps -= 1
            return None
        drafts = self.proposer.propose(batch.reqs, [self._draft_limit(r) for r in batch.reqs])
        num_drafts = sum(len(draft) for draft in drafts)
        collects_hidden_states = self.proposer.uses_target_hidden_states
        if num_drafts == 0 and not collects_hidden_states:
            return None
        if self.kv.available_size() < num_drafts + batch.batch_size:
            return None
        reqs = batch.reqs
        prefix_lens = [req.kv_committed_len for req in reqs]
        output_lens = [len(req.output_ids) for req in reqs]
        num_rows = num_drafts + batch.batch_size
        out_cache_loc = self.kv.alloc_slots(num_rows)
        forward_batch = build_verify_batch(
            self.runner,
            reqs,
            drafts,
            out_cache_loc,
            as_decode_rows=self._verifies_as_decode_rows(num_rows, sum(prefix_lens)),
        )
        hidden_states = None  # [num_drafts + batch, hidden] for EAGLE
        if collects_hidden_states:
            logits, hidden_states = self.runner.forward(forward_batch, return_hidden_states=True)
        else:
            logits = self.runner.forward(forward_batch)  # [num_drafts + batch, vocab]
        if any(needs_replay(req) for req in reqs):
            result = self._commit_by_replay(batch, drafts, logits, prefix_lens)
        else:
            result = self._commit_vectorised(batch, drafts, logits)
        self.proposer.after_verify(reqs, drafts, hidden_states)
        emitted = sum(len(req.output_ids) for req in reqs) - sum(output_lens)
        counters = self.counters
        counters.forward_steps += 1
        # A step without drafts (EAGLE collecting its first features) is no verify step: it
        # neither counts in the accept length nor moves the back-off.
        if num_drafts > 0:
            self._update_backoff(emitted / len(reqs))
            counters.spec_verify_steps += 1
            counters.spec_verified_reqs += len(reqs)
            counters.spec_draft_tokens += num_drafts
            counters.spec_emitted_tokens += emitted
        keep = [row for row, req in enumerate(reqs) if not req.finished]
        if len(keep) < batch.batch_size:
            batch.filter(keep)
        return result

    def _commit_vectorised(
        self, batch: ScheduleBatch, drafts: list[list[int]], logits: torch.Tensor
    ) -> StepResult:
        """Greedy and plainly sampled requests: acceptance for all rows at once."""
        reqs = batch.reqs
        layout = build_verify_input(drafts, [len(req.output_ids) for req in reqs], logits.device)
        num_accepted, final_ids = verify_drafts(logits, layout, batch.sampling_info)
        # The step's one deliberate host sync.
        accepted_host, final_host = [
            values.tolist() for values in (num_accepted.cpu(), final_ids.cpu())
        ]
        result = StepResult()
        counters = self.counters
        for req, draft, accepted, final_id in zip(
            reqs, drafts, accepted_host, final_host, strict=True
        ):
            prefix_len = req.kv_committed_len
            appended = self._append(req, [*draft[:accepted], final_id])
            # KV is valid for the inputs before the last appended token; the rest is rejected.
            req.kv_committed_len = prefix_len + appended
            self.kv.free_uncommitted_slots(req, prefix_len + len(draft) + 1)
            counters.spec_accepted_tokens += min(accepted, appended)
            counters.generated_tokens += appended
            result.outputs.append(
                self.results.finish(req) if req.finished else make_req_output(req)
            )
        return result

    def _commit_by_replay(
        self,
        batch: ScheduleBatch,
        drafts: list[list[int]],
        logits: torch.Tensor,
        prefix_lens: list[int],
    ) -> StepResult:
        """Requests with masks, logprobs, penalties, bias or bans: the plain sampler walks
        the rows (`replay.py`); the batch's sampling tensors are rebuilt afterwards."""
        reqs = batch.reqs
        result, accepted = replay_verify(
            reqs,
            drafts,
            logits,
            prefix_lens=prefix_lens,
            kv=self.kv,
            results=self.results,
            vocab_size=self.results.vocab_size,
        )
        self.counters.spec_accepted_tokens += sum(accepted)
        # Penalty counts, masks and bans follow the output: rebuilt for the tokens appended.
        batch.sampling_info = SamplingBatchInfo.from_reqs(
            reqs, self.results.vocab_size, self.results.device
        )
        return result

    def _update_backoff(self, accept_length: float) -> None:
        """Speculation that gains too little costs more than it saves (a verify forward is
        dearer than a decode step): back off, for twice as long after each failed probe."""
        ema = self.accept_length_ema
        weight = ACCEPT_LENGTH_EMA_WEIGHT
        ema = accept_length if ema is None else weight * accept_length + (1 - weight) * ema
        self.accept_length_ema = ema
        if ema < self.config.min_accept_length:
            self.backoff_steps = self.next_backoff
            self.next_backoff = min(2 * self.next_backoff, MAX_BACKOFF_STEPS)
        else:
            self.next_backoff = 1

    def _draft_limit(self, req: Req) -> int:
        """req's drafts: at most num_steps, within its token limit and the context length."""
        return max(
            0,
            min(
                self.config.num_steps,
                req.remaining_new_tokens - 1,  # the verify step adds one token beyond them
                self.context_length - req.seqlen,
            ),
        )

    def _append(self, req: Req, tokens: list[int]) -> int:
        """Appends `tokens` one by one until one finishes req; returns how many went in."""
        for count, token_id in enumerate(tokens, start=1):
            req.output_ids.append(token_id)
            check_finished(req, [token_id], self.context_length)
            if req.finished:
                return count
        return len(tokens)
