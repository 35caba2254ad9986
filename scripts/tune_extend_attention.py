"""Tuning sweep of extend_attention against torch SDPA (flash) on one CUDA GPU (the H200).

    python3 scripts/tune_extend_attention.py --out "$OUT"            # sweep (about 3 min)
    python3 scripts/tune_extend_attention.py --out "$OUT" --verify   # the shipped table only

Cases (Llama-3.1-8B attention: 32 q heads, 8 KV heads, head_dim 128, bf16): one causal prefill
of 1k, 2k, 4k and 8k tokens (no prefix), 1k new tokens over a 2k cached prefix (paged, scattered
slots through req_to_token) and a batch of 8 x 1k. Causal FLOPs = 4 * heads * head_dim * visible
(query, key) pairs (n^2 / 2 for a prefill of n).

Every config is first checked against SDPA's output (relative error < 2e-2, bf16) on every
case; configs that fail to compile or to match are recorded and skipped. Compilation runs first
in worker processes that fill Triton's on-disk cache (the configs compile in parallel); the
timed loop then loads the binaries. Configs run in order of prior likelihood and the sweep stops
starting new ones after --budget-s.

Writes to --out: extend_attention_sweep.json (every config, every case) and
extend_attention_configs.json, the launcher's table built from the best configs (copy it over
kernels/extend_attention_configs.json; then run again with --verify).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import math
import multiprocessing
import os
import time
from pathlib import Path

import torch
import triton

from radixgen.kernels.extend_attention import extend_attention
from radixgen.kernels.extend_attention_configs import (
    DEFAULT_TABLE_PATH,
    ExtendAttentionConfig,
    format_config_table,
    parse_config_table,
    select_extend_config,
)

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3.1-8B
DTYPE = torch.bfloat16
DEVICE = "cuda"
MAX_REL_ERR = 2e-2
CONTEXT_ROW = 16384  # req_to_token row length: one value for every case (one specialization)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    prefix_len: int
    extend_len: int
    batch: int = 1

    @property
    def flops(self) -> float:
        pairs = self.extend_len * self.prefix_len + self.extend_len * (self.extend_len + 1) / 2
        return 4 * pairs * NUM_HEADS * HEAD_DIM * self.batch


CASES = (
    Case("causal_1k", 0, 1024),
    Case("causal_2k", 0, 2048),
    Case("causal_4k", 0, 4096),
    Case("causal_8k", 0, 8192),
    Case("prefix_2k_extend_1k", 2048, 1024),
    Case("batch_8x1k", 0, 1024, batch=8),
)
# Table rows: max_extend_len bound -> the cases that choose its config (None: every longer run).
TABLE_ROWS = {
    1024: ("causal_1k", "batch_8x1k", "prefix_2k_extend_1k"),
    2048: ("causal_2k",),
    4096: ("causal_4k",),
    None: ("causal_8k",),
}

# (block_m, block_n, num_warps, num_stages): the space is every combination of BLOCK_M 64/128,
# BLOCK_N 32/64/128, 4/8 warps and 1-4 stages, each without and with TMA, less pipelines that
# overflow the 228 KiB of shared memory. These run first, most promising first (the 2026-11-30
# 8k sweep in docs/benchmarks.md), so that a budget cut drops the unlikely ones.
PRIOR_CONFIGS = (
    (128, 128, 8, 3),
    (64, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 64, 8, 4),
    (64, 64, 4, 4),
    (64, 128, 4, 3),
    (128, 128, 8, 2),
    (64, 128, 4, 2),
    (128, 64, 4, 3),
    (64, 32, 4, 3),
    (64, 32, 4, 4),
)


def device_name() -> str:
    return torch.cuda.get_device_name()


def config_space() -> list[ExtendAttentionConfig]:
    grid = itertools.product((64, 128), (32, 64, 128), (4, 8), (1, 2, 3, 4))
    ordered = list(PRIOR_CONFIGS) + [c for c in grid if c not in PRIOR_CONFIGS]
    space = []
    for block_m, block_n, warps, stages in ordered:
        # K and V tiles per pipeline stage, plus the Q tile.
        shared_bytes = (stages * 2 * block_n + block_m) * HEAD_DIM * DTYPE.itemsize
        if shared_bytes > 228 * 1024:
            continue
        for use_tma in (False, True):
            space.append(ExtendAttentionConfig(block_m, block_n, warps, stages, use_tma))
    return space


def make_inputs(case: Case, seed: int = 0) -> dict:
    """Kernel arguments: packed new tokens; prefixes in scattered pool slots."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device=DEVICE, dtype=DTYPE, generator=gen)

    num_tokens = case.batch * case.extend_len
    num_slots = case.batch * case.prefix_len + 1
    req_to_token = torch.zeros(case.batch, CONTEXT_ROW, device=DEVICE, dtype=torch.int32)
    slots = torch.randperm(num_slots - 1, device=DEVICE, generator=gen).int() + 1
    req_to_token[:, : case.prefix_len] = slots.view(case.batch, case.prefix_len)
    k_buffer = randn(num_slots, NUM_KV_HEADS, HEAD_DIM)
    return dict(
        q=randn(num_tokens, NUM_HEADS, HEAD_DIM),
        k_new=randn(num_tokens, NUM_KV_HEADS, HEAD_DIM),
        v_new=randn(num_tokens, NUM_KV_HEADS, HEAD_DIM),
        k_buffer=k_buffer,
        v_buffer=randn(*k_buffer.shape),
        req_to_token=req_to_token,
        req_pool_indices=torch.arange(case.batch, device=DEVICE),
        prefix_lens=torch.full((case.batch,), case.prefix_len, device=DEVICE),
        extend_lens=torch.full((case.batch,), case.extend_len, device=DEVICE),
        extend_start_loc=torch.arange(case.batch, device=DEVICE) * case.extend_len,
        max_extend_len=case.extend_len,
        scaling=HEAD_DIM**-0.5,
    )


def sdpa_runner(case: Case, args: dict):
    """A zero-argument SDPA call computing the case's attention, and how to unpack its output.

    Prefill cases take the flash path (is_causal); the prefix case needs an explicit mask
    (bottom-right causal), which is not the flash path: its time is informational."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    batch, n = case.batch, case.extend_len
    q = args["q"].view(batch, n, NUM_HEADS, HEAD_DIM).transpose(1, 2)
    k = args["k_new"].view(batch, n, NUM_KV_HEADS, HEAD_DIM).transpose(1, 2)
    v = args["v_new"].view(batch, n, NUM_KV_HEADS, HEAD_DIM).transpose(1, 2)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if case.prefix_len == 0:
        return lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True), batch
    slots = args["req_to_token"][0, : case.prefix_len].long()
    k_prefix = args["k_buffer"][slots].transpose(0, 1)[None]  # [1, kv_heads, prefix, d]
    v_prefix = args["v_buffer"][slots].transpose(0, 1)[None]
    group = NUM_HEADS // NUM_KV_HEADS
    k_all = torch.cat((k_prefix, k), dim=2).repeat_interleave(group, dim=1)
    v_all = torch.cat((v_prefix, v), dim=2).repeat_interleave(group, dim=1)
    key_pos = torch.arange(case.prefix_len + n, device=DEVICE)
    mask = key_pos[None, :] <= case.prefix_len + torch.arange(n, device=DEVICE)[:, None]
    return lambda: sdpa(q, k_all, v_all, attn_mask=mask), batch


def sdpa_output(run, batch: int) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    return run().transpose(1, 2).reshape(-1, NUM_HEADS, HEAD_DIM)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def bench_ms(fn, rep_ms: int) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=rep_ms, return_mode="median")


def _compile_worker(configs: list[dict]) -> int:
    """Runs each config once on the 1k case, filling Triton's disk cache; returns how many ran."""
    case = CASES[0]
    args = make_inputs(case)
    done = 0
    for fields in configs:
        try:
            extend_attention(**args, **fields)
            torch.cuda.synchronize()
            done += 1
        except Exception:  # noqa: BLE001 - the timed loop records the error
            pass
    return done


def precompile(space: list[ExtendAttentionConfig], workers: int, timeout_s: float) -> None:
    """Compiles the configs in parallel processes; every case shares one specialization.

    Past timeout_s the workers are stopped (the pool's exit terminates them): what they
    compiled is in the cache, the rest compiles in the timed loop."""
    if workers <= 1:
        return
    chunks = [[dataclasses.asdict(c) for c in space[i::workers]] for i in range(workers)]
    start = time.perf_counter()
    try:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            compiled = sum(pool.map_async(_compile_worker, chunks).get(timeout=timeout_s))
        elapsed = time.perf_counter() - start
        print(f"# precompiled {compiled}/{len(space)} configs in {elapsed:.0f} s", flush=True)
    except Exception as error:  # noqa: BLE001 - compile inline instead
        print(f"# precompile stopped ({error!r}); compiling in the timed loop", flush=True)


def run_config(config_fields: dict, inputs: dict, references: dict, rep_ms: int) -> dict:
    """Checks one config against SDPA on every case, then times it; status and per-case figures."""
    result: dict = {"cases": {}}
    try:
        for case in CASES:
            out = extend_attention(**inputs[case.name], **config_fields)
            error = relative_error(out, references[case.name])
            if not error < MAX_REL_ERR:  # also catches NaN
                return {**result, "status": "mismatch", "error": f"{case.name}: rel err {error}"}
            result["cases"][case.name] = {"rel_err": error}
    except Exception as error:  # noqa: BLE001 - compile errors, out of resources
        return {**result, "status": "error", "error": f"{type(error).__name__}: {error}"[:400]}
    for case in CASES:
        args = inputs[case.name]
        ms = bench_ms(lambda args=args: extend_attention(**args, **config_fields), rep_ms)
        result["cases"][case.name].update(ms=ms, tflops=case.flops / ms / 1e9)
    return {**result, "status": "ok"}


def best_table(results: list[dict]) -> dict:
    """Per table row, the ok config with the best geometric mean of its cases' TFLOP/s."""
    ok = [r for r in results if r["status"] == "ok"]
    rows = []
    for bound, names in TABLE_ROWS.items():

        def score(r, names=names):
            return sum(math.log(r["cases"][name]["tflops"]) for name in names)

        if ok:
            rows.append({"max_extend_len": bound, **max(ok, key=score)["config"]})
    shipped = json.loads(DEFAULT_TABLE_PATH.read_text())  # other head dims are kept
    return {
        "note": "From scripts/tune_extend_attention.py; copy over "
        "kernels/extend_attention_configs.json.",
        "source": f"{device_name()}, triton {triton.__version__}, "
        f"{datetime.date.today().isoformat()}",
        "head_dim": {**shipped["head_dim"], str(HEAD_DIM): rows},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--budget-s", type=float, default=165.0, help="stop starting configs")
    parser.add_argument("--verify", action="store_true", help="time only the table's configs")
    parser.add_argument("--table", type=Path, default=DEFAULT_TABLE_PATH, help="for --verify")
    parser.add_argument("--compile-workers", type=int, default=min(8, (os.cpu_count() or 2) // 2))
    args = parser.parse_args()
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"# {device_name()}, torch {torch.__version__}, triton {triton.__version__}")

    inputs = {case.name: make_inputs(case, seed=i) for i, case in enumerate(CASES)}
    references, sdpa = {}, {}
    for case in CASES:
        run, batch = sdpa_runner(case, inputs[case.name])
        references[case.name] = sdpa_output(run, batch)
        ms = bench_ms(run, rep_ms=100 if args.verify else 30)
        sdpa[case.name] = {"ms": ms, "tflops": case.flops / ms / 1e9, "flash": case.prefix_len == 0}

    if args.verify:
        table = parse_config_table(json.loads(args.table.read_text()))
        chosen = {
            case.name: select_extend_config(HEAD_DIM, case.extend_len, on_cuda=True, table=table)
            for case in CASES
        }
        results = []
        for case in CASES:
            fields = dataclasses.asdict(chosen[case.name])
            result = run_config(fields, inputs, references, rep_ms=100)
            results.append({"config": fields, "for_case": case.name, **result})
    else:
        space = config_space()
        print(f"# {len(space)} configs; TFLOP/s per case:", *(c.name for c in CASES), flush=True)
        precompile(space, args.compile_workers, timeout_s=0.6 * args.budget_s)
        results = []
        for config in space:
            fields = dataclasses.asdict(config)
            if time.perf_counter() - start > args.budget_s:
                results.append({"config": fields, "status": "skipped_budget", "cases": {}})
                continue
            result = run_config(fields, inputs, references, rep_ms=30)
            results.append({"config": fields, **result})
            figures = " ".join(  # TFLOP/s per case, in CASES order
                f"{v.get('tflops', 0):.0f}" for v in result["cases"].values() if "tflops" in v
            )
            elapsed = time.perf_counter() - start
            print(
                f"[{elapsed:.0f}s] {fields} {result['status']} {figures} {result.get('error', '')}"
            )

    summary = {}
    print("\ncase | SDPA TFLOP/s | ours TFLOP/s | ours / SDPA | config")
    for case in CASES:
        candidates = [
            r
            for r in results
            if r["status"] == "ok" and (not args.verify or r["for_case"] == case.name)
        ]
        if not candidates:
            print(f"{case.name} | {sdpa[case.name]['tflops']:.0f} | - | - | none passed")
            continue
        best = max(candidates, key=lambda r: r["cases"][case.name]["tflops"])
        tflops = best["cases"][case.name]["tflops"]
        ratio = tflops / sdpa[case.name]["tflops"]
        summary[case.name] = {
            "tflops": tflops,
            "sdpa_tflops": sdpa[case.name]["tflops"],
            "ratio_to_sdpa": ratio,
            "config": best["config"],
        }
        print(
            f"{case.name} | {sdpa[case.name]['tflops']:.0f} | {tflops:.0f} | {ratio:.2f} | "
            f"{best['config']}"
        )
    report = {
        "device": device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mode": "verify" if args.verify else "sweep",
        "cases": [{**dataclasses.asdict(c), "flops": c.flops, "sdpa": sdpa[c.name]} for c in CASES],
        "best": summary,
        "results": results,
        "elapsed_s": time.perf_counter() - start,
    }
    (args.out / "extend_attention_sweep.json").write_text(json.dumps(report, indent=1))
    if not args.verify:
        table = best_table(results)
        (args.out / "extend_attention_configs.json").write_text(format_config_table(table))
        print("\n# table rows:", *table["head_dim"][str(HEAD_DIM)], sep="\n")
    print(f"# {report['elapsed_s']:.0f} s; wrote {args.out}/extend_attention_sweep.json")


if __name__ == "__main__":
    main()
