"""Overlapped decoding: the next decode step is launched before the previous one's tokens
reach the host, so the device never waits for the scheduler's per-step host work.

A decode step without overlap runs: launch forward and sampling, wait for the sampled ids
(one sync), then append them, check finishing, build outputs, build the next batch; the
device idles during that host work (about 3 ms a step at batch 256 on the H200, measured;
docs/benchmarks.md). With overlap, step N+1 takes step N's sampled ids straight from the
device as its input ids: the host launches N+1's forward, then processes step N (appends its
tokens, advances the constraint matchers) and fills N+1's constraint bitmasks while the
device computes the forward, and only then launches N+1's sampling, which is all that needs
the masks:

    device:  | forward N+1 ....................... | mask copy | sample N+1 | copy ids |
    host:    launch | wait ids N, append, accept, fill masks N+1 | launch sample, copy |

What keeps the outputs identical:
- Step N+1's rows are step N's, minus requests that finish at N by length (known on the
  host). A request that finishes at N on EOS, a stop id, a stop string or a complete
  constraint still runs in N+1 (one wasted row, its mask row left all-allowed); that row's
  result is dropped and its KV slot freed when N is processed.
- Positions count the one pending (not yet processed) token; sampling runs after step N is
  processed, so its counters (seeded draws) and masks see the request's whole output.
- A jump-forward found while processing N (llguidance: it only appends) leaves N+1's row
  with a valid KV but a stale sample: dropped, and the run goes into the step after as one
  multi-token row (an extend forward whose other rows' ids are patched in on the device).
- Requests with logprobs, below `min_new_tokens`, or whose jump-forward may retract the
  sampled token (outlines) do not overlap. Extend batches, retraction and
  aborts first process the step in flight (everything else runs as before); a constraint
  compiling for a waiting request does not.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from radixgen.kernels.host_copy import host_ints_to_device
from radixgen.runtime.attention.tree_grouping import decode_shared_prefixes
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.io_struct import SchedulerCounters
from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.req import Req, ReqStatus
from radixgen.runtime.result_processor import ResultProcessor, StepResult
from radixgen.runtime.schedule_batch import ScheduleBatch


@dataclass
class InflightDecode:
    """A decode step launched on the device whose sampled ids are not processed yet."""

    reqs: list[Req]  # its rows, in order (the running batch's rows when it was launched)
    new_token_counts: list[int]  # tokens each row computes: 1, or a jump-forward's run
    # Rows whose request jumped forward after the launch (while the step before was
    # processed): their KV is valid (the sampled token stays), their sample is not (it
    # predicts what follows that token, where the forced run now goes): dropped.
    stale_rows: frozenset[int]
    next_token_ids: torch.Tensor  # [batch] int64 on the device: the next step's input ids
    host_token_ids: torch.Tensor  # [batch] int64, host copy, valid once `copied` is done
    copied: torch.cuda.Event | None  # None on CPU (the copy is synchronous there)

    @classmethod
    def launch_copy(
        cls,
        reqs: list[Req],
        new_token_counts: list[int],
        stale_rows: frozenset[int],
        next_token_ids: torch.Tensor,
    ) -> InflightDecode:
        """Starts the device-to-host copy of the sampled ids, without waiting for it."""
        rows = (list(reqs), list(new_token_counts), stale_rows, next_token_ids)
        if next_token_ids.device.type != "cuda":
            return cls(*rows, next_token_ids.cpu(), None)
        host = torch.empty(next_token_ids.shape, dtype=torch.int64, pin_memory=True)
        host.copy_(next_token_ids, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return cls(*rows, host, event)

    def token_ids(self) -> list[int]:
        """The sampled ids on the host; waits for this step only (not for later launches)."""
        if self.copied is not None:
            self.copied.synchronize()
        return self.host_token_ids.tolist()


def can_overlap(req: Req) -> bool:
    """Whether req's next step may be launched before its pending token is processed (the
    scheduler also keeps out requests whose jump-forward may retract a token:
    `GrammarHook.jumps_prevent_overlap`)."""
    return not req.return_logprob and len(req.output_ids) >= req.sampling_params.min_new_tokens


def finishes_by_length_after_pending(req: Req, context_length: int) -> bool:
    """True when the pending token makes req reach max_new_tokens or the context length
    (the length checks of `check_finished`, one token ahead)."""
    num_output = len(req.output_ids) + 1
    return (
        num_output >= req.sampling_params.max_new_tokens
        or len(req.origin_input_ids) + num_output >= context_length
    )


class OverlapDecoder:
    """Launches decode steps of the running batch ahead of their host processing, and owns
    the one step in flight. While a step is in flight, the running batch holds exactly its
    rows (some possibly finished: they are dropped at the next launch).

    Both entry points return the processed step's `StepResult` (None when no step was
    processed); the scheduler applies it.

    Args:
        runner: the model runner.
        kv: the KV manager (one slot per row of each launched step).
        counters: forward steps are counted here.
        context_length: the model's context length (finishing by length, one token ahead).
        results: appends each processed step's tokens (a request finishing there that runs
            in the step launched after it gets that step's KV slot freed), then samples the
            launched step (constraint masks filled on the host meanwhile; no host sync).
    """

    def __init__(
        self,
        *,
        runner,
        kv: KVCacheManager,
        counters: SchedulerCounters,
        context_length: int,
        results: ResultProcessor,
    ):
        self.runner = runner
        self.kv = kv
        self.counters = counters
        self.context_length = context_length
        self.results = results
        self.inflight: InflightDecode | None = None

    def launch(self, running: ScheduleBatch) -> StepResult | None:
        """Launches the next decode step of `running`, then processes the step in flight
        (if any) while the device computes. Falls back to processing only, when the next
        step would need a retraction or has no row left."""
        previous = self.inflight
        reqs = running.reqs  # while a step is in flight: exactly its rows
        keep = [
            i
            for i, r in enumerate(reqs)
            if not r.finished
            and not (
                previous is not None
                and i not in previous.stale_rows  # its pending token will be appended
                and finishes_by_length_after_pending(r, self.context_length)
            )
        ]
        # Each kept row's new tokens: the pending sample (on the device), or the tokens the
        # host knows and no step computes yet (a jump-forward's run; every row's last
        # token when nothing is in flight).
        prefix_lens, host_runs = [], []
        for i in keep:
            req = reqs[i]
            prefix_len = req.kv_committed_len
            if previous is not None:
                prefix_len += previous.new_token_counts[i]
            prefix_lens.append(prefix_len)
            if previous is not None and req.status is not ReqStatus.JUMPED:
                host_runs.append(None)
            else:
                host_runs.append(req.fill_slice(prefix_len, req.seqlen) or None)
        counts = [1 if run is None else len(run) for run in host_runs]
        if not keep or self.kv.available_size() < sum(counts):
            # Nothing to launch, or KV needs a retraction: process the step in flight; the
            # next step() decodes the usual way.
            return self.resolve(running)
        if len(keep) < len(reqs):
            running.filter(keep)
        next_reqs = running.reqs
        forward_batch = self._build_forward_batch(
            next_reqs,
            previous=previous,
            previous_rows=keep,
            prefix_lens=prefix_lens,
            host_runs=host_runs,
            counts=counts,
        )
        logits = self.runner.forward(forward_batch)
        self.counters.forward_steps += 1
        self.counters.tree_attention_steps += forward_batch.shared_prefixes is not None
        # While the device computes the forward: process the step in flight (it waits for
        # that step's ids only, queued before this forward), which advances the matchers,
        # so sampling can then fill this step's masks. Requests it finishes keep a wasted row;
        # requests it makes jump forward keep a row whose sample is dropped.
        result, stale_rows = None, frozenset()
        if previous is not None:
            result = self._process(previous, next_reqs=next_reqs)
            stale_rows = frozenset(
                row
                for row, (req, i) in enumerate(zip(next_reqs, keep, strict=True))
                if req.status is ReqStatus.JUMPED and i not in previous.stale_rows
            )
        info = running.sampling_info
        # A stale row's sample is dropped: its constraint's mask could not change anything.
        sampled = self.results.sample(next_reqs, logits, info, dropped_rows=stale_rows)
        if stale_rows and info.has_penalties:
            # Counted by `sample` but dropped; and the run their jump appended is not counted.
            info.recount_rows(sorted(stale_rows), [next_reqs[row] for row in sorted(stale_rows)])
        self.inflight = InflightDecode.launch_copy(
            next_reqs, counts, stale_rows, sampled.next_token_ids
        )
        return result

    def _build_forward_batch(
        self,
        next_reqs: list[Req],
        *,
        previous: InflightDecode | None,
        previous_rows: list[int],
        prefix_lens: list[int],
        host_runs: list[list[int] | None],
        counts: list[int],
    ):
        """The launched step's batch: one token per row (the CUDA-graph decode), or an extend
        forward when a jump-forward's run is among them. Input ids that only the device has
        (the pending samples, `host_runs[row]` None) never go through the host.

        Args:
            next_reqs: its rows; row j was row `previous_rows[j]` of `previous`.
            prefix_lens: tokens of each row with KV computed or in flight.
            host_runs: each row's new tokens known on the host, or None for its pending sample.
            counts: each row's new tokens (1 for a pending sample).
        """
        device = self.runner.device
        device_rows = [row for row, run in enumerate(host_runs) if run is None]
        pending_ids = None  # [len(device_rows)] int64 on the device
        if device_rows:
            rows = host_ints_to_device([previous_rows[row] for row in device_rows], device)
            pending_ids = previous.next_token_ids[rows]
        is_decode = len(counts) == sum(counts)
        if is_decode and len(device_rows) == len(counts):
            input_ids = pending_ids
        else:
            input_ids = [[0] if run is None else run for run in host_runs]  # 0: placeholder
        mode = ForwardMode.DECODE if is_decode else ForwardMode.EXTEND
        forward_batch = self.runner.build_forward_batch(
            mode=mode,
            input_ids=input_ids,
            req_pool_indices=[r.req_pool_idx for r in next_reqs],
            prefix_lens=prefix_lens,
            out_cache_loc=self.kv.alloc_slots(sum(counts)),
            shared_prefixes=decode_shared_prefixes(self.runner, next_reqs, mode),
            lora_slots=[r.lora_slot for r in next_reqs],
        )
        if pending_ids is not None and input_ids is not pending_ids:
            starts = list(itertools.accumulate(counts, initial=0))
            positions = host_ints_to_device([starts[row] for row in device_rows], device)
            forward_batch.input_ids[positions] = pending_ids
        return forward_batch

    def resolve(self, running: ScheduleBatch) -> StepResult | None:
        """Processes the step in flight with nothing launched after it; `running` then holds
        no released request (aborted ones stay for the scheduler to finish)."""
        if self.inflight is None:
            return None
        inflight, self.inflight = self.inflight, None
        result = self._process(inflight, next_reqs=())
        keep = [i for i, r in enumerate(running.reqs) if r.req_pool_idx is not None]
        if len(keep) < len(running.reqs):
            running.filter(keep)
        return result

    def _process(self, inflight: InflightDecode, next_reqs) -> StepResult:
        """Appends the in-flight step's tokens (`next_reqs`: the step launched after it)."""
        alive_reqs, alive_ids = [], []
        rows = zip(inflight.reqs, inflight.new_token_counts, inflight.token_ids(), strict=True)
        for row, (req, count, token_id) in enumerate(rows):
            if req.req_pool_idx is None:
                continue  # finished at an earlier step (a wasted row): already released
            req.kv_committed_len += count
            if req.finished:
                continue  # aborted while in flight: the scheduler releases it
            if row in inflight.stale_rows:
                continue  # jumped forward after the launch: its run goes in the next step
            alive_reqs.append(req)
            alive_ids.append(token_id)
        launched_next = {id(r) for r in next_reqs}
        return self.results.advance(alive_reqs, alive_ids, launched_next)
