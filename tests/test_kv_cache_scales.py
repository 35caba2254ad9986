"""FP8 KV cache scales: the --quantization-param-path file (SGLang's / vLLM's format, separate K
and V factors beside it), the calibration pass that writes it, and the pool that reads it."""

from __future__ import annotations

import json

import pytest
import torch

from radixgen.runtime.cli import main as radixgen_main
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.kv_cache_scales import KVCacheScales, load_kv_cache_scales
from radixgen.runtime.kv_calibration import calibrate_kv_cache_scales
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.server_args import ServerArgs

TINY_LAYERS = 8


def test_scales_file_round_trip_and_the_legacy_format(tmp_path):
    scales = KVCacheScales("float8_e4m3fn", ((0.5, 0.25), (0.125, 2.0)))
    data = scales.to_json("llama")
    assert data["kv_cache"]["scaling_factor"] == {"0": {"0": 0.5, "1": 2.0}}  # max(k, v)
    assert KVCacheScales.from_json(data, num_layers=2) == scales
    # SGLang's / vLLM's file: one factor per layer for K and V; a rank of its own, or rank 0's.
    legacy = {"kv_cache": {"dtype": "float8_e4m3fn",
                           "scaling_factor": {"0": {"0": 0.5, "1": 3}, "1": {"0": 0.7, "1": 0.9}}}}  # fmt: skip
    assert KVCacheScales.from_json(legacy, num_layers=2).layers == ((0.5, 0.5), (3.0, 3.0))
    assert KVCacheScales.from_json(legacy, num_layers=2, tp_rank=1).layers[0] == (0.7, 0.7)
    assert KVCacheScales.from_json(legacy, num_layers=2, tp_rank=5).layers[0] == (0.5, 0.5)
    path = tmp_path / "scales.json"
    path.write_text(json.dumps(legacy))
    assert load_kv_cache_scales(path, num_layers=2, kv_cache_dtype="fp8")[1] == (3.0, 3.0)


@pytest.mark.parametrize(
    "kv_cache,match",
    [
        ({"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1.0}}}, "layers 0..1"),
        ({"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1, "1": 1, "2": 1}}}, "0..1"),
        ({"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1.0, "1": 0.0}}}, "> 0"),
        ({"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1.0, "1": "2"}}}, "numbers"),
        ({"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1.0, "1": True}}}, "numbers"),
        ({"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1, "1": 1}}, "bias": 1}, "bias"),
        ({"dtype": "float8_e5m2", "scaling_factor": {"0": {"0": 1.0, "1": 1.0}}}, "e5m2"),
        ({"dtype": "int8", "scaling_factor": {"0": {"0": 1.0, "1": 1.0}}}, "dtype"),
        ({"scaling_factor": {"0": {"0": 1.0, "1": 1.0}}}, "dtype"),
    ],
)
def test_bad_scales_files_are_refused_naming_the_flag(tmp_path, kv_cache, match):
    path = tmp_path / "scales.json"
    path.write_text(json.dumps({"kv_cache": kv_cache}))
    with pytest.raises(ValueError, match="quantization_param_path") as error:
        load_kv_cache_scales(path, num_layers=2, kv_cache_dtype="fp8_e4m3")
    assert match in str(error.value)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="quantization_param_path"):
        load_kv_cache_scales(path, num_layers=2, kv_cache_dtype="fp8_e4m3")


def test_a_scales_file_needs_an_fp8_kv_cache():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        ServerArgs(model_path="tiny", quantization_param_path="scales.json")


def _stored_amax(runner: ModelRunner, prompts: list[list[int]]) -> list[tuple[float, float]]:
    """Per layer, the largest |value| the pool stores for `prompts` (FP8 codes, before the
    scale): an extend forward of all of them at once."""
    rows = runner.req_to_token_pool.alloc(len(prompts))
    slots = runner.slot_allocator.alloc(sum(map(len, prompts)))
    batch = runner.build_forward_batch(
        mode=ForwardMode.EXTEND,
        input_ids=prompts,
        req_pool_indices=rows,
        prefix_lens=[0] * len(prompts),
        out_cache_loc=slots,
    )
    runner.forward(batch)
    pool = runner.token_to_kv_pool
    return [
        tuple(buffer[slots].float().abs().max().item() for buffer in pool.get_kv_buffer(layer))
        for layer in range(TINY_LAYERS)
    ]


def test_calibrated_scales_put_each_layers_largest_value_on_the_fp8_maximum(tmp_path):
    """Calibrated on some prompts, an e4m3 pool that reads the file stores those prompts'
    largest |K| and |V| of every layer as exactly 448, the format's maximum: nothing
    saturates, and no range is left unused. With the default scale 1.0 it would be the raw
    amax (a few units for tiny)."""
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(300, 4000, (3, 40), generator=generator).tolist()
    args = ServerArgs(model_path="tiny", max_total_tokens=512)
    scales = calibrate_kv_cache_scales(args, prompts, max_batch_tokens=64)  # a batch each
    assert len(scales.layers) == TINY_LAYERS and scales.dtype == "float8_e4m3fn"
    path = tmp_path / "scales.json"
    path.write_text(json.dumps(scales.to_json()))
    fp8 = ModelRunner(
        ServerArgs(
            model_path="tiny",
            max_total_tokens=512,
            kv_cache_dtype="fp8_e4m3",
            quantization_param_path=str(path),
        )
    )
    assert [fp8.token_to_kv_pool.kv_scales(layer) for layer in range(TINY_LAYERS)] == list(
        scales.layers
    )
    assert _stored_amax(fp8, prompts) == [(448.0, 448.0)] * TINY_LAYERS
    unscaled = ModelRunner(ServerArgs(model_path="tiny", max_total_tokens=512,
                                      kv_cache_dtype="fp8_e4m3"))  # fmt: skip
    assert all(k < 100 and v < 100 for k, v in _stored_amax(unscaled, prompts))


def test_calibrate_kv_cache_command(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    lines = ['"def read_lines(path):"', '{"text": "import os\\nprint(os.getcwd())"}', ""]
    prompts.write_text("\n".join(lines))
    output = tmp_path / "scales.json"
    argv = ["calibrate-kv-cache", "--model-path", "tiny", "--prompts-file", str(prompts),
            "--output", str(output), "--kv-cache-dtype", "fp8_e5m2", "--max-total-tokens", "256"]  # fmt: skip
    assert radixgen_main(argv) == 0
    assert "2 prompts" in capsys.readouterr().out
    written = json.loads(output.read_text())
    assert written["model_type"] == "llama" and written["kv_cache"]["dtype"] == "float8_e5m2"
    scales = load_kv_cache_scales(output, num_layers=TINY_LAYERS, kv_cache_dtype="fp8_e5m2")
    assert all(0 < k < 1 and 0 < v < 1 for k, v in scales)  # amax / 57344
    prompts.write_text("[1, 2]\n")
    assert radixgen_main(argv) == 2
    assert "prompts.jsonl:1" in capsys.readouterr().err
    prompts.write_text('"def f():"\n')
    missing = ["--model-path", str(tmp_path / "no-model")]
    assert radixgen_main([*argv[:1], *missing, *argv[3:]]) == 2  # a message, not a traceback
    assert "no-model" in capsys.readouterr().err
