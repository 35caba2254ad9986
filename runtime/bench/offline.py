"""`radixgen bench offline`: the in-process Engine, every prompt submitted at once.

Measures what the scheduler makes of a full queue: request and token throughput over the
whole run, with output lengths forced by `ignore_eos`.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from tqdm import tqdm

from radixgen.runtime.bench.datasets import DatasetArgs, build_dataset, describe
from radixgen.runtime.server_args import ServerArgs


@dataclass(frozen=True)
class OfflineArgs:
    warmup_prompts: int = 4  # a short untimed run first (kernels compile, graphs capture)


def run_offline(server_args: ServerArgs, dataset: DatasetArgs, args: OfflineArgs) -> dict:
    from radixgen.runtime.engine import Engine

    engine = Engine(**asdict(server_args))
    try:
        dataset = with_model_vocab(dataset, engine)
        requests = build_dataset(dataset)
        if any(r.input_ids is None for r in requests):
            raise ValueError(
                f"dataset {dataset.dataset!r} is not an id workload; use bench serving"
            )
        print(f"workload: {describe(requests)}")
        if args.warmup_prompts:
            engine.generate(
                input_ids=[r.input_ids[:64] for r in requests[: args.warmup_prompts]],
                sampling_params={"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True},
            )
            engine.flush_cache()
        sampling_params = [
            {"max_new_tokens": r.output_len, "temperature": 0.0, "ignore_eos": True}
            for r in requests
        ]
        start = time.perf_counter()
        with _progress(engine, total=len(requests)):
            outputs = engine.generate(
                input_ids=[r.input_ids for r in requests], sampling_params=sampling_params
            )
        duration_s = time.perf_counter() - start
        stats = engine.get_stats()
    finally:
        engine.shutdown()
    input_tokens = sum(o["meta_info"]["prompt_tokens"] for o in outputs)
    output_tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    cached_tokens = sum(o["meta_info"].get("cached_tokens", 0) for o in outputs)
    return {
        "successful_requests": len(outputs),
        "duration_s": duration_s,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "cached_tokens": cached_tokens,
        "request_throughput": len(outputs) / duration_s,
        "input_token_throughput": input_tokens / duration_s,
        "output_token_throughput": output_tokens / duration_s,
        "total_token_throughput": (input_tokens + output_tokens) / duration_s,
        "engine_stats": stats,
    }


@contextmanager
def _progress(engine, total: int, interval_s: float = 0.5):
    """A progress bar of finished requests while the one blocking `generate` runs: a thread
    reads the scheduler's counters twice a second (a control message each, nothing per token)."""
    finished_before = engine.get_stats()["num_finished_reqs"]
    stop = threading.Event()

    def poll(bar: tqdm) -> None:
        while not stop.wait(interval_s):
            bar.update(engine.get_stats()["num_finished_reqs"] - finished_before - bar.n)

    with tqdm(total=total, desc="requests") as bar:
        thread = threading.Thread(target=poll, args=(bar,), daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
        bar.update(total - bar.n)  # generate returned: every request finished


def with_model_vocab(dataset: DatasetArgs, engine) -> DatasetArgs:
    """The workload's token ids kept inside the engine's vocabulary (a tokenizer of a few
    hundred entries, as a test model's, keeps the dataset's own bound)."""
    from dataclasses import replace

    vocab = len(engine.tokenizer)
    return replace(dataset, vocab_size=min(dataset.vocab_size, vocab)) if vocab > 300 else dataset


def main_offline(
    server_args: ServerArgs, dataset: DatasetArgs, args: OfflineArgs, output_json: str | None
) -> dict:
    from radixgen.runtime.bench.serving import print_summary

    summary = run_offline(server_args, dataset, args)
    summary["dataset"] = asdict(dataset)
    printed = {k: v for k, v in summary.items() if k not in ("engine_stats", "dataset")}
    print_summary(f"offline {dataset.dataset}", printed)
    if output_json:
        with open(output_json, "w") as f:
            json.dump(summary, f, indent=2, default=str)
    return summary
