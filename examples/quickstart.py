"""Quickstart: a prompt program on the embedded `tiny` model.

    python examples/quickstart.py [--model-path DIR | --url URL] [--max-new-tokens N]

`tiny` has random weights, so its answers are gibberish; constrained outputs (the select
below) are still valid. Point --model-path at a local Llama/Qwen/Mistral folder for real
text.
"""

from __future__ import annotations

from example_utils import run_main

import radixgen as rg


@rg.function
def qa(s, question, answer_tokens):
    s += rg.system("You are a concise assistant.")
    s += rg.user(question)
    s += rg.assistant(rg.gen("answer", max_tokens=answer_tokens, stop="\n"))
    s += rg.user("Was that answer correct? Reply yes or no.")
    s += rg.assistant(rg.select("verdict", ["yes", "no"]))


def run_example(backend, max_new_tokens: int = 24) -> dict:
    # One program run: reads wait for the generation.
    state = qa.run(
        question="What is the capital of France?",
        answer_tokens=max_new_tokens,
        temperature=0.0,
        backend=backend,
    )
    print(state.text())
    meta = state.get_meta_info("answer")
    print(f"answer: {state['answer']!r} ({meta['completion_tokens']} tokens)")
    print(f"verdict: {state['verdict']} (scores {state.get_meta_info('verdict')['scores']})")

    # Streaming: the program runs in the background while we print its tokens.
    streamed = qa.run(
        question="Name a prime number.", answer_tokens=max_new_tokens, stream=True, backend=backend
    )
    print("streamed answer: ", end="")
    for chunk in streamed.text_iter("answer"):
        print(chunk, end="", flush=True)
    print()

    # A batch: the shared system prompt is prefilled once, then every program reuses it.
    questions = ["What is 2+2?", "Name a colour.", "What is a radix tree?"]
    states = qa.run_batch(
        [{"question": q, "answer_tokens": max_new_tokens} for q in questions],
        backend=backend,
        progress_bar=False,
    )
    for question, batch_state in zip(questions, states, strict=True):
        cached = batch_state.get_meta_info("answer")["cached_tokens"]
        print(f"{question!r} -> {batch_state['answer']!r} ({cached} prompt tokens cached)")
    return {"state": state, "streamed": streamed, "batch": states}


def main() -> None:
    run_main(run_example, __doc__, max_new_tokens=24)


if __name__ == "__main__":
    main()
