"""Microbenchmarks of the Triton kernels on a CUDA GPU (run on the H200).

    python scripts/bench_kernels.py [--quick] [--sweep] [--extend] [--fp8-kv-sweep] [--split-sweep]
        [--gather-sweep] [--ncu-decode {bf16,e4m3}]

Prints one table per kernel:
- copy: device-to-device copy bandwidth (bytes read + written / time), the memory ceiling;
- decode: achieved bandwidth of decode_attention (bytes of K/V read / time), Llama-3.1-8B heads
  (32 query, 8 KV, head_dim 128), batch x context grid, history in contiguous slots (and one
  shuffled-slot row: a fragmented pool);
- extend: TFLOP/s of extend_attention for one causal prefill (prefix 0) of 1k..8k tokens, by the
  Triton kernel and by the default (the warp-specialized Gluon kernel on sm_90), and one
  4k-prefix + 4k-extend case (Triton); torch SDPA (flash) beside it for scale;
- vocab mask: apply_token_bitmask_ on 64 rows x 128256 tokens against the torch reference.
`--fp8-kv-sweep` only: decode attention over a bf16 pool against an FP8 e4m3 pool (half the
bytes), the FP8 one at several launch sizes, its dots in bf16 and in fp16, with the K/V tiles on
either side of the dots (`kv_lhs`).
`--gather-sweep` only: the pool's gather alone (no math), TB/s per row length.
`--split-sweep` only: batch-1 / batch-4 decode attention per `min_split_len` (fewer, longer KV
splits on short histories).
`--ncu-decode POOL` only: five launches of decode attention at 256 x 1024 over a bf16 or e4m3
pool (default launch, in-kernel merge, shuffled slots as in a long-running pool), for Nsight
Compute to profile one of (`scripts/h200_pending.sh ncu-decode`).
Times are medians of triton.testing.do_bench.
"""

from __future__ import annotations

import argparse
import functools
import math
import time

import torch
import triton
import triton.language as tl

from radixgen.kernels.decode_attention import decode_attention, default_num_kv_splits
from radixgen.kernels.extend_attention import extend_attention
from radixgen.kernels.extend_attention_hopper import hopper_extend_attention
from radixgen.kernels.vocab_mask import apply_token_bitmask_, apply_token_bitmask_ref_

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3.1-8B
DTYPE = torch.bfloat16


def median_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def bench_copy() -> float:
    src = torch.randn(2**30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / ms / 1e9  # TB/s


def decode_case(batch: int, context: int, shuffled: bool, kv_dtype: torch.dtype = DTYPE):
    num_slots = batch * context + 1
    k_buffer = torch.randn(num_slots, NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    v_buffer = torch.randn_like(k_buffer)
    k_buffer, v_buffer = k_buffer.to(kv_dtype), v_buffer.to(kv_dtype)  # N(0, 1): in FP8's range
    slots = torch.arange(1, num_slots, device="cuda", dtype=torch.int32)
    if shuffled:
        slots = slots[torch.randperm(num_slots - 1, device="cuda")]
    req_to_token = slots.view(batch, context).contiguous()
    return dict(
        q=torch.randn(batch, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE),
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        req_to_token=req_to_token,
        req_pool_indices=torch.arange(batch, device="cuda"),
        seq_lens=torch.full((batch,), context, device="cuda"),
        scaling=HEAD_DIM**-0.5,
    )


def bench_decode(
    batch: int,
    context: int,
    shuffled: bool = False,
    graph: bool = False,
    kv_dtype: torch.dtype = DTYPE,
    **tuning,
) -> tuple[float, float]:
    """(us, TB/s); graph=True times CUDA-graph replays (no launch overhead, as in serving).
    `merge_counters=True` merges the splits in the split kernel (the engine's path)."""
    args = decode_case(batch, context, shuffled, kv_dtype)
    if tuning.pop("merge_counters", False):
        tuning["merge_counters"] = torch.zeros(
            batch * NUM_KV_HEADS, dtype=torch.int32, device="cuda"
        )

    def run():
        return decode_attention(**args, **tuning)

    if graph:
        ms = triton.testing.do_bench_cudagraph(run, rep=100, return_mode="median")
    else:
        ms = median_ms(run)
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * kv_dtype.itemsize
    return ms * 1e3, kv_bytes / ms / 1e9  # us, TB/s


def sweep_fp8_kv_decode() -> None:
    """Decode attention over an e4m3 pool (fp16 dots, K/V on the dots' right: the shipped
    path) against a bf16 pool, per launch size, register cap (`max_registers`, 0 for none) and
    V path (`fp8_v_words`: V read as 32-bit words and converted before the dot, or, the
    default, converted after its load, which reads V from shared memory one byte at a time). Graph replays with the in-kernel merge (the engine's path); TB/s of each
    pool's own bytes. (The eighth session measured bf16 dots and `kv_lhs` slower; the ninth
    made 64 / 4 warps / 5 stages at 128 registers the default: docs/benchmarks.md.)"""
    fp8 = torch.float8_e4m3fn
    print("batch x context | pool | block_n warps stages | max registers | V words | us | TB/s")
    # The byte-load path (V words off, the default) at shorter tiles and deeper pipelines: the
    # pool's gather alone reads 128-byte rows fastest at 16 / 4 warps / 5 stages (4.22 TB/s,
    # `--gather-sweep`, seventeenth session), and the split kernel's tiles were swept at 64.
    configs = (
        (None, None, None, None, True), (None, None, None, None, False),
        # The shipped 32 / 2 warps / 5 stages' neighbours (the twenty-first session's first
        # sweep: 183.9 us at 256 x 1024 against 199.2 at 64 / 4 / 5; slower there and dropped:
        # 16-position tiles of 4 warps, 64 / 8 / 4, 128 / 8 / 3, 32 / 4 / 4 at 96 registers)
        (32, 2, 5, 0, False), (32, 2, 4, 128, False), (32, 2, 6, 128, False),
        (64, 2, 5, 128, False), (32, 1, 5, 128, False),
        # V read as words in 2-warp programs: Nsight Compute (twenty-second session) has the
        # shipped launch issue-bound (58% of issue slots, DRAM 59%), and its V path is 64
        # byte-wide shared loads plus their packing a thread a tile (Triton 3.9's PTX: 596
        # instructions a tile with byte loads, 403 with words)
        (32, 2, 5, 128, True), (32, 2, 5, 0, True), (32, 2, 4, 128, True),
        (32, 2, 6, 128, True), (64, 2, 5, 128, True), (16, 2, 6, 128, True),
    )  # fmt: skip
    for batch, context in ((256, 1024), (64, 4096), (1, 4096)):
        case = f"{batch} x {context}"
        us, tbs = bench_decode(batch, context, graph=True, merge_counters=True)
        print(f"{case} | bf16 | default | - | - | {us:.1f} | {tbs:.2f}")
        for block_n, num_warps, num_stages, max_registers, v_words in (
            configs if batch > 1 else configs[:2]
        ):
            launch = "default" if block_n is None else f"{block_n} {num_warps} {num_stages}"
            cap = "default" if max_registers is None else max_registers or "-"
            try:
                us, tbs = bench_decode(
                    batch, context, graph=True, kv_dtype=fp8, merge_counters=True,
                    block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                    max_registers=max_registers, fp8_v_words=v_words,
                )  # fmt: skip
            except Exception as error:  # noqa: BLE001 (a launch size past shared memory)
                print(f"{case} | e4m3 | {launch} | {cap} | {v_words} | failed: {error}")
                continue
            print(f"{case} | e4m3 | {launch} | {cap} | {v_words} | {us:.1f} | {tbs:.2f}")


def ncu_decode(pool: str, batch: int = 256, context: int = 1024) -> None:
    """Launches for a profiler: the first compiles, the rest run as the engine's would."""
    kv_dtype = torch.float8_e4m3fn if pool == "e4m3" else DTYPE
    args = decode_case(batch, context, shuffled=True, kv_dtype=kv_dtype)
    counters = torch.zeros(batch * NUM_KV_HEADS, dtype=torch.int32, device="cuda")
    for _ in range(5):
        decode_attention(**args, merge_counters=counters)
    torch.cuda.synchronize()
    print(f"ncu-decode: {pool} pool, {batch} x {context}, 5 launches")


@triton.jit
def _gather_rows_kernel(
    pool_ptr,  # [num_slots, slot_words] int32
    req_to_token_ptr,  # [batch, context] int32
    out_ptr,  # [batch, parts] int32
    context,
    slot_words,
    ROW_WORDS: tl.constexpr,  # the words each program reads of a slot
    BLOCK_N: tl.constexpr,
):
    """Reads words [part * ROW_WORDS, (part + 1) * ROW_WORDS) of each of a request's slots (as
    decode attention reads one KV head's rows): the gather alone, no math."""
    req = tl.program_id(0)
    part = tl.program_id(1)
    offs_n = tl.arange(0, BLOCK_N)
    offs_w = tl.arange(0, ROW_WORDS)
    acc = tl.zeros([BLOCK_N, ROW_WORDS], dtype=tl.int32)
    for n in range(0, context, BLOCK_N):
        slots = tl.load(req_to_token_ptr + req * context + n + offs_n).to(tl.int64)
        acc += tl.load(pool_ptr + slots[:, None] * slot_words + part * ROW_WORDS + offs_w[None, :])
    tl.store(out_ptr + req * tl.num_programs(1) + part, tl.sum(tl.sum(acc, 1), 0))


def sweep_gather() -> None:
    """Read bandwidth of the pool's gather alone, per row length: a slot of 1,024 bytes (8 KV
    heads x 128 e4m3 bytes) or 2,048 (bf16) read in rows of 128-1,024 bytes by
    `slot bytes / row bytes` programs per request, 256 requests x 1,024 slots, contiguous or
    shuffled; CUDA-graph replays."""
    print("slot bytes | row bytes | slots | block_n warps stages | us | TB/s")
    batch, context = 256, 1024
    for slot_bytes in (1024, 2048):
        pool = torch.randint(0, 1000, (batch * context + 1, slot_bytes // 4), device="cuda",
                             dtype=torch.int32)  # fmt: skip
        for shuffled in (False, True):
            slots = torch.arange(1, batch * context + 1, device="cuda", dtype=torch.int32)
            if shuffled:
                slots = slots[torch.randperm(slots.numel(), device="cuda")]
            req_to_token = slots.view(batch, context).contiguous()
            for row_bytes in (128, 256, 512, 1024):
                parts = slot_bytes // row_bytes
                out = torch.empty(batch, parts, device="cuda", dtype=torch.int32)
                for block_n, warps, stages in ((64, 4, 3), (32, 4, 4), (64, 8, 3), (16, 4, 5)):
                    if block_n * row_bytes > 64 * 1024:
                        continue
                    run = functools.partial(
                        _gather_rows_kernel[(batch, parts)], pool, req_to_token, out, context,
                        slot_bytes // 4, ROW_WORDS=row_bytes // 4, BLOCK_N=block_n,
                        num_warps=warps, num_stages=stages,
                    )  # fmt: skip
                    ms = triton.testing.do_bench_cudagraph(run, rep=100, return_mode="median")
                    tbs = batch * context * slot_bytes / ms / 1e9
                    print(f"{slot_bytes} | {row_bytes} | {'shuffled' if shuffled else 'contiguous'}"
                          f" | {block_n} {warps} {stages} | {ms * 1e3:.1f} | {tbs:.2f}")  # fmt: skip


def sweep_min_split_len() -> None:
    """Batch-1 and batch-4 decode attention (bf16 pool, CUDA-graph replays with the in-kernel
    merge, the engine's path) per `min_split_len`: the default splits a short history into
    64-position pieces over up to 32 splits, then merges them through a counter; fewer, longer
    splits shorten that chain (one split merges from registers). The fifteenth session's
    batch-1 step spent 7 us a layer in the split kernel at 128-384 positions. `prefetch` rows:
    the default splits with each split's first tile asked into L2 before the PDL wait
    (`prefetch_kv`; back-to-back replays of one kernel stand in for the rotary kernel before
    it), bf16 and e4m3 pools."""
    print("batch x context | min_split_len | us")
    for batch in (1, 4):
        for context in (128, 256, 512, 1024, 4096):
            for min_split_len in (0, 128, 256, 512, 1024):
                us, _ = bench_decode(
                    batch, context, graph=True, merge_counters=True, min_split_len=min_split_len
                )
                print(f"{batch} x {context} | {min_split_len} | {us:.1f}")
            for kv_dtype in (DTYPE, torch.float8_e4m3fn):
                plain, _ = bench_decode(batch, context, graph=True, merge_counters=True,
                                        kv_dtype=kv_dtype)  # fmt: skip
                prefetched, _ = bench_decode(batch, context, graph=True, merge_counters=True,
                                             kv_dtype=kv_dtype, prefetch_kv=True)  # fmt: skip
                print(f"{batch} x {context} | prefetch {str(kv_dtype)[6:]} | {plain:.1f} -> "
                      f"{prefetched:.1f}")  # fmt: skip


def extend_case(prefix_len: int, extend_len: int):
    num_slots = prefix_len + 1
    k_buffer = torch.randn(num_slots, NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    req_to_token = torch.arange(1, num_slots + extend_len, device="cuda", dtype=torch.int32)[None]

    def randn(heads):
        return torch.randn(extend_len, heads, HEAD_DIM, device="cuda", dtype=DTYPE)

    return dict(
        q=randn(NUM_HEADS),
        k_new=randn(NUM_KV_HEADS),
        v_new=randn(NUM_KV_HEADS),
        k_buffer=k_buffer,
        v_buffer=torch.randn_like(k_buffer),
        req_to_token=req_to_token,
        req_pool_indices=torch.zeros(1, device="cuda", dtype=torch.int64),
        prefix_lens=torch.tensor([prefix_len], device="cuda"),
        extend_lens=torch.tensor([extend_len], device="cuda"),
        extend_start_loc=torch.zeros(1, device="cuda", dtype=torch.int64),
        max_extend_len=extend_len,
        scaling=HEAD_DIM**-0.5,
    )


def extend_flops(prefix_len: int, extend_len: int) -> float:
    # Two matmuls (QK^T, PV), 2 flops per multiply-add, over the visible (causal) pairs.
    pairs = extend_len * prefix_len + extend_len * (extend_len + 1) / 2
    return 4 * pairs * NUM_HEADS * HEAD_DIM


def bench_extend(prefix_len: int, extend_len: int, **tuning) -> tuple[float, float]:
    args = extend_case(prefix_len, extend_len)
    ms = median_ms(lambda: extend_attention(**args, **tuning))
    return ms * 1e3, extend_flops(prefix_len, extend_len) / ms / 1e9  # us, TFLOP/s


def bench_vocab_mask(batch: int = 64, vocab: int = 128256) -> tuple[float, float]:
    logits = torch.randn(batch, vocab, device="cuda", dtype=torch.float32)
    words = math.ceil(vocab / 32)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (batch, words), device="cuda", dtype=torch.int32)
    rows = torch.arange(batch, device="cuda")
    triton_ms = median_ms(lambda: apply_token_bitmask_(logits, bitmask, rows))
    ref_ms = median_ms(lambda: apply_token_bitmask_ref_(logits, bitmask, rows))
    return triton_ms * 1e3, ref_ms * 1e3


def graph_ms(fn) -> float:
    """Median ms of fn replayed in a CUDA graph: the kernel without the host's launch work."""
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def host_us(fn, calls: int = 200) -> float:
    """Wall us a call of a launch too small to keep the GPU busy: the host's share."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def extend_calls(batch: int, extend_len: int) -> dict:
    """Triton, Gluon and SDPA on `batch` prompts of `extend_len` (no prefix), as closures."""
    one = extend_case(0, extend_len)
    q, k, v = (one[name].repeat(batch, 1, 1) for name in ("q", "k_new", "v_new"))
    args = dict(
        one,
        q=q,
        k_new=k,
        v_new=v,
        req_pool_indices=torch.zeros(batch, device="cuda", dtype=torch.int64),
        prefix_lens=torch.zeros(batch, device="cuda", dtype=torch.int64),
        extend_lens=torch.full((batch,), extend_len, device="cuda"),
        extend_start_loc=torch.arange(batch, device="cuda") * extend_len,
    )
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q4, k4, v4 = (x.view(batch, extend_len, -1, HEAD_DIM).transpose(1, 2) for x in (q, k, v))
    return dict(
        triton=lambda: extend_attention(**args, kernel="triton"),
        # The default on sm_90 from MIN_EXTEND_LEN tokens; forced, so shorter rows time it too.
        gluon=lambda: extend_attention(**args, max_prefix_len=0, kernel="hopper"),
        sdpa=lambda: sdpa(q4, k4, v4, is_causal=True, enable_gqa=True),
        args=args,
    )


def hopper_variant(args: dict, extend_len: int, out, consumers, num_stages, persistent, pingpong):
    return lambda: hopper_extend_attention(
        args["q"], args["k_new"], args["v_new"], args["extend_lens"], args["extend_start_loc"],
        extend_len, HEAD_DIM**-0.5, out, consumers=consumers, num_stages=num_stages,
        persistent=persistent, pingpong=pingpong,
    )  # fmt: skip


def print_extend_table(quick: bool, pingpong: bool = True) -> None:
    """Causal prefills, Triton / Gluon / SDPA, timed eagerly (host launch work included, as the
    engine runs prefill) and in CUDA graph replay (the kernels alone); then the Gluon kernel's
    launch variants in graph replay (the ping-pong ones only where `pingpong`), and the host's
    us a launch."""
    warm = extend_calls(1, 8192)
    for name in ("triton", "gluon", "sdpa"):
        median_ms(warm[name])  # clocks up, kernels compiled before the first timed row
    print("\n## extend attention (causal prefill, 32/8 heads, d=128, bf16), TFLOP/s")
    print("batch x extend | Triton | Gluon | SDPA | Gluon / SDPA | graph: Triton | Gluon | SDPA "
          "| Gluon / SDPA")  # fmt: skip
    cases = ((1, 1024), (1, 2048), (1, 4096), (1, 8192), (8, 1024))
    for batch, extend_len in cases if not quick else ((1, 8192),):
        calls = extend_calls(batch, extend_len)
        flops = batch * extend_flops(0, extend_len) / 1e9
        eager = [flops / median_ms(calls[name]) for name in ("triton", "gluon", "sdpa")]
        graph = [flops / graph_ms(calls[name]) for name in ("triton", "gluon", "sdpa")]
        print(f"{batch} x {extend_len} | " + " | ".join(f"{t:.0f}" for t in eager)
              + f" | {eager[1] / eager[2]:.2f}x | " + " | ".join(f"{t:.0f}" for t in graph)
              + f" | {graph[1] / graph[2]:.2f}x")  # fmt: skip
    us, tflops = bench_extend(4096, 4096)
    print(f"prefix 4096 + extend 4096 (Triton) | {us:.1f} us | {tflops:.0f} TFLOP/s")
    if quick:
        return
    variants = [(1, 3, True, False), (2, 2, True, False), (2, 3, False, False)]
    variants += [(2, 3, True, False), (2, 2, True, True), (2, 3, False, True), (2, 3, True, True)]
    variants = [v for v in variants if pingpong or not v[3]]
    print("\n### the Gluon kernel's launch variants in graph replay (consumers, stages, "
          "p: persistent grid, pp: ping-pong on named barriers), TFLOP/s")  # fmt: skip
    names = [f"c{c} s{st}{' p' * p}{' pp' * pp}" for c, st, p, pp in variants]
    print("batch x extend | " + " | ".join(names))
    for batch, extend_len in cases:
        a = extend_calls(batch, extend_len)["args"]
        out = torch.empty_like(a["q"])
        flops = batch * extend_flops(0, extend_len) / 1e9
        row = [flops / graph_ms(hopper_variant(a, extend_len, out, *v)) for v in variants]
        print(f"{batch} x {extend_len} | " + " | ".join(f"{t:.0f}" for t in row))
    small = extend_calls(1, 128)
    print("\nhost us a launch (128 tokens): " + ", ".join(
        f"{name} {host_us(small[name]):.1f}" for name in ("triton", "gluon", "sdpa")))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes")
    parser.add_argument("--sweep", action="store_true", help="also sweep tuning parameters")
    parser.add_argument("--extend", action="store_true", help="only the extend attention table")
    parser.add_argument(
        "--no-pingpong",
        action="store_true",
        help="leave the ping-pong launches out of the extend table (a guard run hung or failed)",
    )
    parser.add_argument("--fp8-kv-sweep", action="store_true", help="only the FP8-pool sweep")
    parser.add_argument(
        "--split-sweep", action="store_true", help="only the min_split_len sweep at batch 1 / 4"
    )
    parser.add_argument(
        "--gather-sweep",
        action="store_true",
        help="only the pool gather's bandwidth per row length",
    )
    parser.add_argument(
        "--ncu-decode",
        choices=("bf16", "e4m3"),
        help="only five decode-attention launches over this pool, for Nsight Compute",
    )
    args = parser.parse_args()
    if args.ncu_decode:
        ncu_decode(args.ncu_decode)
        return
    device = torch.cuda.get_device_name()
    print(f"# device: {device}, torch {torch.__version__}, triton {triton.__version__}")
    if args.gather_sweep:
        sweep_gather()
        return
    if args.fp8_kv_sweep:
        sweep_fp8_kv_decode()
        return
    if args.split_sweep:
        sweep_min_split_len()
        return
    if args.extend:
        print_extend_table(args.quick, pingpong=not args.no_pingpong)
        return
    copy_tbs = bench_copy()
    print(f"copy bandwidth: {copy_tbs:.2f} TB/s (read + write)")

    print("\n## decode attention (32 q / 8 kv heads, d=128, bf16): us, TB/s of K/V read")
    batches = (1, 16, 64, 256) if not args.quick else (1, 64)
    contexts = (1024, 4096, 16384) if not args.quick else (4096,)
    print(
        "batch | context | splits | us | TB/s | % of 4.3 TB/s | graph us | graph TB/s "
        "| graph us, merged in-kernel"
    )
    for batch in batches:
        for context in contexts:
            splits = default_num_kv_splits(batch, NUM_KV_HEADS, torch.device("cuda"))
            us, tbs = bench_decode(batch, context)
            graph_us, graph_tbs = bench_decode(batch, context, graph=True)
            merged_us, _ = bench_decode(batch, context, graph=True, merge_counters=True)
            print(
                f"{batch} | {context} | {splits} | {us:.1f} | {tbs:.2f} | {100 * tbs / 4.3:.0f}% "
                f"| {graph_us:.1f} | {graph_tbs:.2f} | {merged_us:.1f}"
            )
    us, tbs = bench_decode(64, 4096, shuffled=True)
    print(f"64 | 4096 shuffled slots | - | {us:.1f} | {tbs:.2f} | {100 * tbs / 4.3:.0f}%")

    if args.sweep:
        print("\n### decode sweep: block_n, warps, stages, splits")
        for batch, context in ((64, 4096), (1, 16384)):
            for block_n, num_warps, num_stages, splits in (
                (32, 4, 2, None), (64, 4, 2, None), (64, 8, 3, None), (128, 4, 3, None),
                (128, 8, 3, None), (64, 4, 3, 1), (64, 4, 3, 2), (64, 4, 3, 8), (64, 4, 3, 16),
            ):  # fmt: skip
                us, tbs = bench_decode(
                    batch, context, block_n=block_n, num_warps=num_warps,
                    num_stages=num_stages, num_kv_splits=splits,
                )  # fmt: skip
                print(f"{batch}x{context} n{block_n} w{num_warps} s{num_stages} "
                      f"splits {splits}: {us:.1f} us {tbs:.2f} TB/s")  # fmt: skip

    print_extend_table(args.quick)

    if args.sweep:
        print("\n### extend sweep at 8192 causal: block_m, block_n, warps, stages")
        for block_m, block_n, num_warps, num_stages in (
            (128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 3), (128, 128, 8, 2),
            (64, 64, 4, 3), (128, 32, 4, 3), (64, 128, 4, 3), (128, 64, 8, 4),
        ):  # fmt: skip
            try:
                us, tflops = bench_extend(
                    0, 8192, block_m=block_m, block_n=block_n, num_warps=num_warps,
                    num_stages=num_stages,
                )  # fmt: skip
                print(f"m{block_m} n{block_n} w{num_warps} s{num_stages}: {tflops:.0f} TFLOP/s")
            except Exception as error:  # out of shared memory for a config: report, go on
                print(f"m{block_m} n{block_n} w{num_warps} s{num_stages}: failed {error!r:.80}")

    triton_us, ref_us = bench_vocab_mask()
    print("\n## vocab mask (64 rows x 128256, fp32 logits)")
    print(f"triton {triton_us:.1f} us | torch reference {ref_us:.1f} us")


if __name__ == "__main__":
    main()
