"""`LoRALinearMethod`: a linear method that wraps any base method (unquantized, FP8, ...) and
adds each token's adapter delta to the base output.

The linear layer's signature stays `x -> y` (shared with quantized and tensor-parallel
methods), so the batch's adapter segments reach the wrapped layers through one
`LoRABatchState` per model, owned by the `LoRAManager` and set by the model runner before each
forward (CUDA graphs: set to static buffers at capture, refilled before each replay).

At decode on CUDA, a projection's delta (shrink, then expand) runs on a side stream beside the
base GEMM, so that it stays off the layer's critical path (at batch 1 on the H200 the two
decode kernels of each of 128 projections per step cost about as much as the 15% the
multi-LoRA target allows in all; docs/lora.md); CUDA graphs capture the fork and the join as
graph edges. The delta then cannot go into the GEMM's output: for o_proj and down_proj, whose
outputs the decoder layer adds to the residual stream next, it goes into the residual
(`apply_adding_to`), and gate_up's and qkv's go into buffers of their own that the next kernel
adds (SiLU-and-mul; the fused rotary + KV store: `apply_with_delta`). Plain `apply` adds it in
line.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixgen.kernels.lora import (
    LoRASegments,
    check_lora_operands,
    lora_apply,
    lora_apply_ref,
    takes_decode_kernels,
)
from radixgen.kernels.lora_decode import (
    decode_partials,
    lora_decode_expand,
    lora_decode_shrink,
    plan_decode_launch,
)
from radixgen.runtime.models.linear import LinearBase, LinearMethod, ParamLayout


@dataclass
class LoRABatchState:
    """The adapter segments of the forward in progress (None: no token uses an adapter)."""

    segments: LoRASegments | None = None
    # CUDA: the stream decode shrinks run on, beside the base GEMM (None: in line).
    shrink_stream: torch.cuda.Stream | None = None


class LoRALinearMethod(LinearMethod):
    """`base.apply(x)` plus the batched LoRA delta from the pool's buffers of this layer.

    Args:
        base: the layer's own method (weights, loading and the base product stay its).
        lora_a: [num_slots, num_shards * max_rank, in]; lora_b: [num_slots, out, max_rank].
        scalings: [num_slots] fp32.
        state: the model's LoRABatchState.
        use_triton: the Triton kernels (CUDA: SGMV, decode) or the torch reference (CPU).
    """

    def __init__(
        self,
        base: LinearMethod,
        *,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scalings: torch.Tensor,
        state: LoRABatchState,
        use_triton: bool,
    ):
        self.base = base
        self.ignored_names = base.ignored_names
        self.lora_a, self.lora_b, self.scalings = lora_a, lora_b, scalings
        self.state = state
        self._apply_delta = lora_apply if use_triton else lora_apply_ref

    def create_weights(self, layer: LinearBase) -> dict[str, ParamLayout]:
        return self.base.create_weights(layer)

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        self.base.process_weights_after_loading(layer)

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        """The base output with the delta added in line (the decoder layer's projections go
        through `apply_adding_to` / `apply_with_delta`, which overlap it with the GEMM)."""
        y = self.base.apply(layer, x)  # [..., out]
        segments = self.state.segments
        if segments is None:
            return y
        x_2d, y_2d = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])  # [T, in], [T, out]
        self._apply_delta(
            x_2d, y_2d, self.lora_a, self.lora_b, self.scalings, segments, layer.output_sizes
        )
        return y

    def apply_adding_to(
        self, layer: LinearBase, x: torch.Tensor, add_to: torch.Tensor
    ) -> torch.Tensor:
        """The delta goes into `add_to` (the residual stream the caller adds the output to
        next) rather than into the output: at decode on CUDA, shrink and expand both run on
        the side stream beside the base GEMM, so none of it is on the critical path."""
        segments = self.state.segments
        if segments is None or not add_to.is_contiguous():
            return self.apply(layer, x)
        target = add_to.view(-1, layer.output_size)  # [T, out]
        side = self.state.shrink_stream
        if side is None or not takes_decode_kernels(segments, layer.output_sizes):
            x_2d = x.reshape(-1, x.shape[-1])  # [T, in]
            self._apply_delta(
                x_2d, target, self.lora_a, self.lora_b, self.scalings, segments, layer.output_sizes
            )
            return self.base.apply(layer, x)
        return self._base_with_delta_beside(layer, x, segments, side, target, zero_first=False)

    def apply_with_delta(
        self, layer: LinearBase, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """At decode: the delta into its own float32 buffer for the next kernel to add
        (gate_up: the SiLU-and-mul; qkv: the rotary + KV store); on CUDA zeroed, shrunk and
        expanded on the side stream beside the base GEMM. Extend batches: the delta is in the
        output, as `apply`."""
        segments = self.state.segments
        if segments is None or not takes_decode_kernels(segments, layer.output_sizes):
            return self.apply(layer, x), None
        rows = x.numel() // x.shape[-1]
        side = self.state.shrink_stream
        if side is None:  # in line (the torch reference on the CPU)
            delta = torch.zeros(rows, layer.output_size, dtype=torch.float32, device=x.device)
            self._apply_delta(
                x.reshape(rows, -1),
                delta,
                self.lora_a,
                self.lora_b,
                self.scalings,
                segments,
                layer.output_sizes,
            )
            y = self.base.apply(layer, x)  # [..., out]
            return y, delta.view(y.shape)
        # [T, out] fp32, zeroed on the side stream (the expand adds into it).
        delta = torch.empty(rows, layer.output_size, dtype=torch.float32, device=x.device)
        y = self._base_with_delta_beside(layer, x, segments, side, delta, zero_first=True)
        return y, delta.view(y.shape)

    def _base_with_delta_beside(
        self,
        layer: LinearBase,
        x: torch.Tensor,  # [..., in]
        segments: LoRASegments,
        side: torch.cuda.Stream,
        target: torch.Tensor,  # [T, out], the delta is added into it
        zero_first: bool,
    ) -> torch.Tensor:
        """Decode on CUDA: the base output, computed while `side` zeroes `target` (if asked)
        and adds the delta into it (shrink, then expand); both are done when it returns."""
        x_2d = x.reshape(-1, x.shape[-1])  # [T, in]
        check_lora_operands(
            x_2d, self.lora_a, self.lora_b, self.scalings, segments, layer.output_sizes
        )
        launch = plan_decode_launch(
            x_2d.shape[0], x_2d.shape[1], layer.output_size, self.lora_a.shape[0], on_cuda=True
        )
        # Allocated on the layer's stream, which frees it only after the join below.
        partials = decode_partials(x_2d, self.lora_a, launch)
        main = torch.cuda.current_stream(x.device)
        side.wait_stream(main)  # x and target are ready
        with torch.cuda.stream(side):
            if zero_first:
                target.zero_()
            lora_decode_shrink(x_2d, self.lora_a, segments.token_slots, launch, partials)
            lora_decode_expand(
                partials,
                target,
                self.lora_b,
                self.scalings,
                segments.token_slots,
                layer.output_sizes,
                launch,
            )
        y = self.base.apply(layer, x)  # [..., out]
        main.wait_stream(side)  # the delta is in target before the next kernel reads it
        return y
