"""extend_attention (Triton) against extend_attention_ref, on the CPU interpreter and on CUDA."""


# TRITON_INTERPRET=1 on CPU-only machines is set by tests/conftest.py

import json

import pytest
import torch

from radixgen.kernels.extend_attention import extend_attention, extend_attention_ref
from radixgen.kernels.extend_attention_configs import (
    DEFAULT_TABLE_PATH,
    ExtendAttentionConfig,
    extend_lengths_per_config,
    format_config_table,
    load_config_table,
    parse_config_table,
    select_extend_config,
)


def make_extend_case(
    *,
    prefix_lens,
    extend_lens,
    num_heads,
    num_kv_heads,
    head_dim,
    dtype,
    device="cpu",
    seed=0,
):
    """Random paged KV pool with scattered prefix slots, and packed new tokens."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(prefix_lens)
    num_tokens = sum(extend_lens)
    max_ctx = max(p + e for p, e in zip(prefix_lens, extend_lens, strict=True)) + 3
    num_slots = sum(prefix_lens) + 8

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    q = randn(num_tokens, num_heads, head_dim)
    k_new = randn(num_tokens, num_kv_heads, head_dim)
    v_new = randn(num_tokens, num_kv_heads, head_dim)
    k_buffer = randn(num_slots, num_kv_heads, head_dim)
    v_buffer = randn(num_slots, num_kv_heads, head_dim)
    # Rows in a shuffled order, slots scattered over the pool (slot 0 never used).
    rows = torch.randperm(batch + 2, generator=gen)[:batch]
    req_to_token = torch.zeros(batch + 2, max_ctx, dtype=torch.int32)
    slots = torch.randperm(num_slots - 1, generator=gen) + 1
    used = 0
    for i, prefix_len in enumerate(prefix_lens):
        req_to_token[rows[i], :prefix_len] = slots[used : used + prefix_len].int()
        used += prefix_len
    starts = torch.tensor([0, *extend_lens[:-1]]).cumsum(0)
    args = dict(
        q=q,
        k_new=k_new,
        v_new=v_new,
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        req_to_token=req_to_token.to(device),
        req_pool_indices=rows.to(device),
        prefix_lens=torch.tensor(prefix_lens).to(device),
        extend_lens=torch.tensor(extend_lens).to(device),
        extend_start_loc=starts.to(device),
        max_extend_len=max(extend_lens),
        scaling=head_dim**-0.5,
    )
    return args


def relative_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


CPU_CASES = [
    # (prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim)
    ([0], [37], 2, 1, 64),  # plain causal prefill, ragged against the block
    ([5, 0, 40], [3, 33, 1], 4, 2, 64),  # ragged prefixes and extends, one prefix 0
    ([17, 64], [20, 9], 4, 4, 128),  # MHA, head_dim 128
    ([9], [12], 2, 1, 96),  # head_dim padded to 128
]


@pytest.mark.parametrize("prefix_lens,extend_lens,num_heads,num_kv_heads,head_dim", CPU_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_extend_attention_matches_reference(
    prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype
):
    args = make_extend_case(
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        seed=len(prefix_lens) + head_dim,
    )
    out = torch.full_like(args["q"], float("nan"))  # every element must be written
    extend_attention(**args, out=out)
    ref = extend_attention_ref(**args)
    assert not out.isnan().any()
    assert relative_error(out, ref) < (1e-5 if dtype == torch.float32 else 2e-3)


# Every structural variant the tuning sweep explores: BLOCK_N below, equal to and above BLOCK_M
# (the unmasked loop must stop at a BLOCK_N boundary at or before the query block), and the
# new tokens' K/V through TMA descriptors (the interpreter emulates them).
VARIANTS = [
    dict(block_m=16, block_n=32, use_tma=False),
    dict(block_m=32, block_n=16, use_tma=False),
    dict(block_m=16, block_n=16, use_tma=True),
    dict(block_m=16, block_n=32, use_tma=True),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_extend_attention_variants_match_reference(variant, dtype):
    # Prefixes with full chunks and a tail, a prefix of exactly one chunk, none; extends past
    # several query blocks and shorter than one.
    args = make_extend_case(
        prefix_lens=[40, 0, 32], extend_lens=[45, 70, 5], num_heads=4, num_kv_heads=2,
        head_dim=64, dtype=dtype, seed=7,
    )  # fmt: skip
    out = torch.full_like(args["q"], float("nan"))
    extend_attention(**args, out=out, **variant)
    assert relative_error(out, extend_attention_ref(**args)) < (
        1e-5 if dtype == torch.float32 else 2e-3
    )


def test_extend_attention_tma_falls_back_where_unaddressable():
    """head_dim 96 (padded tile) and a k_new whose heads are not packed take pointer loads."""
    args = make_extend_case(
        prefix_lens=[3], extend_lens=[40], num_heads=2, num_kv_heads=1, head_dim=96,
        dtype=torch.float32,
    )  # fmt: skip
    out = extend_attention(**args, block_m=16, block_n=16, use_tma=True)
    assert relative_error(out, extend_attention_ref(**args)) < 1e-5
    args = make_extend_case(
        prefix_lens=[3], extend_lens=[40], num_heads=4, num_kv_heads=2, head_dim=64,
        dtype=torch.float32,
    )  # fmt: skip
    args["k_new"] = torch.randn(40, 2, 128)[..., :64]  # heads 128 apart: no 2-D TMA view
    out = extend_attention(**args, block_m=16, block_n=16, use_tma=True)
    assert relative_error(out, extend_attention_ref(**args)) < 1e-5


def test_config_table_selects_by_length_and_head_dim():
    small, large = ExtendAttentionConfig(64, 64, 4, 3), ExtendAttentionConfig(128, 128, 8, 3, True)
    table = parse_config_table(
        {"head_dim": {"128": [large.to_row(None), small.to_row(2048)]}}
    )  # rows in any order: sorted by bound, None last
    assert select_extend_config(128, 1, on_cuda=True, table=table) == small
    assert select_extend_config(128, 2048, on_cuda=True, table=table) == small
    assert select_extend_config(128, 2049, on_cuda=True, table=table) == large
    assert select_extend_config(64, 2048, on_cuda=True, table=table).block_m == 128  # fallback
    assert select_extend_config(128, 2048, on_cuda=False, table=table).block_m == 32  # interpreter
    shipped = load_config_table(DEFAULT_TABLE_PATH)
    assert shipped[128][-1][0] is None  # the shipped table covers every length
    data = json.loads(DEFAULT_TABLE_PATH.read_text())
    assert parse_config_table(json.loads(format_config_table(data))) == shipped


def test_extend_lengths_per_config_reach_every_distinct_row():
    a, b = ExtendAttentionConfig(64, 64, 4, 3), ExtendAttentionConfig(128, 128, 8, 3, True)
    table = parse_config_table(
        {"head_dim": {"128": [a.to_row(1024), b.to_row(4096), b.to_row(None)]}}
    )
    lengths = extend_lengths_per_config(128, table)
    assert lengths == (1024, 4096)  # the open-ended row repeats b: nothing more to compile
    picked = {select_extend_config(128, n, on_cuda=True, table=table) for n in lengths}
    assert picked == {a, b}
    table = parse_config_table({"head_dim": {"128": [a.to_row(1024), b.to_row(None)]}})
    assert extend_lengths_per_config(128, table) == (1024, 1025)
    assert extend_lengths_per_config(64, table) == ()  # the fallback: one config


@pytest.mark.parametrize(
    "data,match",
    [
        ({"head_dim": {"128": [{"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 3}]}},
         "max_extend_len"),
        ({"head_dim": {"128": [{"max_extend_len": None, "block_m": 48, "block_n": 64,
                                "num_warps": 4, "num_stages": 3}]}}, "block_m"),
        ({"head_dim": {"128": [{"max_extend_len": None, "block_m": 64, "block_n": 64,
                                "num_warps": 4, "num_stages": 3, "warps": 2}]}}, "bad row"),
        ({"head_dim": {}, "extra": 1}, "keys"),
    ],
)  # fmt: skip
def test_config_table_rejects_bad_rows(data, match):
    with pytest.raises(ValueError, match=match):
        parse_config_table(data)


def test_extend_attention_prefix_changes_output():
    """The prefix is really read from the pool: changing a prefix slot's V changes the output."""
    args = make_extend_case(
        prefix_lens=[6], extend_lens=[4], num_heads=2, num_kv_heads=1, head_dim=64,
        dtype=torch.float32,
    )  # fmt: skip
    before = extend_attention(**args)
    slot = int(args["req_to_token"][args["req_pool_indices"][0], 2])
    args["v_buffer"][slot] += 10.0
    after = extend_attention(**args)
    assert (after - before).abs().max() > 1e-2
    assert relative_error(after, extend_attention_ref(**args)) < 1e-5


def test_extend_attention_rejects_bad_inputs():
    args = make_extend_case(
        prefix_lens=[2], extend_lens=[3], num_heads=3, num_kv_heads=2, head_dim=64,
        dtype=torch.float32,
    )  # fmt: skip
    with pytest.raises(ValueError, match="num_kv_heads"):
        extend_attention(**args)
    args = make_extend_case(
        prefix_lens=[2], extend_lens=[3], num_heads=2, num_kv_heads=1, head_dim=64,
        dtype=torch.float32,
    )  # fmt: skip
    with pytest.raises(TypeError, match="req_to_token"):
        extend_attention(**{**args, "req_to_token": args["req_to_token"].long()})
    with pytest.raises(TypeError, match="dtype"):
        extend_attention(**{**args, "k_buffer": args["k_buffer"].half()})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("head_dim,num_heads,num_kv_heads", [(128, 32, 8), (64, 16, 16)])
def test_extend_attention_cuda_bf16(head_dim, num_heads, num_kv_heads):
    args = make_extend_case(
        prefix_lens=[0, 300, 1000, 7],
        extend_lens=[1024, 77, 500, 1],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=torch.bfloat16,
        device="cuda",
    )
    out = extend_attention(**args)
    ref = extend_attention_ref(**args)
    assert relative_error(out, ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "variant",
    [
        dict(block_m=64, block_n=128, num_warps=4, num_stages=2, use_tma=False),
        dict(block_m=128, block_n=64, num_warps=8, num_stages=3, use_tma=True),
        dict(block_m=64, block_n=64, num_warps=4, num_stages=3, use_tma=True),
    ],
    ids=lambda v: "-".join(map(str, v.values())),
)
def test_extend_attention_cuda_variants(variant):
    args = make_extend_case(
        prefix_lens=[0, 300, 1000, 7], extend_lens=[1024, 77, 500, 1], num_heads=32,
        num_kv_heads=8, head_dim=128, dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    out = extend_attention(**args, **variant)
    assert relative_error(out, extend_attention_ref(**args)) < 1e-2
