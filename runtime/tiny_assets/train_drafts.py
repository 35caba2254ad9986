"""Trains tiny's two draft models at once on tiny's own predictions, and writes them.

    python -m radixgen.runtime.tiny_assets.train_drafts --out OUT [--steps 300] [--device cuda]

- the EAGLE head (runtime/models/llama_eagle.py): fc(concat(f_p, embed(x_{p+1}))), one decoder
  layer of tiny's shape and a norm predict tiny's next feature f_{p+1}; tiny's LM head reads
  it. Loss: smooth L1 to f_{p+1} plus 0.1 x cross-entropy to tiny's argmax at p + 1. A second
  pass feeds the head its own (detached) predictions as features, as drafting does from the
  second draft on.
- the STANDALONE draft: a one-layer Llama on tiny's (frozen, shared) embedding and LM head,
  with its own layer and final norm; cross-entropy to tiny's argmax at every position.

Both learn tiny's greedy choice (what greedy verification accepts), from one frozen forward
of tiny (float32) per batch over random windows of the corpus's training split (the
`corpus tokens` output given as --data, or by default the first --num-files training files
tokenized here). Only the drafts' own tensors are written, in bfloat16:
`OUT/eagle_head.safetensors` (fc, layers.0.*, norm, and `hot_token_ids`: the training split's
TINY_EAGLE_DRAFT_VOCAB_SIZE most frequent tokens, the vocabulary it drafts from) and `OUT/draft_layers.safetensors`
(model.layers.0.*, model.norm); `tiny_model.py` assembles the loadable folders `tiny-eagle`
and `tiny-draft` from them and tiny's embedding. Seeded; `--steps` fixes the schedule
(`--train-seconds` bounds it by the wall clock instead, whichever ends first).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from radixgen.runtime.tiny_assets.corpus import (
    read_manifest,
    read_verified_sources,
    stdlib_dir,
    tokenize_documents,
)
from radixgen.runtime.tiny_assets.trainable_llama import (
    DecoderLayer,
    RMSNorm,
    TrainableLlama,
    rope_tables,
)
from radixgen.runtime.tiny_model import (
    TINY_ASSETS_DIR,
    TINY_CONFIG,
    TINY_EAGLE_DRAFT_VOCAB_SIZE,
)

EAGLE_HEAD_FILE = "eagle_head.safetensors"
DRAFT_LAYERS_FILE = "draft_layers.safetensors"
FEATURE_LOSS_WEIGHT = 1.0
TOKEN_LOSS_WEIGHT = 0.1


class TrainableEagleHead(nn.Module):
    """The dense training twin of `LlamaEagleHead` (same tensor names and math)."""

    def __init__(self, config: dict):
        super().__init__()
        hidden = config["hidden_size"]
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(config, dropout=0.0)])
        self.norm = RMSNorm(hidden, config["rms_norm_eps"])

    def forward(self, features, embedded, cos, sin) -> torch.Tensor:
        # features, embedded: [batch, seq, hidden] (f_p, embed(x_{p+1})) -> g_{p+1}
        x = self.fc(torch.cat([features, embedded], dim=-1))
        return self.norm(self.layers[0](x, cos, sin))


class TrainableDraft(nn.Module):
    """One decoder layer and a final norm on a frozen, shared embedding / LM head."""

    def __init__(self, config: dict):
        super().__init__()
        self.layer = DecoderLayer(config, dropout=0.0)
        self.norm = RMSNorm(config["hidden_size"], config["rms_norm_eps"])

    def forward(self, embedded, cos, sin) -> torch.Tensor:  # -> [batch, seq, hidden]
        return self.norm(self.layer(embedded, cos, sin))


def init_layers(module: nn.Module, generator: torch.Generator, std: float) -> None:
    for name, param in module.named_parameters():
        if name.endswith("norm.weight"):
            nn.init.ones_(param)
        else:
            nn.init.normal_(param, std=std, generator=generator)


def training_tokens(data: Path | None, num_files: int) -> np.ndarray:
    """The training split's tokens: DATA/train.npy, or the first `num_files` training files."""
    if data is not None:
        return np.load(data / "train.npy")
    entries = [entry for entry in read_manifest() if entry.split == "train"][:num_files]
    return tokenize_documents(read_verified_sources(entries, stdlib_dir())["train"])


def load_tiny(device: torch.device) -> TrainableLlama:
    from safetensors.torch import load_file

    model = TrainableLlama(TINY_CONFIG)
    weights = load_file(TINY_ASSETS_DIR / "model.safetensors")
    model.load_state_dict({name: tensor.float() for name, tensor in weights.items()})
    return model.to(device).eval().requires_grad_(False)


def train(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    tokens = torch.from_numpy(training_tokens(args.data, args.num_files).astype(np.int64))
    tiny = load_tiny(device)
    embedding = tiny.model.embed_tokens.weight  # [vocab, hidden], frozen and shared
    generator = torch.Generator().manual_seed(args.seed)
    eagle, draft = TrainableEagleHead(TINY_CONFIG), TrainableDraft(TINY_CONFIG)
    for module in (eagle, draft):
        init_layers(module, generator, TINY_CONFIG["initializer_range"])
    eagle, draft = eagle.to(device), draft.to(device)
    params = list(eagle.parameters()) + list(draft.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    cos, sin = rope_tables(args.seq_len, TINY_CONFIG["head_dim"], TINY_CONFIG["rope_theta"], device)
    history, start = [], time.perf_counter()
    for step in range(args.steps):
        # The schedule follows the step count, or the wall clock when it is bounded (GPU runs).
        progress = step / args.steps
        if args.train_seconds is not None:
            progress = max(progress, (time.perf_counter() - start) / args.train_seconds)
            if progress >= 1.0:
                break
        lr = args.lr * min(1.0, 20 * progress) * 0.5 * (1 + math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = lr
        offsets = torch.randint(
            0, len(tokens) - args.seq_len, (args.batch_size,), generator=generator
        )
        ids = torch.stack([tokens[o : o + args.seq_len] for o in offsets.tolist()]).to(device)
        with torch.no_grad():
            embedded = F.embedding(ids, embedding)  # [batch, seq, hidden]
            features = tiny_features(tiny, embedded, cos, sin)  # f_p: [batch, seq, hidden]
            greedy = F.linear(features, embedding).argmax(-1)  # tiny's choice after p
        # EAGLE: pairs (f_p, x_{p+1}) for p < seq - 1 predict f_{p+1}, then tiny's greedy[p+1].
        pair_cos, pair_sin = cos[:-1], sin[:-1]
        predicted = eagle(features[:, :-1], embedded[:, 1:], pair_cos, pair_sin)
        eagle_loss = eagle_losses(predicted, features[:, 1:], greedy[:, 1:], embedding)
        # Second pass: its own predictions as features (shifted: g_{p+1} with x_{p+2}).
        rolled = eagle(predicted[:, :-1].detach(), embedded[:, 2:], cos[:-2], sin[:-2])
        eagle_loss = eagle_loss + eagle_losses(rolled, features[:, 2:], greedy[:, 2:], embedding)
        draft_logits = F.linear(draft(embedded, cos, sin), embedding)
        draft_loss = F.cross_entropy(draft_logits.flatten(0, 1), greedy.flatten())
        optimizer.zero_grad(set_to_none=True)
        (eagle_loss + draft_loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % args.log_every == 0 or step == args.steps - 1 or progress >= 0.999:
            with torch.no_grad():
                eagle_match = (F.linear(predicted, embedding).argmax(-1) == greedy[:, 1:]).float()
                draft_match = (draft_logits.argmax(-1) == greedy).float()
            history.append(
                {
                    "step": step,
                    "elapsed_s": round(time.perf_counter() - start, 1),
                    "eagle_loss": round(eagle_loss.item(), 4),
                    "eagle_top1_match": round(eagle_match.mean().item(), 4),
                    "draft_loss": round(draft_loss.item(), 4),
                    "draft_top1_match": round(draft_match.mean().item(), 4),
                }
            )
            print(json.dumps(history[-1]), flush=True)
    save_drafts(eagle, draft, hot_token_ids(tokens.numpy()), args.out)
    metrics = {"args": {k: str(v) for k, v in vars(args).items()}, "history": history}
    (args.out / "draft_training.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def tiny_features(tiny: TrainableLlama, embedded, cos, sin) -> torch.Tensor:
    """tiny's last hidden states after its final norm (what its LM head reads)."""
    x = embedded
    for layer in tiny.model.layers:
        x = layer(x, cos, sin)
    return tiny.model.norm(x)


def eagle_losses(predicted, target_features, target_ids, embedding) -> torch.Tensor:
    feature_loss = F.smooth_l1_loss(predicted, target_features)
    logits = F.linear(predicted, embedding)  # [batch, seq, vocab]
    token_loss = F.cross_entropy(logits.flatten(0, 1), target_ids.flatten())
    return FEATURE_LOSS_WEIGHT * feature_loss + TOKEN_LOSS_WEIGHT * token_loss


def hot_token_ids(tokens: np.ndarray, size: int = TINY_EAGLE_DRAFT_VOCAB_SIZE) -> torch.Tensor:
    """The `size` most frequent token ids of `tokens` (ties: the lower id), ascending."""
    counts = np.bincount(tokens, minlength=TINY_CONFIG["vocab_size"])
    return torch.from_numpy(np.sort(np.argsort(-counts, kind="stable")[:size]))


def save_drafts(
    eagle: TrainableEagleHead, draft: TrainableDraft, hot_ids: torch.Tensor, out: Path
) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)

    def bf16(module: nn.Module, prefix: str) -> dict:
        return {
            prefix + name: tensor.detach().to("cpu", torch.bfloat16).contiguous()
            for name, tensor in module.state_dict().items()
        }

    eagle_weights = bf16(eagle, "") | {"hot_token_ids": hot_ids.to(torch.int64)}
    save_file(eagle_weights, str(out / EAGLE_HEAD_FILE), metadata={"format": "pt"})
    draft_weights = bf16(draft.layer, "model.layers.0.") | bf16(draft.norm, "model.norm.")
    save_file(draft_weights, str(out / DRAFT_LAYERS_FILE), metadata={"format": "pt"})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=None, help="the corpus's {train}.npy")
    parser.add_argument("--num-files", type=int, default=200, help="without --data")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (shared machines)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--train-seconds", type=float, default=None, help="also stop by then")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--log-every", type=int, default=20)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    train(args)


if __name__ == "__main__":
    main()
