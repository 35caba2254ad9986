"""What FP8 costs in accuracy: perplexity deltas on the trained `tiny`, logits cosine and greedy
agreement on random-weight Llama/Qwen shapes. Runs on the CPU (emulated FP8) or a GPU.

    python scripts/fp8_accuracy.py [--device cpu|cuda] [--out DIR]     # JSON to DIR or $OUT
    python scripts/fp8_accuracy.py --tiny-variants "fp8 KV (e4m3)"      # bf16 and these rows

1. tiny, held-out CI slice (4 windows of 1024 tokens, docs/model.md): perplexity of the bf16
   model and of FP8 weights, FP8 KV (e4m3, e5m2; e4m3 also with calibrated scales) and both;
   top-1 agreement of each position's next-token argmax with bf16's (teacher-forced, 4092
   positions); free-running greedy
   agreement (64 tokens after 8 held-out prompts of 128 tokens: position by position, and the
   mean number of tokens before the first difference). On the CPU the attention is the torch
   backend, which reads every token's K/V back from the (FP8) pool, prefill included: the FP8
   KV rows measure attention over a fully FP8 history, as in decode. (On CUDA, Triton's extend
   attention reads a prompt's own K/V unquantized: only later chunks and decode see FP8.)
2. Random-weight checkpoints (seeded, `write_random_model`) at Llama-3 / Qwen2 / Qwen3 layer
   shapes: mean cosine similarity of each position's logits against bf16 over 4 random prompts
   of 256 tokens, the same top-1 agreement, and the same free-running greedy agreement (64
   tokens after 64-token prompts).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path

import torch

import radixgen as rg
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.tiny_assets.corpus import load_ci_slice
from radixgen.runtime.tiny_model import TINY_CONFIG, write_random_model

VARIANTS = {
    "bf16": {},
    "fp8 weights": {"quantization": "fp8"},
    "fp8 KV (e4m3)": {"kv_cache_dtype": "fp8_e4m3"},
    "fp8 KV (e5m2)": {"kv_cache_dtype": "fp8_e5m2"},
    "fp8 weights + KV (e4m3)": {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"},
}
# Layer shapes of real models, with fewer layers (the vocabulary is tiny's tokenizer's).
RANDOM_SHAPES = {
    "llama-3 (GQA 4:1, head_dim 128)": {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 1024,
        "intermediate_size": 3584,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "rope_theta": 500000.0,
    },
    "qwen2 (qkv bias, tied)": {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 4,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
    },
    "qwen3 (q/k norm)": {
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
    },
}


def all_logits(runner: ModelRunner, tokens: list[int]) -> torch.Tensor:  # [len, vocab] fp32
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
    logits = runner.forward(batch).float()
    runner.slot_allocator.free(slots)
    runner.req_to_token_pool.free(rows)
    return logits


def make_runner(model_path: str, device: str, options: dict) -> ModelRunner:
    args = ServerArgs(
        model_path=model_path, device=device, dtype="bfloat16", max_total_tokens=2048, **options
    )
    return ModelRunner(args)


def greedy_ids(model_path: str, device: str, options: dict, prompts: list[list[int]]):
    """[prompts, 64] greedy output ids (EOS ignored)."""
    with rg.Engine(
        model_path=model_path, device=device, dtype="bfloat16", max_total_tokens=2048, **options
    ) as engine:
        outputs = engine.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": 64, "temperature": 0.0, "ignore_eos": True},
        )
    return torch.tensor([output["output_ids"] for output in outputs])


def greedy_agreement(greedy: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """Position-wise agreement, and the mean number of tokens before the first difference."""
    same = greedy == reference  # [prompts, tokens]
    first_difference = torch.where(same.all(1), same.shape[1], (~same).int().argmax(1))
    return {
        "greedy_agreement": same.float().mean().item(),
        "greedy_identical_prefix_mean": first_difference.float().mean().item(),
    }


# Calibration text for the FP8 KV scales of tiny: standard-library sources (what tiny was
# trained on; never the held-out slice), cut into 512-token prompts.
CALIBRATION_MODULES = ("textwrap", "fractions", "string", "json.decoder")


def calibrated_kv_options(device: str, folder: Path) -> dict:
    """Options of an e4m3 KV cache with scales from `radixgen calibrate-kv-cache`'s pass."""
    import importlib
    import inspect

    from radixgen.runtime.kv_calibration import calibrate_kv_cache_scales
    from radixgen.runtime.tiny_model import resolve_model_path
    from radixgen.runtime.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model_path("tiny"))
    prompts = []
    for module in CALIBRATION_MODULES:
        ids = tokenizer.encode(inspect.getsource(importlib.import_module(module)))
        prompts += [ids[start : start + 512] for start in range(0, len(ids) - 511, 512)]
    args = ServerArgs(model_path="tiny", device=device, dtype="bfloat16", max_total_tokens=4096)
    scales = calibrate_kv_cache_scales(args, prompts, kv_cache_dtype="fp8_e4m3")
    path = folder / "kv_scales.json"
    path.write_text(json.dumps(scales.to_json()))
    print(f"calibrated on {len(prompts)} prompts of 512 tokens: {scales.layers}", flush=True)
    return {"kv_cache_dtype": "fp8_e4m3", "quantization_param_path": str(path)}


def tiny_rows(device: str, folder: Path, only: set[str] | None = None) -> list[dict]:
    windows = load_ci_slice().astype("int64").tolist()
    # 8 held-out prompts of 128 tokens: two from each window.
    prompts = [window[start : start + 128] for window in windows for start in (0, 512)]
    reference_argmax, reference_greedy = None, None
    rows = []
    variants = {**VARIANTS, "fp8 KV (e4m3), calibrated scales": None}
    for label, options in variants.items():
        if only is not None and label != "bf16" and label not in only:
            continue
        if options is None:
            options = calibrated_kv_options(device, folder)
        greedy = greedy_ids("tiny", device, options, prompts)
        runner = make_runner("tiny", device, options)
        nll, argmaxes = 0.0, []
        for window in windows:
            logits = all_logits(runner, window)[:-1]  # [1023, vocab]: predicts window[1:]
            targets = torch.tensor(window[1:], device=logits.device)
            nll += torch.nn.functional.cross_entropy(logits, targets, reduction="sum").item()
            argmaxes.append(logits.argmax(-1).cpu())
        argmax = torch.cat(argmaxes)
        if reference_argmax is None:
            reference_argmax, reference_greedy = argmax, greedy
        positions = len(windows) * (len(windows[0]) - 1)
        rows.append(
            {
                "variant": label,
                "perplexity": math.exp(nll / positions),
                "top1_agreement": (argmax == reference_argmax).float().mean().item(),
                **greedy_agreement(greedy, reference_greedy),
            }
        )
        print(rows[-1], flush=True)
    return rows


def random_shape_rows(device: str, folder: Path) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    vocab = TINY_CONFIG["vocab_size"]
    prompts = torch.randint(3, vocab, (4, 256), generator=generator).tolist()
    rows = []
    for shape, overrides in RANDOM_SHAPES.items():
        config = {key: value for key, value in TINY_CONFIG.items() if key != "head_dim"}
        config.update(overrides)  # head_dim: hidden / heads unless the shape sets it
        path = folder / shape.split()[0]
        path.mkdir()
        write_random_model(path, config, seed=0)
        reference, reference_greedy = None, None
        for label, options in VARIANTS.items():
            if label == "fp8 KV (e5m2)":
                continue
            runner = make_runner(str(path), device, options)
            logits = [all_logits(runner, prompt) for prompt in prompts]  # each [256, vocab]
            del runner
            greedy = greedy_ids(str(path), device, options, [prompt[:64] for prompt in prompts])
            if reference is None:
                reference, reference_greedy = logits, greedy
                continue
            cosine = torch.cat(
                [
                    torch.nn.functional.cosine_similarity(ours, theirs, dim=-1)
                    for ours, theirs in zip(logits, reference, strict=True)
                ]
            )
            top1 = torch.cat(
                [
                    ours.argmax(-1) == theirs.argmax(-1)
                    for ours, theirs in zip(logits, reference, strict=True)
                ]
            )
            rows.append(
                {
                    "shape": shape,
                    "variant": label,
                    "logits_cosine_mean": cosine.mean().item(),
                    "logits_cosine_min": cosine.min().item(),
                    "top1_agreement": top1.float().mean().item(),
                    **greedy_agreement(greedy, reference_greedy),
                }
            )
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument(
        "--tiny-variants", nargs="+", help="only these tiny rows (and bf16); no random shapes"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    only = set(args.tiny_variants) if args.tiny_variants else None
    with tempfile.TemporaryDirectory() as folder:
        summary = {"device": args.device, "tiny": tiny_rows(args.device, Path(folder), only)}
        if only is None:
            summary["random_shapes"] = random_shape_rows(args.device, Path(folder))
    path = Path(args.out) / "fp8_accuracy.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
