"""`Int4LinearMethod`: int4 weight-only linear layers from AWQ or GPTQ checkpoints (or from a
high-precision checkpoint quantized by round-to-nearest at load time).

Whatever the checkpoint format (runtime/models/int4_checkpoint.py), a loaded layer holds the
layout the Triton kernels read (kernels/int4_gemm.py):

- `qweight: [K / 8, N] int32`, packed along K (kernels/int4_reference.py: GPTQ's row order, or its
  128-row interleave when the group size is a multiple of 128);
- `scales`, `zeros: [K / G, N]` in the model dtype (zeros as exact small floats);
- `split_k_counters: [16 cdiv(N, 32)] int32` zeros, a buffer the kernels use to reduce split-K
  partials in the launch itself (kernels/int4_gemm.py);
- `input_perm: [K] int64` for GPTQ act-order (`desc_act`) checkpoints only: the kernels need
  each group's rows to be contiguous, so the rows are sorted by `g_idx` at load time and the
  activations gathered in the same order at run time (`x[..., input_perm]`).

The repack happens in `process_weights_after_loading`, once all shards of a fused layer (q/k/v,
gate/up) have arrived: each checkpoint tensor is first unpacked to output-row-first codes
(`prepare_checkpoint_tensor`), so the shards stack along dim 0 like any other layer's.
"""

from __future__ import annotations

import torch
from torch import nn

from radixgen.kernels.int4_gemm import (
    int4_gemm,
    int4_linear,
    int4_takes_gated_input,
    int4_takes_rope_store,
    int4_takes_silu_output,
    pack_int4_rows,
    runtime_span,
    split_k_counter_slots,
)
from radixgen.kernels.rope_store import RopeStore
from radixgen.runtime.models.int4_checkpoint import (
    Int4Scheme,
    awq_codes,
    gptq_codes,
    quantize_rtn_int4,
)
from radixgen.runtime.models.linear import (
    LinearBase,
    LinearMethod,
    ParamLayout,
    is_unbiased_gate_up,
    is_unbiased_qkv,
)


class Int4LinearMethod(LinearMethod):
    """int4 weights with per-group scales and zero points; activations in the model dtype.

    Args:
        scheme: the checkpoint's format.
        from_high_precision: the checkpoint stores float `weight`s, quantized here by
            round-to-nearest with the scheme's group size (asymmetric; `load_format="dummy"`
            and `--quantization awq|gptq` on an unquantized checkpoint).
    """

    def __init__(self, scheme: Int4Scheme, *, from_high_precision: bool = False):
        self.scheme = scheme
        self.from_high_precision = from_high_precision

    def create_weights(self, layer: LinearBase) -> dict[str, ParamLayout]:
        group_size = self.scheme.group_size_for(layer.input_size)
        rows, num_groups = layer.output_sizes, layer.input_size // group_size
        if any(size % 8 for size in rows):
            raise ValueError(f"int4 output sizes {rows} must be multiples of 8 (packed zeros)")
        if self.from_high_precision:
            return {"weight": ParamLayout(rows, (layer.input_size,))}
        layouts = {
            "qweight": ParamLayout(rows, (layer.input_size,), torch.uint8),
            "qzeros": ParamLayout(rows, (num_groups,), torch.uint8),
            "scales": ParamLayout(rows, (num_groups,)),
        }
        if self.scheme.packing == "gptq":
            layouts["g_idx"] = ParamLayout((1,) * len(rows), (layer.input_size,), torch.int32)
        return layouts

    def prepare_checkpoint_tensor(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if self.from_high_precision or name not in ("qweight", "qzeros", "scales", "g_idx"):
            return tensor
        if self.scheme.packing == "awq":
            return awq_codes(name, tensor)
        return gptq_codes(name, tensor, self.scheme.zeros_minus_one)

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        group_size = self.scheme.group_size_for(layer.input_size)
        if self.from_high_precision:
            weight = layer.weight.data
            codes, scales, zeros = quantize_rtn_int4(weight, group_size)
            # fp16 scales, as AWQ/GPTQ checkpoints store them: the same grid as a checkpoint.
            scales = scales.half().to(weight.dtype)
            del layer.weight
        else:
            codes, zeros, scales = layer.qweight.data, layer.qzeros.data, layer.scales.data
            del layer.qweight, layer.qzeros, layer.scales
        input_perm = None
        if self.scheme.packing == "gptq" and not self.from_high_precision:
            input_perm = _act_order_permutation(layer.g_idx.data, group_size)
            del layer.g_idx
            if input_perm is not None:
                codes = codes[:, input_perm]
        # codes: [N, K] uint8; scales, zeros: [N, K / G]
        # [K / 8, N] in the runtime layout (kernels/int4_reference.py: interleaved for group 128)
        packed = pack_int4_rows(codes.T.contiguous(), runtime_span(group_size))
        layer.qweight = _frozen(packed)
        layer.scales = _frozen(scales.T.contiguous())  # [K / G, N]
        layer.zeros = _frozen(zeros.T.to(scales.dtype).contiguous())  # [K / G, N]
        layer.input_perm = None if input_perm is None else _frozen(input_perm)
        layer.group_size = group_size
        # The kernels' split-K tile counters: zero between calls (each launch resets its own).
        slots = split_k_counter_slots(layer.qweight.shape[1])
        counters = torch.zeros(slots, dtype=torch.int32, device=layer.qweight.device)
        layer.register_buffer("split_k_counters", counters, persistent=False)

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        if layer.input_perm is not None:
            x = x.index_select(-1, layer.input_perm)  # act-order: rows sorted by group
        return int4_linear(
            x, layer.qweight, layer.scales, layer.zeros, layer.group_size, layer.bias,
            layer.split_k_counters,
        )  # fmt: skip

    def takes_gated_input(self, layer: LinearBase, num_tokens: int) -> bool:
        # An act-order input permutation would need the gate and up halves permuted alike.
        return layer.input_perm is None and int4_takes_gated_input(
            num_tokens, layer.qweight, layer.group_size
        )

    def apply_gated(self, layer: LinearBase, gate_up: torch.Tensor) -> torch.Tensor:
        out = int4_gemm(
            gate_up, layer.qweight, layer.scales, layer.zeros, layer.group_size,
            layer.split_k_counters, gated=True,
        )  # fmt: skip
        return out if layer.bias is None else out + layer.bias

    def takes_silu_output(self, layer: LinearBase, num_tokens: int) -> bool:
        # No act-order permutation either (int4_gemm takes x as it is).
        return (
            is_unbiased_gate_up(layer) and layer.input_perm is None
            and int4_takes_silu_output(num_tokens, layer.qweight, layer.group_size)
        )  # fmt: skip

    def apply_silu_output(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        return int4_gemm(
            x, layer.qweight, layer.scales, layer.zeros, layer.group_size,
            layer.split_k_counters, silu_out=True,
        )  # fmt: skip

    def takes_rope_store(self, layer: LinearBase, num_tokens: int) -> bool:
        return (
            is_unbiased_qkv(layer) and layer.input_perm is None
            and int4_takes_rope_store(num_tokens, layer.qweight, layer.group_size)
        )  # fmt: skip

    def apply_rope_store(self, layer: LinearBase, x: torch.Tensor, rope: RopeStore) -> torch.Tensor:
        return int4_gemm(
            x, layer.qweight, layer.scales, layer.zeros, layer.group_size,
            layer.split_k_counters, rope_store=rope,
        )  # fmt: skip


def _frozen(tensor: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(tensor, requires_grad=False)


def _act_order_permutation(g_idx: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """The input-row order that makes each group contiguous, or None if it already is.

    Args:
        g_idx: `[num_shards, K]` int32, each shard's group of every input row.

    Raises:
        ValueError: shards with different g_idx (a fused layer shares one input order), or a
            g_idx whose groups do not hold exactly `group_size` rows each.
    """
    if not torch.equal(g_idx, g_idx[:1].expand_as(g_idx)):
        raise ValueError("GPTQ g_idx differs between the fused modules (q/k/v or gate/up)")
    g_idx = g_idx[0].long()  # [K]
    k = g_idx.numel()
    counts = torch.bincount(g_idx.clamp(min=0), minlength=k // group_size)
    if g_idx.min() < 0 or counts.numel() != k // group_size or bool((counts != group_size).any()):
        raise ValueError(
            f"unsupported GPTQ g_idx: every group must hold exactly group_size={group_size} "
            f"input rows (got group sizes {sorted(set(counts.tolist()))})"
        )
    if torch.equal(g_idx, torch.arange(k, device=g_idx.device) // group_size):
        return None
    return torch.argsort(g_idx, stable=True)
