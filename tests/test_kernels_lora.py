"""Batched multi-LoRA (kernels/lora.py, kernels/lora_decode.py): the Triton SGMV and decode
kernels against the torch reference (interpreter: fp32/fp16, small shapes; GPU: bf16 at
Llama-3.1-8B shapes and a CUDA graph), the reference against a per-token loop written from the
definition, and the decode kernels' launch-size table."""

from __future__ import annotations

import pytest
import torch

from radixgen.kernels.lora import lora_apply, lora_apply_ref, lora_apply_sgmv, make_lora_segments
from radixgen.kernels.lora_decode import (
    LoRADecodeConfig,
    load_decode_config_table,
    lora_apply_decode,
    parse_decode_config_table,
    select_decode_config,
)
from tests.sm90_compile import assert_compile_for_sm90_without_spills


def random_pool(num_slots, output_sizes, in_features, max_rank, ranks, dtype, device, seed=0):
    """Stacked buffers with slot i holding a rank-`ranks[i]` adapter (zero-padded)."""
    gen = torch.Generator().manual_seed(seed)
    num_shards = len(output_sizes)
    lora_a = torch.zeros(num_slots, num_shards * max_rank, in_features)
    lora_b = torch.zeros(num_slots, sum(output_sizes), max_rank)
    for slot, rank in enumerate(ranks):
        for shard in range(num_shards):
            lora_a[slot, shard * max_rank : shard * max_rank + rank] = (
                torch.randn(rank, in_features, generator=gen) / in_features**0.5
            )
        lora_b[slot, :, :rank] = torch.randn(sum(output_sizes), rank, generator=gen) / rank**0.5
    scalings = torch.rand(num_slots, generator=gen) + 0.5
    return lora_a.to(dtype).to(device), lora_b.to(dtype).to(device), scalings.to(device)


def per_token_definition(x, y, lora_a, lora_b, scalings, token_slots, output_sizes):
    """y[t] += scaling * B_s (A_s x_t) for each token and shard, by the definition."""
    out = y.clone().double()
    max_rank = lora_b.shape[2]
    for t, slot in enumerate(token_slots.tolist()):
        if slot < 0:
            continue
        offset = 0
        for shard, size in enumerate(output_sizes):
            a = lora_a[slot, shard * max_rank : (shard + 1) * max_rank].double()
            b = lora_b[slot, offset : offset + size].double()
            out[t, offset : offset + size] += scalings[slot].double() * (b @ (a @ x[t].double()))
            offset += size
    return out


CASES = [  # (output_sizes, in_features, max_rank, request_slots, extend_lens)
    ((48,), 40, 8, [0, -1, 1, 1, 2], [5, 3, 17, 2, 1]),  # prefill segments, base in between
    ((32, 16, 16), 64, 16, [2, 0, -1, 1], [1, 1, 1, 1]),  # decode rows, merged qkv
    ((24, 24), 20, 4, [1, 1, 1], [40, 3, 7]),  # long merged segment: 32/64-row tiles
]


@pytest.mark.parametrize("case", CASES)
def test_reference_matches_definition(case):
    output_sizes, in_features, max_rank, slots, lens = case
    lora_a, lora_b, scalings = random_pool(
        3, output_sizes, in_features, max_rank, [max_rank, max_rank // 2, 1], torch.float32, "cpu"
    )
    x = torch.randn(sum(lens), in_features)
    y = torch.randn(sum(lens), sum(output_sizes))
    segments = make_lora_segments(slots, lens, torch.device("cpu"), merge_requests=True)
    expected = per_token_definition(
        x, y, lora_a, lora_b, scalings, segments.token_slots, output_sizes
    )
    out = lora_apply_ref(x, y.clone(), lora_a, lora_b, scalings, segments, output_sizes)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("merge_requests", [True, False])
def test_triton_matches_reference(case, dtype, merge_requests):
    output_sizes, in_features, max_rank, slots, lens = case
    lora_a, lora_b, scalings = random_pool(
        3, output_sizes, in_features, max_rank, [max_rank, max_rank // 2, 1], dtype, "cpu"
    )
    x = torch.randn(sum(lens), in_features).to(dtype)
    y = torch.randn(sum(lens), sum(output_sizes)).to(dtype)
    segments = make_lora_segments(slots, lens, torch.device("cpu"), merge_requests=merge_requests)
    expected = lora_apply_ref(x, y.clone(), lora_a, lora_b, scalings, segments, output_sizes)
    out = lora_apply(x, y.clone(), lora_a, lora_b, scalings, segments, output_sizes)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)
    base_rows = segments.token_slots < 0
    assert torch.equal(out[base_rows], y[base_rows])  # base tokens untouched


def test_sgmv_takes_one_token_segments_too():
    """`lora_apply` sends one-token segments to the decode kernels; SGMV still handles them."""
    output_sizes, in_features, max_rank, slots, lens = CASES[1]
    lora_a, lora_b, scalings = random_pool(
        3, output_sizes, in_features, max_rank, [16, 8, 1], torch.float32, "cpu"
    )
    x, y = torch.randn(4, in_features), torch.randn(4, sum(output_sizes))
    segments = make_lora_segments(slots, lens, torch.device("cpu"), merge_requests=False)
    expected = lora_apply_ref(x, y.clone(), lora_a, lora_b, scalings, segments, output_sizes)
    out = lora_apply_sgmv(x, y.clone(), lora_a, lora_b, scalings, segments, output_sizes)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


DECODE_CONFIGS = [
    None,  # the interpreter's fallback: 2 K splits, 16-wide tiles
    LoRADecodeConfig(split_k=3, block_k=16, shrink_warps=1, block_n=32, expand_warps=1),
    LoRADecodeConfig(split_k=1, block_k=32, shrink_warps=2, block_n=16, expand_warps=2),
    # 10 splits of K=160: the expand sums them in two chunks (8 + 2)
    LoRADecodeConfig(split_k=10, block_k=16, shrink_warps=1, block_n=64, expand_warps=1),
]
DECODE_CASES = [  # (output_sizes, in_features, max_rank, row slots); the pool has 4 slots
    ((32, 16, 16), 64, 16, [2, 0, -1, 1, 0]),  # q/k/v in one launch; slot 3 unused
    # fewer rows than slots (a program per row): a slot two rows share, served once
    ((32, 16, 16), 64, 16, [3, -1, 3]),
    ((24, 40), 40, 4, [-1, 1]),  # the base row first
    ((24, 40), 40, 4, [1, 1, -1, 2, 1, 0, 2]),  # gate/up; shards not multiples of the tile
    ((48,), 150, 8, [0]),  # batch 1; K not a multiple of block_k
    ((16,), 24, 4, [i % 3 - 1 for i in range(70)]),  # ~23 rows per slot: two row groups
    ((16,), 16, 4, [(i // 7) % 4 - 1 for i in range(260)]),  # two 256-row scans
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("config", DECODE_CONFIGS)
@pytest.mark.parametrize("case", DECODE_CASES)
def test_decode_kernels_match_reference(case, config, dtype):
    output_sizes, in_features, max_rank, slots = case
    lora_a, lora_b, scalings = random_pool(
        4, output_sizes, in_features, max_rank, [max_rank, max_rank // 2, 1, 2], dtype, "cpu"
    )
    x = torch.randn(len(slots), in_features).to(dtype)
    y = torch.randn(len(slots), sum(output_sizes)).to(dtype)
    segments = make_lora_segments(
        slots, [1] * len(slots), torch.device("cpu"), merge_requests=False
    )
    expected = lora_apply_ref(x, y.clone(), lora_a, lora_b, scalings, segments, output_sizes)
    out = lora_apply_decode(
        x, y.clone(), lora_a, lora_b, scalings, segments.token_slots, output_sizes, config
    )
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)
    base_rows = segments.token_slots < 0
    assert torch.equal(out[base_rows], y[base_rows])  # base rows untouched


def test_decode_kernels_leave_base_only_batches_alone():
    lora_a, lora_b, scalings = random_pool(2, (8, 8), 16, 4, [4, 4], torch.float32, "cpu")
    y = torch.randn(3, 16)
    slots = torch.full((3,), -1, dtype=torch.int32)
    out = lora_apply_decode(torch.randn(3, 16), y.clone(), lora_a, lora_b, scalings, slots, (8, 8))
    assert torch.equal(out, y)


def test_decode_config_table():
    row = {"split_k": 8, "block_k": 64, "shrink_warps": 4, "block_n": 128, "expand_warps": 4}
    table = parse_decode_config_table(
        {
            "source": "test",
            "shapes": {
                "4096x6144": [dict(row, max_tokens=None), dict(row, max_tokens=1, split_k=16)]
            },
        }
    )
    assert select_decode_config(4096, 6144, 1, True, table).split_k == 16
    assert select_decode_config(4096, 6144, 64, True, table).split_k == 8
    fallback = select_decode_config(14336, 4096, 1, True, table)  # shape not in the table
    assert fallback.split_k == 32 and fallback.block_n == 128
    assert select_decode_config(4096, 6144, 1, False, table).block_n == 16  # interpreter
    with pytest.raises(ValueError, match="fused"):  # the removed one-launch variant's field
        parse_decode_config_table({"shapes": {"8x8": [dict(row, max_tokens=1, fused=True)]}})
    load_decode_config_table.cache_clear()
    assert isinstance(load_decode_config_table(), dict)  # the shipped table parses
    with pytest.raises(ValueError, match="max_tokens"):
        parse_decode_config_table({"shapes": {"4096x6144": [row]}})
    with pytest.raises(ValueError, match="INxOUT"):
        parse_decode_config_table({"shapes": {"4096": [dict(row, max_tokens=None)]}})
    with pytest.raises(ValueError, match="block_n"):
        parse_decode_config_table({"shapes": {"8x8": [dict(row, max_tokens=1, block_n=100)]}})
    with pytest.raises(ValueError, match="keys"):
        parse_decode_config_table({"shapes": {}, "extra": 1})


def test_row_walking_decode_kernels_compile_for_sm90_without_spills():
    """The two-launch decode kernels as batch 1 runs them (a program per row, `BY_ROW`), at the
    H200 table's batch-1 tiles (bf16, rank 16, q/k/v stacked: 48 rank rows)."""
    shrink_sizes = ("T", "K", "RR", "k_per_split", "stride_xt", "stride_a_slot", "stride_ar",
                    "stride_ps", "stride_pt")  # fmt: skip
    shrink = {"x_ptr": "*bf16", "a_ptr": "*bf16", "partial_ptr": "*fp32",
              "token_slot_ptr": "*i32", **dict.fromkeys(shrink_sizes, "i32")}  # fmt: skip
    expand_sizes = ("T", "R", "num_splits", "stride_ps", "stride_pt", "stride_b_slot",
                    "stride_bn", "stride_yt", "size0", "size1", "size2", "blocks0", "blocks1")  # fmt: skip
    expand = {"partial_ptr": "*fp32", "b_ptr": "*bf16", "y_ptr": "*bf16", "scaling_ptr": "*fp32",
              "token_slot_ptr": "*i32", **dict.fromkeys(expand_sizes, "i32")}  # fmt: skip
    assert_compile_for_sm90_without_spills([
        ("radixgen.kernels.lora_decode", "_lora_decode_shrink_kernel", shrink,
         {"SCAN": 16, "BY_ROW": True, "GROUP": 16, "BLOCK_R": 64, "BLOCK_K": 64}, 4),
        ("radixgen.kernels.lora_decode", "_lora_decode_expand_kernel", expand,
         {"SCAN": 16, "BY_ROW": True, "GROUP": 16, "BLOCK_N": 128, "BLOCK_R": 16,
          "SPLIT_CHUNK": 8}, 4),
    ])  # fmt: skip


def test_segments_and_refusals():
    segments = make_lora_segments(
        [1, 1, -1, 1], [2, 3, 1, 1], torch.device("cpu"), merge_requests=True
    )
    assert segments.segment_starts.tolist() == [0, 5, 6]
    assert segments.segment_lens.tolist() == [5, 1, 1]
    assert segments.token_slots.tolist() == [1, 1, 1, 1, 1, -1, 1]
    assert segments.max_segment_len == 5 and segments.slots_present == (1,)
    decode = make_lora_segments([1, 1], [1, 1], torch.device("cpu"), merge_requests=False)
    assert decode.num_segments == 2 and decode.max_segment_len == 1
    lora_a, lora_b, scalings = random_pool(2, (8,), 16, 4, [4, 2], torch.float32, "cpu")
    with pytest.raises(ValueError, match="lora_a"):
        lora_apply(torch.randn(7, 12), torch.zeros(7, 8), lora_a, lora_b, scalings, segments, (8,))
    with pytest.raises(ValueError, match="request_slots"):
        make_lora_segments([1], [1, 2], torch.device("cpu"), merge_requests=True)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,decode", [(1, True), (64, True), (1000, False)])
@pytest.mark.parametrize(
    "output_sizes,in_features",
    [((4096, 1024, 1024), 4096), ((14336, 14336), 4096), ((4096,), 14336)],
)
def test_gpu_llama8b_shapes(num_tokens, decode, output_sizes, in_features):
    device = torch.device("cuda")
    lora_a, lora_b, scalings = random_pool(
        8, output_sizes, in_features, 16, [16] * 8, torch.bfloat16, device
    )
    if decode:
        slots, lens = [i % 8 for i in range(num_tokens)], [1] * num_tokens
    else:
        lens = [125] * 8
        slots = list(range(8))
    x = torch.randn(sum(lens), in_features, device=device, dtype=torch.bfloat16)
    y = torch.randn(sum(lens), sum(output_sizes), device=device, dtype=torch.bfloat16)
    segments = make_lora_segments(slots, lens, device, merge_requests=not decode)
    expected = lora_apply_ref(x, y.clone(), lora_a, lora_b, scalings, segments, output_sizes)
    out = lora_apply(x, y.clone(), lora_a, lora_b, scalings, segments, output_sizes)
    torch.testing.assert_close(out.float(), expected.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [16, 2])  # 2 < 4 slots: a program per row
def test_gpu_decode_cuda_graph_reads_slots_from_tensors(batch):
    device = torch.device("cuda")
    output_sizes, in_features = (4096,), 4096
    lora_a, lora_b, scalings = random_pool(
        4, output_sizes, in_features, 16, [16] * 4, torch.bfloat16, device
    )
    x = torch.randn(batch, in_features, device=device, dtype=torch.bfloat16)
    y0 = torch.randn(batch, 4096, device=device, dtype=torch.bfloat16)
    segments = make_lora_segments([0] * batch, [1] * batch, device, merge_requests=False)
    y = y0.clone()
    lora_apply(x, y, lora_a, lora_b, scalings, segments, output_sizes)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y.copy_(y0)
        lora_apply(x, y, lora_a, lora_b, scalings, segments, output_sizes)
    new_slots = torch.tensor([i % 4 - 1 for i in range(batch)], dtype=torch.int32, device=device)
    segments.segment_slots.copy_(new_slots)
    segments.token_slots.copy_(new_slots)
    graph.replay()
    present = make_lora_segments(new_slots.tolist(), [1] * batch, device, merge_requests=False)
    expected = lora_apply_ref(x, y0.clone(), lora_a, lora_b, scalings, present, output_sizes)
    torch.testing.assert_close(y.float(), expected.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("merge_requests", [False, True])
def test_gpu_segments_built_without_waiting_for_the_device(merge_requests):
    # Built every step on the host while the previous step runs: a copy that synchronizes
    # would expose the host's work (the fifth and sixth sessions' batch-1 LoRA step).
    device = torch.device("cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        segments = make_lora_segments(
            [3, -1, 3, 0], [1, 2, 1, 4], device, merge_requests=merge_requests
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert segments.token_slots.tolist() == [3, -1, -1, 3, 0, 0, 0, 0]
    assert segments.max_segment_len == 4 and segments.slots_present == (0, 3)


@pytest.mark.parametrize("num_segments", [1, 3, 4, 5])
def test_segment_tensors_start_16_byte_aligned(num_segments):
    # Triton compiles a kernel variant per pointer alignment: the packed lists are padded.
    slots = [i % 2 for i in range(num_segments)]
    segments = make_lora_segments(
        slots, [2] * num_segments, torch.device("cpu"), merge_requests=False
    )
    for tensor in (segments.segment_starts, segments.segment_lens, segments.segment_slots):
        assert tensor.data_ptr() % 16 == 0 and tensor.shape == (num_segments,)
    assert segments.segment_lens.tolist() == [2] * num_segments
    assert segments.segment_slots.tolist() == slots
