"""Quickstart: generate from a few chat prompts on the embedded `tiny` model.

    python examples/quickstart.py [--model-path PATH] [--max-new-tokens N]

`tiny` has random weights, so its text is gibberish: this shows the whole path (checkpoint
build, tokenizer, chat template, paged-KV prefill and decode), not a clever model. Point
--model-path at any local Llama/Mistral/Qwen2/Qwen3 HF folder for real text.
"""

from __future__ import annotations

import argparse
import time

from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.simple_generate import generate
from radixgen.runtime.tokenizer import load_tokenizer

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "List three colours.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default="tiny")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()

    start = time.perf_counter()
    runner = ModelRunner(ServerArgs(model_path=args.model_path))
    tokenizer = load_tokenizer(runner.model_path)
    print(f"loaded {runner.model_path} on {runner.device} in {time.perf_counter() - start:.1f}s")

    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        for text in PROMPTS
    ]
    prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in prompts]
    start = time.perf_counter()
    outputs = generate(
        runner, prompt_ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature
    )
    elapsed = time.perf_counter() - start
    for text, output in zip(PROMPTS, outputs, strict=True):
        print(f"\n>>> {text}\n{tokenizer.decode(output, skip_special_tokens=True)!r}")
    num_tokens = sum(len(output) for output in outputs)
    print(f"\n{num_tokens} tokens in {elapsed:.2f}s ({num_tokens / elapsed:.0f} tokens/s)")


if __name__ == "__main__":
    main()
