"""FP8 weights and KV cache through the runtime: load-time quantization, FP8 checkpoints (written
by the `compressed-tensors` package, and in HF's `quant_method: fp8` layout), KV-cache scales,
refused configurations, and the emulated CPU numerics against full precision."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from test_kernels_runtime import make_runner, random_prompts, relative_error, run_steps
from test_model_parity import CASES, _perturbed_model

import radixgen as rg
from radixgen.radix_cache.memory_pool import KVBudget, TokenToKVPool
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.model_runner import ModelRunner, check_fp8_support
from radixgen.runtime.models.linear import Fp8LinearMethod, LinearBase
from radixgen.runtime.models.quantization import resolve_quant_config
from radixgen.runtime.server_args import ServerArgs

# The bar for FP8 against the full-precision model on random-weight shapes.
MIN_COSINE = 0.99
PROMPT = list(range(3, 40, 2))  # 19 token ids < the small vocab (384)


def _runner(folder, **kwargs) -> ModelRunner:
    return ModelRunner(
        ServerArgs(model_path=str(folder), device="cpu", max_total_tokens=512, **kwargs)
    )


def _prefill_logits(runner: ModelRunner, tokens: list[int]) -> torch.Tensor:  # [len, vocab]
    rows = runner.req_to_token_pool.alloc(1)
    slots = runner.slot_allocator.alloc(len(tokens))
    batch = runner.build_forward_batch(
        mode=ForwardMode.EXTEND,
        input_ids=[tokens],
        req_pool_indices=rows,
        prefix_lens=[0],
        out_cache_loc=slots,
        return_all_logits=True,
    )
    logits = runner.forward(batch)
    runner.slot_allocator.free(slots)
    runner.req_to_token_pool.free(rows)
    return logits


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    """A small random Llama (perturbed norms) saved in float32 by transformers."""
    config_class, kwargs = CASES["llama2"]
    folder = tmp_path_factory.mktemp("llama")
    _perturbed_model(config_class, kwargs).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("case", ["llama2", "qwen2_tied", "qwen3"])
def test_load_time_fp8_logits_close_to_full_precision(case, tmp_path):
    config_class, kwargs = CASES[case]
    _perturbed_model(config_class, kwargs).save_pretrained(tmp_path)
    reference = _prefill_logits(_runner(tmp_path, dtype="float32"), PROMPT)
    fp8 = _runner(tmp_path, dtype="float32", quantization="fp8")
    qkv = fp8.model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn and qkv.weight_scale.shape == (qkv.output_size,)
    weights_fp8 = _prefill_logits(fp8, PROMPT)
    assert _cosine(weights_fp8, reference) > MIN_COSINE
    both = _prefill_logits(
        _runner(tmp_path, dtype="float32", quantization="fp8", kv_cache_dtype="fp8"), PROMPT
    )
    assert _cosine(both, reference) > MIN_COSINE
    assert not torch.equal(both, weights_fp8)  # the FP8 KV cache is really read back


def test_fp8_layers_take_activations_quantized_by_the_kernel_before_them(llama_folder, monkeypatch):
    """qkv, gate_up and down get `Fp8Activations` from the norm / SiLU-and-mul (o_proj's input,
    the attention output, is quantized by the layer), and the logits are those of quantizing
    inside every layer: the producers quantize the very values the layer would."""
    from radixgen.kernels.fp8_gemm import Fp8Activations
    from radixgen.runtime.models.linear import LinearBase

    runner = _runner(llama_folder, dtype="float32", quantization="fp8")
    layer = runner.model.model.layers[0]
    seen = {}
    for name, linear in [
        ("qkv", layer.self_attn.qkv_proj),
        ("o", layer.self_attn.o_proj),
        ("gate_up", layer.mlp.gate_up_proj),
        ("down", layer.mlp.down_proj),
    ]:
        linear.register_forward_pre_hook(lambda _, args, name=name: seen.update({name: args[0]}))
    fused = _prefill_logits(runner, PROMPT)
    assert {name for name, x in seen.items() if isinstance(x, Fp8Activations)} == {
        "qkv",
        "gate_up",
        "down",
    }
    # The same model with the producers' quantization turned off: each layer quantizes.
    monkeypatch.setattr(LinearBase, "takes_fp8_activations", lambda self, num_tokens: False)
    seen.clear()
    unfused = _prefill_logits(runner, PROMPT)
    assert not any(isinstance(x, Fp8Activations) for x in seen.values())
    assert torch.equal(fused, unfused)


@pytest.mark.parametrize("flags, fast", [([], True), (["--disable-fp8-fast-accum"], False)])
def test_fp8_fast_accumulation_is_the_default_and_the_flag_turns_it_off(flags, fast, llama_folder):
    """`serve --disable-fp8-fast-accum` reaches every FP8 layer's method (fp8_linear's
    `fast_accum`, cuBLASLt's `use_fast_accum` on the GPU: tests/test_kernels_fp8_gemm.py)."""
    from radixgen.runtime.cli import build_parser, server_args_from_namespace

    namespace = build_parser().parse_args(
        ["serve", "--model-path", str(llama_folder), "--quantization", "fp8", *flags]
    )
    args = server_args_from_namespace(namespace)
    assert args.disable_fp8_fast_accum is not fast
    runner = ModelRunner(dataclasses.replace(args, device="cpu", max_total_tokens=512))
    linears = [m for m in runner.model.modules() if isinstance(m, LinearBase)]
    fp8 = [m for m in linears if isinstance(m.method, Fp8LinearMethod)]
    assert len(fp8) == 4 * runner.model_config.num_layers
    assert {m.method.fast_accum for m in fp8} == {fast}


def _compressed_tensors_checkpoint(source: Path, folder: Path, strategy: str) -> None:
    """Quantizes `source` with compressed-tensors (float8, per `strategy`) and saves it."""
    from compressed_tensors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
    weights = QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True)
    activations = QuantizationArgs(
        num_bits=8, type="float", strategy="token", symmetric=True, dynamic=True
    )
    scheme = QuantizationScheme(targets=["Linear"], weights=weights, input_activations=activations)
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    apply_quantization_config(model, config)
    for module in model.modules():
        if hasattr(module, "weight_scale"):  # the min/max observer's job, done by hand
            w = module.weight.float()
            dims = dict(dim=1, keepdim=True) if strategy == "channel" else {}
            scale, _zero_point = calculate_qparams(w.amin(**dims), w.amax(**dims), weights)
            module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(folder)
    compressor.update_config(folder)


@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_compressed_tensors_fp8_checkpoint(strategy, llama_folder, tmp_path):
    _compressed_tensors_checkpoint(llama_folder, tmp_path, strategy)
    stored = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert (stored["quant_method"], stored["format"]) == ("compressed-tensors", "float-quantized")
    runner = _runner(tmp_path, dtype="bfloat16")
    checkpoint = load_file(tmp_path / "model.safetensors")
    qkv = runner.model.model.layers[1].self_attn.qkv_proj
    name = "model.layers.1.self_attn.k_proj."
    k_rows = slice(qkv.output_sizes[0], qkv.output_sizes[0] + qkv.output_sizes[1])
    assert torch.equal(
        qkv.weight[k_rows].view(torch.uint8), checkpoint[name + "weight"].view(torch.uint8)
    )
    expected_scale = checkpoint[name + "weight_scale"].float().flatten().expand(qkv.output_sizes[1])
    torch.testing.assert_close(qkv.weight_scale[k_rows], expected_scale)
    reference = _prefill_logits(_runner(llama_folder, dtype="float32"), PROMPT)
    assert _cosine(_prefill_logits(runner, PROMPT), reference) > MIN_COSINE


def _hf_fp8_checkpoint(source: Path, folder: Path, block: tuple[int, int] | None) -> None:
    """HF `quant_method: fp8`: per-tensor `weight_scale` + static `input_scale`, or block-wise
    `weight_scale_inv`; per-layer KV-cache scales `self_attn.k_scale` / `v_scale`."""
    config = json.loads((source / "config.json").read_text())
    tensors = load_file(source / "model.safetensors")
    projections = [n for n in tensors if n.endswith("_proj.weight")]
    for name in projections:
        weight = tensors[name].float()
        prefix = name[: -len("weight")]
        if block is None:
            scale = weight.abs().max() / 448.0
            tensors[prefix + "weight_scale"] = scale
            tensors[prefix + "input_scale"] = torch.tensor(0.02)
            tensors[name] = (weight / scale).to(torch.float8_e4m3fn)
        else:
            rows, cols = weight.shape
            tiles = weight.reshape(rows // block[0], block[0], cols // block[1], block[1])
            scale_inv = tiles.abs().amax(dim=(1, 3)) / 448.0  # [rows / bn, cols / bk]
            quantized = tiles / scale_inv[:, None, :, None]
            tensors[prefix + "weight_scale_inv"] = scale_inv
            tensors[name] = quantized.reshape(rows, cols).to(torch.float8_e4m3fn)
    for layer in range(config["num_hidden_layers"]):
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(0.25 + layer)
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(0.5)
    quantization = {"quant_method": "fp8", "activation_scheme": "static"}
    if block is not None:
        quantization = {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "weight_block_size": list(block),
        }
    config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))


@pytest.mark.parametrize("block", [None, (32, 32)])
def test_hf_fp8_checkpoint_and_kv_scales(block, llama_folder, tmp_path):
    _hf_fp8_checkpoint(llama_folder, tmp_path, block)
    reference = _prefill_logits(_runner(llama_folder, dtype="float32"), PROMPT)
    runner = _runner(tmp_path, dtype="float32", kv_cache_dtype="fp8_e4m3")
    assert all(
        layer.weight.dtype == torch.float8_e4m3fn
        for layer in runner.model.modules()
        if isinstance(layer, LinearBase)
    )
    assert runner.token_to_kv_pool.kv_scales(0) == (0.25, 0.5)
    assert runner.token_to_kv_pool.kv_scales(1) == (1.25, 0.5)
    assert _cosine(_prefill_logits(runner, PROMPT), reference) > MIN_COSINE
    bf16_kv = _runner(tmp_path, dtype="float32")  # the checkpoint's KV scales go unused
    assert bf16_kv.token_to_kv_pool.kv_scales(1) == (1.0, 1.0)
    assert _cosine(_prefill_logits(bf16_kv, PROMPT), reference) > MIN_COSINE


def test_fp8_kv_pool_holds_twice_the_tokens():
    bf16 = TokenToKVPool.bytes_per_token(32, 8, 128, torch.bfloat16)
    fp8 = TokenToKVPool.bytes_per_token(32, 8, 128, torch.float8_e4m3fn)
    assert bf16 == 2 * fp8
    budget = KVBudget(num_bytes=bf16 * 1000)
    assert budget.resolve(bytes_per_token=fp8, device="cpu") == 2 * 1000
    pool = TokenToKVPool(
        num_slots=8,
        num_layers=1,
        num_kv_heads=2,
        head_dim=4,
        dtype=torch.bfloat16,
        kv_dtype=torch.float8_e4m3fn,
        kv_scales=[(2.0, 0.5)],
    )
    k = torch.tensor([[[1.0, -3.0, 1000.0, 0.1]] * 2])  # [1 token, 2 heads, 4]
    pool.set_kv(0, torch.tensor([3]), k.bfloat16(), k.bfloat16())
    k_buffer, v_buffer = pool.get_kv_buffer(0)
    assert k_buffer.dtype == torch.float8_e4m3fn
    # stored = value / scale, saturated at e4m3's 448 (never NaN)
    assert k_buffer[3, 0].float().tolist() == pytest.approx([0.5, -1.5, 448.0, 0.05], rel=0.07)
    assert v_buffer[3, 0].float().tolist() == pytest.approx([2.0, -6.0, 448.0, 0.2], rel=0.07)
    with pytest.raises(ValueError, match="FP8 store only"):
        TokenToKVPool(
            num_slots=8,
            num_layers=1,
            num_kv_heads=1,
            head_dim=4,
            dtype=torch.float32,
            kv_scales=[(2.0, 1.0)],
        )
    with pytest.raises(ValueError, match="kv_scales"):
        TokenToKVPool(
            num_slots=8,
            num_layers=2,
            num_kv_heads=1,
            head_dim=4,
            dtype=torch.float32,
            kv_scales=[(1.0, 1.0)],
        )


def test_engine_greedy_with_fp8_weights_and_kv(tiny_model_path):
    prompts = ["def fibonacci(n):", "import os\nimport "]
    params = {"max_new_tokens": 16, "temperature": 0.0}
    configs = {
        "bf16": {},
        "fp8": {"quantization": "fp8", "kv_cache_dtype": "fp8"},
        "e5m2": {"kv_cache_dtype": "fp8_e5m2"},
    }
    outputs, prompt_ids, continuation_logprob = {}, [], {}
    for label, options in configs.items():
        with rg.Engine(model_path="tiny", dtype="bfloat16", max_total_tokens=600, **options) as e:
            outputs[label] = e.generate(prompts, sampling_params=params)
            if label == "bf16":
                prompt_ids = [e.tokenizer.encode(p) for p in prompts]
                continuations = [
                    ids + o["output_ids"]
                    for ids, o in zip(prompt_ids, outputs["bf16"], strict=True)
                ]
            # How well this engine predicts bf16's greedy continuation (teacher-forced):
            # mean logprob a token. Comparing texts instead would hang on near-ties, which
            # rounding (FP8, or another CPU's kernels) may flip.
            continuation_logprob[label] = []
            for ids, full in zip(prompt_ids, continuations, strict=True):
                result = e.generate(
                    input_ids=full,
                    sampling_params={"max_new_tokens": 1},
                    return_logprob=True,
                    logprob_start_len=len(ids),
                )
                logprobs = [lp for lp, _ in result["meta_info"]["input_token_logprobs"]]
                assert len(logprobs) == len(full) - len(ids) == 16
                continuation_logprob[label].append(sum(logprobs) / len(logprobs))
    for label in ("fp8", "e5m2"):
        assert all(o["text"] for o in outputs[label])
        # Measured on the CPU: within 0.03 (FP8 weights + e4m3 KV) and 0.07 (e5m2 KV) nats of
        # bf16's -0.97 / -0.47; broken scales or a wrong dequantisation cost whole nats.
        assert continuation_logprob[label] == pytest.approx(continuation_logprob["bf16"], abs=0.15)


def test_unsupported_configs_are_refused_by_name():
    with pytest.raises(ValueError, match="quant_method 'bitsandbytes'.*not support"):
        resolve_quant_config({"quant_method": "bitsandbytes"}, None)
    with pytest.raises(ValueError, match="format 'pack-quantized'"):
        resolve_quant_config(
            {"quant_method": "compressed-tensors", "format": "pack-quantized"}, None
        )
    group = {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128},
    }
    with pytest.raises(ValueError, match="strategy 'group'"):
        resolve_quant_config(
            {
                "quant_method": "compressed-tensors",
                "format": "float-quantized",
                "config_groups": {"g": group},
            },
            None,
        )
    with pytest.raises(ValueError, match="fmt 'e5m2'"):
        resolve_quant_config({"quant_method": "fp8", "fmt": "e5m2"}, "fp8")
    with pytest.raises(ValueError, match="quantization must be"):
        ServerArgs(quantization="int4")
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        ServerArgs(kv_cache_dtype="int8")
    # A quantized checkpoint with dummy weights: random weights quantized at load time.
    dummy = resolve_quant_config(
        {"quant_method": "fp8", "weight_block_size": [128, 128]}, None, dummy_weights=True
    )
    assert dummy.checkpoint_format == "high_precision"


def test_fp8_refused_on_gpus_without_fp8(monkeypatch):
    """An A100 (8.0) has no FP8: the error names the option and the capability."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8'.*A100 has 8.0"):
        check_fp8_support(torch.device("cuda"), "kv_cache_dtype='fp8'")
    check_fp8_support(torch.device("cpu"), "quantization='fp8'")  # emulated: allowed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp8_engine_on_cuda_matches_bf16_logits(llama_folder):
    """Triton attention over an FP8 pool, the FP8 GEMMs and CUDA graphs, on the GPU."""

    def logits(**kwargs):
        runner = ModelRunner(
            ServerArgs(
                model_path=str(llama_folder),
                device="cuda",
                dtype="bfloat16",
                max_total_tokens=512,
                **kwargs,
            )
        )
        return _prefill_logits(runner, PROMPT)

    reference = logits()
    assert _cosine(logits(quantization="fp8"), reference) > MIN_COSINE
    assert _cosine(logits(quantization="fp8", kv_cache_dtype="fp8"), reference) > MIN_COSINE
    prompts = ["def fibonacci(n):", "import os\nimport ", "class Point:"]
    params = {"max_new_tokens": 32, "temperature": 0.0}
    texts = {}
    for label, options in {
        "bf16": {},
        "fp8": {"quantization": "fp8", "kv_cache_dtype": "fp8"},
    }.items():
        with rg.Engine(model_path="tiny", device="cuda", **options) as engine:
            texts[label] = [o["text"] for o in engine.generate(prompts, sampling_params=params)]
    assert all(texts["fp8"])
    assert sum(a[:10] == b[:10] for a, b in zip(texts["fp8"], texts["bf16"], strict=True)) >= 2


def test_triton_backend_reads_fp8_kv_on_the_interpreter(llama_folder, tmp_path):
    """The Triton backend (interpreter) over an FP8 pool with the checkpoint's KV scales (k 0.25
    and 1.25, v 0.5), through a chunked prefill and decode steps: close to the torch backend
    over the same pool and to the full-precision model. (The backends differ by FP8 rounding:
    Triton's extend reads a chunk's own K/V unquantized, the torch backend from the pool.)"""
    _hf_fp8_checkpoint(llama_folder, tmp_path, block=None)
    options = dict(device="cpu", dtype="float32", kv_cache_dtype="fp8")
    triton_fp8 = make_runner(tmp_path, attention_backend="triton", **options)
    torch_fp8 = make_runner(tmp_path, attention_backend="torch", **options)
    full = make_runner(llama_folder, device="cpu", dtype="float32", attention_backend="torch")
    assert triton_fp8.token_to_kv_pool.kv_scales(1) == (1.25, 0.5)
    prompts = random_prompts([9, 21], triton_fp8.vocab_size)
    steps = dict(first_chunk=4, num_decode_steps=2)
    got = run_steps(triton_fp8, prompts, **steps)
    same_pool = run_steps(torch_fp8, prompts, **steps)
    reference = run_steps(full, prompts, **steps)
    for step, (out, ref, full_ref) in enumerate(zip(got, same_pool, reference, strict=True)):
        assert relative_error(out, ref) < 0.1, f"step {step}"
        assert _cosine(out, full_ref) > MIN_COSINE, f"step {step}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp8_cuda_graph_decode_matches_eager(tiny_model_path):
    options = dict(device="cuda", quantization="fp8", kv_cache_dtype="fp8")
    graph_runner = make_runner(tiny_model_path, cuda_graph_max_bs=8, **options)
    eager_runner = make_runner(tiny_model_path, disable_cuda_graph=True, **options)
    bf16_runner = make_runner(tiny_model_path, device="cuda", disable_cuda_graph=True)
    prompts = random_prompts([11, 40, 23, 5], graph_runner.vocab_size, seed=1)
    steps = dict(first_chunk=3, num_decode_steps=6)
    got = run_steps(graph_runner, prompts, **steps)
    expected = run_steps(eager_runner, prompts, **steps)
    full = run_steps(bf16_runner, prompts, **steps)
    for step, (out, ref, full_ref) in enumerate(zip(got, expected, full, strict=True)):
        assert torch.equal(out, ref), f"step {step}"  # the same kernels, replayed
        assert _cosine(out, full_ref) > MIN_COSINE, f"step {step}"
