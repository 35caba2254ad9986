"""int4 checkpoints (AWQ GEMM, GPTQ v1/v2, act-order) through the runtime: hand-checked byte
layouts, AutoAWQ's packer against ours, one fused linear layer against the dequantized float32
reference, whole models against the model of the dequantized weights, the Engine, and the
configurations refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_model_parity import CASES, _perturbed_model
from test_quantization import _prefill_logits, _runner

import radixgen as rg
from radixgen.kernels.int4_gemm import int4_gemm
from radixgen.runtime.models.int4_checkpoint import (
    Int4Scheme,
    awq_tensors,
    gptq_tensors,
    pack_awq_columns,
    pack_gptq_columns,
    quantize_rtn_int4,
    write_int4_checkpoint,
)
from radixgen.runtime.models.int4_linear import Int4LinearMethod
from radixgen.runtime.models.linear import MergedLinear
from radixgen.runtime.models.quantization import resolve_quant_config
from radixgen.runtime.server_args import ServerArgs

PROMPT = list(range(3, 40, 2))


def relative_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def as_uint32(value: int) -> int:
    return value & 0xFFFFFFFF


def test_awq_byte_layout():
    """Columns 0..7 holding 1..8: nibble i of the word holds column [0,2,4,6,1,3,5,7][i]."""
    codes = torch.arange(1, 9)[None, :]  # [1 row, 8 columns]
    assert as_uint32(pack_awq_columns(codes).item()) == 0x86427531
    # qzeros are packed the same way, along the output columns, one row per group.
    tensors, _ = awq_tensors(torch.zeros(8, 64), 32)  # all-zero weight: zero point 0
    assert tensors["qweight"].shape == (64, 1) and tensors["qzeros"].shape == (2, 1)
    assert tensors["scales"].shape == (2, 8) and tensors["scales"].dtype == torch.float16


def test_gptq_byte_layout():
    """qweight packs 8 input rows per word (row 8i+j in nibble j); qzeros pack 8 output columns
    per word, z - 1 in v1 (a symmetric checkpoint's 8 is stored as 7)."""
    weight = torch.linspace(-1, 1, 16 * 64).reshape(16, 64)
    v1, _ = gptq_tensors(weight, 32, symmetric=True)
    assert v1["qweight"].shape == (8, 16) and v1["qzeros"].shape == (2, 2)
    assert all(as_uint32(word) == 0x77777777 for word in v1["qzeros"].flatten().tolist())
    v2, _ = gptq_tensors(weight, 32, symmetric=True, zeros_minus_one=False)
    assert all(as_uint32(word) == 0x88888888 for word in v2["qzeros"].flatten().tolist())
    assert torch.equal(v1["g_idx"], torch.arange(64, dtype=torch.int32) // 32)
    codes = torch.arange(8)[:, None].repeat(1, 16)  # zeros column-major: 0..7 in column c
    assert as_uint32(pack_gptq_columns(codes.T)[0, 0].item()) == 0x76543210
    codes, _, _ = quantize_rtn_int4(weight, 32, symmetric=True)
    first_word = sum(int(codes[0, j]) << (4 * j) for j in range(8))  # rows 0..7 of column 0
    assert as_uint32(v1["qweight"][0, 0].item()) == first_word


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # AutoAWQ warns that it is archived
def test_awq_packing_matches_autoawq():
    """AutoAWQ's own packer (WQLinear_GEMM.from_linear) writes the same bytes as ours, given
    the weight our checkpoint encodes and its scales and zeros."""
    gemm = pytest.importorskip("awq.modules.linear.gemm")
    generator = torch.Generator().manual_seed(0)
    n, k, group_size = 64, 256, 64  # AutoAWQ needs N % 32 == 0
    weight = torch.randn(n, k, generator=generator) * 0.05
    ours, decoded = awq_tensors(weight, group_size)
    _codes, _scales, zeros = quantize_rtn_int4(weight, group_size)
    linear = torch.nn.Linear(k, n, bias=False)
    linear.weight.data = decoded
    theirs = gemm.WQLinear_GEMM.from_linear(
        linear, 4, group_size, scales=ours["scales"].float(), zeros=zeros.T.float()
    )
    assert torch.equal(theirs.qweight, ours["qweight"])
    assert torch.equal(theirs.qzeros, ours["qzeros"])
    assert torch.equal(theirs.scales, ours["scales"])


SCHEMES = {
    "awq": (Int4Scheme("awq", 64), False),
    "gptq v1 sym": (Int4Scheme("gptq", 64, zeros_minus_one=True), True),
    "gptq v2 asym act-order": (Int4Scheme("gptq", 64, desc_act=True), False),
    "gptq v1 sym act-order per-channel": (
        Int4Scheme("gptq", -1, zeros_minus_one=True, desc_act=True),
        True,
    ),
}


@pytest.mark.parametrize("label", sorted(SCHEMES))
def test_fused_linear_equals_dequantized_reference(label):
    """q/k/v shards (64, 32, 32 rows) of one checkpoint -> one layer whose product is the
    dequantized float32 weight's within 1e-3 relative, on the CPU path and the Triton kernels
    (interpreter) reading the repacked layout."""
    scheme, symmetric = SCHEMES[label]
    generator = torch.Generator().manual_seed(1)
    k, sizes = 256, (64, 32, 32)
    group_size = k if scheme.group_size == -1 else scheme.group_size
    order = torch.randperm(k, generator=generator) if scheme.desc_act else None
    layer = MergedLinear(k, sizes, bias=False, method=Int4LinearMethod(scheme))
    decoded_shards = []
    for shard, rows in enumerate(sizes):
        weight = torch.randn(rows, k, generator=generator) * 0.05
        if scheme.packing == "awq":
            tensors, decoded = awq_tensors(weight, group_size)
        else:
            tensors, decoded = gptq_tensors(
                weight,
                group_size,
                symmetric=symmetric,
                zeros_minus_one=scheme.zeros_minus_one,
                input_order=order,
            )
        assert relative_error(decoded, weight) < 0.15  # really quantized, not garbage
        for name, tensor in tensors.items():
            layer.load_weight(name, tensor.float() if name == "scales" else tensor, shard)
        decoded_shards.append(decoded)
    assert layer.is_loaded and layer.qweight.shape == (k // 8, sum(sizes))
    # act-order needs a permutation unless there is one group (per channel)
    assert (layer.input_perm is not None) == (scheme.desc_act and group_size < k)
    reference_weight = torch.cat(decoded_shards)  # [N, K]
    x = torch.randn(5, k, generator=generator)
    reference = x @ reference_weight.T
    assert relative_error(layer(x), reference) < 1e-3
    gathered = x if layer.input_perm is None else x[:, layer.input_perm]
    for m in (1, 5):  # the GEMV, then the GEMM
        kernel = int4_gemm(gathered[:m].contiguous(), layer.qweight, layer.scales, layer.zeros,
                           layer.group_size)  # fmt: skip
        assert relative_error(kernel, reference[:m]) < 1e-3


@pytest.mark.parametrize(
    "case,scheme,symmetric",
    [
        ("llama2", Int4Scheme("awq", 32), False),
        ("qwen2_tied", Int4Scheme("gptq", 32, zeros_minus_one=True, desc_act=True), True),
    ],
)
def test_model_logits_equal_dequantized_model(case, scheme, symmetric, tmp_path):
    """A whole AWQ / GPTQ (act-order, qkv bias) checkpoint, detected from config.json, gives
    the logits of the float model holding exactly the weights it encodes."""
    config_class, kwargs = CASES[case]
    source, int4, dequantized = (tmp_path / name for name in ("source", "int4", "dequantized"))
    for folder in (source, int4, dequantized):
        folder.mkdir()
    _perturbed_model(config_class, kwargs).save_pretrained(source)
    write_int4_checkpoint(
        source, int4, scheme, symmetric=symmetric, dequantized_destination=dequantized
    )
    stored = json.loads((int4 / "config.json").read_text())["quantization_config"]
    assert stored["quant_method"] == scheme.packing
    runner = _runner(int4, dtype="float32")
    qkv = runner.model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.method, Int4LinearMethod) and qkv.qweight.dtype == torch.int32
    logits = _prefill_logits(runner, PROMPT)
    reference = _prefill_logits(_runner(dequantized, dtype="float32"), PROMPT)
    assert relative_error(logits, reference) < 1e-4
    original = _prefill_logits(_runner(source, dtype="float32"), PROMPT)
    assert relative_error(logits, original) > 1e-3  # the weights really are 4-bit


def test_engine_generates_from_awq_checkpoint_and_rtn(tmp_path):
    """The Engine on an AWQ checkpoint of the trained tiny, and `quantization="awq"` on tiny
    itself (round-to-nearest at load time, the same grid): the same greedy text."""
    from radixgen.runtime.tiny_model import resolve_model_path

    write_int4_checkpoint(Path(resolve_model_path("tiny")), tmp_path, Int4Scheme("awq"))
    params = {"temperature": 0.0, "max_new_tokens": 12}
    prompts = ["The little cat", "Once upon a time"]
    texts = {}
    for label, options in {
        "checkpoint": {"model_path": str(tmp_path)},
        "rtn": {"model_path": "tiny", "quantization": "awq_marlin"},  # vLLM's alias
    }.items():
        with rg.Engine(dtype="float32", max_total_tokens=256, **options) as engine:
            texts[label] = [out["text"] for out in engine.generate(prompts, sampling_params=params)]
    assert all(texts["checkpoint"]) and texts["checkpoint"] == texts["rtn"]


def test_unsupported_int4_configs_are_refused_by_name():
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}
    with pytest.raises(ValueError, match="GPTQ with 8-bit weights is not supported"):
        resolve_quant_config({**gptq, "bits": 8}, None)
    with pytest.raises(ValueError, match="AWQ version 'gemv'"):
        resolve_quant_config({"quant_method": "awq", "bits": 4, "version": "gemv"}, None)
    with pytest.raises(ValueError, match="checkpoint_format 'marlin'"):
        resolve_quant_config({**gptq, "checkpoint_format": "marlin"}, None)
    with pytest.raises(ValueError, match="lm_head"):
        resolve_quant_config({**gptq, "lm_head": True}, None)
    with pytest.raises(ValueError, match="group_size"):
        resolve_quant_config({**gptq, "group_size": 100}, None)
    with pytest.raises(ValueError, match="contradicts"):
        resolve_quant_config(gptq, "awq")
    with pytest.raises(ValueError, match="quantization must be"):
        ServerArgs(quantization="int4")
    # Aliases and detection.
    assert resolve_quant_config(gptq, "gptq_marlin").int4 == Int4Scheme("gptq", 128, True)
    awq = resolve_quant_config({"quant_method": "awq", "bits": 4, "zero_point": True}, None)
    assert awq.method == "awq" and awq.int4 == Int4Scheme("awq", 128)
    dummy = resolve_quant_config(gptq, None, dummy_weights=True)
    assert dummy.checkpoint_format == "int4_high_precision" and dummy.int4.group_size == 128


def test_unusual_g_idx_is_refused():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 64, generator=generator)
    layer = MergedLinear(64, (16, 16), bias=False, method=Int4LinearMethod(Int4Scheme("gptq", 32)))
    tensors, _ = gptq_tensors(weight, 32, symmetric=True)
    for name, tensor in tensors.items():
        layer.load_weight(name, tensor, 0)
    other_order, _ = gptq_tensors(weight, 32, symmetric=True, input_order=torch.randperm(64))
    for name, tensor in tensors.items():
        if name != "g_idx":
            layer.load_weight(name, tensor, 1)
    with pytest.raises(ValueError, match="g_idx differs between the fused modules"):
        layer.load_weight("g_idx", other_order["g_idx"], 1)
    single = MergedLinear(64, (16,), bias=False, method=Int4LinearMethod(Int4Scheme("gptq", 32)))
    uneven = torch.zeros(64, dtype=torch.int32)
    uneven[40:] = 1  # groups of 40 and 24 rows
    for name, tensor in {**tensors, "g_idx": uneven}.items():
        if name != "g_idx":
            single.load_weight(name, tensor, 0)
    with pytest.raises(ValueError, match="every group must hold exactly group_size=32"):
        single.load_weight("g_idx", uneven, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("packing", ["awq", "gptq"])
def test_int4_model_on_cuda_matches_dequantized(packing, tmp_path):
    """The Triton kernels in the model (bf16, CUDA graphs for decode) against the dequantized
    model's logits."""
    from test_kernels_runtime import make_runner, random_prompts, run_steps

    config_class, kwargs = CASES["llama2"]
    source, int4, dequantized = (tmp_path / name for name in ("source", "int4", "dequantized"))
    for folder in (source, int4, dequantized):
        folder.mkdir()
    _perturbed_model(config_class, kwargs).save_pretrained(source)
    gptq = packing == "gptq"
    scheme = Int4Scheme(packing, 32, zeros_minus_one=gptq, desc_act=gptq)
    write_int4_checkpoint(source, int4, scheme, symmetric=True, dequantized_destination=dequantized)
    prompts = random_prompts((5, 13, 9), kwargs["vocab_size"])
    logits = {}
    for label, folder in (("int4", int4), ("dequantized", dequantized)):
        runner = make_runner(str(folder), device="cuda", dtype="bfloat16")
        logits[label] = run_steps(runner, prompts, first_chunk=3, num_decode_steps=8)
    for step, (ours, reference) in enumerate(
        zip(logits["int4"], logits["dequantized"], strict=True)
    ):
        assert relative_error(ours, reference) < 2e-2, step


def _tiny_int4_checkpoint(folder: Path, scheme: Int4Scheme, symmetric: bool = False) -> Path:
    from radixgen.runtime.tiny_model import resolve_model_path

    folder.mkdir()
    write_int4_checkpoint(Path(resolve_model_path("tiny")), folder, scheme, symmetric=symmetric)
    return folder


@pytest.mark.slow  # a server start-up: ~25 s on 2 cores
def test_server_runs_gptq_checkpoint(tmp_path):
    """`radixgen serve` on a GPTQ (act-order) checkpoint answers through the openai client."""
    import openai

    from radixgen.runtime.server.subprocess_launcher import ServerProcess

    scheme = Int4Scheme("gptq", 128, zeros_minus_one=True, desc_act=True)
    gptq = _tiny_int4_checkpoint(tmp_path / "gptq", scheme, symmetric=True)
    flags = ["--model-path", str(gptq), "--log-level", "warning", "--max-total-tokens", "512"]
    with ServerProcess(flags) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
        reply = client.completions.create(
            model=client.models.list().data[0].id,
            prompt="def add(a, b):",
            max_tokens=8,
            temperature=0,
        )
        assert reply.choices[0].text and reply.usage.completion_tokens == 8


def test_bench_cli_runs_int4(tmp_path):
    """`radixgen bench latency` on an AWQ checkpoint, and with `--load-format dummy
    --quantization gptq` (the GPU benchmark's random int4 weights)."""
    from radixgen.runtime.cli import main as radixgen_main

    awq = _tiny_int4_checkpoint(tmp_path / "awq", Int4Scheme("awq"))
    for model_flags in (
        ["--model-path", str(awq)],
        ["--model-path", "tiny", "--load-format", "dummy", "--quantization", "gptq"],
    ):
        out = tmp_path / "latency.json"
        bench = ["bench", "latency", *model_flags, "--batch-sizes", "2", "--input-len", "8",
                 "--output-len", "4", "--max-total-tokens", "256", "--output-json", str(out)]  # fmt: skip
        assert radixgen_main(bench) == 0
        assert json.loads(out.read_text())["results"][0]["decode_ms_per_step_median"] > 0
