"""`LoRALinearMethod`: a linear method that wraps any base method (unquantized, FP8, ...) and
adds each token's adapter delta to the base output.

The linear layer's signature stays `x -> y` (shared with quantized and tensor-parallel
methods), so the batch's adapter segments reach the wrapped layers through one
`LoRABatchState` per model, owned by the `LoRAManager` and set by the model runner before each
forward (CUDA graphs: set to static buffers at capture, refilled before each replay).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixgen.kernels.lora import LoRASegments, lora_apply, lora_apply_ref
from radixgen.runtime.models.linear import LinearBase, LinearMethod, ParamLayout


@dataclass
class LoRABatchState:
    """The adapter segments of the forward in progress (None: no token uses an adapter)."""

    segments: LoRASegments | None = None


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
        y = self.base.apply(layer, x)  # [..., out]
        segments = self.state.segments
        if segments is None:
            return y
        x_2d, y_2d = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])  # [T, in], [T, out]
        self._apply_delta(
            x_2d, y_2d, self.lora_a, self.lora_b, self.scalings, segments, layer.output_sizes
        )
        return y
