"""Tree (cascade) decode attention: shared prefixes read once for all the queries that share them.

Decode attention reads every request's whole history; when 16 requests share a 2048-token
prompt, its KV is read 16 times per step. Here a batch's histories are a tree
(`TreeDecodePlan`, built from `SharedSegment`s): shared segments, then each request's suffix.
Attention over a union of disjoint ranges is the log-sum-exp merge of the per-range results,
so two launches compute exactly what `decode_attention` computes:

1. Shared pass, a fixed grid of (program, KV head) pairs, KV heads fastest; programs loop over
   the plan's real items (`item_count`). An item is a token chunk of a segment and up to
   `members_per_item` member requests; a program takes it for one KV head. Its Q tile is the
   members' query heads of that KV head, `[members_per_item * BLOCK_G, head_dim]` (64 rows by
   default), as in prefill: every K/V row read serves all of them. It writes each member's
   normalised partial output and base-2 log-sum-exp to the member's entry. Padding items (past
   `item_count`) are never visited.
2. Suffix pass, grid `(batch, num_kv_heads, num_kv_splits)`: decode's split-KV program over
   `[suffix_starts[i], seq_lens[i])` (the whole history for a request that shares nothing).
   The last of a (request, KV head)'s splits to finish merges, as plain decode does: the
   suffix splits and the request's shared entries `entry_offsets[i] .. entry_offsets[i+1]`
   (written by the shared pass, launched before), weighted by `exp2(lse - max lse)`. A
   separate merge launch of one program per (request, head) took 28 us of the 156 us at 16 x
   16 sharing 2048 + 256, and 3.3 ms of a 46 ms step at batch 1024 (H200, eleventh session).

Grids depend only on the plan's capacities, the batch size and the split count; lengths and the
grouping are read on the device, so the launches can be captured in a CUDA graph
(`TreeDecodePlan.empty` at capture, real plans copied into its `packed` tensor before replay).

K/V may be stored in another dtype than q (`k_scale`/`v_scale` dequantise per tensor): K/V
tiles are converted to q's dtype for the tensor-core dots; softmax and accumulators are fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixgen.kernels.decode_attention import (
    LOG2_E,
    MAX_KV_SPLITS,
    attend_paged_range,
    check_decode_inputs,
    decode_split_kernel,
    default_decode_blocks,
    default_num_kv_splits,
    fp8_pool_paths,
)
from radixgen.kernels.tree_decode_plan import (
    TreeDecodePlan,
    TreeDecodeWorkspace,
    default_target_items,
)

KV_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2)


@triton.jit
def _tree_shared_kernel(
    q_ptr,  # [batch, num_heads, head_dim]
    k_buffer_ptr,  # [num_slots, num_kv_heads, head_dim]
    v_buffer_ptr,
    req_to_token_ptr,  # [rows, max_context_len] int32
    item_kv_rows_ptr,  # [max_items] int32
    item_kv_starts_ptr,
    item_kv_ends_ptr,
    item_num_members_ptr,
    item_members_ptr,  # [max_items, MEMBERS] int32
    item_entries_ptr,  # [max_items, MEMBERS] int32
    item_count_ptr,  # [1] int32: items below it are real
    partial_out_ptr,  # [max_entries, num_heads, head_dim] fp32
    partial_lse_ptr,  # [max_entries, num_heads] fp32
    qk_scale,
    v_scale,
    num_heads,
    stride_q_batch,
    stride_q_head,
    stride_kb_slot,
    stride_kb_head,
    stride_vb_slot,
    stride_vb_head,
    stride_req_row,
    NUM_KV_HEADS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    MEMBERS: tl.constexpr,
    BLOCK_G: tl.constexpr,  # >= GROUP_SIZE, a power of two; MEMBERS * BLOCK_G >= 16
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_FP16: tl.constexpr,  # FP8 pools: q and the K/V tiles as fp16 (as decode_split_kernel)
    V_FP8_WORDS: tl.constexpr,  # FP8 V read as words, converted before the dot
    V_FP8_PTX: tl.constexpr,
):
    # Programs take items `item0, item0 + step, ...` below the plan's item count (read on the
    # device: the grid is fixed for CUDA graphs), so none is launched for a graph plan's
    # padding (its capacity is batch + ~66 items; launched, ~1,000 padding programs a head
    # took SM slots between the real ones at batch 1024). KV heads vary fastest in the grid:
    # an item's heads read the same token rows together.
    pid = tl.program_id(0)
    kv_head = pid % NUM_KV_HEADS
    item0 = pid // NUM_KV_HEADS
    step = tl.num_programs(0) // NUM_KV_HEADS
    num_items = tl.load(item_count_ptr)

    BLOCK_M: tl.constexpr = MEMBERS * BLOCK_G
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    member = offs_m // BLOCK_G  # row m is query head (m % BLOCK_G) of member (m // BLOCK_G)
    head_in_group = offs_m % BLOCK_G
    mask_d = offs_d < HEAD_DIM
    heads = kv_head * GROUP_SIZE + head_in_group
    for item in range(item0, num_items, step):
        start = tl.load(item_kv_starts_ptr + item)
        end = tl.load(item_kv_ends_ptr + item)
        num_members = tl.load(item_num_members_ptr + item)
        row = tl.load(item_kv_rows_ptr + item).to(tl.int64)
        mask_member = member < num_members
        mask_m = mask_member & (head_in_group < GROUP_SIZE)
        request = tl.load(item_members_ptr + item * MEMBERS + member, mask=mask_member, other=0)
        entry = tl.load(item_entries_ptr + item * MEMBERS + member, mask=mask_member, other=0)
        q = tl.load(
            q_ptr
            + request.to(tl.int64)[:, None] * stride_q_batch
            + heads[:, None] * stride_q_head
            + offs_d[None, :],
            mask=mask_m[:, None] & mask_d[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_D]
        if DOT_FP16:
            q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        acc, m_i, l_i = attend_paged_range(
            q,
            k_buffer_ptr + kv_head * stride_kb_head,
            v_buffer_ptr + kv_head * stride_vb_head,
            req_to_token_ptr + row * stride_req_row,
            start,
            end,
            qk_scale,
            stride_kb_slot,
            stride_vb_slot,
            BLOCK_M,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            False,  # KV_LHS
            V_FP8_WORDS,
            V_FP8_PTX,
        )
        # Member rows past num_members are masked off below; a real item's range is not empty.
        l_i = tl.where(l_i > 0, l_i, 1.0)
        out_row = entry.to(tl.int64) * num_heads + heads  # [BLOCK_M]
        tl.store(
            partial_out_ptr + out_row[:, None] * HEAD_DIM + offs_d[None, :],
            acc * (v_scale / l_i[:, None]),  # scaled as the suffix's partials
            mask=mask_m[:, None] & mask_d[None, :],
        )
        tl.store(partial_lse_ptr + out_row, m_i + tl.math.log2(l_i), mask=mask_m)


def _check_tree_inputs(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, plan):
    check_decode_inputs(
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, kv_dtypes=KV_DTYPES
    )
    if not isinstance(plan, TreeDecodePlan) or plan.batch_size != q.shape[0]:
        raise ValueError(f"plan must be a TreeDecodePlan for a batch of {q.shape[0]} requests")
    if plan.packed.device != q.device:
        raise ValueError(f"plan is on {plan.packed.device}, q on {q.device}")


def tree_decode_attention(
    q: torch.Tensor,  # [batch, num_heads, head_dim]
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    req_to_token: torch.Tensor,  # [rows, max_context_len] int32
    req_pool_indices: torch.Tensor,  # [batch]
    seq_lens: torch.Tensor,  # [batch], >= 1, history length including the current token
    plan: TreeDecodePlan,
    scaling: float,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
    num_kv_splits: int | None = None,
    workspace: TreeDecodeWorkspace | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    max_registers: int | None = None,
    programs_per_sm: int | None = None,
    suffix_launch: tuple[int, int, int] | None = None,
    fp8_dot_fp16: bool | None = None,
    fp8_v_words: bool | None = None,
    passes: str = "both",
) -> torch.Tensor:  # [batch, num_heads, head_dim]
    """`decode_attention` with the plan's shared segments read once per item.

    Args:
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, scaling: as in
            `decode_attention`; K/V may be fp16/bf16/fp32/fp8 whatever q's dtype.
        plan: the grouping (`build_tree_decode_plan`); its segments' slots must be equal in
            every member's `req_to_token` row (the kernel reads them from `kv_row`).
        k_scale, v_scale: per-tensor dequantisation scales of K and V (1.0 unless quantised).
        out: optional output tensor like q.
        num_kv_splits: splits of each suffix (default `default_num_kv_splits`).
        workspace: optional preallocated partials (CUDA graphs keep one static).
        block_n (both passes; default 64 for the shared pass, 128 for the suffix pass over a
            16-bit pool on CUDA), num_warps, num_stages (the shared pass): tuning overrides.
        max_registers, programs_per_sm: the shared pass's register cap (ptxas `.maxnreg`) and
            its grid (programs per SM; the plan's `chunk_tokens` should fill it): tuning
            overrides (`scripts/bench_tree_attention.py --shared-sweep`).
        suffix_launch: (block_n, num_warps, num_stages) of the suffix pass alone, a tuning
            override (`scripts/bench_tree_attention.py --suffix-sweep`).
        fp8_dot_fp16, fp8_v_words: an FP8 pool's paths, as in `decode_attention` (both passes;
            `fp8_pool_paths` picks the defaults).
        passes: "both" (attention); "shared" or "suffix" launch one pass alone, the suffix pass
            then storing its partials unmerged, and leave `out` unwritten: a profiling aid
            (`scripts/bench_tree_attention.py --overlap-probe` runs them on two streams at
            once, to see what overlapping the passes could gain).

    Returns:
        The attention output, shaped and typed like q.

    Raises:
        ValueError/TypeError naming the argument on bad shapes, dtypes, strides or plan.
    """
    _check_tree_inputs(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, plan)
    if passes not in ("both", "shared", "suffix"):
        raise ValueError(f"passes must be 'both', 'shared' or 'suffix', got {passes!r}")
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    group_size = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(f"out must be like q {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)}")
    if batch == 0:
        return out
    num_kv_splits = num_kv_splits or default_num_kv_splits(batch, num_kv_heads, q.device)
    if not 1 <= num_kv_splits <= MAX_KV_SPLITS:
        raise ValueError(f"num_kv_splits must be in [1, {MAX_KV_SPLITS}], got {num_kv_splits}")
    if workspace is None:
        workspace = TreeDecodeWorkspace.allocate(
            max_entries=plan.max_entries,
            batch_size=batch,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            num_kv_splits=num_kv_splits,
            device=q.device,
        )
    counters = workspace.merge_counters
    if (
        workspace.shared_out.shape[0] < plan.max_entries
        or workspace.suffix_out.shape != (batch, num_heads, num_kv_splits, head_dim)
        or counters.dtype != torch.int32
        or counters.numel() < batch * num_kv_heads
    ):
        raise ValueError("workspace is too small for the plan, batch or num_kv_splits")

    qk_scale = scaling * LOG2_E * k_scale
    dot_fp16, v_fp8_words = fp8_pool_paths(
        q, v_buffer, fp8_dot_fp16=fp8_dot_fp16, fp8_v_words=fp8_v_words
    )
    block_d = max(16, triton.next_power_of_2(head_dim))
    on_cuda = q.device.type == "cuda"
    default_n, default_warps, default_stages = default_decode_blocks(head_dim, q.device)
    # The suffix pass reads short ranges (a question and its answer so far): 128-position tiles
    # beat 64 there on the H200 over a 16-bit pool (twelfth session's sweep, docs/benchmarks.md:
    # 83.5 -> 78.0 us at 16 x 16 sharing 2048 + 256, 286.7 -> 275.7 us at 64 x 16), while the
    # shared pass's 64-row Q tiles want 64 (53 -> 70 us at 128).
    wide_suffix = on_cuda and head_dim <= 128 and k_buffer.element_size() >= 2
    suffix_block_n = block_n or (128 if wide_suffix else default_n)
    suffix_warps, suffix_stages = default_warps, default_stages
    if suffix_launch is not None:
        suffix_block_n, suffix_warps, suffix_stages = suffix_launch
    block_n = block_n or default_n
    strides = (
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        req_to_token.stride(0),
    )
    if plan.max_items > 0 and passes != "suffix":
        members = plan.members_per_item
        block_g = max(triton.next_power_of_2(group_size), triton.cdiv(16, members))
        # A fixed grid (CUDA graphs): at most the automatic chunking's target of programs.
        target = default_target_items(num_kv_heads, q.device, programs_per_sm)
        grid_items = min(plan.max_items, target)
        _tree_shared_kernel[(grid_items * num_kv_heads,)](
            q,
            k_buffer,
            v_buffer,
            req_to_token,
            plan.item_kv_rows,
            plan.item_kv_starts,
            plan.item_kv_ends,
            plan.item_num_members,
            plan.item_members,
            plan.item_entries,
            plan.item_count,
            workspace.shared_out,
            workspace.shared_lse,
            qk_scale,
            v_scale,
            num_heads,
            *strides,
            NUM_KV_HEADS=num_kv_heads,
            GROUP_SIZE=group_size,
            MEMBERS=members,
            BLOCK_G=block_g,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_N=block_n,
            DOT_FP16=dot_fp16,
            V_FP8_WORDS=v_fp8_words,
            V_FP8_PTX=on_cuda,
            num_warps=num_warps or (8 if members * block_g * block_d > 8192 else 4),
            # 3 stages beat 2 at every chunk and member count of the H200 sweep (ninth session,
            # docs/benchmarks.md: 162.5 -> 149.3 us at 16 x 16 sharing 2048 + 256).
            num_stages=num_stages or (3 if on_cuda else 1),
            **({"maxnreg": max_registers} if max_registers else {}),
        )
    if passes == "shared":
        return out
    decode_split_kernel[(batch, num_kv_heads, num_kv_splits)](
        q,
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices,
        seq_lens,
        plan.suffix_starts,
        workspace.suffix_out,
        workspace.suffix_lse,
        out,
        workspace.merge_counters,
        workspace.shared_out,
        workspace.shared_lse,
        plan.entry_offsets,
        qk_scale,
        v_scale,
        *strides,
        out.stride(0),
        out.stride(1),
        num_kv_splits,
        0,  # min_split_len: splits as short as one tile
        HAS_KV_STARTS=True,
        MERGE=passes == "both",
        HAS_SHARED=True,
        DOT_FP16=dot_fp16,
        KV_LHS=False,
        V_FP8_WORDS=v_fp8_words,
        V_FP8_PTX=on_cuda,
        GROUP_SIZE=group_size,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_H=max(16, triton.next_power_of_2(group_size)),
        BLOCK_N=suffix_block_n,
        num_warps=suffix_warps,
        num_stages=suffix_stages,
    )
    return out


def tree_decode_attention_ref(
    q: torch.Tensor,  # [batch, num_heads, head_dim]
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,  # [rows, max_context_len] int32
    req_pool_indices: torch.Tensor,  # [batch]
    seq_lens: torch.Tensor,  # [batch]
    plan: TreeDecodePlan,
    scaling: float,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Plain-torch reference of `tree_decode_attention`: the same decomposition (one partial
    per item member and one per suffix, natural-log lse), merged per request; fp32 math."""
    group = q.shape[1] // k_buffer.shape[1]
    queries = q.float()

    def attend(rows: list[int], slots: torch.Tensor):
        """Partials of requests `rows` over `slots`: ([len(rows), H, D], [len(rows), H])."""
        keys = (k_buffer[slots].float() * k_scale).repeat_interleave(group, dim=1)
        values = (v_buffer[slots].float() * v_scale).repeat_interleave(group, dim=1)
        scores = torch.einsum("rhd,khd->rhk", queries[rows], keys) * scaling
        lse = torch.logsumexp(scores, dim=-1)
        return torch.einsum("rhk,khd->rhd", scores.softmax(dim=-1), values), lse

    parts: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(q.shape[0])]
    for item in range(plan.num_items):
        members = plan.item_members[item, : int(plan.item_num_members[item])].tolist()
        start, end = int(plan.item_kv_starts[item]), int(plan.item_kv_ends[item])
        slots = req_to_token[int(plan.item_kv_rows[item]), start:end].long()
        outs, lses = attend(members, slots)
        for i, member in enumerate(members):
            parts[member].append((outs[i], lses[i]))
    for request in range(q.shape[0]):
        start, end = int(plan.suffix_starts[request]), int(seq_lens[request])
        if end > start:
            slots = req_to_token[int(req_pool_indices[request]), start:end].long()
            outs, lses = attend([request], slots)
            parts[request].append((outs[0], lses[0]))
    out = torch.empty_like(q)
    for request, request_parts in enumerate(parts):
        outs = torch.stack([o for o, _ in request_parts])  # [parts, H, D]
        weights = torch.stack([lse for _, lse in request_parts]).softmax(dim=0)  # [parts, H]
        out[request] = (outs * weights[..., None]).sum(dim=0).to(q.dtype)
    return out
