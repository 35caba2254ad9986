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


LAYERS = 32  # distinct adapter buffers per timed graph: weights come from HBM, as in serving


def graph_time_us(calls: list, replays: int = 10) -> float:
    """Microseconds per call of `calls` captured in one CUDA graph (median of `replays`)."""
    for call in calls:
        call()  # compiled outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return sorted(times)[len(times) // 2]


def adapter_layers(in_features: int, output_sizes: tuple[int, ...], layers: int) -> list[tuple]:
    """`layers` pools of NUM_ADAPTERS rank-16 adapters (bf16 lora_a, lora_b), ones as scalings."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    pools = []
    for _ in range(layers):
        shape_a = (NUM_ADAPTERS, len(output_sizes) * RANK, in_features)
        lora_a = (torch.randn(shape_a, device=device) * 0.01).to(dtype)
        shape_b = (NUM_ADAPTERS, sum(output_sizes), RANK)
        lora_b = (torch.randn(shape_b, device=device) * 0.01).to(dtype)
        pools.append((lora_a, lora_b))
    return pools


def check_against_reference(apply, x, lora_a, lora_b, scalings, segments, output_sizes) -> None:
    """Raises AssertionError when `apply` disagrees with the torch reference (before timing)."""
    from radixgen.kernels.lora import lora_apply_ref

    y0 = torch.randn(x.shape[0], sum(output_sizes), device=x.device, dtype=x.dtype)
    expected = lora_apply_ref(x, y0.clone(), lora_a, lora_b, scalings, segments, output_sizes)
    out = apply(x, y0.clone(), lora_a, lora_b, scalings, segments, output_sizes)
    torch.testing.assert_close(out.float(), expected.float(), atol=3e-2, rtol=3e-2)


def bench_kernels(swept_table: dict | None = None) -> dict:
    """Args: swept_table: a parsed decode table from `--sweep` (also timed, as lora_swept_us)."""
    import triton

    from radixgen.kernels.lora import lora_apply, lora_apply_sgmv, make_lora_segments
    from radixgen.kernels.lora_decode import lora_apply_decode, select_decode_config

    device, dtype = torch.device("cuda"), torch.bfloat16
    results = []
    cases = {"decode_bs1": [1], "decode_bs64": [1] * 64, "prefill_8x512": [512] * 8}
    for shape_name, (in_features, output_sizes) in SHAPES.items():
        out_features = sum(output_sizes)
        pools = adapter_layers(in_features, output_sizes, LAYERS)
        lora_a, lora_b = pools[0]
        scalings = torch.ones(NUM_ADAPTERS, device=device)
        weight = torch.randn(out_features, in_features, device=device, dtype=dtype) * 0.02
        for case, lens in cases.items():
            slots = [i % NUM_ADAPTERS for i in range(len(lens))]
            segments = make_lora_segments(slots, lens, device, merge_requests=lens[0] > 1)
            x = torch.randn(sum(lens), in_features, device=device, dtype=dtype)
            y = torch.empty(sum(lens), out_features, device=device, dtype=dtype)
            args = (scalings, segments, output_sizes)
            for apply in (lora_apply, lora_apply_sgmv):
                check_against_reference(apply, x, lora_a, lora_b, *args)

            # The base projection's GEMM (F.linear's) into a preallocated y, and the LoRA delta
            # (L2-warm: one adapter pool; cold: LAYERS pools in turn, as the model's layers).
            base = functools.partial(torch.matmul, x, weight.T, out=y)
            lora = functools.partial(lora_apply, x, y, lora_a, lora_b, *args)
            lora()  # compile outside the graph
            base_ms = triton.testing.do_bench_cudagraph(base, rep=100, return_mode="median")
            lora_ms = triton.testing.do_bench_cudagraph(lora, rep=100, return_mode="median")
            row = {
                "shape": shape_name,
                "case": case,
                "tokens": sum(lens),
                "base_gemm_us": base_ms * 1e3,
                "lora_us": lora_ms * 1e3,  # lora_apply: decode kernels for decode cases
                "lora_over_base": lora_ms / base_ms,
            }
            if lens[0] == 1:
                sgmv = functools.partial(lora_apply_sgmv, x, y, lora_a, lora_b, *args)
                sgmv()
                row["sgmv_us"] = (
                    triton.testing.do_bench_cudagraph(sgmv, rep=100, return_mode="median") * 1e3
                )  # the SGMV kernels on the same rows: the path decode took before
                row["lora_cold_us"] = graph_time_us(
                    [functools.partial(lora_apply, x, y, a, b, *args) for a, b in pools]
                )
                if swept_table is not None:
                    config = select_decode_config(
                        in_features, out_features, len(lens), True, swept_table
                    )
                    row["lora_swept_cold_us"] = graph_time_us(
                        [
                            functools.partial(
                                lora_apply_decode, x, y, a, b, scalings, segments.token_slots,
                                output_sizes, config,
                            )
                            for a, b in pools
                        ]
                    )  # fmt: skip
            results.append(row)
            print(json.dumps(row), flush=True)
        del pools, weight
        torch.cuda.empty_cache()
    return {"device": torch.cuda.get_device_name(), "rank": RANK, "results": results}


# The decode sweep, a coordinate search from the fallback: each entry replaces these fields of
# the best config so far (warps alone: tried on the best split/tile).
SHRINK_GRID = [
    {"split_k": split_k, "block_k": block_k}
    for split_k in (4, 8, 16, 32, 64)
    for block_k in (32, 64, 128)
] + [{"shrink_warps": 2}, {"shrink_warps": 8}]
EXPAND_GRID = [{"block_n": n} for n in (64, 128, 256)] + [{"expand_warps": w} for w in (2, 8)]
SWEEP_BATCHES = {1: 8, 64: None}  # timed batch -> the max_tokens of its table row
SWEEP_BUDGET_S = 90.0  # then each (shape, batch) keeps its best so far


def sweep_one(in_features, output_sizes, pools, batch: int, deadline: float) -> list[dict]:
    """Coordinate search from the fallback (shrink sizes, then expand sizes) for one projection
    and decode batch; every candidate is checked against the reference before it is timed.
    Returns the measurements, the winner last."""
    from dataclasses import asdict, replace

    import triton

    from radixgen.kernels.lora import make_lora_segments
    from radixgen.kernels.lora_decode import fallback_decode_config, lora_apply_decode

    device = torch.device("cuda")
    scalings = torch.ones(NUM_ADAPTERS, device=device)
    slots = [i % NUM_ADAPTERS for i in range(batch)]
    segments = make_lora_segments(slots, [1] * batch, device, merge_requests=False)
    x = torch.randn(batch, in_features, device=device, dtype=torch.bfloat16)
    y = torch.zeros(batch, sum(output_sizes), device=device, dtype=torch.bfloat16)
    measured = []

    def timed(config) -> float:
        def apply(x, y, a, b, scalings, segments, sizes):
            return lora_apply_decode(x, y, a, b, scalings, segments.token_slots, sizes, config)

        check_against_reference(apply, x, *pools[0], scalings, segments, output_sizes)
        us = graph_time_us(
            [
                functools.partial(apply, x, y, a, b, scalings, segments, output_sizes)
                for a, b in pools
            ]
        )
        measured.append({"batch": batch, "us": us, **asdict(config)})
        return us

    best = fallback_decode_config(in_features, sum(output_sizes), on_cuda=True)
    best_us = timed(best)
    for grid in (SHRINK_GRID, EXPAND_GRID):
        for fields in grid:
            candidate = replace(best, **fields)
            if candidate == best or time.monotonic() > deadline:
                continue
            if triton.cdiv(in_features, candidate.split_k) < candidate.block_k // 2:
                continue  # chunks mostly masked
            us = timed(candidate)
            if us < best_us:
                best, best_us = candidate, us
    measured.append({"batch": batch, "best_us": best_us, **asdict(best)})
    return measured


def sweep_decode(out_dir: Path) -> tuple[dict, dict]:
    """Times the decode kernels' launch sizes per projection shape and batch (rank 16, 8
    adapters, LAYERS pools in turn: weights from HBM); writes the winners as
    `lora_decode_configs.json` (copy it over kernels/lora_decode_configs.json).

    Returns:
        (the measurements as JSON, the parsed table of winners)."""
    import triton

    from radixgen.kernels.launch_tables import format_shape_table
    from radixgen.kernels.lora_decode import parse_decode_config_table

    deadline = time.monotonic() + SWEEP_BUDGET_S
    shapes, measured = {}, []
    pairs_left = len(SHAPES) * len(SWEEP_BATCHES)
    for shape_name, (in_features, output_sizes) in SHAPES.items():
        pools = adapter_layers(in_features, output_sizes, LAYERS)
        rows = []
        for batch, max_tokens in SWEEP_BATCHES.items():
            # An equal share of what is left, so that no shape is starved by the compiles.
            share = max(0.0, deadline - time.monotonic()) / pairs_left
            pairs_left -= 1
            runs = sweep_one(in_features, output_sizes, pools, batch, time.monotonic() + share)
            measured += [{"shape": shape_name, **run} for run in runs]
            winner = {k: v for k, v in runs[-1].items() if k not in ("batch", "best_us")}
            rows.append({"max_tokens": max_tokens, **winner})
            print(json.dumps(measured[-1]), flush=True)
        shapes[f"{in_features}x{sum(output_sizes)}"] = rows
        del pools
        torch.cuda.empty_cache()
    table = {
        "note": "From scripts/bench_lora.py kernels --sweep; copy over "
        "kernels/lora_decode_configs.json. Rank 16, 8 adapters, weights from HBM.",
        "source": f"{torch.cuda.get_device_name()}, triton {triton.__version__}, "
        f"{time.strftime('%Y-%m-%d')}",
        "shapes": shapes,
    }
    (out_dir / "lora_decode_configs.json").write_text(format_shape_table(table))
    summary = {
        "device": torch.cuda.get_device_name(),
        "out_of_budget": time.monotonic() > deadline,
        "table": table,
        "results": measured,
    }
    return summary, parse_decode_config_table(table)


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
    parser.add_argument(
        "--sweep", action="store_true", help="kernels: also sweep the decode launch sizes"
    )
    args = parser.parse_args()
    if args.mode == "serve-one":
        args.result.write_text(json.dumps(serve_one(args.config, args.model, args.adapters)))
        return
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    swept = None
    if args.mode == "kernels" and args.sweep:  # first: the kernels table then times its winners
        sweep, swept = sweep_decode(out_dir)
        (out_dir / "lora_decode_sweep.json").write_text(json.dumps(sweep, indent=2))
    result = bench_kernels(swept) if args.mode == "kernels" else bench_serving(out_dir)
    (out_dir / f"lora_{args.mode}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "results"}, indent=2))


if __name__ == "__main__":
    main()
