"""Choosing among code continuations: `rg.select` scores each choice from prompt logprobs (no
sampling), with three scoring methods; `rg.gen(choices=...)` decodes constrained instead.

    python examples/select_choices.py [--model-path DIR | --url URL]

The embedded `tiny` model was trained on Python, so it prefers the continuation that is valid,
idiomatic Python (tests/test_tiny_quality.py checks a handful of such cases).
"""

from __future__ import annotations

from example_utils import run_main

import radixgen as rg

# (code so far, candidate continuations): the first candidate is the idiomatic one.
CASES = [
    ("for i in range(10):\n    ", ["print(i)", "else:", ") ("]),
    ("try:\n    value = int(text)\nexcept ", ["ValueError:", "while", "+= 1"]),
    ("if __name__ == ", ['"__main__":', "def", "return 0"]),
]


@rg.function
def continue_code(s, code, choices, method):
    s += code
    s += rg.select("by_score", choices, choices_method=method)
    s += "\n# The same choice by constrained decoding:\n" + code
    s += rg.gen("by_decoding", choices=choices, temperature=0.0)


def run_example(backend, max_new_tokens: int = 0) -> dict[str, list[rg.ProgramState]]:
    states = {}
    for method in rg.ChoicesMethod:
        states[method.value] = []
        print(f"{method.value}:")
        for code, choices in CASES:
            state = continue_code.run(code=code, choices=choices, method=method, backend=backend)
            scores = state.get_meta_info("by_score")["scores"]
            pairs = zip(choices, scores, strict=True)
            ranked = ", ".join(f"{choice!r} {_rounded(score)}" for choice, score in pairs)
            print(f"  {code!r} + {state['by_score']!r}   ({ranked})")
            print(f"    constrained decoding picked {state['by_decoding']!r}")
            states[method.value].append(state)
    return states


def _rounded(score):
    """A score, or greedy_token_selection's list of per-token scores, to 2 decimals."""
    return [round(x, 2) for x in score] if isinstance(score, list) else round(score, 2)


def main() -> None:
    run_main(run_example, __doc__, max_new_tokens=0)


if __name__ == "__main__":
    main()
