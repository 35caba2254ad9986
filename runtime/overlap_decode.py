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
- Requests with logprobs, below `min_new_tokens`, or that may jump forward do not overlap
  (a jump rewrites the output the step ahead was built on). Extend batches, retraction,
  aborts and constraint compiles first process the step in flight (everything else runs as
  before).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixgen.runtime.forward_batch import ForwardMode, host_ints_to_device
from radixgen.runtime.io_struct import SchedulerCounters
from radixgen.runtime.kv_cache_manager import KVCacheManager
from radixgen.runtime.req import Req, ReqStatus
from radixgen.runtime.result_processor import ResultProcessor, StepResult
from radixgen.runtime.schedule_batch import ScheduleBatch


@dataclass
class InflightDecode:
    """A decode step launched on the device whose sampled ids are not processed yet."""

    reqs: list[Req]  # its rows, in order (the running batch's rows when it was launched)
    next_token_ids: torch.Tensor  # [batch] int64 on the device: the next step's input ids
    host_token_ids: torch.Tensor  # [batch] int64, host copy, valid once `copied` is done
    copied: torch.cuda.Event | None  # None on CPU (the copy is synchronous there)

    @classmethod
    def launch_copy(cls, reqs: list[Req], next_token_ids: torch.Tensor) -> InflightDecode:
        """Starts the device-to-host copy of the sampled ids, without waiting for it."""
        if next_token_ids.device.type != "cuda":
            return cls(list(reqs), next_token_ids, next_token_ids.cpu(), None)
        host = torch.empty(next_token_ids.shape, dtype=torch.int64, pin_memory=True)
        host.copy_(next_token_ids, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return cls(list(reqs), next_token_ids, host, event)

    def token_ids(self) -> list[int]:
        """The sampled ids on the host; waits for this step only (not for later launches)."""
        if self.copied is not None:
            self.copied.synchronize()
        return self.host_token_ids.tolist()


def can_overlap(req: Req) -> bool:
    """Whether req's next step may be launched before its pending token is processed (the
    scheduler also keeps requests that may jump forward out: `GrammarHook.may_jump_forward`)."""
    return (
        req.status is ReqStatus.DECODING  # not JUMPED: a forced run needs a multi-token row
        and not req.return_logprob
        and len(req.output_ids) >= req.sampling_params.min_new_tokens
    )


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
        pending = 1 if previous is not None else 0
        reqs = running.reqs
        keep = [
            i
            for i, r in enumerate(reqs)
            if not r.finished
            and not (pending and finishes_by_length_after_pending(r, self.context_length))
        ]
        if not keep or self.kv.available_size() < len(keep):
            # Nothing to launch, or KV needs a retraction: process the step in flight; the
            # next step() decodes the usual way.
            return self.resolve(running)
        if len(keep) < len(reqs):
            running.filter(keep)
        next_reqs = running.reqs
        out_cache_loc = self.kv.alloc_slots(len(next_reqs))
        if previous is None:
            input_ids = [r.output_ids[-1:] for r in next_reqs]
        else:
            keep_rows = host_ints_to_device(keep, self.runner.device)
            input_ids = previous.next_token_ids[keep_rows]  # never seen by the host
        forward_batch = self.runner.build_forward_batch(
            mode=ForwardMode.DECODE,
            input_ids=input_ids,
            req_pool_indices=[r.req_pool_idx for r in next_reqs],
            prefix_lens=[r.kv_committed_len + pending for r in next_reqs],
            out_cache_loc=out_cache_loc,
        )
        logits = self.runner.forward(forward_batch)
        self.counters.forward_steps += 1
        # While the device computes the forward: process the step in flight (it waits for
        # that step's ids only, queued before this forward), which advances the matchers,
        # so sampling can then fill this step's masks. Requests it finishes keep a wasted row.
        result = None if previous is None else self._process(previous, next_reqs=next_reqs)
        sampled = self.results.sample(next_reqs, logits, running.sampling_info)
        self.inflight = InflightDecode.launch_copy(next_reqs, sampled.next_token_ids)
        return result

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
        for req, token_id in zip(inflight.reqs, inflight.token_ids(), strict=True):
            if req.req_pool_idx is None:
                continue  # finished at an earlier step (a wasted row): already released
            req.kv_committed_len += 1
            if req.finished:
                continue  # aborted while in flight: the scheduler releases it
            alive_reqs.append(req)
            alive_ids.append(token_id)
        launched_next = {id(r) for r in next_reqs}
        return self.results.advance(alive_reqs, alive_ids, launched_next)
