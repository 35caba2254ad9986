"""Warp-specialized extend attention for Hopper (sm_90), written in Gluon.

The Triton kernel (`extend_attention.py`) reaches 0.87-0.91x of torch SDPA on the H200 at 1k-8k
causal tokens: Triton 3.6 gives its loop no warp specialization on Hopper and waits on every
wgmma result before the softmax that reads it, so the tensor cores idle while the softmax runs.
This kernel arranges the work the way FlashAttention-3 does, with Gluon's explicit primitives:

- one **loader warp** streams the query tiles and a ring of `NUM_STAGES` K/V tiles into shared
  memory with TMA, each tile announced on its own mbarrier (`k_ready`, `v_ready`) and its slot
  handed back by the consumers on `kv_empty`;
- two **consumer warpgroups** (64 query rows each; `consumers=1`: one, in 64-row programs)
  run the online softmax. Each issues the scores of K/V tile j (`S_j = Q K_j^T`, asynchronous
  wgmma) and the value product of tile j-1 (`O += P_{j-1} V_{j-1}`) back to back, waits for
  the scores only, and computes the softmax of tile j while the tensor cores still work on
  tile j-1's product (intra-warpgroup overlap); P stays in registers as the product's A
  operand.

Scope: new tokens attending causally to themselves (prefix-free extend batches: prompts that
share nothing with the radix cache). Requests are packed as in `extend_attention`; K/V tiles
past a request's end are read (TMA zero-fills past the tensor) and masked by causality, and only
a request's own query rows are stored. Grid: one program per (query head, request, 128-row query
block), heads fastest and the heaviest (last) query blocks first, as the Triton kernel orders it.

Needs Triton's Gluon with the Hopper module (`triton.experimental.gluon.language.nvidia.hopper`);
`HOPPER_GLUON` is False where it is missing, and callers take the Triton kernel.
"""

from __future__ import annotations

import functools

import torch
import triton

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mbarrier as sm80_mbarrier
    from triton.experimental.gluon.language.nvidia.hopper import (
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # Triton 3.6 (the H200's) names the TMA load async_copy_global_to_shared; later releases
    # call it async_load.
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    HOPPER_GLUON = True
except ImportError:  # a Triton without Gluon's Hopper module
    HOPPER_GLUON = False

LOG2_E = 1.4426950408889634
HALF_M = 64  # query rows a consumer warpgroup (the wgmma's M)
CONSUMERS = 2  # consumer warpgroups a program: blocks of 128 query rows, K/V tiles of 128 keys
NUM_STAGES = 3  # K/V tiles in flight: 3 x (32 + 32) KiB + 32 KiB of Q at head_dim 128
# Registers a thread at launch: two programs of one consumer warpgroup and a loader warp share
# an SM (2 x 160 threads x 200 <= 64 Ki); the two-consumer program runs alone (None: ptxas).
MAX_REGISTERS = {1: 200, 2: None}
CONSUMER_REGS = 240  # registers a thread of the second consumer warpgroup (setmaxnreg)
LOADER_REGS = 24
# One program per SM looping over the work items (heaviest first, dealt in a zigzag), rather than
# one program per item: an item's queries and first K/V tiles load while the item before
# finishes.
PERSISTENT = True
# The two consumer warpgroups issue their matrix products by turns on hardware named barriers
# (FlashAttention-3's ping-pong; the mbarrier version was slower: docs/benchmarks.md).
PINGPONG = False
# The shortest batch (max_extend_len) `extend_attention` sends here. Shorter prefills are bound
# by the host, where this kernel's launch (~190 us of Python and TMA descriptor encoding against
# the Triton kernel's ~80, H200) costs more than its GPU time saves (1.12x the Triton kernel's
# TFLOP/s at 1k tokens in graph replay; docs/benchmarks.md, twenty-third session).
MIN_EXTEND_LEN = 1024


def hopper_extend_supported(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> bool:
    """Whether this kernel can run these tensors here (else the Triton kernel does): sm_90,
    bf16/fp16, head_dim 128, and q, k_new, v_new addressable by TMA as [tokens, heads * 128]."""
    if not (HOPPER_GLUON and q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9):
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or q.shape[2] != 128:
        return False
    for t in (q, k_new, v_new):
        tma_rows = t.stride(2) == 1 and t.stride(1) == 128 and (t.stride(0) * 2) % 16 == 0
        if t.dtype != q.dtype or not tma_rows or t.data_ptr() % 16:
            return False
    return True


if HOPPER_GLUON:
    PINGPONG_BARRIER = gl.constexpr(8)  # named barriers 8 and 9 (Triton's partitions use 0-2)

    @gluon.jit
    def _lap_item(lap, num_programs):
        """The work item of this program's `lap`-th lap over the grid. Items go heaviest first,
        so even laps deal them to the programs left to right and odd laps right to left: each
        program's sum of tiles evens out (a plain round robin gave the first programs the
        heaviest item of every lap: 10% slower at 1-4k tokens on the H200)."""
        pid = gl.program_id(0)
        return lap * num_programs + gl.where(lap % 2 == 0, pid, num_programs - 1 - pid)

    @gluon.jit
    def _work_item(
        item,
        num_items,
        extend_lens_ptr,
        extend_start_loc_ptr,
        batch,
        num_m_blocks,
        num_heads,
        BLOCK_N: gl.constexpr,
    ):
        """Work item `item` (heads fastest, the heaviest query blocks first): (head, the
        request's first row, its length, the block's first query position, the block's K/V
        tiles); tiles 0 past the last item or where the block lies past the request's end."""
        head = item % num_heads
        rest = item // num_heads
        request = rest % batch
        block = num_m_blocks - 1 - rest // batch
        extend_len = gl.load(extend_lens_ptr + request).to(gl.int32)
        first_row = gl.load(extend_start_loc_ptr + request).to(gl.int32)
        block_start = block * BLOCK_N
        num_tiles = gl.where((item < num_items) & (block_start < extend_len), block + 1, 0)
        return head, first_row, extend_len, block_start, num_tiles

    @gluon.jit
    def _loader(
        q_desc,
        k_desc,
        v_desc,
        q_smem,  # [CONSUMERS, HALF_M, HEAD_DIM]
        k_smem,  # [NUM_STAGES, BLOCK_N, HEAD_DIM]
        v_smem,
        q_bar,
        q_empty,
        k_ready,  # [NUM_STAGES, 1] mbarriers
        v_ready,
        kv_empty,
        extend_lens_ptr,
        extend_start_loc_ptr,
        batch,
        num_m_blocks,
        num_heads,  # (tensors: a worker partition takes no constexpr arguments)
        group_size,
    ):
        HALF_M: gl.constexpr = q_smem.shape[1]
        HEAD_DIM: gl.constexpr = q_smem.shape[2]
        NUM_STAGES: gl.constexpr = k_smem.shape[0]
        BLOCK_N: gl.constexpr = k_smem.shape[1]
        CONSUMERS: gl.constexpr = q_smem.shape[0]
        num_items = num_heads * batch * num_m_blocks
        tiles_before = 0  # K/V tiles this program loaded for its earlier items: the ring's count
        items_before = 0  # items this program ran: q_bar's / q_empty's phase
        num_programs = gl.num_programs(0)
        for lap in range(0, (num_items + num_programs - 1) // num_programs):
            item = _lap_item(lap, num_programs)
            head, first_row, extend_len, block_start, num_tiles = _work_item(
                item, num_items, extend_lens_ptr, extend_start_loc_ptr, batch, num_m_blocks,
                num_heads, BLOCK_N,
            )  # fmt: skip
            if num_tiles > 0:
                # The consumers release Q once the item's last scores are computed, so the next
                # item's queries load while they finish its last value product and store.
                mbarrier.wait(q_empty, (items_before & 1) ^ 1)
                mbarrier.expect(q_bar, CONSUMERS * q_desc.block_type.nbytes)
                for c in gl.static_range(CONSUMERS):
                    q_row = first_row + block_start + c * HALF_M
                    tma_load(q_desc, [q_row, head * HEAD_DIM], q_bar, q_smem.index(c))
                kv_col = (head // group_size) * HEAD_DIM
                for j in range(num_tiles):
                    tile = tiles_before + j
                    stage = tile % NUM_STAGES
                    # A fresh barrier counts its phase before the first as complete: round 0
                    # passes.
                    mbarrier.wait(kv_empty.index(stage), ((tile // NUM_STAGES) & 1) ^ 1)
                    row = first_row + j * BLOCK_N
                    mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
                    tma_load(k_desc, [row, kv_col], k_ready.index(stage), k_smem.index(stage))
                    mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
                    tma_load(v_desc, [row, kv_col], v_ready.index(stage), v_smem.index(stage))
                tiles_before += num_tiles
                items_before += 1

    @gluon.jit
    def _softmax_tile(
        s,  # [HALF_M, BLOCK_N] fp32 raw scores, wgmma accumulator layout
        m_i,  # [HALF_M] running max (log2 units, scaled)
        l_i,  # [HALF_M] running sum
        qk_scale,
        query_pos,  # [HALF_M] positions of the rows in the request
        key_start,  # position of the tile's first key
        p_layout: gl.constexpr,
        dtype: gl.constexpr,
        MASKED: gl.constexpr,
    ):
        if MASKED:  # the diagonal tile: key_pos <= query_pos
            key_pos = key_start + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
            visible = key_pos[None, :] <= query_pos[:, None]
            s = gl.where(visible, s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, 1))
            p = gl.exp2(s - m_new[:, None])
        else:  # scale and max subtraction in one FMA a score
            m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
            p = gl.exp2(s * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        p = gl.convert_layout(p.to(dtype), p_layout)  # the value product's A operand
        return p, m_new, l_i, alpha

    @gluon.jit
    def _named_barrier(instruction: gl.constexpr, barrier_id):
        """`bar.sync` (wait) or `bar.arrive` (signal, no wait) on the hardware named barrier
        `barrier_id` of the two consumer warpgroups' 256 threads (ids 0-2 are Triton's own)."""
        gl.inline_asm_elementwise(
            instruction + " $1, 256;\n\tmov.u32 $0, 0;",
            "=r,r",
            [barrier_id],
            dtype=gl.int32,
            is_pure=False,
            pack=1,
        )

    @gluon.jit
    def _take_turn(pingpong, warpgroup):
        """Ping-pong (FlashAttention-3's warpgroup schedule; `pingpong` is a [2] shared
        allocation when on, [1] when off): wait until the other warpgroup has issued its
        matrix products, so the two issue by turns and one's softmax runs while the other's
        products hold the tensor cores."""
        if pingpong.shape[0] == 2:
            _named_barrier("bar.sync", PINGPONG_BARRIER + warpgroup)

    @gluon.jit
    def _pass_turn(pingpong, warpgroup):
        if pingpong.shape[0] == 2:
            _named_barrier("bar.arrive", PINGPONG_BARRIER + 1 - warpgroup)

    @gluon.jit
    def _consumer_step(
        j,  # the tile's index in the item (its keys start at j * BLOCK_N)
        tile,  # its index in the program's K/V ring count (stage and phase)
        pingpong,
        warpgroup,
        p,  # P of tile j - 1, registers
        acc,  # [HALF_M, HEAD_DIM] fp32
        m_i,
        l_i,
        q_tile,
        k_smem,
        v_smem,
        k_ready,
        v_ready,
        kv_empty,
        qk_scale,
        query_pos,
        s_layout: gl.constexpr,
        p_layout: gl.constexpr,
        HALF_M: gl.constexpr,
        BLOCK_N: gl.constexpr,
        NUM_STAGES: gl.constexpr,
        MASKED: gl.constexpr,
    ):
        stage = tile % NUM_STAGES
        prev = (tile - 1) % NUM_STAGES
        mbarrier.wait(k_ready.index(stage), (tile // NUM_STAGES) & 1)
        _take_turn(pingpong, warpgroup)
        s = warpgroup_mma(
            q_tile,
            k_smem.index(stage).permute((1, 0)),
            gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout),
            use_acc=False,
            is_async=True,
        )
        mbarrier.wait(v_ready.index(prev), ((tile - 1) // NUM_STAGES) & 1)
        acc = warpgroup_mma(p, v_smem.index(prev), acc, is_async=True)
        _pass_turn(pingpong, warpgroup)
        # wgmma groups retire in order: with one left outstanding, the scores are done and the
        # value product of tile j - 1 may still run while the softmax of tile j does.
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        p, m_i, l_i, alpha = _softmax_tile(
            s, m_i, l_i, qk_scale, query_pos, j * BLOCK_N, p_layout, v_smem.dtype, MASKED
        )
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        sm80_mbarrier.arrive(kv_empty.index(prev))  # K and V of tile j - 1 are read
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
        return p, acc, m_i, l_i

    @gluon.jit
    def _consumer_item(
        q_tile,  # [HALF_M, HEAD_DIM] this warpgroup's query rows
        k_smem,
        v_smem,
        q_bar,
        q_empty,
        k_ready,
        v_ready,
        kv_empty,
        out_ptr,
        stride_out_token,
        first_row,
        rows_start,  # position of the first of this warpgroup's rows in the request
        extend_len,
        head,
        num_tiles,
        tiles_before,  # K/V tiles of the program's earlier items (the ring's count)
        items_before,  # the program's earlier items (q_bar's phase)
        qk_scale,
        pingpong,
        warpgroup,
    ):
        HALF_M: gl.constexpr = q_tile.shape[0]
        HEAD_DIM: gl.constexpr = q_tile.shape[1]
        NUM_STAGES: gl.constexpr = k_smem.shape[0]
        BLOCK_N: gl.constexpr = k_smem.shape[1]
        dtype: gl.constexpr = v_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
        )
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
        )
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

        query_pos = rows_start + gl.arange(0, HALF_M, layout=row_layout)
        m_i = gl.full([HALF_M], float("-inf"), gl.float32, row_layout)
        l_i = gl.full([HALF_M], 0.0, gl.float32, row_layout)
        acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)

        # Tile 0 alone (masked: the diagonal when the block is the request's first).
        first = tiles_before % NUM_STAGES
        mbarrier.wait(q_bar, items_before & 1)
        mbarrier.wait(k_ready.index(first), (tiles_before // NUM_STAGES) & 1)
        _take_turn(pingpong, warpgroup)
        s = warpgroup_mma(
            q_tile,
            k_smem.index(first).permute((1, 0)),
            gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout),
            use_acc=False,
            is_async=True,
        )
        _pass_turn(pingpong, warpgroup)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, m_i, l_i, alpha = _softmax_tile(
            s, m_i, l_i, qk_scale, query_pos, 0, p_layout, dtype, True
        )
        # Tiles wholly before the block need no mask; the last one is the diagonal.
        for j in range(1, num_tiles - 1):
            p, acc, m_i, l_i = _consumer_step(
                j, tiles_before + j, pingpong, warpgroup, p, acc, m_i, l_i, q_tile, k_smem,
                v_smem, k_ready, v_ready, kv_empty, qk_scale, query_pos, s_layout, p_layout,
                HALF_M, BLOCK_N, NUM_STAGES, False,
            )  # fmt: skip
        if num_tiles > 1:
            p, acc, m_i, l_i = _consumer_step(
                num_tiles - 1, tiles_before + num_tiles - 1, pingpong, warpgroup, p, acc, m_i, l_i,
                q_tile, k_smem, v_smem, k_ready, v_ready, kv_empty, qk_scale, query_pos, s_layout,
                p_layout, HALF_M, BLOCK_N, NUM_STAGES, True,
            )  # fmt: skip
        # Every score of the item is computed: the loader may bring the next item's queries.
        sm80_mbarrier.arrive(q_empty)
        last_tile = tiles_before + num_tiles - 1
        last = last_tile % NUM_STAGES
        mbarrier.wait(v_ready.index(last), (last_tile // NUM_STAGES) & 1)
        _take_turn(pingpong, warpgroup)
        acc = warpgroup_mma(p, v_smem.index(last), acc, is_async=True)
        _pass_turn(pingpong, warpgroup)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        sm80_mbarrier.arrive(kv_empty.index(last))

        acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
        offs_m = gl.arange(0, HALF_M, layout=gl.SliceLayout(1, o_layout))
        offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        rows = rows_start + offs_m
        ptrs = (
            out_ptr
            + (first_row + rows)[:, None].to(gl.int64) * stride_out_token
            + head * HEAD_DIM
            + offs_d[None, :]
        )
        gl.store(ptrs, acc.to(dtype), mask=(rows < extend_len)[:, None])

    @gluon.jit
    def _consumer(
        warpgroup,  # 0 or 1: which half of each query block (a tensor, as partitions need)
        pingpong,  # [2] shared bytes: the warpgroups take turns; [1]: they do not
        q_smem,
        k_smem,
        v_smem,
        q_bar,
        q_empty,
        k_ready,
        v_ready,
        kv_empty,
        out_ptr,
        stride_out_token,
        extend_lens_ptr,
        extend_start_loc_ptr,
        batch,
        num_m_blocks,
        num_heads,
        group_size,
        qk_scale,
    ):
        """A consumer warpgroup's loop over the program's work items (the loader's order)."""
        HALF_M: gl.constexpr = q_smem.shape[1]
        BLOCK_N: gl.constexpr = k_smem.shape[1]
        q_tile = q_smem.index(warpgroup)
        num_items = num_heads * batch * num_m_blocks
        tiles_before = 0
        items_before = 0
        if pingpong.shape[0] == 2:
            if warpgroup == 1:  # warpgroup 0 takes the first turn
                _named_barrier("bar.arrive", PINGPONG_BARRIER + 0)
        num_programs = gl.num_programs(0)
        for lap in range(0, (num_items + num_programs - 1) // num_programs):
            item = _lap_item(lap, num_programs)
            head, first_row, extend_len, block_start, num_tiles = _work_item(
                item, num_items, extend_lens_ptr, extend_start_loc_ptr, batch, num_m_blocks,
                num_heads, BLOCK_N,
            )  # fmt: skip
            if num_tiles > 0:
                _consumer_item(
                    q_tile, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, out_ptr,
                    stride_out_token, first_row, block_start + warpgroup * HALF_M, extend_len,
                    head, num_tiles, tiles_before, items_before, qk_scale, pingpong, warpgroup,
                )  # fmt: skip
                tiles_before += num_tiles
                items_before += 1

    @gluon.jit(do_not_specialize=["batch", "num_m_blocks"])  # one compile for every batch
    def _hopper_extend_kernel(
        q_desc,  # q as [num_tokens, num_heads * HEAD_DIM], blocks [HALF_M, HEAD_DIM]
        k_desc,  # k_new as [num_tokens, num_kv_heads * HEAD_DIM], blocks [BLOCK_N, HEAD_DIM]
        v_desc,
        out_ptr,  # [num_tokens, num_heads, HEAD_DIM]
        extend_lens_ptr,  # [batch]
        extend_start_loc_ptr,  # [batch]
        qk_scale,  # softmax scale * log2(e)
        stride_out_token,
        batch,
        num_m_blocks,
        NUM_HEADS: gl.constexpr,
        GROUP_SIZE: gl.constexpr,  # query heads a KV head
        HEAD_DIM: gl.constexpr,
        HALF_M: gl.constexpr,  # query rows a consumer warpgroup
        CONSUMERS: gl.constexpr,  # consumer warpgroups a program: 1 or 2
        NUM_STAGES: gl.constexpr,
        CONSUMER_REGS: gl.constexpr,
        LOADER_REGS: gl.constexpr,
        PINGPONG: gl.constexpr,  # two consumers issue their matrix products by turns
    ):
        # Blocks of CONSUMERS * HALF_M query rows against key tiles of the same length: only
        # the last tile (the diagonal) needs the causal mask. A program runs the work items
        # pid, pid + num_programs, ...: one each in a grid of every item, or many in a
        # persistent grid, where the loader fetches an item's queries and first K/V tiles
        # while the consumers still finish the item before.
        BLOCK_N: gl.constexpr = CONSUMERS * HALF_M
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, HALF_M, HEAD_DIM], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        mbarrier.init(q_empty, count=CONSUMERS)  # one arrival per consumer
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=CONSUMERS)

        shared = (q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty)
        # A worker partition's arguments are tensors and shared memory: no constexprs.
        work = (extend_lens_ptr, extend_start_loc_ptr, batch, num_m_blocks)
        work += (gl.to_tensor(NUM_HEADS), gl.to_tensor(GROUP_SIZE))
        loader_args = (q_desc, k_desc, v_desc) + shared + work
        consumer_args = shared + (out_ptr, stride_out_token) + work + (qk_scale,)
        # A worker partition takes no constexpr: the ping-pong flag travels as the length of an
        # unused shared allocation ([2]: on), which the partitions read at compile time.
        pingpong = gl.allocate_shared_memory(
            gl.int8, [1 + (PINGPONG and CONSUMERS == 2)], gl.SwizzledSharedLayout(1, 1, 1, [0])
        )
        first = (gl.to_tensor(0), pingpong) + consumer_args
        if CONSUMERS == 2:
            second = (gl.to_tensor(1), pingpong) + consumer_args
            gl.warp_specialize(
                [(_consumer, first), (_consumer, second), (_loader, loader_args)],
                [4, 1],
                [CONSUMER_REGS, LOADER_REGS],
            )
        else:
            gl.warp_specialize([(_consumer, first), (_loader, loader_args)], [1], [LOADER_REGS])


@functools.cache
def multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache  # a pure function of its arguments, ~7 us each to build: once per shape
def shared_layout(block_shape: tuple[int, ...], dtype: torch.dtype):
    """The swizzled shared-memory layout TMA writes a [rows, head_dim] tile in."""
    gl_dtype = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return gl.NVMMASharedLayout.get_default_for(list(block_shape), gl_dtype)


def tma_descriptor(x: torch.Tensor, rows: int) -> TensorDescriptor:
    """The TMA descriptor of x ([tokens, heads, head_dim]) read in [rows, head_dim] tiles, through
    a view where heads and head_dim are contiguous, as projected (x may be a strided view)."""
    flat = x.flatten(1)
    block = [rows, x.shape[-1]]
    return TensorDescriptor(
        flat, list(flat.shape), list(flat.stride()), block, shared_layout(tuple(block), x.dtype)
    )


def hopper_extend_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, 128]
    k_new: torch.Tensor,  # [num_tokens, num_kv_heads, 128]
    v_new: torch.Tensor,  # [num_tokens, num_kv_heads, 128]
    extend_lens: torch.Tensor,  # [batch]
    extend_start_loc: torch.Tensor,  # [batch]
    max_extend_len: int,
    scaling: float,
    out: torch.Tensor,  # like q
    *,
    consumers: int = CONSUMERS,
    num_stages: int = NUM_STAGES,
    persistent: bool = PERSISTENT,
    pingpong: bool = PINGPONG,
) -> torch.Tensor:
    """Causal self-attention of each request's new tokens (no cached prefix), on sm_90.

    The caller (`extend_attention`) has validated the inputs and checked
    `hopper_extend_supported`; k_new / v_new may be strided views (TMA reads them by row).
    """
    _, num_heads, head_dim = q.shape
    num_kv_heads = k_new.shape[1]
    batch = extend_lens.shape[0]
    if consumers not in (1, 2):
        raise ValueError(f"consumers must be 1 or 2, got {consumers}")
    block_n = consumers * HALF_M  # query rows a work item, keys a K/V tile
    num_m_blocks = triton.cdiv(max_extend_len, block_n)
    num_items = num_heads * batch * num_m_blocks
    if persistent:  # as many programs as fit on the GPU at once, each looping over items
        per_sm = 2 if consumers == 1 and num_stages <= 3 else 1  # registers / shared memory
        grid = (min(num_items, per_sm * multiprocessors(q.device)),)
    else:
        grid = (num_items,)
    _hopper_extend_kernel[grid](
        tma_descriptor(q, HALF_M),
        tma_descriptor(k_new, block_n),
        tma_descriptor(v_new, block_n),
        out,
        extend_lens,
        extend_start_loc,
        scaling * LOG2_E,
        out.stride(0),
        batch,
        num_m_blocks,
        NUM_HEADS=num_heads,
        GROUP_SIZE=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        HALF_M=HALF_M,
        CONSUMERS=consumers,
        NUM_STAGES=num_stages,
        CONSUMER_REGS=CONSUMER_REGS,
        LOADER_REGS=LOADER_REGS,
        PINGPONG=pingpong,
        num_warps=4,
        maxnreg=MAX_REGISTERS[consumers],
    )
    return out
