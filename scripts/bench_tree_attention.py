"""Microbenchmark: tree (cascade) decode attention against today's decode kernel (CUDA GPU).

    python scripts/bench_tree_attention.py [--out PATH]
        [--quick | --blocks-sweep | --suffix-sweep | --shared-sweep | --overlap-probe]

Llama-3.1-8B attention shape (32 query heads, 8 KV heads, head_dim 128, bf16 KV). Each case is
`groups` x `per_group` requests sharing a `prefix`-token prefix (one shared segment per group,
scattered slots) plus `suffix` own tokens. Both kernels run on the same inputs; outputs must agree
(relative error < 1e-2, bf16) or the script fails. Times are medians of CUDA-graph replays
(`triton.testing.do_bench_cudagraph`, as the engine runs decode) and of eager launches; the plan
is built once outside the timing (its host cost is reported separately), and each of the tree's
kernels is timed on its own under torch.profiler. "padded": the same grouping in a plan of the
engine's CUDA-graph capacity (`graph_plan_capacity`: batch + ~66 items, mostly padding), as
serving runs it. The main
case is the issue's target (16 x 16, 2048 + 256: >= 4x). A sweep of members_per_item /
chunk_tokens on it (and the shared pass's pipeline stages and warps) shows the tuning margin;
--blocks-sweep, --suffix-sweep and --shared-sweep run only their sweeps (the K/V tiles of both
passes; the suffix pass's own launch; the shared pass's, with and without a software
pipeline); --overlap-probe times each pass alone and both at once on two streams. JSON goes to
--out, or $OUT/bench_tree_attention.json.
"""

from __future__ import annotations

import argparse
import json
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
    graph_plan_capacity,
)

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
DTYPE = torch.bfloat16
KV_BYTES_PER_TOKEN = 2 * NUM_KV_HEADS * HEAD_DIM * DTYPE.itemsize  # one layer, K and V

CASES = [
    # (groups, per_group, prefix, suffix): the target first
    (16, 16, 2048, 256),
    (64, 4, 2048, 128),  # generated-shared-prefix (128-token questions), 256 running
    (16, 16, 2048, 16),  # early in decode: suffix = question only
    (1, 256, 4096, 256),  # one big group (a shared system prompt)
    (128, 2, 512, 256),  # pairs, short prefix: near the break-even
    (256, 1, 0, 2304),  # no sharing: the tree kernel with an empty plan (fallback overhead)
]
QUICK_CASES = CASES[:1]
SWEEP = [
    dict(members_per_item=members, chunk_tokens=chunk, num_stages=stages, num_warps=warps)
    for members in (8, 16, 32)
    for chunk in (512, 1024, 2048)
    for stages in (3, 4)
    for warps in (4,)  # 8 warps lost at every size and chunk in the ninth session's sweep
]
# --blocks-sweep: both passes' K/V tile (block_n) and the shared pass's launch, on the target
# case (default and 1024-token chunks) and on generated-shared-prefix's decode batch
# (64 x 16 sharing 2048 + ~256, batch 1024).
BLOCKS_CASES = [
    ((16, 16, 2048, 256), None),
    ((16, 16, 2048, 256), 1024),
    ((64, 16, 2048, 256), None),
]
BLOCKS_SWEEP = [
    dict(block_n=block_n, num_stages=stages, num_warps=warps)
    for block_n in (64, 128)
    for stages in (2, 3, 4)
    for warps in (4, 8)
]
# --suffix-sweep: the suffix pass's own launch (block_n, warps, stages) at the target case
# (2,048 programs of 256 positions: short loops, where the default's 128-position tiles leave
# one or two programs an SM) and at generated-shared-prefix's decode batch.
SUFFIX_CASES = [(16, 16, 2048, 256), (64, 16, 2048, 256)]
SUFFIX_SWEEP = [
    (block_n, warps, stages)
    for block_n in (32, 64, 128)
    for warps in (2, 4, 8)
    for stages in (1, 2, 3)
]


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


def kernel_times_us(fn, repeats: int = 20) -> dict[str, float]:
    """us per call of each GPU kernel `fn` launches (eager, under torch.profiler): which of
    the tree's passes (shared, suffix, merge) holds the time."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            times[event.name] = times.get(event.name, 0.0) + event.device_time / repeats
    return times


def build_plan(segments, batch: int, **plan_options):
    return build_tree_decode_plan(
        segments,
        batch_size=batch,
        group_size=NUM_HEADS // NUM_KV_HEADS,
        num_kv_heads=NUM_KV_HEADS,
        device=torch.device("cuda"),
        **plan_options,
    )


def allocate_workspace(batch: int, entries: int) -> TreeDecodeWorkspace:
    device = torch.device("cuda")
    return TreeDecodeWorkspace.allocate(
        max_entries=entries,
        batch_size=batch,
        num_heads=NUM_HEADS,
        num_kv_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        num_kv_splits=default_num_kv_splits(batch, NUM_KV_HEADS, device),
        device=device,
    )


def relative_error(out, ref) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def bench_case(
    groups,
    per_group,
    prefix,
    suffix,
    *,
    modes=("graph", "eager"),
    num_stages=None,
    num_warps=None,
    block_n=None,
    suffix_launch=None,
    max_registers=None,
    programs_per_sm=None,
    **plan_options,
) -> dict:
    device = torch.device("cuda")
    args, segments = make_case(groups, per_group, prefix, suffix)
    batch = groups * per_group
    start = time.perf_counter()
    plan_options["programs_per_sm"] = programs_per_sm  # the automatic chunking fills the grid
    plan = build_plan(segments, batch, **plan_options)
    torch.cuda.synchronize()
    plan_build_us = 1e6 * (time.perf_counter() - start)
    max_items, max_entries = graph_plan_capacity(batch, num_kv_heads=NUM_KV_HEADS, device=device)
    padded_plan = build_plan(
        segments, batch, max_items=max_items, max_entries=max_entries, **plan_options
    )

    workspace = allocate_workspace(batch, plan.max_entries)
    padded_workspace = allocate_workspace(batch, max_entries)
    if padded_plan is None:  # a grouping the graph's plan refuses: the engine decodes it plainly
        padded_plan, padded_workspace = plan, workspace
    decode_out = torch.empty_like(args["q"])
    tree_out = torch.empty_like(args["q"])
    launch = dict(
        num_stages=num_stages,
        num_warps=num_warps,
        block_n=block_n,
        suffix_launch=suffix_launch,
        max_registers=max_registers,
        programs_per_sm=programs_per_sm,
    )

    def run_decode():
        decode_attention(**args, out=decode_out)

    def run_tree():
        tree_decode_attention(**args, plan=plan, workspace=workspace, out=tree_out, **launch)

    def run_padded():
        tree_decode_attention(
            **args, plan=padded_plan, workspace=padded_workspace, out=tree_out, **launch
        )

    run_decode()
    for run in (run_padded, run_tree):  # the exact plan's output stays for the error
        run()
        error = relative_error(tree_out, decode_out)
        if not error < 1e-2:
            raise SystemExit(f"tree output differs from decode: relative error {error}")
    result = dict(
        groups=groups,
        per_group=per_group,
        prefix=prefix,
        suffix=suffix,
        batch=batch,
        members_per_item=plan.members_per_item,
        num_items=plan.num_items,
        num_entries=plan.num_entries,
        relative_error=error,
        plan_build_us=plan_build_us,
        decode_kv_mb=batch * (prefix + suffix) * KV_BYTES_PER_TOKEN / 1e6,
        tree_kv_mb=(len(segments) * prefix + batch * suffix) * KV_BYTES_PER_TOKEN / 1e6
        if segments
        else batch * (prefix + suffix) * KV_BYTES_PER_TOKEN / 1e6,
    )
    for mode in modes:
        decode_us = time_us(run_decode, mode == "graph")
        tree_us = time_us(run_tree, mode == "graph")
        result[f"decode_us_{mode}"] = decode_us
        result[f"tree_us_{mode}"] = tree_us
        result[f"speedup_{mode}"] = decode_us / tree_us
    if "graph" in modes:
        result["tree_kernels_us"] = kernel_times_us(run_tree)
        result["tree_us_graph_padded"] = time_us(run_padded, True)
        result["max_items_padded"] = max_items
    # MB / us = TB/s: the bandwidth each kernel achieves on the KV bytes it has to read.
    result["decode_tb_s"] = result["decode_kv_mb"] / result["decode_us_graph"]
    result["tree_tb_s"] = result["tree_kv_mb"] / result["tree_us_graph"]
    return result


def run_cases(cases, results: dict) -> None:
    print(
        f"{'case':>26} {'decode us':>10} {'tree us':>9} {'speedup':>8} {'items':>6} "
        f"{'padded us':>10}"
    )
    for case in cases:
        row = bench_case(*case)
        results["cases"].append(row)
        name = "{groups}x{per_group} {prefix}+{suffix}".format(**row)
        print(
            f"{name:>26} {row['decode_us_graph']:>10.1f} {row['tree_us_graph']:>9.1f} "
            f"{row['speedup_graph']:>7.2f}x {row['num_items']:>6} "
            f"{row['tree_us_graph_padded']:>10.1f}"
        )
        passes = ", ".join(f"{name} {us:.1f}" for name, us in row["tree_kernels_us"].items())
        print(f"{'':>26} tree kernels (eager, us): {passes}")


def run_plan_sweep(results: dict) -> None:
    for tuning in SWEEP:
        row = bench_case(*CASES[0], modes=("graph",), **tuning)
        results["sweep"].append({**row, **tuning})
        print(
            f"   sweep {tuning}: tree {row['tree_us_graph']:.1f} us ({row['speedup_graph']:.2f}x)"
        )


def run_blocks_sweep(results: dict) -> None:
    for case, chunk in BLOCKS_CASES:
        for tuning in BLOCKS_SWEEP:
            row = bench_case(*case, modes=("graph",), chunk_tokens=chunk, **tuning)
            results["sweep"].append({**row, **tuning, "chunk_tokens": chunk})
            print(
                f"   {case} chunk {chunk} {tuning}: tree {row['tree_us_graph']:.1f} us "
                f"({row['speedup_graph']:.2f}x) passes "
                + ", ".join(f"{k[:12]} {v:.1f}" for k, v in row["tree_kernels_us"].items())
            )


# --shared-sweep: the shared pass's launch with the suffix pass at its default. Its default
# (64-position tiles, 3 stages, 4 warps) takes 255 registers and 80.5 KB of shared memory on
# sm_90a: 2 programs an SM, and the pass reads at ~2.9 TB/s (47 us at 16 x 16; the suffix pass
# 3.4-3.8). The fourteenth session's sweep (register caps for 3-4 programs an SM, 32-position
# tiles, 8 warps; docs/benchmarks.md) found nothing better. Why more programs did not help:
# Triton pipelines the gathered loads with the slot ids two iterations ahead and K/V one, and
# waits for every copy at the top of each iteration (sm_90a TTGIR, Triton 3.9 on the CPU
# machine): one 32 KB tile is in flight a program whatever the stages (2-4 measured alike).
# The launches below without a software pipeline (1 stage; 128-position tiles put 64 KB in
# flight) were all slower in the fifteenth session (136.5-206.0 us against 126.2 at 16 x 16):
# kept to re-check the default.
SHARED_CASES = [(16, 16, 2048, 256), (64, 16, 2048, 256)]
SHARED_SWEEP = [
    dict(block_n=64, num_stages=3, num_warps=4),  # the default
    dict(block_n=128, num_stages=1, num_warps=4),
    dict(block_n=128, num_stages=1, num_warps=8),
    dict(block_n=64, num_stages=1, num_warps=4),
    dict(block_n=64, num_stages=1, num_warps=4, max_registers=168, programs_per_sm=3),
]
SUFFIX_DEFAULT_LAUNCH = (128, 4, 3)  # tree_decode_attention's over a 16-bit pool on CUDA


def run_shared_sweep(results: dict) -> None:
    for case in SHARED_CASES:
        for tuning in SHARED_SWEEP:
            try:
                row = bench_case(
                    *case, modes=("graph",), suffix_launch=SUFFIX_DEFAULT_LAUNCH, **tuning
                )
            except Exception as error:  # a launch that does not fit (shared memory)
                print(f"   {case} shared {tuning}: {type(error).__name__}")
                continue
            results["sweep"].append({**row, **tuning})
            shared_us = row["tree_kernels_us"].get("_tree_shared_kernel", float("nan"))
            print(
                f"   {case} shared {tuning}: tree {row['tree_us_graph']:.1f} us "
                f"({row['speedup_graph']:.2f}x), shared pass {shared_us:.1f} us"
            )


def run_suffix_sweep(results: dict) -> None:
    for case in SUFFIX_CASES:
        for launch in SUFFIX_SWEEP:
            try:
                row = bench_case(*case, modes=("graph",), suffix_launch=launch)
            except Exception as error:  # a launch that does not fit (shared memory)
                print(f"   {case} suffix {launch}: {type(error).__name__}")
                continue
            results["sweep"].append({**row, "suffix_launch": launch})
            suffix_us = row["tree_kernels_us"].get("decode_split_kernel", float("nan"))
            print(
                f"   {case} suffix {launch}: tree {row['tree_us_graph']:.1f} us "
                f"({row['speedup_graph']:.2f}x), suffix pass {suffix_us:.1f} us"
            )


# --overlap-probe: each pass alone, and both at once on two streams (the suffix pass unmerged),
# launched in either order: what running them concurrently could gain over one after the other
# (both on two streams, unmerged: 112.8 us against 125.2 us one after the other at 16 x 16; a
# concurrent mode in which both passes counted towards one merge took 127.5-148.5 us, fourteenth
# session, and was removed). Launches (shared memory from Triton's sm_90a compile on the CPU
# machine; an H200 SM has 228 KB): the defaults, where a suffix program (128-position tiles, 3
# stages: 72.5 KB) does not fit beside the two resident shared ones (80.5 KB each), and suffix
# tiles of 64 (38 KB) or 32 positions (21 KB), which do.
OVERLAP_CASES = [(16, 16, 2048, 256), (64, 16, 2048, 256)]
OVERLAP_LAUNCHES = [
    {},
    {"suffix_launch": (64, 4, 2)},
    {"suffix_launch": (32, 4, 2)},
]


def overlap_probe_case(groups: int, per_group: int, prefix: int, suffix: int, launch: dict) -> dict:
    args, segments = make_case(groups, per_group, prefix, suffix)
    batch = groups * per_group
    plan = build_plan(segments, batch)
    workspace = allocate_workspace(batch, plan.max_entries)
    out = torch.empty_like(args["q"])
    side = torch.cuda.Stream()

    def run(passes: str) -> None:
        tree_decode_attention(
            **args, plan=plan, workspace=workspace, out=out, passes=passes, **launch
        )

    def run_two_streams(first: str, second: str) -> None:
        side.wait_stream(torch.cuda.current_stream())
        run(first)
        with torch.cuda.stream(side):
            run(second)
        torch.cuda.current_stream().wait_stream(side)

    row: dict = {"case": (groups, per_group, prefix, suffix), "launch": launch}
    for name, fn in (
        ("both_us", lambda: run("both")),
        ("shared_us", lambda: run("shared")),
        ("suffix_unmerged_us", lambda: run("suffix")),
        ("shared_then_suffix_two_streams_us", lambda: run_two_streams("shared", "suffix")),
        ("suffix_then_shared_two_streams_us", lambda: run_two_streams("suffix", "shared")),
    ):
        fn()
        torch.cuda.synchronize()
        row[name] = time_us(fn, graph=True)
    return row


def run_overlap_probe(results: dict) -> None:
    for case in OVERLAP_CASES:
        for launch in OVERLAP_LAUNCHES:
            row = overlap_probe_case(*case, launch)
            results["overlap"].append(row)
            times = ", ".join(f"{k} {v:.1f}" for k, v in row.items() if k.endswith("_us"))
            print(f"   {case} {launch}: {times}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON path (default $OUT/...)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the target case only, no sweep")
    mode.add_argument(
        "--blocks-sweep", action="store_true", help="only the block_n / stages / warps sweep"
    )
    mode.add_argument(
        "--suffix-sweep", action="store_true", help="only the suffix pass's launch sweep"
    )
    mode.add_argument(
        "--overlap-probe", action="store_true", help="each pass alone and both on two streams"
    )
    mode.add_argument(
        "--shared-sweep", action="store_true", help="only the shared pass's launch sweep"
    )
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
        overlap=[],
    )
    if options.blocks_sweep:
        run_blocks_sweep(results)
    elif options.suffix_sweep:
        run_suffix_sweep(results)
    elif options.overlap_probe:
        run_overlap_probe(results)
    elif options.shared_sweep:
        run_shared_sweep(results)
    elif options.quick:
        run_cases(QUICK_CASES, results)
    else:
        run_cases(CASES, results)
        run_plan_sweep(results)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
