"""The int4 checkpoint formats on disk: AWQ (GEMM packing) and GPTQ, read and written.

Every tensor below is a checkpoint module's, `W: [N, K]` (out, in) in float, quantized per
group of `G` consecutive input features as `W[n, k] ~ (q[n, k] - z[g, n]) * s[g, n]`,
`g = k // G` (GPTQ with `desc_act`: `g = g_idx[k]`).

AWQ (`quant_method: awq`, `version: gemm`), packed along the output columns:
- `qweight: [K, N / 8] int32`: nibble i (bits 4i..4i+3) of word `[k, c]` holds `q` of column
  `8 c + AWQ_ORDER[i]`, with AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7];
- `qzeros: [K / G, N / 8] int32`: `z`, packed the same way;
- `scales: [K / G, N]` fp16.

GPTQ (`quant_method: gptq`), packed along the input rows:
- `qweight: [K / 8, N] int32`: nibble j of word `[i, n]` holds `q` of row `k = 8 i + j`;
- `qzeros: [K / G, N / 8] int32`: nibble j of word `[g, c]` holds column `8 c + j`'s zero, stored
  as `z - 1` (mod 16) by the original format (`checkpoint_format: gptq`, "v1"; symmetric
  checkpoints store 7 for z = 8) or as `z` (`gptq_v2`);
- `scales: [K / G, N]` fp16; `g_idx: [K] int32`: the group of each input row (`k // G` without
  `desc_act`; with it, a permutation's groups).

The readers (`*_codes`) return codes in output-row-first layouts, which is how the linear
layer stacks the shards of a fused projection; the writers quantize a float weight by
round-to-nearest (`quantize_rtn_int4`), which is what tests and scripts/int4_accuracy.py use to
make checkpoints (AutoAWQ's packer checks the AWQ writer in tests/test_int4_checkpoint.py).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from radixgen.kernels.int4_gemm import pack_int4_rows, unpack_int4_rows

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
Int4Packing = Literal["awq", "gptq"]


@dataclass(frozen=True)
class Int4Scheme:
    """How an int4 checkpoint stores its linear layers (validated by quantization.py).

    Attributes:
        packing: "awq" (GEMM packing) or "gptq".
        group_size: input features per scale; -1: one group over all of K (per channel).
        zeros_minus_one: GPTQ "v1" zeros (`z - 1` stored); False for AWQ and gptq_v2.
        desc_act: GPTQ act-order: `g_idx` permutes the groups (repacked at load time).
    """

    packing: Int4Packing
    group_size: int = 128
    zeros_minus_one: bool = False
    desc_act: bool = False

    def group_size_for(self, input_size: int) -> int:
        """The group size of a layer with `input_size` features.

        Raises:
            ValueError: the group size does not divide the layer's input size.
        """
        group_size = input_size if self.group_size == -1 else self.group_size
        if input_size % group_size or group_size % 8:
            raise ValueError(
                f"int4 group_size {group_size} must be a multiple of 8 dividing the layer's "
                f"input size {input_size}"
            )
        return group_size


def _check_packed(name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype != torch.int32 or tensor.dim() != 2:
        raise ValueError(
            f"{name} must be a 2-D int32 tensor, got {tuple(tensor.shape)} {tensor.dtype}"
        )


def unpack_awq_columns(packed: torch.Tensor) -> torch.Tensor:  # [R, 8 C] uint8
    """`[R, C] int32` in AWQ order -> codes `[R, 8 C]`."""
    shifts = torch.tensor(AWQ_ORDER, dtype=torch.int32, device=packed.device).argsort() * 4
    # shifts[j]: the bit offset of column 8 c + j in its word.
    codes = (packed[:, :, None] >> shifts.to(torch.int32)[None, None, :]) & 0xF  # [R, C, 8]
    return codes.reshape(packed.shape[0], -1).to(torch.uint8)


def pack_awq_columns(codes: torch.Tensor) -> torch.Tensor:  # [R, C / 8] int32
    """Inverse of `unpack_awq_columns`."""
    rows, cols = codes.shape
    grouped = codes.to(torch.int32).reshape(rows, cols // 8, 8)[:, :, list(AWQ_ORDER)]
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=codes.device)
    return (grouped << shifts).sum(-1, dtype=torch.int32)  # disjoint bits: sum == or


def unpack_gptq_columns(packed: torch.Tensor) -> torch.Tensor:  # [R, 8 C] uint8
    """GPTQ qzeros: `[R, C] int32`, nibble j of word c -> column `8 c + j`."""
    return unpack_int4_rows(packed.T.contiguous()).T


def pack_gptq_columns(codes: torch.Tensor) -> torch.Tensor:  # [R, C / 8] int32
    return pack_int4_rows(codes.T.contiguous()).T.contiguous()


def awq_codes(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """An AWQ checkpoint tensor in output-row-first layout: qweight -> `[N, K]` codes, qzeros
    -> `[N, K / G]` zeros (uint8), scales -> `[N, K / G]`."""
    if name == "scales":
        return tensor.T
    _check_packed(name, tensor)
    return unpack_awq_columns(tensor).T


def gptq_codes(name: str, tensor: torch.Tensor, zeros_minus_one: bool) -> torch.Tensor:
    """A GPTQ checkpoint tensor in output-row-first layout: qweight -> `[N, K]` codes, qzeros
    -> `[N, K / G]` zeros (uint8, `z`: a v1 `z - 1` is incremented, so 15 reads as 16),
    scales -> `[N, K / G]`, g_idx -> `[1, K]` int32."""
    if name == "scales":
        return tensor.T
    if name == "g_idx":
        if tensor.dim() != 1 or tensor.is_floating_point():
            raise ValueError(f"g_idx must be a 1-D integer tensor, got {tuple(tensor.shape)}")
        return tensor.to(torch.int32)[None, :]
    _check_packed(name, tensor)
    if name == "qweight":
        return unpack_int4_rows(tensor).T
    return (unpack_gptq_columns(tensor) + int(zeros_minus_one)).T


def quantize_rtn_int4(
    weight: torch.Tensor, group_size: int, *, symmetric: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest asymmetric (or symmetric, z = 8) 4-bit quantization per group.

    Args:
        weight: `[N, K]` float, K a multiple of group_size.

    Returns:
        codes `[N, K]` uint8 in 0..15, scales `[N, K / G]` float32, zeros `[N, K / G]` uint8.
    """
    n, k = weight.shape
    groups = weight.float().reshape(n, k // group_size, group_size)
    if symmetric:
        scales = groups.abs().amax(-1) / 7.5
        zeros = torch.full_like(scales, 8.0)
    else:
        low = groups.amin(-1).clamp(max=0.0)
        high = groups.amax(-1).clamp(min=0.0)
        scales = (high - low) / 15.0
        zeros = (-low / scales.clamp(min=1e-12)).round().clamp(0, 15)
    scales = scales.clamp(min=1e-8)  # an all-zero group
    codes = (groups / scales[..., None] + zeros[..., None]).round().clamp(0, 15)
    return codes.reshape(n, k).to(torch.uint8), scales, zeros.to(torch.uint8)


def _dequantized(codes, scales, zeros, group_size: int) -> torch.Tensor:  # [N, K] float32
    """`(q - z) * s` of `quantize_rtn_int4`'s outputs (scales as stored: fp16)."""
    zeros_per_column = zeros.float().repeat_interleave(group_size, 1)
    scales_per_column = scales.half().float().repeat_interleave(group_size, 1)
    return (codes.float() - zeros_per_column) * scales_per_column


def awq_tensors(
    weight: torch.Tensor, group_size: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The AWQ checkpoint tensors of a float `[N, K]` weight (RTN, zero points), and the
    weight they encode (`[N, K]` float32)."""
    codes, scales, zeros = quantize_rtn_int4(weight, group_size)
    tensors = {
        "qweight": pack_awq_columns(codes.T.contiguous()),
        "qzeros": pack_awq_columns(zeros.T.contiguous()),
        "scales": scales.T.contiguous().half(),
    }
    return tensors, _dequantized(codes, scales, zeros, group_size)


def gptq_tensors(
    weight: torch.Tensor,
    group_size: int,
    *,
    symmetric: bool,
    zeros_minus_one: bool = True,
    input_order: torch.Tensor | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The GPTQ checkpoint tensors of a float `[N, K]` weight (RTN), and the weight they
    encode (`[N, K]` float32, a v1 zero of 0 reads back as 16: avoid asymmetric v1 there).

    Args:
        input_order: act-order (`desc_act`): the order in which input rows were quantized;
            group `i` holds rows `input_order[i G : (i + 1) G]` (g_idx follows). None: in order.
    """
    n, k = weight.shape
    order = torch.arange(k) if input_order is None else input_order
    codes, scales, zeros = quantize_rtn_int4(weight[:, order], group_size, symmetric=symmetric)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[order] = torch.arange(k, dtype=torch.int32) // group_size
    codes_in_place = torch.empty_like(codes)
    codes_in_place[:, order] = codes  # [N, K] in the checkpoint's row order
    stored_zeros = (zeros.to(torch.int32) - int(zeros_minus_one)) & 0xF
    tensors = {
        "qweight": pack_int4_rows(codes_in_place.T.contiguous()),
        "qzeros": pack_gptq_columns(stored_zeros.T.contiguous()),
        "scales": scales.T.contiguous().half(),
        "g_idx": g_idx,
    }
    if zeros_minus_one:
        zeros = ((zeros.to(torch.int32) - 1) & 0xF) + 1  # what a v1 reader sees
    dequantized = torch.empty(n, k)
    dequantized[:, order] = _dequantized(codes, scales, zeros, group_size)
    return tensors, dequantized


def parse_int4_quantization_config(
    config: dict, method: Int4Packing
) -> tuple[Int4Scheme, tuple[str, ...]]:
    """The scheme and the unquantized modules of an AWQ or GPTQ `quantization_config`.

    Raises:
        ValueError: naming what radixgen does not read (bit width, AWQ version, GPTQ
            checkpoint format, quantized lm_head, per-module overrides, group size).
    """
    bits = config.get("bits", config.get("w_bit"))
    if bits != 4:
        raise ValueError(
            f"{method.upper()} with {bits}-bit weights is not supported: radixgen reads 4-bit "
            f"{method.upper()} checkpoints only"
        )
    group_size = config.get("group_size", config.get("q_group_size", 128))
    if not isinstance(group_size, int) or not (
        group_size == -1 or (group_size > 0 and group_size % 8 == 0)
    ):
        raise ValueError(
            f"{method.upper()} group_size must be -1 or a positive multiple of 8, got {group_size!r}"
        )
    ignored = tuple(config.get("modules_to_not_convert") or ())
    if method == "awq":
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(
                f"AWQ version {version!r} is not supported: radixgen reads GEMM packing "
                "(version 'gemm')"
            )
        if not config.get("zero_point", True):
            raise ValueError("AWQ without zero points (zero_point: false) is not supported")
        return Int4Scheme("awq", group_size), ignored
    checkpoint_format = config.get("checkpoint_format") or config.get("format") or "gptq"
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ValueError(
            f"GPTQ checkpoint_format {checkpoint_format!r} is not supported (gptq or gptq_v2)"
        )
    if config.get("lm_head"):
        raise ValueError("GPTQ with a quantized lm_head (lm_head: true) is not supported")
    if config.get("dynamic"):
        raise ValueError("GPTQ per-module overrides (dynamic) are not supported")
    scheme = Int4Scheme(
        "gptq",
        group_size,
        zeros_minus_one=checkpoint_format == "gptq",
        desc_act=bool(config.get("desc_act", False)),
    )
    return scheme, ignored


# The projections an int4 checkpoint quantizes (the embeddings, norms and LM head stay float).
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_int4_checkpoint(
    source: Path,
    destination: Path,
    scheme: Int4Scheme,
    *,
    symmetric: bool = False,
    seed: int = 0,
    dequantized_destination: Path | None = None,
) -> None:
    """Quantizes a float checkpoint folder's projections (RTN) into an AWQ or GPTQ checkpoint.

    Args:
        source: a HF folder with one model.safetensors (tokenizer files are copied along).
        destination, dequantized_destination: existing folders; the second (optional) gets
            a float32 checkpoint of exactly the weights the int4 one encodes.
        scheme: the format; GPTQ `desc_act` draws a seeded random act-order per layer input.
        symmetric: GPTQ only (AWQ always has zero points).
    """
    from safetensors.torch import load_file, save_file

    config = json.loads((source / "config.json").read_text())
    group_size, generator = scheme.group_size, torch.Generator().manual_seed(seed)
    orders: dict[str, torch.Tensor] = {}  # fused modules share their input's act-order
    quantized, dequantized = {}, {}
    for name, tensor in load_file(str(source / "model.safetensors")).items():
        module, _, leaf = name.rpartition(".")
        if leaf != "weight" or module.rpartition(".")[2] not in _PROJECTIONS:
            quantized[name] = dequantized[name] = tensor
            continue
        weight = tensor.float()
        size = weight.shape[1] if group_size == -1 else group_size
        if scheme.packing == "awq":
            tensors, decoded = awq_tensors(weight, size)
        else:
            order = None
            if scheme.desc_act:
                input_key = module.replace("k_proj", "q_proj").replace("v_proj", "q_proj")
                input_key = input_key.replace("up_proj", "gate_proj")
                if input_key not in orders:
                    orders[input_key] = torch.randperm(weight.shape[1], generator=generator)
                order = orders[input_key]
            tensors, decoded = gptq_tensors(
                weight,
                size,
                symmetric=symmetric,
                zeros_minus_one=scheme.zeros_minus_one,
                input_order=order,
            )
        quantized.update({f"{module}.{key}": value for key, value in tensors.items()})
        dequantized[name] = decoded
    quantization_config = {"quant_method": scheme.packing, "bits": 4, "group_size": group_size}
    if scheme.packing == "awq":
        quantization_config.update(version="gemm", zero_point=True)
    else:
        quantization_config.update(
            desc_act=scheme.desc_act,
            sym=symmetric,
            checkpoint_format="gptq" if scheme.zeros_minus_one else "gptq_v2",
        )
    outputs = [(destination, quantized, {**config, "quantization_config": quantization_config})]
    if dequantized_destination is not None:
        float_config = {**config, "torch_dtype": "float32"}
        float_weights = {name: tensor.float() for name, tensor in dequantized.items()}
        outputs.append((dequantized_destination, float_weights, float_config))
    for folder, weights, folder_config in outputs:
        for path in source.iterdir():
            if path.is_file() and path.suffix != ".safetensors" and path.name != "config.json":
                shutil.copyfile(path, folder / path.name)
        (folder / "config.json").write_text(json.dumps(folder_config, indent=2) + "\n")
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
