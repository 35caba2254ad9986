"""Overlapped decoding: the next decode step is launched before the previous one's tokens
reach the host, so the device never waits for the scheduler's per-step host work.

A decode step without overlap runs: launch forward and sampling, wait for the sampled ids
(one sync), then append them, check finishing, build outputs, build the next batch; the
device idles during that host work (about 3 ms a step at batch 256 on the H200, measured;
docs/benchmarks.md). With overlap, step N+1 takes step N's sampled ids straight from the
device as its input ids, and the host processes step N while N+1 runs.

What keeps the outputs identical:
- Step N+1's rows are step N's, minus requests that finish at N by length (known on the
  host). A request that finishes at N on EOS, a stop id or a stop string still runs in N+1
  (one wasted row); that row's result is dropped and its KV slot freed when N is processed.
- Positions and sampling counters count the one pending (not yet processed) token.
- Only plain requests overlap: no constraint (its mask needs the previous token), no
  logprobs, nothing still below `min_new_tokens`. Extend batches, retraction, aborts and
  constraint compiles first process the step in flight (everything else runs as before).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixgen.runtime.req import Req


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
    """Whether req's next step may be launched before its pending token is processed."""
    return (
        req.grammar is None
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
