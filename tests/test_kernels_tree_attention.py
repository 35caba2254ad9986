"""tree_decode_attention (Triton) and tree_decode_attention_ref against decode attention, on random
multi-level prefix trees (interpreter: fp32/fp16, small sizes; CUDA: bf16 at Llama-3.1-8B shape)."""

# TRITON_INTERPRET=1 on CPU-only machines is set by tests/conftest.py

import random

import pytest
import torch

from radixgen.kernels.decode_attention import decode_attention, decode_attention_ref
from radixgen.kernels.tree_decode_attention import (
    tree_decode_attention,
    tree_decode_attention_ref,
)
from radixgen.kernels.tree_decode_plan import (
    SharedSegment,
    TreeDecodePlan,
    TreeDecodeWorkspace,
    build_tree_decode_plan,
    default_target_items,
)
from tests.sm90_compile import assert_compile_for_sm90_without_spills


def random_tree_case(
    *,
    num_groups=2,
    requests_per_group=3,
    num_unshared=1,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    dtype=torch.float32,
    max_node_len=24,
    max_suffix_len=20,
    device="cpu",
    seed=0,
):
    """A paged KV pool holding a random prefix tree, and the segments of its shared nodes.

    Each group is a random tree of depth 1..3 whose nodes (random lengths, scattered slots) are
    shared by the requests below them; every request adds its own suffix (possibly empty, when
    it has a shared prefix). `num_unshared` requests share nothing. Shared nodes are sometimes
    cut in two consecutive segments, and single-member nodes are sometimes given as segments of
    one (both valid groupings).
    """
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    next_slot = [1]  # slot 0 is the pool's padding slot

    def new_slots(n):
        start = next_slot[0]
        next_slot[0] += n
        return list(range(start, start + n))

    histories, segments = [], []  # per request: its slots; the SharedSegments
    node_members = []  # (start, end, [request indices]) per tree node, parents first

    # Requests of the group walk down a random tree: each level, the group's requests are
    # split among 1..2 children.
    def grow(requests, start, prefix, depth):
        length = rng.randint(1, max_node_len)
        slots = new_slots(length)
        node_members.append((start, start + length, requests))
        for r in requests:
            histories[r] = prefix + slots
        if depth < 3 and len(requests) > 1 and rng.random() < 0.7:
            cut = rng.randint(1, len(requests) - 1)
            for part in (requests[:cut], requests[cut:]):
                grow(part, start + length, prefix + slots, depth + 1)

    for _ in range(num_groups):
        first = len(histories)
        histories += [[] for _ in range(requests_per_group)]
        grow(list(range(first, first + requests_per_group)), 0, [], 1)
    histories += [[] for _ in range(num_unshared)]
    batch = len(histories)
    seq_lens = []
    for r in range(batch):
        shared = len(histories[r])
        own = rng.randint(0 if shared else 1, max_suffix_len)
        histories[r] = histories[r] + new_slots(own)
        seq_lens.append(len(histories[r]))

    rows = torch.randperm(batch + 3, generator=gen)[:batch]
    req_to_token = torch.zeros(batch + 3, max(seq_lens) + 2, dtype=torch.int32)
    for r, history in enumerate(histories):
        req_to_token[rows[r], : len(history)] = torch.tensor(history, dtype=torch.int32)
    for start, end, members in node_members:
        if len(members) < 2 and rng.random() < 0.5:
            continue  # left in the member's own suffix
        kv_row = int(rows[rng.choice(members)])
        cuts = [start, end]
        if end - start > 1 and rng.random() < 0.3:
            cuts.insert(1, rng.randint(start + 1, end - 1))
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            segments.append(SharedSegment(kv_row, lo, hi, tuple(rng.sample(members, len(members)))))
    segments = _drop_orphans(segments)
    num_slots = next_slot[0] + 3

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    return dict(
        q=randn(batch, num_heads, head_dim),
        k_buffer=randn(num_slots, num_kv_heads, head_dim),
        v_buffer=randn(num_slots, num_kv_heads, head_dim),
        req_to_token=req_to_token.to(device),
        req_pool_indices=rows.to(device),
        seq_lens=torch.tensor(seq_lens).to(device),
        scaling=head_dim**-0.5,
    ), segments


def _drop_orphans(segments):
    """Keeps, for each request, only the segments that tile a prefix of its history (a
    single-member node kept below a skipped one would leave a gap)."""
    reach: dict[int, int] = {}
    kept = []
    for segment in sorted(segments, key=lambda s: s.start):
        if all(reach.get(m, 0) == segment.start for m in segment.members):
            kept.append(segment)
            for m in segment.members:
                reach[m] = segment.end
    return kept


def relative_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def make_plan(args, segments, **options):
    num_heads, num_kv_heads = args["q"].shape[1], args["k_buffer"].shape[1]
    return build_tree_decode_plan(
        segments,
        batch_size=args["q"].shape[0],
        group_size=num_heads // num_kv_heads,
        num_kv_heads=num_kv_heads,
        device=args["q"].device,
        **options,
    )


def make_workspace(args, max_entries, num_kv_splits):
    batch, num_heads, head_dim = args["q"].shape
    return TreeDecodeWorkspace.allocate(
        max_entries=max_entries,
        batch_size=batch,
        num_heads=num_heads,
        num_kv_heads=args["k_buffer"].shape[1],
        head_dim=head_dim,
        num_kv_splits=num_kv_splits,
        device=args["q"].device,
    )


CPU_CASES = [
    # (groups, per group, unshared, heads, kv heads, head_dim, members_per_item, chunk, splits)
    (2, 5, 1, 8, 2, 32, 2, 16, 2),  # GQA 4, two member blocks per node, chunked segments
    (3, 3, 2, 4, 4, 16, 4, 64, 3),  # MHA, one block, no chunking, 3 suffix splits
    (1, 6, 0, 8, 1, 64, 1, 8, 1),  # MQA (group 8): one member per item, tiny chunks
    (2, 4, 3, 2, 1, 24, 8, 20, 2),  # head_dim padded to 32, chunk not a multiple of BLOCK_N
]


@pytest.mark.parametrize(
    "groups,per_group,unshared,num_heads,num_kv_heads,head_dim,members,chunk,splits", CPU_CASES
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tree_attention_equals_decode_attention(
    groups, per_group, unshared, num_heads, num_kv_heads, head_dim, members, chunk, splits, dtype
):
    args, segments = random_tree_case(
        num_groups=groups,
        requests_per_group=per_group,
        num_unshared=unshared,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        seed=head_dim + groups,
    )
    levels = [sum(r in s.members for s in segments) for r in range(args["q"].shape[0])]
    assert any(len(s.members) > 1 for s in segments) and max(levels) >= 2  # a multi-level tree
    plan = make_plan(args, segments, members_per_item=members, chunk_tokens=chunk)
    out = torch.full_like(args["q"], float("nan"))  # every element must be written
    tree_decode_attention(**args, plan=plan, out=out, num_kv_splits=splits)
    expected = decode_attention_ref(**args)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-3
    assert not out.isnan().any()
    assert relative_error(out, expected) < tolerance
    assert relative_error(tree_decode_attention_ref(**args, plan=plan), expected) < tolerance


def test_tree_attention_equals_the_decode_kernel_with_empty_suffixes():
    """Requests whose whole history is shared (empty suffix) next to ones sharing nothing; the
    tree kernel gives the existing Triton decode kernel's output."""
    args, segments = random_tree_case(num_unshared=2, head_dim=32, max_suffix_len=1, seed=7)
    suffixes = args["seq_lens"] - make_plan(args, segments).suffix_starts
    assert (suffixes == 0).any() and (suffixes > 0).any()
    plan = make_plan(args, segments, members_per_item=4, chunk_tokens=16)
    out = tree_decode_attention(**args, plan=plan, num_kv_splits=2)
    assert relative_error(out, decode_attention(**args, num_kv_splits=2)) < 1e-5
    # The suffix pass in its own tiles (16 positions; the shared pass keeps 32 on the CPU).
    own = tree_decode_attention(**args, plan=plan, num_kv_splits=2, suffix_launch=(16, 4, 1))
    assert relative_error(own, out) < 1e-5


def test_passes_alone_store_partials_that_merge_to_the_output():
    """`passes="shared"` and `passes="suffix"` (the overlap probe's launches) store the
    partials the merged launch combines: their log-sum-exp merge, done here in torch, is the
    attention."""
    args, segments = random_tree_case(num_unshared=1, head_dim=32, seed=11)
    plan = make_plan(args, segments, members_per_item=2, chunk_tokens=16)
    batch = args["q"].shape[0]
    workspace = make_workspace(args, plan.max_entries, num_kv_splits=2)
    for passes in ("shared", "suffix"):
        tree_decode_attention(
            **args, plan=plan, workspace=workspace, num_kv_splits=2, passes=passes
        )
    offsets = plan.entry_offsets.tolist()
    merged = torch.empty_like(args["q"], dtype=torch.float32)
    for i in range(batch):
        outs = torch.cat(  # [splits + entries, num_heads, head_dim]
            [
                workspace.suffix_out[i].transpose(0, 1),
                workspace.shared_out[offsets[i] : offsets[i + 1]],
            ]
        )
        lses = torch.cat(  # [splits + entries, num_heads], base 2
            [
                workspace.suffix_lse[i].transpose(0, 1),
                workspace.shared_lse[offsets[i] : offsets[i + 1]],
            ]
        )
        weights = torch.exp2(lses - lses.max(0).values)
        merged[i] = (weights[..., None] * outs).sum(0) / weights.sum(0)[:, None]
    assert offsets[-1] > 0  # some requests had shared entries to merge
    assert relative_error(merged, decode_attention_ref(**args)) < 1e-5
    with pytest.raises(ValueError, match="passes"):
        tree_decode_attention(**args, plan=plan, passes="merge")


def test_padded_plan_gives_the_same_output():
    """A plan padded to larger capacities (CUDA graphs) and an empty plan (no sharing) are
    exact; rebuilt into the static tables of the capture."""
    args, segments = random_tree_case(seed=3)
    batch = args["q"].shape[0]
    exact = make_plan(args, segments, members_per_item=2, chunk_tokens=16)
    padded = make_plan(
        args, segments, members_per_item=2, chunk_tokens=16, max_items=40, max_entries=64
    )
    assert padded.max_items == 40 and padded.num_items == exact.num_items
    assert padded.item_count.tolist() == [exact.num_items]  # what the shared pass loops to
    # More items than the shared pass has programs (4 on the CPU): each takes several.
    assert exact.num_items > default_target_items(args["k_buffer"].shape[1], args["q"].device)
    static = TreeDecodePlan.empty(
        batch_size=batch, members_per_item=2, max_items=40, max_entries=64, device=args["q"].device
    )
    workspace = make_workspace(args, max_entries=64, num_kv_splits=2)
    expected = decode_attention_ref(**args)
    no_sharing = tree_decode_attention(**args, plan=static, workspace=workspace, num_kv_splits=2)
    assert relative_error(no_sharing, expected) < 1e-5
    assert static.same_layout(padded)
    static.packed.copy_(padded.packed)
    out = tree_decode_attention(**args, plan=static, workspace=workspace, num_kv_splits=2)
    assert relative_error(out, expected) < 1e-5


def test_plan_capacity_and_validation():
    segment = SharedSegment(kv_row=0, start=0, end=1000, members=tuple(range(16)))
    options = dict(batch_size=20, group_size=4, num_kv_heads=8, device=torch.device("cpu"))
    plan = build_tree_decode_plan([segment], members_per_item=16, chunk_tokens=100, **options)
    assert plan.num_items == 10 and plan.num_entries == 160
    assert plan.entry_offsets.tolist() == [10 * i for i in range(17)] + [160] * 4
    # Capacities: the chunks grow until the plan fits, or it is refused.
    fitted = build_tree_decode_plan(
        [segment], members_per_item=16, chunk_tokens=100, max_items=4, **options
    )
    assert fitted.num_items == 3 and fitted.max_items == 4
    assert build_tree_decode_plan([segment], members_per_item=8, max_items=1, **options) is None
    with pytest.raises(ValueError, match="tile"):
        gap = SharedSegment(kv_row=0, start=5, end=10, members=(0, 1))
        build_tree_decode_plan([gap], **options)
    with pytest.raises(ValueError, match="outside the batch"):
        build_tree_decode_plan([SharedSegment(0, 0, 4, (0, 25))], **options)
    with pytest.raises(ValueError, match="power of two"):
        build_tree_decode_plan([segment], members_per_item=3, **options)


# ---- CUDA, real sizes ---------------------------------------------------------------------


def llama8b_shared_case(*, groups, per_group, prefix_len, suffix_len, dtype, seed=0):
    """Llama-3.1-8B attention shape: 32 query heads, 8 KV heads, head_dim 128; `groups` groups
    of `per_group` requests sharing a `prefix_len`-token prefix plus `suffix_len` own tokens."""
    gen = torch.Generator().manual_seed(seed)
    batch = groups * per_group
    seq_len = prefix_len + suffix_len
    num_slots = groups * prefix_len + batch * suffix_len + 1
    perm = torch.randperm(num_slots - 1, generator=gen).int() + 1
    req_to_token = torch.zeros(batch, seq_len, dtype=torch.int32)
    segments = []
    for g in range(groups):
        shared = perm[g * prefix_len : (g + 1) * prefix_len]
        members = tuple(range(g * per_group, (g + 1) * per_group))
        req_to_token[list(members), :prefix_len] = shared
        segments.append(SharedSegment(g * per_group, 0, prefix_len, members))
    own = perm[groups * prefix_len :].view(batch, suffix_len)
    req_to_token[:, prefix_len:] = own
    args = dict(
        q=torch.randn(batch, 32, 128, generator=gen).to(dtype).cuda(),
        k_buffer=torch.randn(num_slots, 8, 128, generator=gen).to(dtype).cuda(),
        v_buffer=torch.randn(num_slots, 8, 128, generator=gen).to(dtype).cuda(),
        req_to_token=req_to_token.cuda(),
        req_pool_indices=torch.arange(batch).cuda(),
        seq_lens=torch.full((batch,), seq_len).cuda(),
        scaling=128**-0.5,
    )
    return args, segments


@pytest.mark.gpu
@pytest.mark.parametrize("groups,per_group", [(16, 16), (4, 3), (1, 64)])
def test_tree_attention_bf16_real_sizes_cuda(groups, per_group):
    args, segments = llama8b_shared_case(
        groups=groups, per_group=per_group, prefix_len=2048, suffix_len=256, dtype=torch.bfloat16
    )
    plan = make_plan(args, segments)
    out = tree_decode_attention(**args, plan=plan)
    expected = decode_attention(**args)
    assert relative_error(out, expected) < 1e-2
    subset = slice(0, min(8, args["q"].shape[0]))  # the fp32 reference, on a few requests
    small = {
        k: (v[subset] if k in ("q", "req_pool_indices", "seq_lens") else v) for k, v in args.items()
    }
    assert relative_error(out[subset], decode_attention_ref(**small)) < 1e-2


@pytest.mark.gpu
def test_tree_attention_random_trees_bf16_cuda():
    args, segments = random_tree_case(
        num_groups=6,
        requests_per_group=12,
        num_unshared=5,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        dtype=torch.bfloat16,
        max_node_len=700,
        max_suffix_len=300,
        device="cuda",
        seed=11,
    )
    plan = make_plan(args, segments)
    out = tree_decode_attention(**args, plan=plan)
    assert relative_error(out, decode_attention(**args)) < 1e-2
    assert (
        relative_error(tree_decode_attention_ref(**args, plan=plan), decode_attention_ref(**args))
        < 5e-3  # both fp32 math; bf16 outputs may round one ulp apart
    )


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float8_e4m3fn])
def test_kv_dtype_is_a_parameter(kv_dtype):
    """K/V stored in another dtype than q (fp16, fp8) with per-tensor scales: the output is the
    attention over the dequantised K/V."""
    args, segments = random_tree_case(num_groups=1, requests_per_group=4, seed=5)
    k_scale, v_scale = 0.5, 2.0
    stored_k = (args["k_buffer"] / k_scale).to(kv_dtype)
    stored_v = (args["v_buffer"] / v_scale).to(kv_dtype)
    dequantised = dict(
        args, k_buffer=stored_k.float() * k_scale, v_buffer=stored_v.float() * v_scale
    )
    quantised = dict(args, k_buffer=stored_k, v_buffer=stored_v)
    plan = make_plan(args, segments, members_per_item=4, chunk_tokens=16)
    out = tree_decode_attention(
        **quantised, plan=plan, k_scale=k_scale, v_scale=v_scale, num_kv_splits=2
    )
    expected = decode_attention_ref(**dequantised)
    assert relative_error(out, expected) < 1e-5
    reference = tree_decode_attention_ref(**quantised, plan=plan, k_scale=k_scale, v_scale=v_scale)
    assert relative_error(reference, expected) < 1e-5


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_pool_paths_give_the_same_attention(fp8_dtype):
    """fp16 queries over an FP8 pool, both passes: V read as words and converted before the
    dots (CUDA's default; the interpreter runs its exact integer conversion) or converted
    after its load: the same output, and the attention over the dequantised pool."""
    args, segments = random_tree_case(num_groups=2, requests_per_group=3, seed=7)
    args = dict(args, q=args["q"].half())
    stored = {name: (args[name] / 2.0).to(fp8_dtype) for name in ("k_buffer", "v_buffer")}
    quantised = dict(args, **stored)
    dequantised = dict(args, **{name: t.float() * 2.0 for name, t in stored.items()})
    plan = make_plan(args, segments, members_per_item=4, chunk_tokens=16)
    outs = [
        tree_decode_attention(
            **quantised, plan=plan, k_scale=2.0, v_scale=2.0, num_kv_splits=2, fp8_v_words=words
        )
        for words in (True, False)
    ]
    assert relative_error(outs[0], outs[1]) < 1e-5
    assert relative_error(outs[0], decode_attention_ref(**dequantised)) < 2e-3


def test_shared_pass_compiles_for_sm90_without_spills():
    """The shared pass at the engine's Llama-3.1-8B launch (16 members of GQA group 4: a 64-row
    Q tile, 64-position tiles, 4 warps, the default 3 stages), bf16 and FP8 pools: no spills."""
    strides = ("stride_q_batch", "stride_q_head", "stride_kb_slot", "stride_kb_head",
               "stride_vb_slot", "stride_vb_head", "stride_req_row")  # fmt: skip
    tables = ("item_kv_rows_ptr", "item_kv_starts_ptr", "item_kv_ends_ptr",
              "item_num_members_ptr", "item_members_ptr", "item_entries_ptr",
              "item_count_ptr")  # fmt: skip
    signature = {
        "q_ptr": "*bf16",
        "k_buffer_ptr": "*bf16",
        "v_buffer_ptr": "*bf16",
        "req_to_token_ptr": "*i32",
        **dict.fromkeys(tables, "*i32"),
        "partial_out_ptr": "*fp32",
        "partial_lse_ptr": "*fp32",
        "qk_scale": "fp32",
        "v_scale": "fp32",
        "num_heads": "i32",
        **dict.fromkeys(strides, "i32"),
    }
    fp8_pool = {"k_buffer_ptr": "*fp8e4nv", "v_buffer_ptr": "*fp8e4nv"}
    constexprs = {"NUM_KV_HEADS": 8, "GROUP_SIZE": 4, "MEMBERS": 16, "BLOCK_G": 4,
                  "HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_N": 64, "V_FP8_PTX": True}  # fmt: skip
    bf16 = {"DOT_FP16": False, "V_FP8_WORDS": 0}
    # An FP8 pool's V as words: no byte-wide shared-memory loads (as decode_split_kernel's).
    fp8 = {"DOT_FP16": True, "V_FP8_WORDS": 1}
    assert_compile_for_sm90_without_spills([
        ("radixgen.kernels.tree_decode_attention", "_tree_shared_kernel", signature | pool,
         constexprs | paths, 4, {"num_stages": 3, "forbid_ptx": forbid})
        for pool, paths, forbid in (({}, bf16, []), (fp8_pool, fp8, ["ld.shared.b8"]))
    ])  # fmt: skip
