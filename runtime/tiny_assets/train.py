"""Trains the `tiny` model on the standard-library corpus and writes its checkpoint.

    python -m radixgen.runtime.tiny_assets.corpus tokens --out DATA     # on Python 3.11
    python -m radixgen.runtime.tiny_assets.train --data DATA --out OUT [--shapes mid6 deep8]

With several `--shapes`, one process per shape trains concurrently on the one GPU for the
same wall-clock budget; the shape with the lowest validation loss wins and its checkpoint is
copied to OUT (the others stay under --work-dir). Each process keeps the weights of its best
validation loss (early stopping: the corpus is ~8M tokens, and a budget of minutes runs many
epochs over it), rounds them to bfloat16, measures held-out perplexity over the whole test
split in float32, and writes `model.safetensors`, `config.json` and `metrics.json`.

The learning-rate schedule (linear warm-up, cosine decay) runs over `--train-seconds` of wall
clock, or over `--steps` optimizer steps when given: everything is seeded, so a fixed step
count replays a run exactly; a time budget trains as many steps as the machine allows.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from radixgen.runtime.tiny_assets.corpus import CI_SLICE_WINDOWS, EVAL_WINDOW, eval_windows
from radixgen.runtime.tiny_assets.trainable_llama import TrainableLlama
from radixgen.runtime.tiny_model import TINY_CONFIG

# Candidate shapes: hidden 256, 8 query / 4 KV heads of 32; the same ~4.7M parameters outside
# the tied 32000 x 256 embedding (8.2M), spent on depth or on MLP width.
SHAPES = {
    "wide4": {"num_hidden_layers": 4, "intermediate_size": 1280},
    "mid6": {"num_hidden_layers": 6, "intermediate_size": 768},
    "deep8": {"num_hidden_layers": 8, "intermediate_size": 512},
}


def shape_config(shape: str) -> dict:
    """tiny's config.json with a candidate shape: tied embeddings, the shape's depth/width."""
    return {**TINY_CONFIG, **SHAPES[shape], "tie_word_embeddings": True}


def learning_rate(progress: float, peak: float, warmup: float = 0.05) -> float:
    """Linear warm-up over the first `warmup` of training, then cosine down to peak / 10."""
    if progress < warmup:
        return peak * progress / warmup
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, (progress - warmup) / (1 - warmup))))
    return peak * (0.1 + 0.9 * cosine)


@torch.no_grad()
def mean_nll(model: TrainableLlama, windows: torch.Tensor, batch: int, exact: bool) -> float:
    """Mean next-token NLL over windows [n, W] (positions 1..W-1 of each are predicted).

    exact: float32 math (the reported figure); otherwise bf16 autocast (selection only).
    """
    total, count = 0.0, 0
    for start in range(0, len(windows), batch):
        chunk = windows[start : start + batch]  # [b, W] int64
        with torch.autocast(chunk.device.type, torch.bfloat16, enabled=not exact):
            logits = model(chunk[:, :-1])  # [b, W - 1, vocab]
        nll = F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
        total += nll.item()
        count += chunk[:, 1:].numel()
    return total / count


def train_one(args: argparse.Namespace) -> dict:
    """Trains `args.shapes[0]`; writes the checkpoint and metrics into args.out."""
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    config = shape_config(args.shapes[0])
    train_tokens = torch.from_numpy(np.load(args.data / "train.npy").astype(np.int64)).to(device)
    valid = torch.from_numpy(eval_windows(np.load(args.data / "valid.npy")).astype(np.int64))
    test = torch.from_numpy(eval_windows(np.load(args.data / "test.npy")).astype(np.int64))
    valid, test = valid.to(device), test.to(device)

    model = TrainableLlama(config, dropout=args.dropout)
    # Initialised on the CPU: the same weights on any machine.
    model.init_weights(torch.Generator(device="cpu").manual_seed(args.seed))
    model.to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        fused=device.type == "cuda",
    )

    def loss_of(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, torch.bfloat16):
            logits = model(inputs)  # [batch, seq, vocab]
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    compiled_loss = torch.compile(loss_of) if args.compile else loss_of
    sampler = torch.Generator(device=device).manual_seed(args.seed)
    offsets = torch.arange(args.seq_len + 1, device=device)

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(
            0, len(train_tokens) - args.seq_len - 1, (args.batch_size, 1), generator=sampler,
            device=device,
        )  # fmt: skip
        window = train_tokens[starts + offsets]  # [batch, seq + 1]
        return window[:, :-1], window[:, 1:]

    best = {"valid_nll": float("inf"), "step": 0, "state": None}
    history = []

    def validate(step: int, elapsed: float, train_loss: float) -> None:
        """Validation loss now; keeps a copy of the weights if it is the best so far."""
        nonlocal best
        model.eval()
        valid_nll = mean_nll(model, valid, args.eval_batch, exact=False)
        model.train()
        history.append([step, round(elapsed, 1), round(train_loss, 4), round(valid_nll, 4)])
        print(f"{args.shapes[0]} step {step} {elapsed:.0f}s train {train_loss:.4f} "
              f"valid {valid_nll:.4f}", flush=True)  # fmt: skip
        if valid_nll < best["valid_nll"]:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            best = {"valid_nll": valid_nll, "step": step, "state": state}

    step, started, elapsed = 0, None, 0.0
    while True:
        if args.steps:
            progress = step / args.steps
        else:  # the budget, or max_epochs over the corpus if the machine gets there first
            epochs = step * args.batch_size * args.seq_len / len(train_tokens)
            progress = max(elapsed / args.train_seconds, epochs / args.max_epochs)
        if progress >= 1.0:
            break
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(progress, args.lr)
        inputs, targets = next_batch()
        try:
            loss = compiled_loss(inputs, targets)
        except Exception as error:  # a compiler failure must not cost the GPU run
            if compiled_loss is loss_of:
                raise
            print(f"torch.compile failed ({type(error).__name__}: {error}); running eager")
            compiled_loss = loss_of
            loss = loss_of(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step == 1:
            loss.item()  # the first step compiles: the budget starts after it
            started = time.perf_counter()
        # The host runs at most a few steps ahead of the device: close enough for a schedule.
        elapsed = time.perf_counter() - started
        if step % args.eval_every == 0:
            validate(step, elapsed, loss.item())
    elapsed = time.perf_counter() - started
    if step % args.eval_every:
        validate(step, elapsed, loss.item())
    model.load_state_dict(best["state"])

    # What ships: bfloat16 weights. Measure those, in float32 math.
    shipped = {k: v.to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    model.load_state_dict({k: v.float() for k, v in shipped.items()})
    model.eval()
    torch.backends.cuda.matmul.allow_tf32 = False
    test_nll = mean_nll(model, test, args.eval_batch, exact=True)
    stride = max(1, len(test) // CI_SLICE_WINDOWS)
    ci_nll = mean_nll(model, test[::stride][:CI_SLICE_WINDOWS], args.eval_batch, exact=True)
    metrics = {
        "shape": args.shapes[0],
        "config": config,
        "parameters": sum(v.numel() for v in shipped.values()),
        "steps": step,
        "best_step": best["step"],
        "batch_tokens": args.batch_size * args.seq_len,
        "tokens_seen": step * args.batch_size * args.seq_len,
        "epochs": step * args.batch_size * args.seq_len / len(train_tokens),
        "train_seconds": round(elapsed, 1),
        "best_valid_nll": best["valid_nll"],
        "test_tokens_predicted": len(test) * (EVAL_WINDOW - 1),
        "test_perplexity": math.exp(test_nll),
        "ci_slice_perplexity": math.exp(ci_nll),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "args": {k: str(v) for k, v in vars(args).items()},
        "history": history,
    }
    save_checkpoint(shipped, config, metrics, args.out, args.shard_mib)
    print(json.dumps({k: v for k, v in metrics.items() if k not in ("history", "config")}))
    return metrics


def save_checkpoint(
    weights: dict, config: dict, metrics: dict, out: Path, shard_mib: int | None
) -> None:
    """config.json, metrics.json and the weights: one model.safetensors, or (with shard_mib)
    HF-style shards of at most shard_mib each plus model.safetensors.index.json."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    if shard_mib is None:
        save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    shards: list[dict] = [{}]
    limit = shard_mib * 2**20 - 2**16  # room for the header
    for name in sorted(weights):
        size = weights[name].numel() * weights[name].element_size()
        if shards[-1] and sum(t.numel() * 2 for t in shards[-1].values()) + size > limit:
            shards.append({})
        shards[-1][name] = weights[name]
    weight_map = {}
    for index, shard in enumerate(shards, 1):
        file_name = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / file_name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file_name))
    index_file = {"metadata": {}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index_file, indent=2) + "\n")


def train_candidates(args: argparse.Namespace) -> None:
    """One process per shape, concurrently; copies the best validation loss's files to out."""
    processes = {}
    for shape in args.shapes:
        command = [sys.executable, "-m", "radixgen.runtime.tiny_assets.train", "--shapes", shape]
        command += ["--out", str(args.work_dir / shape)] + forwarded_options(args)
        (args.work_dir / shape).mkdir(parents=True, exist_ok=True)
        log = open(args.work_dir / shape / "log.txt", "w")  # noqa: SIM115 (closed below)
        processes[shape] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log)
    results = {}
    for shape, (process, log) in processes.items():
        process.wait()
        log.close()
        metrics_file = args.work_dir / shape / "metrics.json"
        if process.returncode == 0 and metrics_file.is_file():
            results[shape] = json.loads(metrics_file.read_text())
        print(f"--- {shape} (exit {process.returncode})")
        print("\n".join((args.work_dir / shape / "log.txt").read_text().splitlines()[-6:]))
    if not results:
        raise SystemExit("every candidate failed")
    winner = min(results, key=lambda shape: results[shape]["best_valid_nll"])
    args.out.mkdir(parents=True, exist_ok=True)
    for path in (args.work_dir / winner).iterdir():
        if path.name != "log.txt":
            shutil.copy(path, args.out / path.name)
    summary = {
        shape: {k: v for k, v in m.items() if k not in ("config", "args")}
        for shape, m in results.items()
    }
    (args.out / "candidates.json").write_text(json.dumps(summary, indent=2) + "\n")
    with open(args.out / "train_log.txt", "w") as combined:
        for shape in args.shapes:
            combined.write(f"=== {shape}\n" + (args.work_dir / shape / "log.txt").read_text())
    print(f"winner: {winner}")
    for shape, m in results.items():
        print(f"{shape}: valid nll {m['best_valid_nll']:.4f} test ppl {m['test_perplexity']:.3f} "
              f"steps {m['steps']} epochs {m['epochs']:.1f}")  # fmt: skip


def forwarded_options(args: argparse.Namespace) -> list[str]:
    options = ["--data", str(args.data), "--device", args.device, "--seed", str(args.seed)]
    options += ["--train-seconds", str(args.train_seconds), "--lr", str(args.lr)]
    options += ["--max-epochs", str(args.max_epochs), "--dropout", str(args.dropout)]
    options += ["--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len)]
    options += ["--eval-every", str(args.eval_every), "--eval-batch", str(args.eval_batch)]
    options += ["--steps", str(args.steps)] if args.steps else []
    options += ["--shard-mib", str(args.shard_mib)] if args.shard_mib else []
    options += [] if args.compile else ["--no-compile"]
    return options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="{train,valid,test}.npy")
    parser.add_argument("--out", type=Path, required=True, help="the winner's checkpoint")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/tiny-candidates"))
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-seconds", type=float, default=300.0)
    parser.add_argument("--steps", type=int, default=None, help="fixed schedule (replays)")
    parser.add_argument("--max-epochs", type=float, default=40.0)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-batch", type=int, default=32)
    parser.add_argument("--shard-mib", type=int, default=None, help="shard the weights")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    args = parser.parse_args(argv)
    if args.train_seconds <= 0 or (args.steps is not None and args.steps <= 0):
        parser.error("--train-seconds and --steps must be positive")
    return args


def main() -> None:
    args = parse_args()
    if len(args.shapes) > 1:
        train_candidates(args)
    else:
        train_one(args)


if __name__ == "__main__":
    main()
