"""Batch run: one program over many inputs, concurrently, with a progress bar.

    python examples/batch_run.py [--model-path DIR | --url URL] [--max-new-tokens N]

run_batch first finds the text every program starts with (the few-shot header below),
prefills it once, and then every program reads it from the radix cache. The embedded
`tiny` code model labels reviews no better than chance; use --model-path with a larger model.
"""

from __future__ import annotations

from example_utils import run_main

import radixgen as rg

FEW_SHOT = (
    "Classify the sentiment of each review as positive or negative.\n"
    "Review: I loved every minute of it.\nSentiment: positive\n"
    "Review: The plot made no sense at all.\nSentiment: negative\n"
)
REVIEWS = [
    "A delight from start to finish.",
    "Two hours I will never get back.",
    "The actors seemed bored.",
    "Beautiful music and a clever story.",
    "It was fine, I guess.",
    "The best film of the year.",
    "Too long and too loud.",
    "My kids asked to watch it again.",
]


@rg.function
def classify(s, review, reason_tokens):
    s += FEW_SHOT
    s += f"Review: {review}\nSentiment: "
    s += rg.select("sentiment", ["positive", "negative"])
    s += "\nReason: " + rg.gen("reason", max_tokens=reason_tokens, stop="\n")


def run_example(backend, max_new_tokens: int = 16) -> list[rg.ProgramState]:
    states = classify.run_batch(
        [{"review": review, "reason_tokens": max_new_tokens} for review in REVIEWS],
        backend=backend,
        temperature=0.0,
        progress_bar=True,
    )
    for review, state in zip(REVIEWS, states, strict=True):
        if state.error is not None:
            print(f"{review!r}: failed with {state.error!r}")
            continue
        cached = state.get_meta_info("reason")["cached_tokens"]
        print(f"{state['sentiment']:>8}  {review!r}  ({cached} prompt tokens cached)")
    return states


def main() -> None:
    run_main(run_example, __doc__, max_new_tokens=16)


if __name__ == "__main__":
    main()
