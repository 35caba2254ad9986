"""`radixgen bench hf`: the same workload through transformers' `generate`, on the same GPU.

This is the side-by-side peer: bf16, sdpa attention, a dynamic KV cache and plain eager
`generate` for every batch size; plus, for batch size 1, a static cache with
`torch.compile` (transformers' own fast path), so that a ratio comes out of one run.
Output lengths are forced (`min_new_tokens == max_new_tokens`), prompts are random ids.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class HFBenchArgs:
    model_path: str = "tiny"
    load_format: str = "auto"  # "dummy": random weights from config.json alone
    dtype: str = "auto"  # auto: bf16 on CUDA, fp32 on CPU
    batch_sizes: tuple[int, ...] = (1,)
    input_len: int = 128
    output_len: int = 256
    compile_bs1: bool = True  # also run the static-cache + torch.compile variant at bs 1
    seed: int = 0
    warmup: bool = True


def _load_model(args: HFBenchArgs, device, dtype):
    import torch

    from radixgen.runtime.hf_compat import import_installed_kernels
    from radixgen.runtime.tiny_model import resolve_model_path

    import_installed_kernels()  # before transformers' models (runtime/hf_compat.py)
    from transformers import AutoConfig, AutoModelForCausalLM

    path = resolve_model_path(args.model_path)
    if args.load_format == "dummy":
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                config, torch_dtype=dtype, attn_implementation="sdpa"
            )
        # from_config initialises with the config's std; keep it (numbers don't matter).
    else:
        model = AutoModelForCausalLM.from_pretrained(
            path, torch_dtype=dtype, attn_implementation="sdpa", local_files_only=True
        ).to(device)
    model.eval()
    eos = model.generation_config.eos_token_id
    model.generation_config.pad_token_id = eos[0] if isinstance(eos, list) else eos
    return model


def _time_generate(model, input_ids, output_len: int, **kwargs) -> float:
    import torch

    if input_ids.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            do_sample=False,
            **kwargs,
        )
    if input_ids.is_cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    assert out.shape[1] == input_ids.shape[1] + output_len, "generate did not force the length"
    return elapsed


def run_hf(args: HFBenchArgs) -> list[dict]:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {
        "auto": torch.bfloat16 if device == "cuda" else torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
        "float32": torch.float32,
    }[args.dtype]
    model = _load_model(args, device, dtype)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    variants = [("hf-eager-dynamic-cache", {}, bs) for bs in args.batch_sizes]
    if args.compile_bs1 and device == "cuda":
        variants.append(("hf-static-cache-compile", {"cache_implementation": "static"}, 1))
    for name, kwargs, batch_size in variants:
        if kwargs.get("cache_implementation") == "static":
            model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        input_ids = torch.randint(300, vocab, (batch_size, args.input_len), generator=generator)
        input_ids = input_ids.to(device)
        if args.warmup:
            # Static-cache compile needs its real lengths to warm up (it recompiles otherwise).
            warm_len = args.output_len if kwargs else min(8, args.output_len)
            _time_generate(model, input_ids, warm_len, **kwargs)
        elapsed = _time_generate(model, input_ids, args.output_len, **kwargs)
        output_tokens = batch_size * args.output_len
        rows.append(
            {
                "variant": name,
                "batch_size": batch_size,
                "input_len": args.input_len,
                "output_len": args.output_len,
                "elapsed_s": elapsed,
                "output_token_throughput": output_tokens / elapsed,
                "ms_per_step": 1000 * elapsed / args.output_len,
            }
        )
        print(json.dumps(rows[-1]))
    return rows


def main_hf(args: HFBenchArgs, output_json: str | None) -> list[dict]:
    rows = run_hf(args)
    if output_json:
        with open(output_json, "w") as f:
            json.dump({"args": asdict(args), "results": rows}, f, indent=2)
    return rows
