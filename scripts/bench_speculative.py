"""Speculative decoding benchmarks (docs/benchmarks.md, `## speculative decoding`).

    python scripts/bench_speculative.py tokens [--device cpu] [--batch-sizes 1 8]
    python scripts/bench_speculative.py verify-cost       # CUDA, Llama-3.1-8B shape, dummy weights
    python scripts/bench_speculative.py oracle            # CUDA, Llama-3.1-8B shape, dummy weights

`tokens`: the trained tiny model on windows of its held-out test split (code completion),
greedy: tokens/s and the mean accepted length per verify step, plain decoding vs NGRAM (or
STANDALONE, EAGLE with --draft-model-path: tiny's trained tiny-draft, tiny-eagle), at each
batch size (prompts run `batch_size` at a time through the Engine, warmed up first); the
outputs must be identical (fp32) or the script fails.

`verify-cost`: one static batch through the model runner: the time of a verify forward (an
extend of 1 + K tokens per request with every row's logits, as the speculative step runs it)
relative to a decode step (CUDA graph), for K = 1, 2, 4, 8 at batch 1, 8, 32.

`oracle`: end-to-end tokens/s with an *oracle* draft: the target's own greedy continuation,
each drafted position independently replaced by a wrong token with probability 1 - alpha.
Expected tokens per step: (1 - alpha^(K+1)) / (1 - alpha). Dummy weights: acceptance means
nothing, so these rows are labelled oracle runs. Dummy weights also make greedy decoding
fragile: their logits are ~N(0, 1.3^2) over 128k tokens, rounded to bf16 (steps of 1/32 near
the top), so the top two often tie and the verify and decode kernels' rounding picks
different ones within a few tokens: a continuation recorded by one run stops being the next
run's. So the harness pins the target's greedy choice (`PinnedGreedy`: after every forward,
plain and speculative alike, the logit of the continuation's token at each row gets a large
margin, one device scatter): the continuation is then the target's greedy output by
construction (checked: every run must output it), and acceptance is exactly the oracle's.

JSON goes to --out, or $OUT/bench_speculative_<mode>.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from radixgen.runtime.bench.model_configs import write_dummy_model_folder
from radixgen.runtime.bench.oracle_drafts import OracleProposer, PinnedGreedy
from radixgen.runtime.engine import Engine
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.tiny_assets.corpus import CI_SLICE_PATH
from radixgen.runtime.tiny_model import resolve_model_path

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def heldout_prompts(num_prompts: int, prompt_len: int) -> list[list[int]]:
    """Windows of tiny's held-out test split (4 x 1024 tokens), spread over it."""
    windows = np.load(CI_SLICE_PATH)  # [4, 1024] uint16
    per_window = -(-num_prompts // len(windows))
    stride = (windows.shape[1] - prompt_len) // per_window
    prompts = [
        windows[w, i * stride : i * stride + prompt_len].tolist()
        for w in range(len(windows))
        for i in range(per_window)
    ]
    return prompts[:num_prompts]


def write_truncated_draft(num_layers: int, folder: Path) -> str:
    """A STANDALONE draft without training: tiny's first `num_layers` layers with its
    embedding (tied to the output head) and final norm, in `folder`."""
    from safetensors.torch import load_file, save_file

    source = Path(resolve_model_path("tiny"))
    folder.mkdir(parents=True, exist_ok=True)
    weights = load_file(source / "model.safetensors")
    save_file(
        {
            name: tensor
            for name, tensor in weights.items()
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < num_layers
        },
        folder / "model.safetensors",
    )
    config = json.loads((source / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": num_layers}))
    for file in source.iterdir():
        if file.is_file() and file.name not in ("model.safetensors", "config.json"):
            shutil.copyfile(file, folder / file.name)
    return str(folder)


COUNTERS = (
    "num_forward_steps",
    "num_spec_verify_steps",
    "num_spec_draft_tokens",
    "num_spec_accepted_tokens",
    "num_spec_verified_reqs",
)


def run_engine(
    options: dict,
    prompts: list[list[int]],
    batch_size: int,
    max_new_tokens: int,
    proposer=None,
    temperature: float = 0.0,
    verify_as_decode_rows: bool | None = None,
    pinned_sequences: dict[tuple[int, ...], list[int]] | None = None,
    warm_up: bool = False,
) -> dict:
    """Runs `prompts` `batch_size` at a time through an Engine (greedy, or sampled with seed 1
    at `temperature`); `warm_up` first runs an untimed batch."""
    with Engine(**options) as engine:
        # Benchmark-only switches on the scheduler's decoder (the Engine has no public hook):
        # a draft source (the oracle: any DraftProposer) and the verify forward's form.
        if proposer is not None:
            engine._scheduler.speculative.proposer = proposer
        if verify_as_decode_rows is not None:
            engine._scheduler.speculative.verify_as_decode_rows = verify_as_decode_rows
        if pinned_sequences is not None:
            PinnedGreedy(engine._scheduler.runner, pinned_sequences)
        params = {**GREEDY, "max_new_tokens": max_new_tokens}
        if temperature > 0:
            params |= {"temperature": temperature, "seed": 1}
        # The warm-up batch is the first one reversed (same lengths, no prefix shared with the
        # timed prompts): it compiles the kernels the timed batches use (the Engine's own
        # warm-up covers the serving dtype's plan, not every shape here). Counters are
        # differences from after it.
        if warm_up:
            warm = [list(reversed(prompt)) for prompt in prompts[:batch_size]]
            engine.generate(input_ids=warm, sampling_params=params)
        before = engine.get_stats()
        outputs = []
        start = time.perf_counter()
        for first in range(0, len(prompts), batch_size):
            chunk = prompts[first : first + batch_size]
            outputs += engine.generate(input_ids=chunk, sampling_params=params)
        elapsed_s = time.perf_counter() - start
        engine.check_integrity()
        after = engine.get_stats()
    stats = {key: after[key] - before[key] for key in COUNTERS}
    emitted = stats["num_spec_accepted_tokens"] + stats["num_spec_verified_reqs"]
    output_ids = [output["output_ids"] for output in outputs]
    return {
        "batch_size": batch_size,
        "elapsed_s": elapsed_s,
        "output_tokens": sum(len(ids) for ids in output_ids),
        "tokens_per_s": sum(len(ids) for ids in output_ids) / elapsed_s,
        "forward_steps": stats["num_forward_steps"],
        "spec_verify_steps": stats["num_spec_verify_steps"],
        "spec_accept_length": emitted / max(stats["num_spec_verified_reqs"], 1),
        "spec_draft_tokens": stats["num_spec_draft_tokens"],
        "spec_accepted_tokens": stats["num_spec_accepted_tokens"],
        "output_ids": output_ids,
    }


def bench_tokens(args) -> list[dict]:
    prompts = heldout_prompts(args.num_prompts, args.prompt_len)
    if args.draft_layers is not None:
        folder = Path(tempfile.mkdtemp(prefix="radixgen-draft-"))
        args.draft_model_path = write_truncated_draft(args.draft_layers, folder)
    # A fixed KV size (the CPU default): on a GPU the STANDALONE draft gets as many slots as
    # the target, which must leave it room.
    base = {
        "model_path": "tiny",
        "device": args.device,
        "dtype": args.dtype,
        "max_total_tokens": 1 << 16,
    }
    rows = []
    for batch_size in args.batch_sizes:
        plain = run_engine(
            base,
            prompts,
            batch_size,
            args.max_new_tokens,
            temperature=args.temperature,
            warm_up=True,
        )
        speculative = {
            **base,
            "speculative_algorithm": args.algorithm,
            "speculative_draft_model_path": args.draft_model_path,
            "speculative_num_steps": args.num_steps,
            "speculative_max_batch_size": args.speculative_max_batch_size,
            "speculative_min_accept_length": args.speculative_min_accept_length,
        }
        ngram = run_engine(
            speculative,
            prompts,
            batch_size,
            args.max_new_tokens,
            temperature=args.temperature,
            warm_up=True,
        )
        identical = plain.pop("output_ids") == ngram.pop("output_ids")
        if args.dtype == "float32" and args.temperature == 0 and not identical:
            raise AssertionError(f"batch {batch_size}: {args.algorithm} changed greedy outputs")
        rows.append(
            {
                "batch_size": batch_size,
                "algorithm": args.algorithm,
                "draft_model_path": args.draft_model_path,
                "num_steps": args.num_steps,
                "identical_outputs": identical,
                "plain": plain,
                "speculative": ngram,
                "speedup": ngram["tokens_per_s"] / plain["tokens_per_s"],
            }
        )
        print(
            f"batch {batch_size:>3}: plain {plain['tokens_per_s']:8.1f} tok/s, {args.algorithm} "
            f"{ngram['tokens_per_s']:8.1f} tok/s ({rows[-1]['speedup']:.2f}x), accept length "
            f"{ngram['spec_accept_length']:.2f}, identical {identical}",
            flush=True,
        )
    return rows


# ---- verify cost at the 8B shape -------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_ms(device: torch.device, step, repeats: int) -> float:
    """Median ms of `step()` (the first two calls are warm-up)."""
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times[2:] or times)


def target_model_options(args) -> dict:
    """The 8B shape with dummy weights, or (`--model tiny`, a smoke test) the tiny model."""
    if args.model == "tiny":
        return {"model_path": "tiny", "dtype": "float32"}
    folder = write_dummy_model_folder(args.model, Path(args.model_dir))
    return {"model_path": str(folder), "load_format": "dummy"}


def _static_forward(
    runner: ModelRunner,
    req_rows: list[int],
    per_request: torch.Tensor,  # [batch, slots per request] int64
    num_new: int,
    *,
    position: int,
    as_decode_rows: bool = False,
) -> None:
    """One forward of `num_new` tokens per request after `position` cached ones: a decode
    step for 1 (CUDA graph), else a verify forward: an extend with every row's logits, or
    (`as_decode_rows`) one decode row per token (the decode CUDA graph of that row count)."""
    batch_size = len(req_rows)
    out_cache_loc = per_request[:, position : position + num_new].reshape(-1)
    if as_decode_rows:
        batch = runner.build_forward_batch(
            mode=ForwardMode.DECODE,
            input_ids=[[301 + i] for _ in req_rows for i in range(num_new)],
            req_pool_indices=[row for row in req_rows for _ in range(num_new)],
            prefix_lens=[position + i for _ in req_rows for i in range(num_new)],
            out_cache_loc=out_cache_loc,
        )
    else:
        batch = runner.build_forward_batch(
            mode=ForwardMode.DECODE if num_new == 1 else ForwardMode.EXTEND,
            input_ids=[[301 + i for i in range(num_new)]] * batch_size,
            req_pool_indices=req_rows,
            prefix_lens=[position] * batch_size,
            out_cache_loc=out_cache_loc,
            return_all_logits=num_new > 1,
        )
    runner.forward(batch).argmax(dim=-1)


def bench_verify_cost(args) -> list[dict]:
    runner = ModelRunner(
        ServerArgs(
            **target_model_options(args),
            context_length=args.prompt_len + 64,
            # Rows for the verify-as-decode-rows forwards' CUDA graphs (9 per request).
            max_running_requests=max(args.batch_sizes) * 9,
            max_total_tokens=max(args.batch_sizes) * (args.prompt_len + 16) + 64,
        )
    )
    rows = []
    for batch_size in args.batch_sizes:
        req_rows = runner.req_to_token_pool.alloc(batch_size)
        slots = runner.slot_allocator.alloc(batch_size * (args.prompt_len + 16))
        per_request = slots.view(batch_size, args.prompt_len + 16)
        prompts = torch.randint(300, runner.vocab_size, (batch_size, args.prompt_len)).tolist()
        runner.forward(
            runner.build_forward_batch(
                mode=ForwardMode.EXTEND,
                input_ids=prompts,
                req_pool_indices=req_rows,
                prefix_lens=[0] * batch_size,
                out_cache_loc=per_request[:, : args.prompt_len].reshape(-1),
            )
        )
        step = functools.partial(
            _static_forward, runner, req_rows, per_request, position=args.prompt_len
        )
        decode_ms = _timed_ms(runner.device, functools.partial(step, 1), args.repeats)
        for num_draft in (1, 2, 4, 8):
            verify_ms = _timed_ms(
                runner.device, functools.partial(step, num_draft + 1), args.repeats
            )
            rows_ms = _timed_ms(
                runner.device,
                functools.partial(step, num_draft + 1, as_decode_rows=True),
                args.repeats,
            )
            rows.append(
                {
                    "batch_size": batch_size,
                    "num_draft_tokens": num_draft,
                    "decode_ms": decode_ms,
                    "verify_ms": verify_ms,
                    "verify_over_decode": verify_ms / decode_ms,
                    "verify_as_decode_rows_ms": rows_ms,
                    "verify_as_decode_rows_over_decode": rows_ms / decode_ms,
                }
            )
            print(rows[-1], flush=True)
        runner.slot_allocator.free(slots)
        runner.req_to_token_pool.free(req_rows)
    return rows


# ---- oracle drafts at the 8B shape -------------------------------------------------------------


def bench_oracle(args) -> list[dict]:
    base = {
        **target_model_options(args),
        "context_length": args.prompt_len + args.max_new_tokens + 16,
        # Decode graphs up to the largest verify forward as decode rows, no more (start-up).
        "cuda_graph_max_bs": max(args.batch_sizes) * (args.num_steps + 1),
    }
    verify_as_decode_rows = {"auto": None, "extend": False, "decode-rows": True}[args.verify]
    rows = []
    for batch_size in args.batch_sizes:
        generator = torch.Generator().manual_seed(batch_size)
        prompts = torch.randint(300, 30000, (batch_size, args.prompt_len), generator=generator)
        prompts = prompts.tolist()
        # The greedy continuations the harness pins (random tokens: any sequence will do).
        continuations = torch.randint(
            300, 30000, (batch_size, args.max_new_tokens), generator=generator
        )
        recorded = {tuple(p): c for p, c in zip(prompts, continuations.tolist(), strict=True)}
        pinned = {tuple(p[:16]): p + recorded[tuple(p)] for p in prompts}
        plain = run_engine(base, prompts, batch_size, args.max_new_tokens, pinned_sequences=pinned)
        if plain.pop("output_ids") != [recorded[tuple(p)] for p in prompts]:
            raise AssertionError(f"batch {batch_size}: the pinned continuation was not output")
        for alpha in args.alphas:
            options = {
                **base,
                "speculative_algorithm": "NGRAM",  # its decoder; the oracle replaces the drafts
                "speculative_num_steps": args.num_steps,
                "speculative_max_batch_size": args.speculative_max_batch_size,
            }
            proposer = OracleProposer(recorded, alpha, vocab_size=30000)
            oracle = run_engine(
                options,
                prompts,
                batch_size,
                args.max_new_tokens,
                proposer,
                verify_as_decode_rows=verify_as_decode_rows,
                pinned_sequences=pinned,
            )
            if oracle.pop("output_ids") != [recorded[tuple(p)] for p in prompts]:
                raise AssertionError(f"batch {batch_size} alpha {alpha}: outputs changed")
            k = args.num_steps
            rows.append(
                {
                    "label": f"oracle run ({args.model})",
                    "batch_size": batch_size,
                    "alpha": alpha,
                    "verify": args.verify,
                    "num_draft_tokens": k,
                    "expected_tokens_per_step": (1 - alpha ** (k + 1)) / (1 - alpha),
                    "plain_tokens_per_s": plain["tokens_per_s"],
                    "oracle": oracle,
                    "speedup": oracle["tokens_per_s"] / plain["tokens_per_s"],
                }
            )
            print(
                f"oracle batch {batch_size:>3} alpha {alpha}: plain {plain['tokens_per_s']:.1f} "
                f"tok/s, oracle {oracle['tokens_per_s']:.1f} tok/s ({rows[-1]['speedup']:.2f}x), "
                f"accept length {oracle['spec_accept_length']:.2f} (expected "
                f"{rows[-1]['expected_tokens_per_step']:.2f})",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["tokens", "verify-cost", "oracle"])
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--algorithm", default="NGRAM", help="tokens mode: NGRAM, STANDALONE or EAGLE"
    )
    parser.add_argument(
        "--draft-model-path",
        default=None,
        help="tokens mode: STANDALONE's draft (tiny-draft: tiny's) or EAGLE's head (tiny-eagle)",
    )
    parser.add_argument(
        "--draft-layers",
        type=int,
        default=None,
        help="tokens mode, STANDALONE: draft with tiny's first N layers (untrained as a draft)",
    )
    parser.add_argument("--dtype", default="float32", help="tokens mode (fp32: exact outputs)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--num-steps", type=int, default=4, help="drafted tokens per step")
    parser.add_argument(
        "--speculative-max-batch-size",
        type=int,
        default=None,
        help="batches above it decode plainly (default: the engine's rule)",
    )
    parser.add_argument(
        "--speculative-min-accept-length",
        type=float,
        default=None,
        help="the back-off threshold (default: the engine's; 0: never back off)",
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="tokens mode: 0 greedy, else seeded"
    )
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.5, 0.7, 0.9])
    parser.add_argument(
        "--verify",
        choices=["auto", "extend", "decode-rows"],
        default="auto",
        help="oracle: the verify forward's form (auto: decode rows when a CUDA graph takes them)",
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--model",
        default="llama-3.1-8b",
        help="verify-cost and oracle: a runtime/bench/model_configs.py preset (dummy weights), "
        "or 'tiny' (a CPU smoke test)",
    )
    parser.add_argument("--model-dir", default="/tmp/radixgen-llama-3.1-8b")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.batch_sizes is None:
        args.batch_sizes = [1, 8] if args.mode == "tokens" else [1, 8, 32]
    run = {"tokens": bench_tokens, "verify-cost": bench_verify_cost, "oracle": bench_oracle}
    rows = run[args.mode](args)
    record = {
        "mode": args.mode,
        "args": vars(args),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
    }
    out = args.out or os.path.join(
        os.environ.get("OUT", "."), f"bench_speculative_{args.mode}.json"
    )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(record, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
