"""Microbenchmark: tree (cascade) decode attention against today's decode kernel (CUDA GPU).

    python scripts/bench_tree_attention.py [--out PATH] [--quick] [--budget-s S]

Llama-3.1-8B attention shape (32 query heads, 8 KV heads, head_dim 128, bf16 KV). Each case is
`groups` x `per_group` requests sharing a `prefix`-token prefix (one shared segment per group,
scattered slots) plus `suffix` own tokens. The tree side is what the engine runs: the planner's
rule (`profitable_segments`) decides whether the batch takes the tree path or the plain kernel
(`path`); where it picks plain, the forced tree time is reported too. Outputs must agree with
the plain kernel's (relative error < 1e-2, bf16) or the script fails. Times are medians of
CUDA-graph replays (`triton.testing.do_bench_cudagraph`, as the engine runs decode) and of eager
launches; the plan is built once outside the timing (its host cost is reported separately).

The sweep (skipped with --quick) times the shared pass's tunables (members_per_item, chunk
tokens, BLOCK_N, warps, stages) on the issue's target (16 x 16, 2048 + 256) and on the
generated-shared-prefix decode batch (64 x 16, 2048 + 256), each config checked against the plain
kernel first; it stops starting configs after --budget-s (default 100 s) and reports the best.
JSON goes to --out, or $OUT/bench_tree_attention.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import triton

from radixgen.kernels.decode_attention import decode_attention, default_num_kv_splits
from radixgen.kernels.tree_decode_attention import tree_decode_attention
from radixgen.kernels.tree_decode_plan import (
    SharedSegment,
    TreeDecodeWorkspace,
    build_tree_decode_plan,
    profitable_segments,
)

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
DTYPE = torch.bfloat16
KV_BYTES_PER_TOKEN = 2 * NUM_KV_HEADS * HEAD_DIM * DTYPE.itemsize  # one layer, K and V

CASES = [
    # (groups, per_group, prefix, suffix): the target first
    (16, 16, 2048, 256),
    (64, 16, 2048, 256),  # generated-shared-prefix's real decode batch: 1024 running
    (64, 4, 2048, 128),
    (16, 16, 2048, 16),  # early in decode: suffix = question only
    (1, 256, 4096, 256),  # one big group (a shared system prompt)
    (128, 2, 512, 256),  # pairs, short prefix: the planner picks the plain kernel
    (256, 1, 0, 2304),  # no sharing: the plain kernel through an empty plan
]
QUICK_CASES = CASES[:2]
SWEEP_CASES = CASES[:2]
DEFAULT_TUNING = dict(members_per_item=16, chunk_tokens=None, block_n=64, num_warps=4, num_stages=3)
# Most promising first: the sweep stops at its time budget.
SWEEP = [
    dict(DEFAULT_TUNING, chunk_tokens=chunk) for chunk in (None, 512, 1024, 2048)
] + [
    dict(members_per_item=members, chunk_tokens=None, block_n=block_n, num_warps=warps,
         num_stages=stages)
    for members in (16, 32, 8)
    for block_n in (64, 32, 128)
    for stages in (3, 4, 2)
    for warps in (4, 8)
    if (members, block_n, stages, warps) != (16, 64, 3, 4)
]  # fmt: skip


def make_case(groups: int, per_group: int, prefix: int, suffix: int, device="cuda", seed=0):
    """Inputs of both kernels and the groups' shared segments (none for groups of one)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    batch = groups * per_group
    seq_len = prefix + suffix
    num_slots = groups * prefix + batch * suffix + 1
    perm = torch.randperm(num_slots - 1, device=device, generator=gen).int() + 1
    req_to_token = torch.zeros(batch, seq_len, dtype=torch.int32, device=device)
    segments = []
    for g in range(groups):
        members = list(range(g * per_group, (g + 1) * per_group))
        if prefix:
            req_to_token[members, :prefix] = perm[g * prefix : (g + 1) * prefix]
        if prefix and per_group > 1:
            segments.append(SharedSegment(members[0], 0, prefix, tuple(members)))
    req_to_token[:, prefix:] = perm[groups * prefix :].view(batch, suffix)
    k_buffer = torch.randn(num_slots, NUM_KV_HEADS, HEAD_DIM, device=device, generator=gen)
    v_buffer = torch.randn(num_slots, NUM_KV_HEADS, HEAD_DIM, device=device, generator=gen)
    args = dict(
        q=torch.randn(batch, NUM_HEADS, HEAD_DIM, device=device, generator=gen).to(DTYPE),
        k_buffer=k_buffer.to(DTYPE),
        v_buffer=v_buffer.to(DTYPE),
        req_to_token=req_to_token,
        req_pool_indices=torch.arange(batch, device=device),
        seq_lens=torch.full((batch,), seq_len, device=device),
        scaling=HEAD_DIM**-0.5,
    )
    return args, segments


def time_us(fn, graph: bool) -> float:
    if graph:
        return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def relative_error(out, ref) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


class Case:
    """One case's inputs, the plain kernel's output and times (measured once)."""

    def __init__(self, groups, per_group, prefix, suffix, modes=("graph", "eager")):
        self.shape = dict(groups=groups, per_group=per_group, prefix=prefix, suffix=suffix)
        self.args, self.segments = make_case(groups, per_group, prefix, suffix)
        self.batch = groups * per_group
        self.decode_out = torch.empty_like(self.args["q"])
        self.run_decode()
        self.decode_us = {mode: time_us(self.run_decode, mode == "graph") for mode in modes}

    def run_decode(self):
        decode_attention(**self.args, out=self.decode_out)

    def tree(self, segments, *, members_per_item=None, chunk_tokens=None, **launch):
        """(run, plan, relative error, plan build us) of the tree kernel over `segments`,
        its output checked."""
        device = self.args["q"].device
        start = time.perf_counter()
        plan = build_tree_decode_plan(
            segments,
            batch_size=self.batch,
            group_size=NUM_HEADS // NUM_KV_HEADS,
            num_kv_heads=NUM_KV_HEADS,
            device=device,
            members_per_item=members_per_item,
            chunk_tokens=chunk_tokens,
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
        build_us = 1e6 * (time.perf_counter() - start)
        workspace = TreeDecodeWorkspace.allocate(
            max_entries=plan.max_entries,
            batch_size=self.batch,
            num_heads=NUM_HEADS,
            head_dim=HEAD_DIM,
            num_kv_splits=default_num_kv_splits(self.batch, NUM_KV_HEADS, device),
            device=device,
        )
        out = torch.empty_like(self.args["q"])

        def run():
            tree_decode_attention(**self.args, plan=plan, workspace=workspace, out=out, **launch)

        run()
        error = relative_error(out, self.decode_out)
        if not error < 1e-2:
            raise SystemExit(f"tree output differs from decode: relative error {error}")
        return run, plan, error, build_us


def bench_case(case: Case, modes=("graph", "eager")) -> dict:
    kept = profitable_segments(case.segments)
    run, plan, error, plan_build_us = case.tree(kept)
    shared_tokens = sum(s.end - s.start for s in kept)
    suffix_tokens = case.batch * (case.shape["prefix"] + case.shape["suffix"]) - sum(
        len(s.members) * (s.end - s.start) for s in kept
    )
    result = dict(
        **case.shape,
        batch=case.batch,
        path="tree" if kept else "plain",
        members_per_item=plan.members_per_item,
        num_items=plan.num_items,
        num_entries=plan.num_entries,
        relative_error=error,
        plan_build_us=plan_build_us,
        decode_kv_mb=case.batch
        * (case.shape["prefix"] + case.shape["suffix"])
        * KV_BYTES_PER_TOKEN
        / 1e6,
        tree_kv_mb=(shared_tokens + suffix_tokens) * KV_BYTES_PER_TOKEN / 1e6,
    )
    for mode in modes:
        tree_us = time_us(run, mode == "graph")
        result[f"decode_us_{mode}"] = case.decode_us[mode]
        result[f"tree_us_{mode}"] = tree_us
        result[f"speedup_{mode}"] = case.decode_us[mode] / tree_us
    if not kept and case.segments:  # what the rule avoided
        forced, _, _, _ = case.tree(case.segments)
        result["forced_tree_us_graph"] = time_us(forced, True)
    # MB / us = TB/s: the bandwidth each kernel achieves on the KV bytes it has to read.
    result["decode_tb_s"] = result["decode_kv_mb"] / result["decode_us_graph"]
    result["tree_tb_s"] = result["tree_kv_mb"] / result["tree_us_graph"]
    return result


def sweep(cases: list[Case], budget_s: float) -> list[dict]:
    """Times each tuning (checked first) on every sweep case until the budget is spent."""
    rows = []
    start = time.perf_counter()
    for tuning in SWEEP:
        if time.perf_counter() - start > budget_s:
            rows.append(dict(tuning, status="skipped_budget"))
            continue
        row = dict(tuning, status="ok")
        for case in cases:
            name = "{groups}x{per_group} {prefix}+{suffix}".format(**case.shape)
            try:
                run, plan, _, _ = case.tree(case.segments, **tuning)
            except Exception as error:  # a config that does not compile (shared memory)
                row.update(status=f"error: {type(error).__name__}: {str(error)[:200]}")
                break
            tree_us = time_us(run, True)
            row[name] = dict(
                tree_us=tree_us, speedup=case.decode_us["graph"] / tree_us, items=plan.num_items
            )
        rows.append(row)
        timings = {k: round(v["tree_us"], 1) for k, v in row.items() if isinstance(v, dict)}
        print(f"   sweep {tuning}: {row['status']} {timings}", flush=True)
    return rows


def best_of(rows: list[dict]) -> dict:
    """The config with the best geometric-mean speedup over the sweep cases."""
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return {}

    def score(row):
        speedups = [v["speedup"] for v in row.values() if isinstance(v, dict)]
        return math.prod(speedups) ** (1 / len(speedups))

    return dict(max(ok, key=score), geomean_speedup=max(score(r) for r in ok))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON path (default $OUT/...)")
    parser.add_argument("--quick", action="store_true", help="the two target cases, no sweep")
    parser.add_argument("--budget-s", type=float, default=100.0, help="sweep time budget")
    options = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    out_path = options.out or os.path.join(os.environ.get("OUT", "."), "bench_tree_attention.json")
    results = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        cases=[],
        sweep=[],
    )
    print(f"{'case':>26} {'path':>6} {'decode us':>10} {'tree us':>9} {'speedup':>8} {'items':>6}")
    cases = {}
    for shape in QUICK_CASES if options.quick else CASES:
        cases[shape] = Case(*shape)
        row = bench_case(cases[shape])
        results["cases"].append(row)
        name = "{groups}x{per_group} {prefix}+{suffix}".format(**row)
        print(
            f"{name:>26} {row['path']:>6} {row['decode_us_graph']:>10.1f} "
            f"{row['tree_us_graph']:>9.1f} {row['speedup_graph']:>7.2f}x {row['num_items']:>6}",
            flush=True,
        )
    if not options.quick:
        results["sweep"] = sweep([cases[s] for s in SWEEP_CASES], options.budget_s)
        results["best"] = best_of(results["sweep"])
        print(f"best: {results['best']}")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
