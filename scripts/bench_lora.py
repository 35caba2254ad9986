"""Multi-LoRA benchmarks on the H200 (issue 22's targets), JSON to $OUT (or --out).

    python scripts/bench_lora.py kernels              # SGMV microbenchmark
    python scripts/bench_lora.py serving              # decode throughput / step time, base vs LoRA

kernels: `lora_apply` (shrink + expand, rank 16, 8 adapters in the pool) at the Llama-3.1-8B
projection shapes, for decode batches of 1 and 64 rows (adapters spread uniformly: BGMV) and a
prefill of 8 x 512 tokens (one adapter per request: SGMV), against the bf16 base GEMM of the same
projection (`F.linear`), medians of CUDA-graph replays.

serving: a dummy-weight Llama-3.1-8B in the Engine, once without LoRA and once with 8 random
rank-16 adapters on all seven projections (`--max-loras-per-batch 8`); each configuration runs in
its own process (a fresh GPU). Decode time = time(output 257) - time(output 1) of the same batch
(the prefill cancels), so tokens/s counts decode steps only. Targets: batch 64 spread over the 8
adapters >= 0.8x the base model's decode throughput; batch 1 with one adapter <= 1.15x the base
step time.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

RANK = 16
NUM_ADAPTERS = 8
# (in, output sizes) of the Llama-3.1-8B projections.
SHAPES = {
    "qkv": (4096, (4096, 1024, 1024)),
    "o": (4096, (4096,)),
    "gate_up": (4096, (14336, 14336)),
    "down": (14336, (4096,)),
}
ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def bench_kernels() -> dict:
    import triton

    from radixgen.kernels.lora import lora_apply, make_lora_segments

    device, dtype = torch.device("cuda"), torch.bfloat16
    results = []
    cases = {"decode_bs1": [1], "decode_bs64": [1] * 64, "prefill_8x512": [512] * 8}
    for shape_name, (in_features, output_sizes) in SHAPES.items():
        out_features = sum(output_sizes)
        lora_a = torch.randn(NUM_ADAPTERS, len(output_sizes) * RANK, in_features, device=device)
        lora_a = (lora_a * 0.01).to(dtype)
        lora_b = (torch.randn(NUM_ADAPTERS, out_features, RANK, device=device) * 0.01).to(dtype)
        scalings = torch.ones(NUM_ADAPTERS, device=device)
        weight = torch.randn(out_features, in_features, device=device, dtype=dtype) * 0.02
        for case, lens in cases.items():
            slots = [i % NUM_ADAPTERS for i in range(len(lens))]
            segments = make_lora_segments(slots, lens, device, merge_requests=lens[0] > 1)
            x = torch.randn(sum(lens), in_features, device=device, dtype=dtype)
            y = torch.empty(sum(lens), out_features, device=device, dtype=dtype)

            # The base projection's GEMM (F.linear's) into a preallocated y, and the LoRA delta.
            base = functools.partial(torch.matmul, x, weight.T, out=y)
            lora = functools.partial(
                lora_apply, x, y, lora_a, lora_b, scalings, segments, output_sizes
            )
            lora()  # compile outside the graph
            base_ms = triton.testing.do_bench_cudagraph(base, rep=100, return_mode="median")
            lora_ms = triton.testing.do_bench_cudagraph(lora, rep=100, return_mode="median")
            results.append(
                {
                    "shape": shape_name,
                    "case": case,
                    "tokens": sum(lens),
                    "base_gemm_us": base_ms * 1e3,
                    "lora_sgmv_us": lora_ms * 1e3,
                    "lora_over_base": lora_ms / base_ms,
                }
            )
            print(json.dumps(results[-1]), flush=True)
    return {"device": torch.cuda.get_device_name(), "rank": RANK, "results": results}


def write_random_adapter(folder: Path, *, num_layers: int, seed: int) -> None:
    """A PEFT-format rank-16 adapter on all seven projections of Llama-3.1-8B (random A, B)."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    sizes = {  # module -> (in, out)
        "q_proj": (4096, 4096), "k_proj": (4096, 1024), "v_proj": (4096, 1024),
        "o_proj": (4096, 4096), "gate_proj": (4096, 14336), "up_proj": (4096, 14336),
        "down_proj": (14336, 4096),
    }  # fmt: skip
    tensors = {}
    for layer in range(num_layers):
        for module, (fan_in, fan_out) in sizes.items():
            block = (
                "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            )
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (
                torch.randn(RANK, fan_in, generator=generator) * 0.01
            ).to(torch.bfloat16)
            tensors[f"{prefix}.lora_B.weight"] = (
                torch.randn(fan_out, RANK, generator=generator) * 0.01
            ).to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": RANK, "lora_alpha": 32, "target_modules": ALL_MODULES}
    (folder / "adapter_config.json").write_text(json.dumps(config))


def serve_one(config: str, model: str, adapters_dir: Path) -> dict:
    """Decode measurements of one configuration ("base" or "lora") in this process."""
    from radixgen.runtime.engine import Engine

    options = {"model_path": model, "load_format": "dummy"}
    names = [f"adapter{i}" for i in range(NUM_ADAPTERS)]
    if config == "lora":
        options |= {
            "lora_paths": [f"{name}={adapters_dir / name}" for name in names],
            "max_loras_per_batch": NUM_ADAPTERS,
            "max_lora_rank": RANK,
            "lora_target_modules": ["all"],
        }
    engine = Engine(**options)
    out = {"config": config}
    try:
        for batch in (1, 64):
            prompts = [[(7 * i + j) % 30000 + 10 for j in range(128)] for i in range(batch)]
            adapters = [names[i % NUM_ADAPTERS] for i in range(batch)] if config == "lora" else None

            timed = functools.partial(_timed_generate, engine, prompts, adapters)
            timed(8)  # warm-up: kernels of this batch size compiled, graphs captured
            decode_s = min(timed(257) for _ in range(2)) - min(timed(1) for _ in range(2))
            out[f"bs{batch}"] = {
                "decode_tokens_per_s": batch * 256 / decode_s,
                "step_ms": decode_s / 256 * 1e3,
            }
            print(json.dumps({config: out[f"bs{batch}"], "batch": batch}), flush=True)
    finally:
        engine.shutdown()
    return out


def _timed_generate(engine, prompts, adapters, output_len: int) -> float:
    """Seconds of one greedy batch (the cache flushed first: every run prefills the same)."""
    params = {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0}
    engine.flush_cache()
    start = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=params, lora_path=adapters)
    return time.perf_counter() - start


def bench_serving(out_dir: Path) -> dict:
    model = os.environ.get("MODEL", "/tmp/llama-3.1-8b")
    if not Path(model, "config.json").is_file():
        from radixgen.runtime.bench.model_configs import write_dummy_model_folder

        write_dummy_model_folder("llama-3.1-8b", model)
    adapters_dir = Path(os.environ.get("LORA_ADAPTERS", "/tmp/lora_adapters"))  # ~85 MB each
    for i in range(NUM_ADAPTERS):
        write_random_adapter(adapters_dir / f"adapter{i}", num_layers=32, seed=i)
    runs = {}
    for config in ("base", "lora"):  # one process each: a fresh GPU for each engine
        result = out_dir / f"serving_{config}.json"
        subprocess.run(
            [sys.executable, __file__, "serve-one", config, "--model", model,
             "--adapters", str(adapters_dir), "--result", str(result)],
            check=True,
        )  # fmt: skip
        runs[config] = json.loads(result.read_text())
    base, lora = runs["base"], runs["lora"]
    return {
        "device": torch.cuda.get_device_name(),
        "runs": runs,
        "bs64_throughput_ratio": lora["bs64"]["decode_tokens_per_s"]
        / base["bs64"]["decode_tokens_per_s"],  # target >= 0.8
        "bs1_step_time_ratio": lora["bs1"]["step_ms"] / base["bs1"]["step_ms"],  # target <= 1.15
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["kernels", "serving", "serve-one"])
    parser.add_argument("config", nargs="?", choices=["base", "lora"])
    parser.add_argument("--out", default=os.environ.get("OUT", "lora_bench_out"))
    parser.add_argument("--model", default="/tmp/llama-3.1-8b")
    parser.add_argument("--adapters", type=Path)
    parser.add_argument("--result", type=Path)
    args = parser.parse_args()
    if args.mode == "serve-one":
        args.result.write_text(json.dumps(serve_one(args.config, args.model, args.adapters)))
        return
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = bench_kernels() if args.mode == "kernels" else bench_serving(out_dir)
    (out_dir / f"lora_{args.mode}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "results"}, indent=2))


if __name__ == "__main__":
    main()
