"""decode_attention (Triton, split-KV) against decode_attention_ref, on the interpreter and CUDA."""


# TRITON_INTERPRET=1 on CPU-only machines is set by tests/conftest.py

import pytest
import torch

from radixgen.kernels.decode_attention import decode_attention, decode_attention_ref
from tests.sm90_compile import PDL_PTX, assert_compile_for_sm90_without_spills


def make_decode_case(*, seq_lens, num_heads, num_kv_heads, head_dim, dtype, device="cpu", seed=0):
    """Random paged KV pool; each request's history sits in scattered slots of a shuffled row."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    num_slots = sum(seq_lens) + 5

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    rows = torch.randperm(batch + 3, generator=gen)[:batch]
    req_to_token = torch.zeros(batch + 3, max(seq_lens) + 2, dtype=torch.int32)
    slots = torch.randperm(num_slots - 1, generator=gen) + 1
    used = 0
    for i, seq_len in enumerate(seq_lens):
        req_to_token[rows[i], :seq_len] = slots[used : used + seq_len].int()
        used += seq_len
    return dict(
        q=randn(batch, num_heads, head_dim),
        k_buffer=randn(num_slots, num_kv_heads, head_dim),
        v_buffer=randn(num_slots, num_kv_heads, head_dim),
        req_to_token=req_to_token.to(device),
        req_pool_indices=rows.to(device),
        seq_lens=torch.tensor(seq_lens).to(device),
        scaling=head_dim**-0.5,
    )


def relative_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


CPU_CASES = [
    # (seq_lens, num_heads, num_kv_heads, head_dim, num_kv_splits)
    ([1, 70, 33], 8, 2, 64, 4),  # GQA 4, a length-1 history, empty splits
    ([100], 4, 4, 128, 3),  # MHA, head_dim 128, splits not a power of two
    ([45, 9], 8, 1, 64, 1),  # MQA (group 8), one split
    ([20, 51], 2, 1, 96, 2),  # head_dim padded to 128
    ([3, 40], 8, 2, 64, 16),  # most splits empty: the in-kernel merge reads only the used ones
]


@pytest.mark.parametrize("seq_lens,num_heads,num_kv_heads,head_dim,num_kv_splits", CPU_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_attention_matches_reference(
    seq_lens, num_heads, num_kv_heads, head_dim, num_kv_splits, dtype
):
    args = make_decode_case(
        seq_lens=seq_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        seed=head_dim + len(seq_lens),
    )
    ref = decode_attention_ref(**args)
    counters = torch.zeros(len(seq_lens) * num_kv_heads, dtype=torch.int32)
    # Merged by a second launch, then in the split kernel by each group's last split program
    # (twice: the counters are left zero for the next call).
    for merge_counters in (None, counters, counters):
        out = torch.full_like(args["q"], float("nan"))  # every element must be written
        decode_attention(
            **args, out=out, num_kv_splits=num_kv_splits, merge_counters=merge_counters
        )
        assert not out.isnan().any()
        assert relative_error(out, ref) < (1e-5 if dtype == torch.float32 else 2e-3)
        assert not counters.any()


def test_decode_attention_reads_only_history():
    """A slot past seq_len must not matter; one inside it must."""
    args = make_decode_case(
        seq_lens=[10], num_heads=2, num_kv_heads=1, head_dim=64, dtype=torch.float32
    )
    row = int(args["req_pool_indices"][0])
    before = decode_attention(**args, num_kv_splits=2)
    args["req_to_token"][row, 10] = int(args["req_to_token"][row, 3])  # beyond the history
    args["v_buffer"][int(args["req_to_token"][row, 11])] += 100.0
    assert torch.equal(decode_attention(**args, num_kv_splits=2), before)
    args["v_buffer"][int(args["req_to_token"][row, 9])] += 10.0  # the current token
    assert (decode_attention(**args, num_kv_splits=2) - before).abs().max() > 1e-2


def test_decode_attention_rejects_bad_inputs():
    args = make_decode_case(seq_lens=[3], num_heads=2, num_kv_heads=1, head_dim=64,
                            dtype=torch.float32)  # fmt: skip
    with pytest.raises(ValueError, match="num_kv_splits"):
        decode_attention(**args, num_kv_splits=64)
    with pytest.raises(ValueError, match="seq_lens"):
        decode_attention(**{**args, "seq_lens": args["seq_lens"].float()})
    with pytest.raises(ValueError, match="k_buffer"):
        decode_attention(**{**args, "k_buffer": args["k_buffer"][:, :, :32]})
    with pytest.raises(ValueError, match="merge_counters"):
        decode_attention(**args, merge_counters=torch.zeros(1, dtype=torch.int64))


def test_split_kernel_compiles_for_sm90_without_spills():
    """The split kernel at Llama-3.1-8B's GQA (4 query heads per KV head, head dim 128), bf16,
    with and without the in-kernel merge, and over an e4m3 pool with fp16 dots (K/V on either
    side of them), through Triton's compiler and ptxas for sm_90."""
    strides = (
        "stride_q_batch",
        "stride_q_head",
        "stride_kb_slot",
        "stride_kb_head",
        "stride_vb_slot",
        "stride_vb_head",
        "stride_req_row",
        "stride_o_batch",
        "stride_o_head",
        "num_kv_splits",
        "min_split_len",
    )
    signature = {
        "q_ptr": "*bf16",
        "k_buffer_ptr": "*bf16",
        "v_buffer_ptr": "*bf16",
        "req_to_token_ptr": "*i32",
        "req_pool_indices_ptr": "*i64",
        "seq_lens_ptr": "*i64",
        "kv_starts_ptr": "*i32",
        "partial_out_ptr": "*fp32",
        "partial_lse_ptr": "*fp32",
        "o_ptr": "*bf16",
        "merge_counters_ptr": "*i32",
        "shared_out_ptr": "*fp32",
        "shared_lse_ptr": "*fp32",
        "entry_offsets_ptr": "*i32",
        "qk_scale": "fp32",
        "v_scale": "fp32",
        **dict.fromkeys(strides, "i32"),
    }
    fp8_pool = {"k_buffer_ptr": "*fp8e4nv", "v_buffer_ptr": "*fp8e4nv"}
    assert_compile_for_sm90_without_spills([
        ("radixgen.kernels.decode_attention", "decode_split_kernel", signature | pool,
         {"HAS_KV_STARTS": shared, "MERGE": merge, "HAS_SHARED": shared, "DOT_FP16": dot_fp16,
          "KV_LHS": kv_lhs,
          "V_FP8_WORDS": v_words, "V_FP8_PTX": True, "GROUP_SIZE": 4, "HEAD_DIM": 128,
          "BLOCK_D": 128, "BLOCK_H": 16, "BLOCK_N": block_n},
         4, options)
        for merge, shared, pool, dot_fp16, kv_lhs, v_words, block_n, options in (
            (False, False, {}, False, False, 0, 64, {}), (True, False, {}, False, False, 0, 64, {}),
            (True, False, fp8_pool, True, False, 0, 64, {}),
            (True, False, fp8_pool, True, True, 0, 64, {}),
            # The FP8 pool's launches of the sweep capped at 128 registers (`max_registers`).
            (True, False, fp8_pool, True, False, 0, 64, {"maxnreg": 128}),
            # V read as words and converted before the dot (`fp8_v_words=True`), so no
            # byte-wide shared-memory loads (64 a thread a tile without it).
            (True, False, fp8_pool, True, False, 1, 64,
             {"maxnreg": 128, "num_stages": 5, "forbid_ptx": ["ld.shared.b8", "ld.shared.u8"]}),
            # Tree attention's suffix pass, which merges the shared entries too.
            (True, True, {}, False, False, 0, 64, {}),
        )
    ] + [  # with programmatic dependent launch (kernels/pdl.py)
        ("radixgen.kernels.decode_attention", "decode_split_kernel", signature,
         {"HAS_KV_STARTS": False, "MERGE": True, "HAS_SHARED": False, "DOT_FP16": False,
          "KV_LHS": False, "V_FP8_WORDS": 0, "V_FP8_PTX": True, "GROUP_SIZE": 4, "HEAD_DIM": 128,
          "BLOCK_D": 128, "BLOCK_H": 16, "BLOCK_N": 64, "USE_PDL": True}, 4, PDL_PTX),
    ] + [  # ... with the first tile's K/V rows asked into L2 before the wait (bf16, FP8)
        ("radixgen.kernels.decode_attention", "decode_split_kernel", signature | pool,
         {"HAS_KV_STARTS": False, "MERGE": True, "HAS_SHARED": False, "DOT_FP16": bool(pool),
          "KV_LHS": False, "V_FP8_WORDS": 0, "V_FP8_PTX": True, "GROUP_SIZE": 4, "HEAD_DIM": 128,
          "BLOCK_D": 128, "BLOCK_H": 16, "BLOCK_N": 64, "USE_PDL": True, "PREFETCH_KV": True},
         4, {"require_ptx": [*PDL_PTX["require_ptx"], "prefetch.global.L2"]})
        for pool in ({}, fp8_pool)
    ] + [  # the FP8 pool's shipped tiles: 32 positions, 2 warps (1 on large grids), 5 stages
        # (compiled uncapped: Triton 3.9 here spills 8 bytes under the shipped 128-register cap
        # at 2 warps, which the H200's Triton 3.6 ran in the twenty-first session's sweep and
        # GPU tests)
        ("radixgen.kernels.decode_attention", "decode_split_kernel", signature | fp8_pool,
         {"HAS_KV_STARTS": False, "MERGE": True, "HAS_SHARED": False, "DOT_FP16": True,
          "KV_LHS": False, "V_FP8_WORDS": 0, "V_FP8_PTX": True, "GROUP_SIZE": 4, "HEAD_DIM": 128,
          "BLOCK_D": 128, "BLOCK_H": 16, "BLOCK_N": 32, "USE_PDL": True},
         num_warps, {"num_stages": 5, **PDL_PTX})
        for num_warps in (2, 1)
    ])  # fmt: skip


@pytest.mark.parametrize(
    "variant",
    [{"kv_lhs": True}, {"max_registers": 128}, {"min_split_len": 64}, {"prefetch_kv": True}],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tuning_variants_match_reference(dtype, variant):
    """K/V as the dots' left operands (transposed scores and output), a register cap (ptxas
    `.maxnreg`, a compile option only), splits of at least 64 positions (fewer of them on
    short histories), the first tile's rows prefetched into L2 (a no-op without PDL): the same
    attention."""
    for seq_lens, num_heads, num_kv_heads, head_dim, num_kv_splits in (CPU_CASES[0], CPU_CASES[3]):
        args = make_decode_case(
            seq_lens=seq_lens,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
        )
        counters = torch.zeros(len(seq_lens) * num_kv_heads, dtype=torch.int32)
        out = decode_attention(
            **args, num_kv_splits=num_kv_splits, merge_counters=counters, **variant
        )
        ref = decode_attention_ref(**args)
        assert relative_error(out, ref) < (1e-5 if dtype == torch.float32 else 2e-3)


def test_min_split_len_puts_a_short_history_in_one_split():
    args = make_decode_case(
        seq_lens=[70, 33], num_heads=8, num_kv_heads=2, head_dim=64, dtype=torch.float32
    )
    partial_out = torch.full((2, 8, 4, 64), float("nan"))
    partial_lse = torch.full((2, 8, 4), float("nan"))
    out = decode_attention(
        **args, num_kv_splits=4, partial_out=partial_out, partial_lse=partial_lse,
        min_split_len=100,
    )  # fmt: skip
    assert relative_error(out, decode_attention_ref(**args)) < 1e-5
    # Splits of 128 positions (100 rounded up to the CPU launch's 32-position tile): only the
    # first split of each request holds positions; the others are empty (lse -inf).
    assert torch.isfinite(partial_lse[:, :, 0]).all()
    assert torch.isneginf(partial_lse[:, :, 1:]).all()
    with pytest.raises(ValueError, match="min_split_len"):
        decode_attention(**args, min_split_len=-1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("head_dim,num_heads,num_kv_heads", [(128, 32, 8), (64, 16, 16)])
def test_decode_attention_cuda_bf16(head_dim, num_heads, num_kv_heads):
    args = make_decode_case(
        seq_lens=[1, 4000, 777, 16384, 64],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=torch.bfloat16,
        device="cuda",
    )
    ref = decode_attention_ref(**args)
    counters = torch.zeros(5 * num_kv_heads, dtype=torch.int32, device="cuda")
    for num_kv_splits in (None, 1, 7, 32):
        for merge_counters, kv_lhs in ((None, False), (counters, False), (counters, True)):
            out = decode_attention(
                **args, num_kv_splits=num_kv_splits, merge_counters=merge_counters, kv_lhs=kv_lhs
            )
            assert relative_error(out, ref) < 1e-2
            assert not counters.any()
            # The first tile's rows asked into L2 before the PDL wait: the same bits.
            prefetched = decode_attention(
                **args, num_kv_splits=num_kv_splits, merge_counters=merge_counters,
                kv_lhs=kv_lhs, prefetch_kv=True,
            )  # fmt: skip
            assert torch.equal(prefetched, out)
