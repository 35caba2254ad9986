"""Quickstart: Python code completion with the embedded `tiny` model.

    python examples/quickstart.py [--model-path DIR | --url URL] [--max-new-tokens N]

`tiny` is a 13M-parameter Llama trained on Python's standard library (docs/model.md): it
completes Python, plausibly if not always correctly; it is not a chat model. Point
--model-path at a local Llama/Qwen/Mistral folder for a larger model.
"""

from __future__ import annotations

from example_utils import run_main

import radixgen as rg

# A completed definition ends at the next top-level statement.
END_OF_DEFINITION = ["\n\n\n", "\ndef ", "\nclass "]
STUBS = [
    'def read_lines(path):\n    """Return the lines of a text file."""',
    "class Stack:\n    def __init__(self):",
    'def is_python_file(name):\n    """Return True if the file name ends with .py."""',
]


@rg.function
def complete(s, stub, body_tokens):
    s += stub
    # Greedy, with a mild repetition penalty: small models otherwise tend to loop.
    s += rg.gen("body", max_tokens=body_tokens, stop=END_OF_DEFINITION, repetition_penalty=1.2)


@rg.function
def next_token_choice(s):
    s += "def add(a, b):\n    return a"
    s += rg.select("operator", [" + b", " import b", " ) b"])


def run_example(backend, max_new_tokens: int = 64) -> dict:
    # One program run: reads wait for the generation.
    state = complete.run(
        stub=STUBS[0], body_tokens=max_new_tokens, temperature=0.0, backend=backend
    )
    print(state.text())
    meta = state.get_meta_info("body")
    print(f"--- {meta['completion_tokens']} tokens, finish: {meta['finish_reason']}\n")

    # select scores each option from prompt logprobs: the code model prefers valid Python.
    choice = next_token_choice.run(backend=backend)
    print(f"select: {choice['operator']!r} (scores {choice.get_meta_info('operator')['scores']})\n")

    # Streaming: the program runs in the background while we print its tokens.
    streamed = complete.run(
        stub=STUBS[1], body_tokens=max_new_tokens, temperature=0.0, stream=True, backend=backend
    )
    print(STUBS[1], end="")
    for chunk in streamed.text_iter("body"):
        print(chunk, end="", flush=True)
    print("\n")

    # A batch: one program per stub, run concurrently.
    states = complete.run_batch(
        [{"stub": stub, "body_tokens": max_new_tokens} for stub in STUBS],
        temperature=0.0,
        backend=backend,
        progress_bar=False,
    )
    for batch_state in states:
        print(batch_state.text(), end="\n---\n")
    return {"state": state, "choice": choice, "streamed": streamed, "batch": states}


def main() -> None:
    run_main(run_example, __doc__, max_new_tokens=64)


if __name__ == "__main__":
    main()
