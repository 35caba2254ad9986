"""What folding a batch's per-step outputs costs the Engine's caller thread (a CPU aid, not a
test).

    OMP_NUM_THREADS=1 python scripts/bench_batch_outputs.py [--requests 1024] [--steps 256]

The scheduler thread puts one `ReqOutput` per request per decode step into the request's
result channel; a non-streaming `Engine.generate` folds them into `OutputAccumulator`s. This
puts `requests x steps` outputs (generated-shared-prefix's 1,024 x 256 by default) into real
`ResultChannel`s, then times folding them all at once, which is what a batch's caller did after
the last step while it read one request's channel after another (before the thirteenth
session). A tokenizer stub keeps the final decode out of the figure: only the folding is timed.
"""

from __future__ import annotations

import argparse
import time

from radixgen.runtime.engine_loop import ResultChannel
from radixgen.runtime.io_struct import ReqOutput
from radixgen.runtime.output_accumulator import OutputAccumulator


class _LengthTokenizer:
    """Decodes n ids to n characters: the decode's cost is not what this measures."""

    def decode(self, ids, skip_special_tokens=True):
        return "x" * len(ids)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=256)
    args = parser.parse_args()
    rids = [f"r{i}" for i in range(args.requests)]
    samples = [
        OutputAccumulator(
            tokenizer=_LengthTokenizer(),
            rid=rid,
            index=0,
            prompt_ids=[1] * 8,
            skip_special_tokens=True,
            stop_strings=[],
            return_logprob=False,
            top_logprobs_num=0,
            stream=False,
        )
        for rid in rids
    ]
    channels = [ResultChannel() for _ in rids]
    start = time.perf_counter()
    for step in range(args.steps):
        for rid, channel in zip(rids, channels, strict=True):
            channel.put(
                ReqOutput(
                    rid=rid,
                    index=0,
                    new_token_ids=[5],
                    finished=step == args.steps - 1,
                    prompt_tokens=8,
                    completion_tokens=step + 1,
                )
            )
    put_s = time.perf_counter() - start
    start = time.perf_counter()
    for sample, channel in zip(samples, channels, strict=True):
        while not sample.finished:
            sample.add(channel.get())
    fold_s = time.perf_counter() - start
    total = args.requests * args.steps
    print(f"{total} outputs: built and put {put_s:.3f} s (the scheduler thread's side)")
    print(f"folded at once {fold_s:.3f} s ({1e6 * fold_s / total:.2f} us an output)")


if __name__ == "__main__":
    main()
