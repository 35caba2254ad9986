"""How long `Engine.generate` spends building and validating a batch before the scheduler sees
it (CPU; a benchmark, not a test).

    OMP_NUM_THREADS=1 python scripts/bench_request_build.py [--repeats 5]

generated-shared-prefix's 1,024 prompts of 2,176 token ids on the tiny model (the vocabulary
bounds the ids): `Engine._make_requests`, which builds each `GenerateReq` and runs
`validate_request` with the model's limits, timed `--repeats` times. Until it returns the
scheduler idles.
"""

from __future__ import annotations

import argparse
import statistics
import time

from radixgen.runtime.bench.datasets import DatasetArgs, build_dataset
from radixgen.runtime.bench.offline import with_model_vocab
from radixgen.runtime.engine import Engine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    engine = Engine(model_path="tiny", max_total_tokens=4096)
    try:
        dataset = DatasetArgs(dataset="generated-shared-prefix")
        requests = build_dataset(with_model_vocab(dataset, engine))
        ids = [r.input_ids for r in requests]
        params = [
            {"max_new_tokens": r.output_len, "temperature": 0.0, "ignore_eos": True}
            for r in requests
        ]
        times_ms = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            engine._make_requests(None, params, ids, False, None, 0, None, False, None)
            times_ms.append(1e3 * (time.perf_counter() - start))
    finally:
        engine.shutdown()
    print(
        f"{len(ids)} prompts, {sum(map(len, ids))} ids: "
        f"{', '.join(f'{t:.0f}' for t in times_ms)} ms; median {statistics.median(times_ms):.0f} ms"
    )


if __name__ == "__main__":
    main()
