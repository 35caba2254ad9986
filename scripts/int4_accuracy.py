"""What int4 weights cost in accuracy on the trained `tiny`: held-out perplexity, top-1 agreement
and free-running greedy agreement against bf16 (the same measures as scripts/fp8_accuracy.py,
whose helpers this reuses). Runs on the CPU (the dequantize-then-matmul reference) or a GPU.

    python scripts/int4_accuracy.py [--device cpu|cuda] [--out DIR]     # JSON to DIR or $OUT

Variants (every projection int4, group 128; embeddings / LM head stay bf16):
- "awq rtn g128": `quantization="awq"` on tiny itself: round-to-nearest with zero points at load
  time (no activation-aware scaling: AWQ's format, not its calibration);
- "awq checkpoint g128": the same RTN written as an AWQ checkpoint and detected from config.json
  (must equal the previous row: the checkpoint path changes nothing);
- "gptq sym act-order g128": a symmetric GPTQ v1 checkpoint with a random act-order (RTN, so the
  order only changes which rows share a scale).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path

import torch
from fp8_accuracy import all_logits, greedy_agreement, greedy_ids, make_runner

from radixgen.runtime.models.int4_checkpoint import Int4Scheme, write_int4_checkpoint
from radixgen.runtime.tiny_assets.corpus import load_ci_slice
from radixgen.runtime.tiny_model import resolve_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    windows = load_ci_slice().astype("int64").tolist()
    prompts = [window[start : start + 128] for window in windows for start in (0, 512)]
    tiny = Path(resolve_model_path("tiny"))
    with tempfile.TemporaryDirectory() as awq, tempfile.TemporaryDirectory() as gptq:
        write_int4_checkpoint(tiny, Path(awq), Int4Scheme("awq", 128))
        write_int4_checkpoint(
            tiny,
            Path(gptq),
            Int4Scheme("gptq", 128, zeros_minus_one=True, desc_act=True),
            symmetric=True,
        )
        variants = {
            "bf16": ("tiny", {}),
            "awq rtn g128": ("tiny", {"quantization": "awq"}),
            "awq checkpoint g128": (awq, {}),
            "gptq sym act-order g128": (gptq, {}),
        }
        rows, reference_argmax, reference_greedy = [], None, None
        for label, (model_path, options) in variants.items():
            greedy = greedy_ids(model_path, args.device, options, prompts)
            runner = make_runner(model_path, args.device, options)
            nll, argmaxes = 0.0, []
            for window in windows:
                logits = all_logits(runner, window)[:-1]  # [1023, vocab]: predicts window[1:]
                targets = torch.tensor(window[1:], device=logits.device)
                nll += torch.nn.functional.cross_entropy(logits, targets, reduction="sum").item()
                argmaxes.append(logits.argmax(-1).cpu())
            del runner
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
    result = {"device": args.device, "torch": torch.__version__, "tiny": rows}
    out = Path(args.out) / "int4_accuracy.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
