"""`CudaGraphRunner`: decode steps replayed from CUDA graphs, one graph per batch-size bucket.

A decode step of a small batch is launch-bound: hundreds of small kernels whose launches cost
more than their work. Capturing the whole model forward once per batch size and replaying it
removes the launch gaps.

How it stays correct:
- Every input the graph reads lives in a static buffer (`input_ids`, `positions`,
  `req_pool_indices`, `seq_lens`, `out_cache_loc`), sized for the largest bucket; a replay
  copies the batch into the first rows and fills the rest with padding requests.
- Padding requests decode token 0 at position 0 in request row 0 with history length 1, and
  write their K/V to slot 0, the pool's padding slot that is never allocated. Their logits
  are dropped.
- The attention metadata of each bucket (split count, split workspaces) is built before the
  capture and kept alive by this runner: the graph holds its pointers. The Triton decode
  kernels read the lengths on the device, so one graph serves every length.
- The KV pool and `req_to_token` are the runner's own tensors, never reallocated.
- LoRA (`model_runner.lora_manager`): each row's adapter slot lives in a static buffer (-1 for
  padding rows and base-model requests) read by the SGMV kernels on the device, one segment
  per row, so one graph serves every mix of adapters.
- EAGLE (`model_runner.graphs_keep_hidden_states`): the graphs also write every row's last
  hidden state into a shared `[max_batch_size, hidden]` buffer, so EAGLE's verify forwards
  (decode rows) replay graphs too; other engines keep logits only.
- Tree attention (`model_runner.tree_attention_enabled`): each batch size of 2 or more gets a
  second graph whose attention is `tree_decode_attention` over a static `TreeDecodePlan` of fixed
  capacities. A batch with `shared_prefixes` copies its plan into that graph's tables and replays
  it; a plan that does not fit them, or a batch without sharing, replays the plain graph. The
  tree kernels' grids depend only on the capacities, so one graph serves every grouping.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.lora import LoRASegments
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from radixgen.runtime.model_runner import ModelRunner

logger = logging.getLogger(__name__)


# Above this batch size, graphs are captured every LARGE_BATCH_STEP rows: padding costs
# at most 1/8 of a batch there, and fewer graphs keep start-up capture time short.
LARGE_BATCH_START = 256
LARGE_BATCH_STEP = 32


def capture_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 256, then every 32 up to `max_batch_size` (which is
    always included)."""
    sizes = [size for size in (1, 2, 4) if size < max_batch_size]
    sizes += list(range(8, min(max_batch_size, LARGE_BATCH_START + 1), 8))
    sizes += list(range(LARGE_BATCH_START + LARGE_BATCH_STEP, max_batch_size, LARGE_BATCH_STEP))
    return sorted({*sizes, max_batch_size})


@dataclass
class _StaticInputs:
    """The graph-visible inputs, `[max_batch_size]` each."""

    input_ids: torch.Tensor  # int64
    positions: torch.Tensor  # int64
    req_pool_indices: torch.Tensor  # int64
    seq_lens: torch.Tensor  # int64
    out_cache_loc: torch.Tensor  # int64

    def fill_padding(self) -> None:
        self.input_ids.zero_()
        self.positions.zero_()
        self.req_pool_indices.zero_()
        self.seq_lens.fill_(1)
        self.out_cache_loc.zero_()  # the padding slot


@dataclass
class _CapturedGraph:
    graph: torch.cuda.CUDAGraph
    forward_batch: ForwardBatch  # views of the static inputs, the batch the graph ran on
    attn_metadata: object  # kept alive: the graph reads its workspaces
    logits: torch.Tensor  # [batch_size, vocab] float32: rows of the shared output buffer
    hidden_states: torch.Tensor | None  # [batch_size, hidden]: rows of the shared buffer


class CudaGraphRunner:
    """Captures decode forwards for the batch sizes of `capture_batch_sizes` and replays them.

    Args:
        model_runner: a runner on CUDA whose attention backend reads lengths on the device
            (the Triton backend).
    """

    def __init__(self, model_runner: ModelRunner):
        self.model_runner = model_runner
        self.device = model_runner.device
        max_batch_size = min(
            model_runner.server_args.cuda_graph_max_bs, model_runner.max_running_requests
        )
        self.batch_sizes = capture_batch_sizes(max_batch_size)
        self.max_batch_size = max_batch_size

        def buffer():
            return torch.zeros(max_batch_size, dtype=torch.int64, device=self.device)

        self.static = _StaticInputs(buffer(), buffer(), buffer(), buffer(), buffer())
        self.static.fill_padding()
        self.lora_state = (
            model_runner.lora_manager.state if model_runner.lora_manager is not None else None
        )
        # [max_batch_size] int32: each row's LoRA slot (-1: none); decode segments are rows.
        self.static_lora_slots = torch.full(
            (max_batch_size,), -1, dtype=torch.int32, device=self.device
        )
        self.static_row_starts = torch.arange(max_batch_size, dtype=torch.int32, device=self.device)
        self.static_row_lens = torch.ones(max_batch_size, dtype=torch.int32, device=self.device)
        self.graphs: dict[int, _CapturedGraph] = {}
        self.tree_graphs: dict[int, _CapturedGraph] = {}  # tree attention, batch sizes >= 2
        self.memory_pool = torch.cuda.graph_pool_handle()
        self._logits: torch.Tensor | None = None  # every graph's output rows
        self.keeps_hidden_states = model_runner.graphs_keep_hidden_states
        self._hidden_states: torch.Tensor | None = None  # every graph's hidden-state rows
        self._capture_all()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return (
            forward_batch.mode == ForwardMode.DECODE
            and forward_batch.batch_size <= self.max_batch_size
        )

    def replay(
        self, forward_batch: ForwardBatch, return_hidden_states: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Runs a decode batch through the smallest captured graph that holds it.

        Returns:
            float32 logits [batch, vocab] (a fresh tensor, not the graph's buffer).
        """
        batch = forward_batch.batch_size
        padded = self.batch_sizes[bisect.bisect_left(self.batch_sizes, batch)]
        static = self.static
        if padded > batch:
            static.fill_padding()
        # One dispatch for the five copies (the host's step at batch 1 is ~0.2 ms of launches).
        torch._foreach_copy_(
            [
                static.input_ids[:batch],
                static.positions[:batch],
                static.req_pool_indices[:batch],
                static.seq_lens[:batch],
                static.out_cache_loc[:batch],
            ],
            [
                forward_batch.input_ids,
                forward_batch.positions,
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                forward_batch.out_cache_loc,
            ],
        )
        if self.lora_state is not None:
            self.static_lora_slots.fill_(-1)
            if forward_batch.lora_segments is not None:  # decode: one segment per row
                self.static_lora_slots[:batch].copy_(forward_batch.lora_segments.segment_slots)
        captured = self.graphs[padded]
        tree_graph = self.tree_graphs.get(padded)
        if (
            forward_batch.shared_prefixes is not None
            and tree_graph is not None
            and self.model_runner.attn_backend.fill_graph_tree_plan(
                tree_graph.attn_metadata, forward_batch.shared_prefixes
            )
        ):
            captured = tree_graph
        captured.graph.replay()
        logits = captured.logits[:batch].clone()
        if not return_hidden_states:
            return logits
        if captured.hidden_states is None:
            raise ValueError("these graphs keep no hidden states (graphs_keep_hidden_states)")
        return logits, captured.hidden_states[:batch].clone()

    def _capture_all(self) -> None:
        backend = self.model_runner.attn_backend
        stream = torch.cuda.Stream(device=self.device)
        # Largest first: the smaller graphs then fit in the memory the largest left in the pool.
        with_tree = self.model_runner.tree_attention_enabled
        with torch.no_grad():
            for batch_size in reversed(self.batch_sizes):
                forward_batch = self._static_forward_batch(batch_size)
                metadata = backend.make_metadata(forward_batch)
                self.graphs[batch_size] = self._capture(stream, forward_batch, metadata)
                if with_tree and batch_size >= 2:
                    with_tree = self._capture_tree(stream, batch_size)
        backend.metadata = None
        torch.cuda.synchronize(self.device)
        logger.info(
            "captured decode CUDA graphs for batch sizes %s%s",
            self.batch_sizes,
            " (plain and tree attention)" if self.tree_graphs else "",
        )

    def _capture_tree(self, stream, batch_size: int) -> bool:
        """Captures the tree-attention graph of `batch_size`; False (tree attention turned off
        for this runner, with the error logged) if its kernels fail to build, so that a fault
        of the newer kernel leaves the engine serving with plain decode attention."""
        # Its own ForwardBatch (same static tensors): the backend matches metadata to the batch.
        forward_batch = self._static_forward_batch(batch_size)
        metadata = self.model_runner.attn_backend.make_graph_tree_metadata(forward_batch)
        try:
            self.tree_graphs[batch_size] = self._capture(stream, forward_batch, metadata)
        except Exception:  # the warm-up compiles the kernels, before any graph capture starts
            logger.exception("tree attention turned off: its decode graph failed to build")
            self.tree_graphs.clear()
            self.model_runner.tree_attention_enabled = False
            return False
        return True

    def _capture(self, stream, forward_batch: ForwardBatch, metadata) -> _CapturedGraph:
        model = self.model_runner.model
        self.model_runner.attn_backend.metadata = metadata
        if self.lora_state is not None:  # the wrapped layers read the static segments
            self.lora_state.segments = forward_batch.lora_segments
        stream.wait_stream(torch.cuda.current_stream(self.device))
        keep = self.keeps_hidden_states
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: compiles kernels, settles allocations
                outputs = model(forward_batch, keep)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        logits, hidden = outputs if keep else (outputs, None)
        if self._logits is None:  # [max_batch_size, vocab], outside the graph pool
            self._logits = logits.new_empty((self.max_batch_size, logits.shape[1]))
        if keep and self._hidden_states is None:  # [max_batch_size, hidden], likewise
            self._hidden_states = hidden.new_empty((self.max_batch_size, hidden.shape[1]))
        del outputs, logits, hidden
        batch_size = forward_batch.batch_size
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.memory_pool, stream=stream):
            # Every graph writes its logits into the one shared buffer (graphs replay one at
            # a time; `replay` clones its rows): the graph's own logits tensor goes back to
            # the pool for the next capture. Kept per graph, the logits of the 59 batch sizes
            # up to 1,024 at a 128,256 vocabulary held 9.5 GiB (fp32), twice with tree
            # attention: the H200 ran out of memory serving with both graph sets.
            outputs = model(forward_batch, keep)
            logits, hidden = outputs if keep else (outputs, None)
            self._logits[:batch_size].copy_(logits)
            if keep:
                self._hidden_states[:batch_size].copy_(hidden)
        del outputs, logits, hidden
        hidden_rows = self._hidden_states[:batch_size] if keep else None
        return _CapturedGraph(
            graph, forward_batch, metadata, self._logits[:batch_size], hidden_rows
        )

    def _static_forward_batch(self, batch_size: int) -> ForwardBatch:
        static = self.static
        runner = self.model_runner
        ones = torch.ones(batch_size, dtype=torch.int64, device=self.device)
        return ForwardBatch(
            mode=ForwardMode.DECODE,
            input_ids=static.input_ids[:batch_size],
            positions=static.positions[:batch_size],
            req_pool_indices=static.req_pool_indices[:batch_size],
            seq_lens=static.seq_lens[:batch_size],
            prefix_lens=static.seq_lens[:batch_size] - 1,  # unused by decode attention
            extend_lens=ones,
            out_cache_loc=static.out_cache_loc[:batch_size],
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
            seq_lens_cpu=[1] * batch_size,
            prefix_lens_cpu=[0] * batch_size,
            extend_lens_cpu=[1] * batch_size,
            lora_segments=self._static_lora_segments(batch_size),
        )

    def _static_lora_segments(self, batch_size: int) -> LoRASegments | None:
        if self.lora_state is None:
            return None
        slots = self.static_lora_slots[:batch_size]
        return LoRASegments(
            token_slots=slots,
            segment_starts=self.static_row_starts[:batch_size],
            segment_lens=self.static_row_lens[:batch_size],
            segment_slots=slots,
            max_segment_len=1,
            slots_present=(),  # host list of the torch reference; graphs run the kernels
        )
