"""Offline throughput of the scheduler: N random prompts submitted at once, greedy, ignore_eos.

    python -m radixgen.runtime.bench.offline_throughput --model-path /tmp/llama-3.1-8b \
        --load-format dummy --dummy-config llama-3.1-8b \
        --num-prompts 256 --input-len 512 --output-len 256

`--dummy-config llama-3.1-8b` first writes that model's config.json (and the tiny model's
tokenizer files, which the scheduler needs only for stop strings) into `--model-path`, so a
dummy-weight 8B runs with no download. The scheduler is driven directly (no detokenization):
this measures the engine, with prefill and decode time reported apart.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

LLAMA_3_1_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16",
}
DUMMY_CONFIGS = {"llama-3.1-8b": LLAMA_3_1_8B_CONFIG}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_dummy_config(folder: str | Path, preset: str = "llama-3.1-8b") -> Path:
    """Writes `preset`'s config.json plus the tiny tokenizer into `folder` (created)."""
    from radixgen.runtime.tiny_model import resolve_model_path

    if preset not in DUMMY_CONFIGS:
        raise ValueError(f"preset must be one of {sorted(DUMMY_CONFIGS)}, got {preset!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(DUMMY_CONFIGS[preset], indent=2))
    tiny = Path(resolve_model_path("tiny"))
    for name in TOKENIZER_FILES:
        if (tiny / name).is_file():
            shutil.copyfile(tiny / name, folder / name)
    return folder


def run(server_args, num_prompts: int, input_len: int, output_len: int, seed: int) -> dict:
    from radixgen.runtime.forward_batch import ForwardMode
    from radixgen.runtime.io_struct import TokenizedGenerateReq
    from radixgen.runtime.sampling_params import SamplingParams
    from radixgen.runtime.scheduler import Scheduler

    scheduler = Scheduler(server_args)
    rng = random.Random(seed)
    # Ids from the low range: valid for any vocabulary, and distinct prompts (no cache hits).
    id_range = min(scheduler.vocab_size, 32000)
    prompts = [[rng.randrange(10, id_range) for _ in range(input_len)] for _ in range(num_prompts)]
    params = SamplingParams(max_new_tokens=output_len, temperature=0.0, ignore_eos=True)

    def drain(tag: str, batch: list[list[int]], sampling: SamplingParams) -> dict:
        for i, ids in enumerate(batch):
            scheduler.add_request(TokenizedGenerateReq(f"{tag}-{i}", ids, sampling))
        step_times = {ForwardMode.EXTEND: 0.0, ForwardMode.DECODE: 0.0}
        step_counts = {ForwardMode.EXTEND: 0, ForwardMode.DECODE: 0}
        num_output = 0
        start = time.perf_counter()
        while scheduler.has_work():
            prefill_before = scheduler.counters.computed_prefill_tokens
            step_start = time.perf_counter()
            outputs = scheduler.step()
            _sync(scheduler)
            # A step that computed prompt tokens was an extend step.
            extended = scheduler.counters.computed_prefill_tokens > prefill_before
            mode = ForwardMode.EXTEND if extended else ForwardMode.DECODE
            step_times[mode] += time.perf_counter() - step_start
            step_counts[mode] += 1
            for output in outputs:
                if output.error:
                    raise RuntimeError(f"request {output.rid} failed: {output.error}")
                num_output += len(output.new_token_ids)
        duration = time.perf_counter() - start
        return {
            "duration_s": duration,
            "output_tokens": num_output,
            "extend_steps": step_counts[ForwardMode.EXTEND],
            "decode_steps": step_counts[ForwardMode.DECODE],
            "extend_time_s": step_times[ForwardMode.EXTEND],
            "decode_time_s": step_times[ForwardMode.DECODE],
        }

    # Warm-up: kernels compile, allocator settles. Not timed.
    drain(
        "warmup",
        [p[:32] for p in prompts[:4]],
        SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True),
    )
    scheduler.flush_cache()
    result = drain("bench", prompts, params)
    stats = scheduler.get_stats()
    input_tokens = num_prompts * input_len
    duration = result["duration_s"]
    return {
        "num_prompts": num_prompts,
        "input_len": input_len,
        "output_len": output_len,
        **result,
        "request_throughput": num_prompts / duration,
        "input_token_throughput": input_tokens / duration,
        "output_token_throughput": result["output_tokens"] / duration,
        "total_token_throughput": (input_tokens + result["output_tokens"]) / duration,
        "kv_total_slots": stats.kv_total_slots,
        "num_retractions": stats.num_retractions,
        "max_running_requests": scheduler.runner.max_running_requests,
        "attention_backend": scheduler.runner.attn_backend_name,
        "device": str(scheduler.device),
    }


def _sync(scheduler) -> None:
    if scheduler.device.type == "cuda":
        import torch

        torch.cuda.synchronize(scheduler.device)


def main(argv: list[str] | None = None) -> dict:
    from radixgen.runtime.cli import add_server_args, server_args_from_namespace

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_server_args(parser)
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--bench-seed", type=int, default=0)
    parser.add_argument(
        "--dummy-config",
        choices=sorted(DUMMY_CONFIGS),
        default=None,
        help="write this model's config.json into --model-path first",
    )
    parser.add_argument("--output-json", default=None)
    namespace = parser.parse_args(argv)
    if namespace.dummy_config:
        if getattr(namespace, "model_path", "tiny") == "tiny":
            parser.error("--dummy-config needs --model-path FOLDER to write the config into")
        write_dummy_config(namespace.model_path, namespace.dummy_config)
    server_args = server_args_from_namespace(namespace)
    summary = run(
        server_args,
        namespace.num_prompts,
        namespace.input_len,
        namespace.output_len,
        namespace.bench_seed,
    )
    print(json.dumps(summary, indent=2))
    if namespace.output_json:
        Path(namespace.output_json).write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
