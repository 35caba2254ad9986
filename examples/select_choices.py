"""Choosing among options: `rg.select` scores each choice from prompt logprobs (no
sampling), with three scoring methods; `rg.gen(choices=...)` decodes constrained instead.

    python examples/select_choices.py [--model-path DIR | --url URL]
"""

from __future__ import annotations

from example_utils import run_main

import radixgen as rg

CHOICES = ["Paris", "London", "Berlin", "Antidisestablishmentarianism"]


@rg.function
def capital(s, method):
    s += "Question: What is the capital of France?\nAnswer: "
    s += rg.select("by_score", CHOICES, choices_method=method)
    s += "\nSame question, answered by constrained decoding: "
    s += rg.gen("by_decoding", choices=CHOICES, temperature=0.0)


def run_example(backend, max_new_tokens: int = 0) -> dict[str, rg.ProgramState]:
    states = {}
    for method in rg.ChoicesMethod:
        state = capital.run(method=method, backend=backend)
        scores = state.get_meta_info("by_score")["scores"]
        print(f"{method.value}: picked {state['by_score']!r}")
        for choice, score in zip(CHOICES, scores, strict=True):
            print(f"    {choice:<30} {score}")
        print(f"  constrained decoding picked {state['by_decoding']!r}")
        states[method.value] = state
    return states


def main() -> None:
    run_main(run_example, __doc__, max_new_tokens=0)


if __name__ == "__main__":
    main()
